"""KV-cache calculator: the numbers lab 1 is graded against, and the `minengine kv` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from minengine import kvcalc
from minengine.cli.main import main
from minengine.kvcalc import (
    PRESETS,
    GiB,
    KVCalcError,
    estimate,
    estimate_num_params,
    from_hf_config,
    kv_bytes_mha,
    kv_bytes_per_batch,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    load_model_spec,
    tokens_held,
)
from minengine.perf import model_spec

ROOT = Path(__file__).resolve().parents[1]
SEED_7B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}  # seeds: MHA, no kv heads


# --------------------------------------------------------------------------------------------- sizes
def test_seed_worked_example() -> None:
    """Seeds: 7B, 32 layers, hidden 4096, fp16: 4K -> 2 GiB, 128K -> 64 GiB, batch 8 at 128K -> 512 GiB."""
    for model in (SEED_7B, "llama-2-7b"):
        spec = load_model_spec(model)
        assert spec.attention_type == "MHA"
        assert kv_bytes_per_sequence(spec, 4096, "fp16") == 2 * GiB
        assert kv_bytes_per_sequence(spec, 128 * 1024, "fp16") == 64 * GiB
        assert kv_bytes_per_batch(spec, 128 * 1024, 8, kv_cache_dtype="fp16") == 512 * GiB
        # the seeds' hidden-size formula is the MHA special case of the general one
        assert kv_bytes_mha(32, 4096, 4096, 1, 2) == kv_bytes_per_sequence(spec, 4096, "fp16")
    # "the weights are 14 GB": 6.74 B params x 2 bytes
    assert kvcalc.weight_bytes(load_model_spec("llama-2-7b")) / 1e9 == pytest.approx(13.5, abs=0.1)


def test_llama31_8b_is_128_kib_per_token() -> None:
    spec = load_model_spec("llama-3.1-8b")
    assert spec.attention_type == "GQA"
    assert kv_bytes_per_token(spec, "bf16") == 131_072 == 2 * 32 * 8 * 128 * 2
    assert kv_bytes_per_token(spec) == 131_072  # auto = the model's bf16
    # the MHA formula would overstate it 4x (32 query heads vs 8 KV heads)
    assert kv_bytes_mha(32, 4096, 1, 1, 2) == 4 * 131_072


def test_deepseek_v3_mla() -> None:
    spec = load_model_spec("deepseek-v3")
    assert spec.is_mla and spec.attention_type == "MLA"
    assert kv_bytes_per_token(spec, "bf16") == 61 * 576 * 2 == 70_272
    assert kv_bytes_per_token(spec, "fp8") == 61 * 576
    assert kv_bytes_per_token(spec, "bf16", tensor_parallel_size=8) == 70_272  # latent replicated per rank
    assert spec.weight_dtype == "fp8" and spec.dtype == "bf16"


def test_dtypes_and_group_scales() -> None:
    spec = load_model_spec("llama-3.1-8b")
    sizes = {d: kv_bytes_per_token(spec, d) for d in ("fp32", "bf16", "fp16", "fp8", "int8", "int4")}
    assert sizes == {"fp32": 262_144, "bf16": 131_072, "fp16": 131_072, "fp8": 65_536, "int8": 65_536,
                     "int4": 32_768}
    # int4 with one fp16 scale per 64 elements: 2048 elements per layer -> 1024 B + 32 scales x 2 B
    assert kv_bytes_per_token(spec, "int4", quant_group_size=64) == 32 * (1024 + 32 * 2)
    with pytest.raises(KVCalcError, match="unknown dtype"):
        kv_bytes_per_token(spec, "fp6")


def test_mqa_and_head_dim_from_config() -> None:
    mqa = from_hf_config({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                          "num_key_value_heads": 1})
    assert mqa.attention_type == "MQA" and mqa.head_dim == 16
    assert kv_bytes_per_token(mqa, "fp16") == 2 * 2 * 1 * 16 * 2
    falcon = from_hf_config({"n_layer": 2, "n_embd": 64, "n_head": 4, "multi_query": True})
    assert falcon.num_kv_heads == 1
    gemma3 = load_model_spec("gemma-3-27b")  # explicit head_dim 128 differs from hidden/heads = 168
    assert gemma3.head_dim == 128


# --------------------------------------------------------------------------------- sliding windows
def test_gemma2_sliding_window_caps_half_the_layers() -> None:
    spec = load_model_spec("gemma-2-9b")
    per_layer = 2 * 8 * 256 * 2  # 8 KV heads x head_dim 256, bf16
    assert spec.num_sliding_layers == 21 and spec.layer_windows[:2] == (4096, None)
    assert kv_bytes_per_token(spec) == 42 * per_layer
    # below the window every layer holds every token
    assert kv_bytes_per_sequence(spec, 4096) == 42 * 4096 * per_layer
    # at 8K the 21 local layers stop at 4,096 tokens
    assert kv_bytes_per_sequence(spec, 8192) == 21 * (8192 + 4096) * per_layer
    # paged: an unaligned window straddles one extra block
    assert kv_bytes_per_sequence(spec, 8192, block_size=16) == 21 * (8192 + 4096 + 16) * per_layer
    full = load_model_spec("gemma-2-9b", disable_sliding_window=True)
    assert kv_bytes_per_sequence(full, 8192) == 42 * 8192 * per_layer


def test_window_rules_per_family() -> None:
    assert load_model_spec("mistral-7b").num_sliding_layers == 32  # v0.1: every layer
    assert load_model_spec("mistral-7b-v0.3").num_sliding_layers == 0
    assert load_model_spec("qwen2.5-7b").num_sliding_layers == 0  # use_sliding_window false
    qwen_on = {**PRESETS["qwen2.5-7b"]["config"], "use_sliding_window": True, "sliding_window": 4096,
               "max_window_layers": 20}
    assert from_hf_config(qwen_on).layer_windows == (None,) * 20 + (4096,) * 8
    gemma3 = load_model_spec("gemma-3-27b")  # nested text_config; 5 local : 1 global
    assert gemma3.num_sliding_layers == 52 and gemma3.layer_windows[5] is None
    explicit = from_hf_config({"num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
                               "sliding_window": 128,
                               "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})
    assert explicit.layer_windows == (128, None, 128)
    with pytest.raises(KVCalcError, match="layer type"):
        from_hf_config({"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
                        "layer_types": ["linear_attention"]})


def test_paged_rounding() -> None:
    assert tokens_held(17, None, 16) == 32
    assert tokens_held(16, None, 16) == 16
    assert tokens_held(17, None, None) == 17
    assert tokens_held(5000, 4096, None) == 4096
    assert tokens_held(5000, 4096, 16) == 257 * 16
    spec = load_model_spec("llama-3.1-8b")
    assert kv_bytes_per_sequence(spec, 17, block_size=16) == 32 * 131_072
    assert kv_bytes_per_sequence(spec, 17) == 17 * 131_072


# ----------------------------------------------------------------------------------- tensor parallel
def test_tensor_parallel_split_and_replication() -> None:
    spec = load_model_spec("llama-3.1-8b")  # 8 KV heads
    assert kv_bytes_per_token(spec, tensor_parallel_size=2) == 131_072 // 2
    assert kv_bytes_per_token(spec, tensor_parallel_size=8) == 131_072 // 8
    # TP 16 > 8 KV heads: each rank still holds one head, so the group stores every head twice
    assert kv_bytes_per_token(spec, tensor_parallel_size=16) == 131_072 // 8
    est = estimate(spec, 1024, tensor_parallel_size=16)
    assert est.total_bytes_all_gpus == 2 * kv_bytes_per_sequence(spec, 1024)
    with pytest.raises(KVCalcError, match="TP=3"):
        kv_bytes_per_token(spec, tensor_parallel_size=3)
    with pytest.raises(KVCalcError, match="KV heads"):
        kv_bytes_per_token(load_model_spec("qwen2.5-7b"), tensor_parallel_size=7)  # 28 heads, 4 KV heads


# ------------------------------------------------------------------------------------------ capacity
def test_capacity_matches_hand_computation() -> None:
    est = estimate("llama-3.1-8b", 8192, 16, gpu="h100", gpu_memory_utilization=0.9,
                   activation_reserve_bytes=2 * GiB)
    weights = 8_030_261_248 * 2
    budget = int(80 * GiB * 0.9) - weights - 2 * GiB
    assert est.weight_bytes == weights and est.kv_budget_bytes == budget
    assert est.num_gpu_blocks == budget // (16 * 131_072)
    assert est.kv_cache_tokens == est.num_gpu_blocks * 16
    assert est.max_concurrency == pytest.approx(budget / (8192 * 131_072))
    assert est.max_num_seqs == 55
    assert est.max_context_len == (budget // 16 // 131_072) // 16 * 16  # whole blocks per sequence
    assert est.fits
    assert not estimate("llama-3.1-8b", 8192, 64, gpu="h100").fits


def test_capacity_when_weights_do_not_fit() -> None:
    est = estimate("llama-3.1-70b", 4096, gpu="h100")
    assert est.kv_budget_bytes == 0 and est.max_num_seqs == 0 and not est.fits
    assert any("no room" in w for w in est.warnings)
    est = estimate("llama-3.1-70b", 4096, gpu="h100", tensor_parallel_size=4)
    assert est.fits and est.weight_bytes == pytest.approx(70_553_706_496 * 2 / 4, abs=1)


def test_max_context_limits() -> None:
    est = estimate("llama-3.1-8b", 8192, gpu="h200", tensor_parallel_size=8)
    assert est.max_context_len == 131_072 and est.max_context_limited_by_model  # memory would allow more
    est = estimate("mistral-7b", 65_536, 4, gpu="h100")  # every layer slides: memory never runs out
    assert est.max_context_len == kvcalc.MAX_CONTEXT_SEARCH and not est.max_context_limited_by_model


def test_seed_story_128k_on_one_gpu() -> None:
    """The seeds' story: 128K x batch 8 on a 7B model cannot fit on one GPU; one sequence fits on an H200."""
    est = estimate("llama-2-7b", 128 * 1024, 8, kv_cache_dtype="fp16", gpu="h100")
    assert est.total_bytes == 512 * GiB and not est.fits and est.max_num_seqs == 0
    assert est.max_context_len == (est.kv_budget_bytes // 8 // (512 * 1024)) // 16 * 16  # 14,704 tokens
    assert any("max_position_embeddings" in w for w in est.warnings)
    assert estimate("llama-2-7b", 128 * 1024, 1, kv_cache_dtype="fp16", gpu="h200").fits


def test_bad_inputs_raise_readable_errors() -> None:
    with pytest.raises(KVCalcError, match="unknown model"):
        load_model_spec("not-a-model")
    with pytest.raises(KVCalcError, match=">= 1"):
        estimate("llama-3.1-8b", 0)
    with pytest.raises(KVCalcError, match="gpu_memory_utilization"):
        estimate("llama-3.1-8b", 1024, gpu="h100", gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="valid keys"):
        estimate("llama-3.1-8b", 1024, gpu="b900")
    with pytest.raises(KVCalcError, match="config lacks"):
        from_hf_config({"hidden_size": 64})


# ------------------------------------------------------------------------------------------- inputs
@pytest.mark.parametrize("key", list(PRESETS))
def test_presets_load_and_give_positive_numbers(key: str) -> None:
    spec = load_model_spec(key)
    assert load_model_spec(PRESETS[key]["hf_id"]) == spec  # a preset's hub id resolves offline
    tp = 8 if spec.num_params > 20e9 else 1
    est = estimate(spec, 4096, 4, gpu="h200", tensor_parallel_size=tp)
    assert est.bytes_per_token > 0 and est.bytes_per_sequence > 0 and est.total_bytes > 0
    assert est.weight_bytes > 0 and est.kv_budget_bytes > 0 and est.max_num_seqs >= 1 and est.fits
    counted = estimate_num_params(PRESETS[key]["config"])
    if key not in ("gemma-3-27b", "deepseek-v3"):  # the cited count equals the count from the config
        assert counted == PRESETS[key]["num_params"]


def test_config_json_path_and_folder(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(PRESETS["llama-3.1-8b"]["config"]))
    for source in (folder / "config.json", folder, str(folder / "config.json")):
        spec = load_model_spec(source)
        assert kv_bytes_per_token(spec) == 131_072 and spec.name == "my-model"
        assert spec.num_params == 8_030_261_248  # estimated from the config
    (folder / "bad.json").write_text("{not json")
    with pytest.raises(KVCalcError, match="cannot read"):
        load_model_spec(folder / "bad.json")
    with pytest.raises(KVCalcError, match="no such config file"):
        load_model_spec(tmp_path / "missing.json")


def test_hub_id_offline_gives_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    def offline(*args: object, **kwargs: object) -> str:
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    for reachable in (False, True):  # no route at all / the request itself fails
        monkeypatch.setattr(model_spec, "_hub_reachable", lambda reachable=reachable: reachable)
        with pytest.raises(KVCalcError, match="offline"):
            load_model_spec("some-org/some-model")
    assert load_model_spec("Qwen/Qwen3-8B").name == "qwen3-8b"  # presets never touch the network


def test_hub_id_fetches_only_config_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub

    path = tmp_path / "config.json"
    path.write_text(json.dumps(PRESETS["qwen3-8b"]["config"]))
    asked = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download",
                        lambda repo_id, filename, **kw: asked.append((repo_id, filename)) or str(path))
    spec = load_model_spec("some-org/qwen-clone")
    assert asked == [("some-org/qwen-clone", "config.json")] and spec.hf_id == "some-org/qwen-clone"


