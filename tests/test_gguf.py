"""minengine's own GGUF reader (``models/gguf.py``): dequantization against the ``gguf`` package's
reference, and tiny random Llamas written with ``gguf.GGUFWriter`` (the way llama.cpp's converter
writes them: llama.* metadata, blk.N.* names, q/k rows permuted) that must give the logits of the HF
model they came from. No download: every file is made here.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch
from hf_utils import build_hf_model

from minengine.models import (
    AttentionMetadata,
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedModelError,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from minengine.models import gguf as mgguf

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (make installs it)")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

IDS = [1, 5, 9, 200, 17, 300, 42, 511, 3, 77, 123, 64]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Converted folders go to this test's own cache, never the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


# ---- dequantization, block by block, against gguf.quants -------------------------------------------


def _random_blocks(qtype: QT, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random raw blocks: arbitrary quant bytes, finite fp16 scale (and min) of either sign."""
    size = mgguf.BLOCK_BYTES[qtype.name]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    n_halves = 2 if qtype == QT.Q4_1 else 1
    halves = (rng.standard_normal((n_blocks, n_halves)) * 0.05).astype(np.float16)
    raw[:, : 2 * n_halves] = halves.view(np.uint8)
    return raw


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q4_1])
def test_quantized_blocks_match_gguf_reference(qtype):
    rng = np.random.default_rng(qtype.value)
    raw = _random_blocks(qtype, 257, rng)
    ours = mgguf.dequantize_blocks(raw, qtype.name)
    reference = quants.dequantize(raw, qtype).reshape(-1)
    assert ours.dtype == np.float32 and ours.shape == (257 * 32,)
    np.testing.assert_array_equal(ours, reference)


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.BF16])
def test_float_types_match_gguf_reference(qtype):
    x = np.random.default_rng(1).standard_normal((7, 64)).astype(np.float32) * 3
    raw = quants.quantize(x, qtype)
    np.testing.assert_array_equal(
        mgguf.dequantize_blocks(raw, qtype.name), quants.dequantize(raw, qtype).reshape(-1)
    )


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q4_1])
def test_quantize_round_trip_is_close(qtype):
    """Values quantized by gguf come back near where they were (the layout is read the right way round)."""
    x = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)
    back = mgguf.dequantize_blocks(quants.quantize(x, qtype), qtype.name).reshape(x.shape)
    step = {"Q8_0": 1 / 127, "Q4_0": 1 / 8, "Q4_1": 1 / 15}[qtype.name]
    assert np.abs(back - x).max() <= step * np.abs(x).max() * 1.01


def test_unsupported_tensor_type_is_named():
    with pytest.raises(UnsupportedModelError, match=r"Q6_K is not supported; supported: F32, .*Q4_1"):
        mgguf.dequantize_blocks(np.zeros(210, np.uint8), "Q6_K")


def _llamacpp_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp convert_hf_to_gguf.py's ``LlamaModel.permute``."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_undoes_llamacpp_permute():
    w = torch.randn(6 * 16, 40)
    assert not torch.equal(_llamacpp_permute(w, 6), w)
    torch.testing.assert_close(mgguf.unpermute_qk(_llamacpp_permute(w, 6), 6), w, atol=0, rtol=0)
    b = torch.randn(3 * 8)
    torch.testing.assert_close(mgguf.unpermute_qk(_llamacpp_permute(b, 3), 3), b, atol=0, rtol=0)


def test_tensor_names_map_to_hf():
    assert mgguf.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert mgguf.hf_name("blk.12.ffn_down.weight") == "model.layers.12.mlp.down_proj.weight"
    assert mgguf.hf_name("blk.0.attn_k.bias") == "model.layers.0.self_attn.k_proj.bias"
    with pytest.raises(UnsupportedModelError, match="blk.0.ssm_conv1d.weight"):
        mgguf.hf_name("blk.0.ssm_conv1d.weight")


# ---- a tiny random Llama, written to GGUF and read back --------------------------------------------


_GGUF_NAMES = {v: k for k, v in mgguf._GLOBAL_NAMES.items()}
_GGUF_BLOCK = {v: k for k, v in mgguf._BLOCK_NAMES.items()}


def _gguf_name(hf: str) -> str:
    base, _, suffix = hf.rpartition(".")
    if base in _GGUF_NAMES:
        return f"{_GGUF_NAMES[base]}.{suffix}"
    _, _, layer, rest = base.split(".", 3)
    return f"blk.{layer}.{_GGUF_BLOCK[rest]}.{suffix}"


def write_gguf(hf_model, path, qtype: QT = QT.F32) -> dict[str, torch.Tensor]:
    """Write ``hf_model`` as llama.cpp would; returns the state dict the file really holds
    (matrices after gguf's own quantize -> dequantize, so it is the exact reference)."""
    c = hf_model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(c.vocab_size)
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    held = {}
    for name, t in hf_model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        t = t.detach().float()
        stored = t
        if ".q_proj." in name:
            stored = _llamacpp_permute(t, c.num_attention_heads)
        elif ".k_proj." in name:
            stored = _llamacpp_permute(t, c.num_key_value_heads)
        array = stored.numpy()
        if t.dim() == 2 and qtype != QT.F32:  # llama.cpp keeps 1-D tensors (norms, biases) in F32
            raw = quants.quantize(array, qtype)
            w.add_tensor(_gguf_name(name), raw, raw_dtype=qtype)
            t = torch.from_numpy(quants.dequantize(raw, qtype).reshape(t.shape).copy())
            if ".q_proj." in name:  # the round trip is of the permuted rows: permute them back
                t = mgguf.unpermute_qk(t, c.num_attention_heads)
            elif ".k_proj." in name:
                t = mgguf.unpermute_qk(t, c.num_key_value_heads)
        else:
            w.add_tensor(_gguf_name(name), array)
        held[name] = t
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return held


def _ours(model, ids=IDS) -> torch.Tensor:
    meta = AttentionMetadata.for_prefill([len(ids)])
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), meta.positions(), meta))


def _hf(model, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_f32_gguf_gives_the_hf_logits(tmp_path, tied):
    hf = build_hf_model("llama", tie_word_embeddings=tied)  # q/k/v/o and MLP biases, GQA 4:2
    write_gguf(hf, tmp_path / "tiny.gguf")
    model = load_model(tmp_path / "tiny.gguf", device="cpu")
    config = json.loads((model.model_path / "config.json").read_text())
    assert config["num_key_value_heads"] == 2 and config["tie_word_embeddings"] is tied
    assert model.config.attention_bias and model.config.mlp_bias
    for name, value in hf.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, atol=0, rtol=0, msg=name)
    torch.testing.assert_close(_ours(model), _hf(hf), atol=1e-4, rtol=1e-5)


def test_q8_0_gguf_gives_the_logits_of_its_dequantized_weights(tmp_path):
    hf = build_hf_model("llama")
    original = _hf(hf)
    held = write_gguf(hf, tmp_path / "tiny-q8.gguf", QT.Q8_0)
    model = load_model(tmp_path / "tiny-q8.gguf", device="cpu")
    hf.load_state_dict(held)  # the HF model with exactly the weights the file holds
    torch.testing.assert_close(_ours(model), _hf(hf), atol=1e-4, rtol=1e-5)
    # and stays near the unquantized model (this random model's large weights amplify the ~0.4% error
    # per weight of Q8_0; measured: cosine 0.9996, max error 4% of the largest logit)
    ours = _ours(model)
    assert torch.nn.functional.cosine_similarity(ours.flatten(), original.flatten(), dim=0) > 0.999
    assert (ours - original).abs().max() < 0.1 * original.abs().max()


def test_second_load_reuses_the_cache_and_a_changed_file_gets_a_new_one(tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_gguf(build_hf_model("llama"), path)
    folder = resolve_model_path(path)
    assert folder.parent == tmp_path / "xdg" / "minengine" / "gguf" and folder.name.startswith("tiny-")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "generation_config.json",
                                                        "model.safetensors"]  # fmt: skip

    def refuse(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(mgguf, "write_hf_folder", refuse)
    assert resolve_model_path(str(path)) == folder
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match="converted again"):
        resolve_model_path(path)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".converting-")]