# ----------------------------------------------------------------------------------------------- CLI
def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["kv", "--model", "llama-3.1-8b", "--context", "8192", "--batch", "16", "--dtype", "bf16",
                 "--gpu", "h100", "--tp", "1"])
    out = capsys.readouterr().out
    assert code == 0
    for text in ("per token", "128.0 KiB", "131,072 B", "per sequence", "1.00 GiB", "16.00 GiB", "fits",
                 "yes", "max concurrency", "55 sequences", "max context"):
        assert text in out


def test_cli_seed_question(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kv", "-m", "llama-2-7b", "-c", "128K", "-b", "8", "--dtype", "fp16", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert "64.00 GiB" in out and "512.00 GiB" in out and "NO" in out and "does not fit" in out


def test_cli_json_and_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kv", "-m", "deepseek-v3", "-c", "4K", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bytes_per_token"] == 70_272 and data["spec"]["kv_lora_rank"] == 512
    assert main(["kv", "--list"]) == 0
    out = capsys.readouterr().out
    assert "llama-3.1-8b" in out and "h100-sxm" in out


@pytest.mark.parametrize("argv", [
    ["kv", "--model", "llama-3.1-8b", "--batch", "x"],
    ["kv", "--model", "llama-3.1-8b", "--tp", "3"],
    ["kv", "--model", "llama-3.1-8b", "--gpu", "b900"],
    ["kv", "--model", "nope"],
    ["kv", "--model", "llama-3.1-8b", "--context", "-5"],
    ["kv", "--model", "llama-3.1-8b", "--dtype", "fp6"],
    ["kv", "--model", "llama-3.1-8b", "--gpu", "h100", "--gpu-memory-utilization", "2"],
    ["kv"],
    ["no-such-command"],
])
def test_cli_bad_arguments_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error" in err and "Traceback" not in err


def test_cli_help_lists_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "kv" in capsys.readouterr().out


def test_cli_subprocess_and_no_torch() -> None:
    run = subprocess.run([sys.executable, "-m", "minengine", "kv", "--model", "llama-3.1-8b", "--context",
                          "8K", "--gpu", "h100"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "128.0 KiB" in run.stdout
    bad = subprocess.run([sys.executable, "-m", "minengine", "kv", "--model", "llama-3.1-8b", "--tp", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1
    probe = "import sys, minengine.cli.main, minengine.cli.kv; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], cwd=ROOT, timeout=60).returncode == 0


# ---------------------------------------------------------------------- one normaliser for model inputs
def test_every_function_accepts_any_model_description(tmp_path: Path) -> None:
    """A preset name, an HF dict, a config.json path or folder, a KVSpec and a ModelConfig mean one model."""
    from minengine.models.config import ModelConfig

    cfg = PRESETS["llama-3.1-8b"]["config"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_model_spec("llama-3.1-8b")
    model_config = ModelConfig.from_hf({**cfg, "architectures": ["LlamaForCausalLM"]})
    for model in ("llama-3.1-8b", cfg, tmp_path, tmp_path / "config.json", str(tmp_path), spec, model_config):
        assert kv_bytes_per_token(model) == 131_072, model
        assert kvcalc.kv_bytes_per_token_per_layer(model, "fp8") == 131_072 // 32 // 2
        assert kv_bytes_per_sequence(model, 100, block_size=16) == 112 * 131_072  # 7 blocks of 16
        assert kv_bytes_per_batch(model, 100, 3) == 3 * 100 * 131_072
        assert kvcalc.kv_heads_per_rank(model, 2) == 4
        assert kvcalc.weight_bytes(model) == 2 * 8_030_261_248
        assert (estimate(model, 4096, gpu="h100").num_gpu_blocks
                == estimate(spec, 4096, gpu="h100").num_gpu_blocks)


@pytest.mark.parametrize("bad", [42, 3.5, None, [1, 2], object()])
def test_a_wrong_model_type_gives_the_readable_error(bad: object) -> None:
    for call in (lambda: kv_bytes_per_token(bad), lambda: kv_bytes_per_sequence(bad, 10),
                 lambda: kv_bytes_per_batch(bad, 10, 2), lambda: kvcalc.weight_bytes(bad),
                 lambda: estimate(bad, 1024), lambda: load_model_spec(bad)):
        with pytest.raises(KVCalcError, match="cannot describe a model from .*pass a KVSpec, a Hugging Face"):
            call()


def test_one_dtype_table() -> None:
    assert model_spec.normalise_dtype("torch.bfloat16") == model_spec.normalise_dtype("BF16") == "bf16"
    assert model_spec.dtype_bits("half") == 16 and model_spec.dtype_bits("float8_e4m3fn") == 8
    assert model_spec.dtype_of_bits(16) == "bf16" and model_spec.dtype_of_bits(4) == "int4"
    assert model_spec.dtype_names("fp16") == ["fp16", "float16", "half"]
    with pytest.raises(KVCalcError, match="unknown dtype"):
        model_spec.dtype_bits("fp6")
    with pytest.raises(KVCalcError, match="auto"):
        model_spec.dtype_bits("auto")