def test_a_conversion_for_everyone_is_found_first_and_users_convert_into_their_cache(tmp_path, monkeypatch,
                                                                                     capsys):
    """make setup converts the packaged model into the environment (a hub's one venv) for every user; a
    file only one user loads goes to that user's cache; a read-only environment says so, never half-writes."""
    from minengine.models import gguf_cache

    env, xdg = tmp_path / "venv", tmp_path / "xdg"
    monkeypatch.setattr(sys, "prefix", str(env))
    monkeypatch.delenv(gguf_cache.ENV_DIR, raising=False)
    shared, mine = env / "share" / "minengine" / "gguf", xdg / "minengine" / "gguf"
    assert gguf_cache.roots() == [shared, mine]
    packaged, other = tmp_path / "packaged.gguf", tmp_path / "other.gguf"
    write_gguf(build_hf_model("llama"), packaged)
    write_gguf(build_hf_model("llama"), other)
    monkeypatch.setattr(gguf_cache, "PACKAGED_MODELS", {"tiny-packaged": None})
    monkeypatch.setattr(gguf_cache, "packaged_model_file", lambda name: packaged)
    assert gguf_cache.main([]) == 0  # what make setup runs: every packaged model
    out = capsys.readouterr().out
    assert "tiny-packaged: model folder for every user of this environment: " + str(shared) in out
    assert "converted in" in out
    folder = gguf_cache.cache_folder(packaged)
    assert folder.parent == shared and (folder / "model.safetensors").is_file()
    assert oct(folder.stat().st_mode & 0o777) == "0o755"  # other users can read it

    def refuse(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(mgguf, "write_hf_folder", refuse)
    assert resolve_model_path(packaged) == folder  # a user's load finds it: no conversion, no copy
    assert gguf_cache.main([]) == 0  # and make setup run again converts nothing
    assert "(already converted)" in capsys.readouterr().out
    monkeypatch.undo()  # (restores everything; set the two places up again)
    monkeypatch.setattr(sys, "prefix", str(env))
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    monkeypatch.delenv(gguf_cache.ENV_DIR, raising=False)
    assert resolve_model_path(other).parent == mine  # an ordinary load converts into the user's cache

    real_access = os.access
    monkeypatch.setattr(os, "access",
                        lambda p, mode: real_access(p, mode) and not str(p).startswith(str(env)))
    third = tmp_path / "third.gguf"
    write_gguf(build_hf_model("llama"), third)
    with pytest.raises(ModelLoadError, match="cannot write the converted model"):
        gguf_cache.gguf_model_folder(third, for_everyone=True)
    assert not list(shared.glob("third-*")) and not list(shared.glob(".converting-*"))
    monkeypatch.setattr(gguf_cache, "PACKAGED_MODELS", {"tiny-packaged": None})
    monkeypatch.setattr(gguf_cache, "packaged_model_file", lambda name: third)
    assert gguf_cache.main(["tiny-packaged"]) == 0
    assert "read-only here; each user converts it on first load" in capsys.readouterr().out
    assert gguf_cache.main(["no-such-model"]) == 2
    assert "not a packaged model: no-such-model" in capsys.readouterr().out
    monkeypatch.setenv(gguf_cache.ENV_DIR, str(tmp_path / "one"))
    assert gguf_cache.roots() == [tmp_path / "one"]  # one folder, named: nothing else is looked at
    assert resolve_model_path(third).parent == tmp_path / "one"


def test_gguf_without_tokenizer_has_none(tmp_path):
    write_gguf(build_hf_model("llama"), tmp_path / "tiny.gguf")
    with pytest.raises(ModelNotFoundError, match="no tokenizer"):
        load_tokenizer(tmp_path / "tiny.gguf")


def test_other_architectures_and_corrupt_files_are_refused(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "mamba.gguf"), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="'mamba' is not supported.*only 'llama'"):
        load_model(tmp_path / "mamba.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF not really")
    with pytest.raises(ModelLoadError, match="could not read GGUF file"):
        load_model(tmp_path / "bad.gguf")
