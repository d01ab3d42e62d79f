"""Roofline cost model: analytic checks against the numbers in REFERENCE.md and the seeds, model adapters,
and the measured machine record."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import pytest

from minengine.kvcalc import load_model_spec
from minengine.perf import get_accelerator
from minengine.perf.roofline import (
    CostModel,
    ModelShape,
    attention_pairs,
    roofline_points,
    step_cost_of_record,
)


def ideal(model: str = "llama-2-7b", gpu: str = "h100") -> CostModel:
    """The pure roofline: datasheet peaks, no efficiency loss, no overhead."""
    return CostModel.create(model, gpu, compute_efficiency=1.0, memory_efficiency=1.0, overhead_s=0.0)


def test_batch1_decode_is_weight_bytes_over_bandwidth() -> None:
    """Seeds: 7B fp16 on an H100 needs ~14 GB / 3.35 TB/s = 4.2 ms per token, whatever the FLOPs."""
    cm = ideal()
    cost = cm.decode_cost(batch_size=1, context_len=1)
    assert cost.bound == "memory"
    weights_s = cm.model.weight_bytes / get_accelerator("h100").bandwidth_bytes_per_s
    assert cost.time == pytest.approx(weights_s, rel=0.025)  # the embedding rows are gathered, not streamed
    assert cost.time == pytest.approx(cost.weight_bytes / get_accelerator("h100").bandwidth_bytes_per_s,
                                      rel=0.01)
    assert cost.time == pytest.approx(4.2e-3, rel=0.07)  # 13.2 GB streamed (13.5 GB less the embedding)
    # Doubling the FLOPs of the chip does not move it; doubling the bandwidth halves it.
    faster = get_accelerator("h100")
    import dataclasses

    more_flops = cm.with_(accelerator=dataclasses.replace(faster, bf16_tflops=2 * faster.bf16_tflops))
    wider = dataclasses.replace(faster, bandwidth_bytes_per_s=2 * faster.bandwidth_bytes_per_s)
    more_bw = cm.with_(accelerator=wider)
    assert more_flops.decode_cost(1, 1).time == pytest.approx(cost.time)
    assert more_bw.decode_cost(1, 1).time == pytest.approx(cost.time / 2, rel=0.01)


@pytest.mark.parametrize("gpu, ridge", [("h100", 295), ("a100-80gb", 153), ("h200", 206)])
def test_ridge_is_peak_over_bandwidth(gpu: str, ridge: float) -> None:
    cm = ideal(gpu=gpu)
    acc = get_accelerator(gpu)
    assert cm.ridge_point == pytest.approx(acc.bf16_tflops * 1e12 / acc.bandwidth_bytes_per_s)
    assert cm.ridge_point == pytest.approx(ridge, abs=1.5)
    eff = cm.with_(compute_efficiency=0.5, memory_efficiency=0.8)
    assert eff.effective_ridge_point == pytest.approx(ridge * 0.5 / 0.8, abs=1)


@pytest.mark.parametrize("batch", [1, 8, 64, 256])
def test_decode_intensity_is_about_batch_in_16_bit(batch: int) -> None:
    """2 x params x B FLOPs over 2 x params bytes: intensity ~ B FLOP/byte (KV of 1 token is negligible)."""
    cost = ideal().decode_cost(batch, context_len=1)
    assert cost.linear_flops / cost.weight_bytes == pytest.approx(batch, rel=0.01)  # the matmuls
    assert cost.intensity == pytest.approx(batch, rel=0.15)  # + activations of the element-wise kernels


def test_prefill_flops_and_time_proportional_to_tokens_when_compute_bound() -> None:
    cm = ideal()
    m = cm.model
    for tokens in (512, 2048, 8192):
        cost = cm.prefill_cost(tokens)
        assert cost.bound == "compute"
        assert cost.linear_flops == 2 * m.body_flop_params * tokens + 2 * m.lm_head_params
        pairs = tokens * (tokens + 1) // 2  # causal: query i sees keys 0..i
        assert cost.attention_flops == 4 * m.num_attention_heads * m.head_dim * m.num_layers * pairs
    per_token = [cm.prefill_cost(t).time / t for t in (1024, 2048, 4096)]
    assert max(per_token) / min(per_token) < 1.1  # linear, bent only a little by attention's T^2 term
    # 8k tokens: the quadratic term is now a visible share (~4 % at 2k, ~15 % at 8k for Llama-2-7B)
    share = cm.prefill_cost(8192).attention_flops / cm.prefill_cost(8192).flops
    assert 0.1 < share < 0.2
    # A short prompt is memory-bound: 16 tokens cost what 1 does (the weights are read either way).
    assert cm.prefill_cost(16).time == pytest.approx(cm.prefill_cost(1).time, rel=0.02)


def test_seed_claim_decode_time_flat_until_ridge_then_linear() -> None:
    """Seeds: decode time barely grows with batch (weights dominate) until the batch nears the ridge."""
    cm = CostModel.create("llama-2-7b", "h100")  # default efficiencies and overhead
    t1, t32 = cm.decode_cost(1, 128).time, cm.decode_cost(32, 128).time
    assert t32 / t1 < 1.5
    # far past the ridge (intensity ~ B >> 295): compute-bound, time doubles with the batch
    big, bigger = cm.decode_cost(2048, 16), cm.decode_cost(4096, 16)
    assert bigger.bound == "compute"
    assert bigger.time / big.time == pytest.approx(2.0, rel=0.1)
    points = roofline_points(cm, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
    assert [p.bound for p in points][:6] == ["memory"] * 6
    assert all(a.time <= b.time for a, b in zip(points, points[1:], strict=False))


def test_long_context_kv_reads_dominate_mha_decode() -> None:
    """Attention's KV reads grow with batch x context: at 4k context a 7B MHA decode batch of 32 reads
    ~64 GiB of KV, far more than its 13.5 GB of weights."""
    cost = ideal().decode_cost(32, 4096)
    assert cost.kv_read_bytes == 32 * 4096 * 512 * 1024  # 0.5 MiB per token in fp16
    assert cost.kv_read_bytes > 4 * cost.weight_bytes and cost.bound == "memory"


def test_attention_pairs_with_and_without_window() -> None:
    for chunk in (1, 3, 17):
        for context in (0, 5, 40):
            keys = [context + i + 1 for i in range(chunk)]
            assert attention_pairs(chunk, context) == sum(keys)
            for window in (1, 4, 16, 100):
                assert attention_pairs(chunk, context, window) == sum(min(k, window) for k in keys)
    mistral = ideal("mistral-7b")  # every layer slides over 4,096 tokens
    assert mistral.decode_cost(1, 8000).kv_read_bytes == mistral.decode_cost(1, 4096).kv_read_bytes


def test_model_shape_adapters_agree() -> None:
    spec = load_model_spec("llama-3.1-8b")
    from_preset, from_spec = ModelShape.from_model("llama-3.1-8b"), ModelShape.from_model(spec)
    assert from_preset.num_params == from_spec.num_params == 8_030_261_248
    assert from_preset.kv_bytes_per_token == from_spec.kv_bytes_per_token == 128 * 1024  # REFERENCE.md
    assert from_preset.vocab_size == 128256 and from_spec.vocab_size == 0  # a bare KVSpec has no vocab
    assert from_preset.max_position_embeddings == 131072
    mixtral = ModelShape.from_model("mixtral-8x7b")
    assert mixtral.active_params == pytest.approx(12.9e9, rel=0.01)  # 2 of 8 experts per token
    assert ModelShape.from_model("llama-2-7b", dtype="fp8").weight_bytes == pytest.approx(6.74e9, rel=0.01)


def test_model_shape_from_model_config_matches_hf_dict() -> None:
    from minengine.models.config import ModelConfig
    from minengine.models.loader import resolve_model_path

    path = resolve_model_path(None) / "config.json"
    hf = json.loads(path.read_text())
    from_config = ModelShape.from_model(ModelConfig.from_hf(hf), dtype="fp32")
    from_dict = ModelShape.from_model(hf, dtype="fp32")
    for name in ("num_params", "num_layers", "kv_bytes_per_token", "body_flop_params", "lm_head_params"):
        assert getattr(from_config, name) == getattr(from_dict, name), name
    assert from_config.weight_bytes_per_param == 4 and from_config.tie_word_embeddings


def test_step_cost_of_record_matches_chunks() -> None:
    from minengine.core.records import StepRecord

    cm = CostModel.create("llama-2-7b", "a100")
    record = StepRecord(step=1, start=0.0, end=1.0, prefill_chunks=[(300, 100)], decode_context_lens=[10, 20])
    assert step_cost_of_record(cm, record).time == pytest.approx(cm.step_time([(300, 100), (1, 9), (1, 19)]))
    assert cm.step_cost([]).time == 0.0


def test_measure_this_machine_is_quick_cached_and_persisted(tmp_path) -> None:
    import torch

    from minengine.perf.measure import cpu_name, measure_this_machine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        acc = measure_this_machine("cpu")
        elapsed = time.perf_counter() - start
        assert elapsed < 10  # ~0.5-3 s; generous for a busy shared machine
        assert measure_this_machine("cpu") is acc  # cached
        file = tmp_path / "machine.json"
        again = measure_this_machine("cpu", persist=True, cache_file=file)
        assert again == acc and json.loads(file.read_text())
        assert measure_this_machine("cpu", persist=True, cache_file=file) == acc
        # measured on another chip under the same home folder: not this machine's numbers
        stored = json.loads(file.read_text())
        (key, value), = stored.items()
        assert f"|{cpu_name()}|" in key
        file.write_text(json.dumps({key.replace(cpu_name(), "Another CPU"): {**value, "bf16_tflops": 123.0}}))
        assert measure_this_machine("cpu", persist=True, cache_file=file) == acc
        assert len(json.loads(file.read_text())) == 2  # both chips' entries kept
    finally:
        torch.set_num_threads(threads)
    print(f"\nthis machine: {acc.bandwidth_bytes_per_s / 1e9:.1f} GB/s read, "
          f"{acc.bf16_tflops * 1e3:.1f} GFLOP/s fp32 matmul, ridge {acc.ridge_point:.1f} FLOP/byte")
    assert 1e8 < acc.bandwidth_bytes_per_s < 1e13 and 1e-3 < acc.bf16_tflops < 1e3
    assert math.isfinite(acc.ridge_point) and acc.source.startswith("measured")
    cm = CostModel(acc, ModelShape.from_model("llama-2-7b", dtype="fp32"))
    assert cm.decode_cost(1, 1).bound == "memory"


def test_model_shape_and_cost_model_accept_any_model_description(tmp_path) -> None:
    from minengine.kvcalc import PRESETS

    cfg = PRESETS["llama-3.1-8b"]["config"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ref = ModelShape.from_model("llama-3.1-8b")
    fields = ("num_params", "num_layers", "kv_bytes_per_token", "body_flop_params", "lm_head_params",
              "weight_bytes", "max_position_embeddings")
    for model in (cfg, tmp_path, tmp_path / "config.json", str(tmp_path / "config.json"),
                  "meta-llama/Llama-3.1-8B"):
        shape = ModelShape.from_model(model)
        assert [getattr(shape, f) for f in fields] == [getattr(ref, f) for f in fields], model
        expected = CostModel.create("llama-3.1-8b", "h100").decode_cost(8, 1024).time
        assert CostModel.create(model, "h100").decode_cost(8, 1024).time == expected
    for bad in (42, None, [1, 2], object()):
        with pytest.raises(ValueError, match="cannot describe a model from .*pass a KVSpec"):
            ModelShape.from_model(bad)
        with pytest.raises(ValueError, match="cannot describe a model from .*pass a KVSpec"):
            CostModel.create(bad, "h100")


# ------------------------------------------------------------------ checks against published measurements
def static_batch_throughput(cm: CostModel, batch: int, prompt: int, output: int) -> tuple[float, float]:
    """Static batching as TensorRT-LLM's and lmdeploy's benchmarks run it: one prefill step of the whole
    batch (which samples the first token), then ``output - 1`` decode steps. (output tok/s, prefill s)."""
    first = total = cm.step_time([(prompt, 0)] * batch)
    for k in range(1, output):
        total += cm.step_time([(1, prompt + k - 1)] * batch)
    return batch * output / total, first


# Llama-2-7B fp16 on one A100-80GB. LLaMA-7B (v1) has the same shape (32 layers, hidden 4096, MHA,
# MLP 11008, vocab 32000), so TensorRT-LLM's LLaMA 7B rows apply.
#   TRT: TensorRT-LLM release 0.5.0, docs/source/performance.md, "High Throughput", A100 GPUs (FP16),
#        LLaMA 7B, out tok/s.
#   LMD: lmdeploy v0.1.0a1, docs/en/benchmark/a100_fp16.md, "Static Inference Benchmark", llama2-7b.
#   gpt-fast: PyTorch blog "Accelerating Generative AI with PyTorch II: GPT, Fast" (2023): Llama-2-7B bf16,
#        batch 1, 104.9 tok/s on an A100 (REFERENCE.md).
PUBLISHED_A100 = [
    # (source, batch, prompt, output, output tok/s)
    ("TRT 64x128/128", 64, 128, 128, 3486.0),
    ("TRT 32x128/2048", 32, 128, 2048, 1459.0),
    ("TRT 32x2048/128", 32, 2048, 128, 529.0),
    ("TRT 16x2048/2048", 16, 2048, 2048, 592.0),
    ("LMD 1x1/128", 1, 1, 128, 100.02),
    ("LMD 16x128/128", 16, 128, 128, 1272.47),
    ("LMD 64x128/2048", 64, 128, 2048, 1852.06),
]
PUBLISHED_BAND = (0.85, 1.15)  # model / published: 0.90-1.11x today


@pytest.mark.parametrize("name, batch, prompt, output, published", PUBLISHED_A100)
def test_throughput_matches_published_a100_figures(name: str, batch: int, prompt: int, output: int,
                                                   published: float) -> None:
    cm = CostModel.create("llama-2-7b", "a100")
    tok_s, _ = static_batch_throughput(cm, batch, prompt, output)
    print(f"\n{name}: model {tok_s:,.0f} tok/s, published {published:,.0f} ({tok_s / published:.2f}x)")
    assert PUBLISHED_BAND[0] <= tok_s / published <= PUBLISHED_BAND[1]


# LLaMA 7B with FP8 weights and FP8 KV cache on one H100 SXM, static batching (gptSessionBenchmark):
#   TensorRT-LLM docs/source/performance.md as updated for v0.6.1, "Peak Throughput", H100 GPUs (FP8),
#   out tok/s/GPU, each at the batch NVIDIA found best for that shape. (The v0.5.0 table's batch-64 rows
#   ran a less tuned build: 64x128/128 was 9,193 there, and the model is 1.28x of that.)
PUBLISHED_H100_FP8 = [
    ("TRT 768x128/128", 768, 128, 128, 19694.0),
    ("TRT 112x128/2048", 112, 128, 2048, 6818.0),
    ("TRT 80x2048/128", 80, 2048, 128, 2244.0),
    ("TRT 48x2048/2048", 48, 2048, 2048, 2740.0),
]


@pytest.mark.parametrize("name, batch, prompt, output, published", PUBLISHED_H100_FP8)
def test_throughput_matches_published_h100_fp8_figures(name: str, batch: int, prompt: int, output: int,
                                                       published: float) -> None:
    cm = CostModel.create("llama-2-7b", "h100", dtype="fp8")
    assert cm.model.kv_bytes_per_token == 32 * 2 * 4096  # FP8 KV cache: one byte per element
    tok_s, _ = static_batch_throughput(cm, batch, prompt, output)
    print(f"\n{name}: model {tok_s:,.0f} tok/s, published {published:,.0f} ({tok_s / published:.2f}x)")
    assert PUBLISHED_BAND[0] <= tok_s / published <= PUBLISHED_BAND[1]


def test_long_prompt_first_token_latency_matches_published_figures() -> None:
    """TensorRT-LLM 0.5.0 performance.md, "Low Latency", LLaMA 7B batch 1, a 2,048-token prompt: 36 ms on
    an H100 (FP8), 133 ms on an A100 (FP16). At 128 tokens the same table says 7 ms and 16 ms, where the
    model gives about half: a short prefill is dominated by fixed costs (kernel launches, the runtime's
    own work) that one per-step overhead does not capture; the model is for steps of real work."""
    h100 = CostModel.create("llama-2-7b", "h100", dtype="fp8").prefill_cost(2048).time
    a100 = CostModel.create("llama-2-7b", "a100").prefill_cost(2048).time
    assert h100 == pytest.approx(0.036, rel=0.15)
    assert a100 == pytest.approx(0.133, rel=0.15)


def test_batch1_decode_and_prefill_latency_match_published_a100_figures() -> None:
    cm = CostModel.create("llama-2-7b", "a100")
    per_token = cm.decode_cost(1, 512).time
    assert 1 / per_token == pytest.approx(104.9, rel=0.10)  # gpt-fast, batch 1: 9.5 ms per token
    # lmdeploy's table above: batch 1, a 2,048-token prompt: first-token latency 0.139 s (FTL ave); in
    # the model ~90 % matmul compute, ~6 % FlashAttention, ~4 % element-wise kernels.
    prefill = cm.prefill_cost(2048)
    assert prefill.time == pytest.approx(0.139, rel=0.10)
    assert prefill.op("prefill_attention").time > 0.04 * prefill.time  # attention is no longer free


def test_mixed_step_costs_the_sum_of_its_parts() -> None:
    """100 decodes (KV ~576 tokens each) + a 512-token chunk, Llama-2-7B on an A100. The decodes'
    bandwidth-bound attention does not overlap the chunk's compute-bound matmuls (different kernels),
    so the step costs their sum; what truly overlaps is that the decode tokens ride in the chunk's
    matmuls, which read the weights once. The old single max(compute, memory) priced it at 0.70x."""
    cm = CostModel.create("llama-2-7b", "a100")
    decodes = [(1, 575)] * 100
    mixed = cm.step_cost([(512, 0), *decodes])
    prefill, decode = cm.step_cost([(512, 0)]), cm.step_cost(decodes)
    shared = sum(decode.op(n).time for n in ("qkv_o_proj", "mlp", "lm_head")) + decode.overhead
    assert mixed.time >= 0.95 * (prefill.time + decode.time - shared)
    assert mixed.time >= 0.9 * (prefill.time + decode.time)  # was 0.70x
    assert mixed.time <= prefill.time + decode.time
    assert mixed.op("decode_attention").time == pytest.approx(decode.op("decode_attention").time)
    assert mixed.op("decode_attention").bound == "memory" and mixed.op("mlp").bound == "compute"
    assert mixed.time == pytest.approx(sum(op.time for op in mixed.ops) + mixed.overhead)


def test_efficiency_table_has_a_source_for_every_row() -> None:
    from minengine.perf.efficiency import EFFICIENCIES, GENERIC, efficiency_for

    for (key, _dtype), eff in EFFICIENCIES.items():
        get_accelerator(key)  # a real table key
        assert eff.source and 0 < eff.attention_compute <= eff.gemm_compute < 1
        assert 0 < eff.weight_stream <= eff.kv_stream < 1
    assert efficiency_for("a100-80gb", 2) is EFFICIENCIES[("a100-80gb", "16")]
    assert efficiency_for("h100-sxm", 1) is EFFICIENCIES[("h100-sxm", "8")]
    assert efficiency_for("a100-80gb", 1) is EFFICIENCIES[("a100-80gb", "16")]  # no fp8 row: 16-bit's
    assert efficiency_for("l4", 2) is GENERIC
    cm = CostModel.create("llama-2-7b", "a100", compute_efficiency=0.5)
    assert cm.eff.gemm_compute == cm.eff.attention_compute == 0.5 and cm.eff.weight_stream == 0.74


def test_quiz5_q10_step_times_come_from_the_cost_model_and_fit_each_scenario() -> None:
    """Quiz 5 Q10 quotes step times of Llama-3.1-8B on an H100 priced by this cost model; each scenario's
    premise must hold in them: a whole 8,000-token prompt (chunking off) or a 16,384-token budget makes a
    step many decode steps long, and a 512-token chunk breaks a TPOT SLO of 1.25x a decode step that
    pure decode steps meet."""
    import runpy
    from pathlib import Path

    params = runpy.run_path(str(Path(__file__).resolve().parents[1] / "quizzes/quiz5_final/params.py"))
    ms = params["q10_step_ms"]()
    assert 5 < ms["decode"] < 30  # 64 streams of an 8B model on an H100: a few weight reads' worth
    assert ms["prompt_8k"] > 10 * ms["decode"] and ms["budget_16k"] > 2 * ms["prompt_8k"]
    assert 1.25 * ms["decode"] < ms["chunk_512"] < 3 * ms["decode"]
    cost = CostModel.create("llama-3.1-8b", "h100-sxm", dtype="bf16")
    assert ms["chunk_512"] == pytest.approx(1e3 * cost.step_time([(1, 2047)] * 64 + [(512, 4096)]))


# ------------------------------------------------------------------ tensor parallelism (issue 41, item 2)
def test_a_tensor_parallel_gpu_holds_a_share_of_weights_heads_and_kv() -> None:
    whole = CostModel.create("llama-2-70b", "h100").model
    four = whole.sharded(4)
    assert four.num_params == whole.num_params // 4 and four.num_attention_heads == 16
    assert four.num_kv_heads == 2 and four.kv_bytes_per_token == whole.kv_bytes_per_token / 4
    assert four.lm_head_params == whole.lm_head_params / 4  # the vocabulary is split too
    sixteen = whole.sharded(16)  # 8 KV heads over 16 GPUs: one each, every head on two GPUs
    assert sixteen.num_kv_heads == 1 and sixteen.kv_bytes_per_token == whole.kv_bytes_per_token / 8
    assert whole.sharded(1) is whole
    with pytest.raises(ValueError, match="does not divide llama-2-70b's 64 attention heads"):
        whole.sharded(3)


def test_a_steps_all_reduces_are_two_per_layer_priced_as_a_ring_on_the_link() -> None:
    one = CostModel.create("llama-2-70b", "h100", dtype="bf16")
    assert one.decode_cost(8, 1024).op("all_reduce") is None  # one GPU: nothing to join
    for t in (2, 4, 8):
        cm = one.with_(tensor_parallel_size=t)
        tokens = 64
        cost = cm.all_reduce_cost(tokens)
        message = tokens * 8192 * 2  # bf16 activations of the hidden size
        assert cost.bytes == pytest.approx(160 * 2 * (t - 1) / t * message)  # 80 layers x 2
        assert cost.time == pytest.approx(160 * 10e-6 + cost.bytes / 450e9)
        step = cm.decode_cost(tokens, 1024)
        assert step.op("all_reduce") == cost and step.time > cost.time
    # splitting the weights makes a bandwidth-bound decode step faster, but by less than t: the
    # all-reduces and the per-step overhead are not split
    t1, t4 = one.decode_cost(8, 1024).time, one.with_(tensor_parallel_size=4).decode_cost(8, 1024).time
    assert t1 / 4 < t4 < t1 / 2
    with pytest.raises(ValueError, match="no link bandwidth"):
        CostModel.create("llama-2-70b", "h100").with_(
            accelerator=replace(one.accelerator, link_bandwidth_bytes_per_s=0.0),
            tensor_parallel_size=2).decode_cost(1, 10)


# LLaMA 70B (Llama-2-70B's shape) over several GPUs, from TensorRT-LLM's docs/source/performance.md as
# updated for v0.6.1. "Low Latency" (its v0.5 data): batch 1, first-token latency at TP 4, a 2,048-token
# prompt: 109 ms on H100 (FP8), 377 ms on A100 (FP16). "Peak Throughput", H100 GPUs (FP8), out tok/s per
# GPU, static batching (gptSessionBenchmark), each at the batch NVIDIA found best.
PUBLISHED_70B_TTFT = [("h100", "fp8", 0.109), ("a100", None, 0.377)]
# (source, tp, batch, prompt, output, out tok/s per GPU, band of model / published)
PUBLISHED_70B_H100_FP8 = [
    ("TRT 1024x128/128 TP2", 2, 1024, 128, 128, 2657.0, PUBLISHED_BAND),
    ("TRT 96x2048/128 TP2", 2, 96, 2048, 128, 306.0, PUBLISHED_BAND),
    # Not matched: the long-output rows, where 2,048 decode steps at a large batch make up the run. The
    # model is 2.1-2.3x faster than TensorRT-LLM there (a decode step of 480 x ~1,100 tokens at TP 4
    # priced at ~34 ms, against 81 ms in the table), while the same table's 7B rows at TP 1 match within
    # 11 % (PUBLISHED_H100_FP8 above). The all-reduces are not the gap: at 10 us each plus the ring's
    # bytes they cost ~6 ms of such a step. Not explained yet; held where RESULTS.md §12 says (2.27x and
    # 2.08x), so a change to the model that moves them shows.
    ("TRT 480x128/2048 TP4", 4, 480, 128, 2048, 1486.0, (1.9, 2.5)),
    ("TRT 64x2048/2048 TP2", 2, 64, 2048, 2048, 547.0, (1.9, 2.5)),
]


@pytest.mark.parametrize("gpu, dtype, published", PUBLISHED_70B_TTFT)
def test_tensor_parallel_first_token_latency_matches_published_70b_figures(gpu: str, dtype: str | None,
                                                                           published: float) -> None:
    cm = CostModel.create("llama-2-70b", gpu, dtype=dtype, tensor_parallel_size=4)
    ttft = cm.prefill_cost(2048).time
    print(f"\n70B TP4 {gpu}: model {1e3 * ttft:.0f} ms, published {1e3 * published:.0f} "
          f"({ttft / published:.2f}x)")
    assert PUBLISHED_BAND[0] <= ttft / published <= PUBLISHED_BAND[1]


@pytest.mark.parametrize("name, tp, batch, prompt, output, published, band", PUBLISHED_70B_H100_FP8)
def test_tensor_parallel_throughput_against_published_70b_figures(
        name: str, tp: int, batch: int, prompt: int, output: int, published: float,
        band: tuple[float, float]) -> None:
    cm = CostModel.create("llama-2-70b", "h100", dtype="fp8", tensor_parallel_size=tp)
    tok_s, _ = static_batch_throughput(cm, batch, prompt, output)
    per_gpu = tok_s / tp
    print(f"\n{name}: model {per_gpu:,.0f} tok/s/GPU, published {published:,.0f} "
          f"({per_gpu / published:.2f}x)")
    assert band[0] <= per_gpu / published <= band[1]


def test_the_simulator_prices_a_tensor_parallel_step_as_the_cost_model_does() -> None:
    """The simulator's fast path (RooflineExecutor.step_time) writes the cost model out by hand; under
    tensor parallelism it must still give CostModel.step_cost's time, all-reduces included, on every
    step of a run, and size the KV cache from one GPU's share of the weights and of each token's K/V."""
    from minengine.kvcalc.calculator import kv_cache_budget
    from minengine.sim.simulator import Simulator
    from minengine.sim.workload import Uniform, synthetic_workload

    cm = CostModel.create("llama-2-70b", "h100", dtype="bf16", tensor_parallel_size=4)
    sim = Simulator(cost_model=cm, max_num_batched_tokens=512)
    per_gpu = cm.model.sharded(4)
    budget = kv_cache_budget(cm.accelerator.memory_bytes, 0.9, per_gpu.weight_bytes)
    assert sim.num_blocks == int(budget // (16 * per_gpu.kv_bytes_per_token))  # the bf16 70B: 4 GPUs' KV
    assert "on 4 x H100 SXM 80GB" in sim.describe()
    step_time, priced = sim.executor.step_time, []

    def spy(out, num_sampled=None):
        cost = sim.executor.step_cost(out)
        assert step_time(out, num_sampled) == pytest.approx(cost.time, rel=1e-9)
        priced.append(cost.op("all_reduce").time)
        return step_time(out, num_sampled)

    sim.executor.step_time = spy  # type: ignore[method-assign]
    result = sim.run(synthetic_workload(40, 10, Uniform(20, 800), Uniform(1, 30), seed=0))
    assert len(result.requests) == 40 and priced and all(t > 0 for t in priced)


# ------------------------------------------------------------------ MoE: the experts a batch touches (41.2)
def test_a_moe_batch_reads_the_experts_its_tokens_touch() -> None:
    """Mixtral-8x7B, top-2 of 8 experts: one token reads 2 experts of each layer, 8 tokens ~7.2 (uniform
    routing: 8 x (1 - (6/8)^8)), 64 nearly all 8. So a batch-1 decode step reads ~13 B params' worth of
    weights and a batch-64 step all ~47 B: MoE decode is cheap alone and as dear as a dense 47B together."""
    m = ModelShape.from_model("mixtral-8x7b")
    assert (m.num_experts, m.experts_per_token, m.expert_params) == (8, 2, 3 * 4096 * 14336)
    assert m.experts_touched(1) == pytest.approx(2.0)
    assert m.experts_touched(8) == pytest.approx(8 * (1 - 0.75**8))
    assert 7.99 < m.experts_touched(64) < 8.0
    cm = CostModel.create("mixtral-8x7b", "h100", dtype="bf16")
    one, many = cm.decode_cost(1, 512), cm.decode_cost(64, 512)
    table = m.lm_head_params  # the embedding table: one row gathered per token, not streamed
    assert one.weight_bytes == pytest.approx(2 * (m.active_params - table))  # bf16: what one token uses
    assert many.weight_bytes == pytest.approx(2 * (m.num_params - table), rel=1e-4)  # all resident experts
    # against a dense model of the same size in memory, batch 1 is ~3.6x cheaper in bytes, batch 64 even
    dense = replace(m, num_experts=0, experts_per_token=0, expert_params=0)
    assert dense.mlp_weight_bytes(1) / m.mlp_weight_bytes(1) > 3.5
    assert dense.mlp_weight_bytes(64) == pytest.approx(m.mlp_weight_bytes(64), rel=1e-4)


def test_qwen3_moe_names_its_experts_differently_and_is_read_the_same_way() -> None:
    """Qwen3-MoE configs say num_experts and moe_intermediate_size (Qwen/Qwen3-30B-A3B config.json: 128
    experts, 8 per token, 768 wide). The shape here is that config's; the parameter count is computed."""
    from minengine.perf.model_spec import estimate_num_params

    cfg = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "intermediate_size": 6144,
           "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
           "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
           "max_position_embeddings": 40960, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    m = ModelShape.from_model(cfg)
    assert m.num_params == estimate_num_params(cfg)
    assert (m.num_experts, m.experts_per_token, m.expert_params) == (128, 8, 3 * 2048 * 768)
    assert m.experts_touched(1) == pytest.approx(8.0) and m.experts_touched(16) < 128 * 0.66
    assert 2.5e9 < m.active_params < 3.6e9  # the "A3B": ~3 B active of ~30 B
    assert m.mlp_weight_bytes(256) > 10 * m.mlp_weight_bytes(1)


def test_the_simulator_prices_moe_steps_by_the_experts_they_touch() -> None:
    from minengine.sim.simulator import Simulator
    from minengine.sim.workload import Uniform, synthetic_workload

    cm = CostModel.create("mixtral-8x7b", "h100", dtype="bf16", tensor_parallel_size=2)
    sim = Simulator(cost_model=cm, max_num_batched_tokens=512)
    step_time, sizes = sim.executor.step_time, []

    def spy(out, num_sampled=None):
        cost = sim.executor.step_cost(out)
        assert step_time(out, num_sampled) == pytest.approx(cost.time, rel=1e-9)
        sizes.append(cost.num_tokens)
        return step_time(out, num_sampled)

    sim.executor.step_time = spy  # type: ignore[method-assign]
    sim.run(synthetic_workload(30, 5, Uniform(20, 300), Uniform(1, 30), seed=1))
    assert min(sizes) < 8 < max(sizes)  # steps both below and above full coverage were priced


def test_deepseek_v3_activates_37b_of_its_671b() -> None:
    """DeepSeek-V3's config: 256 routed experts (8 per token) and 1 shared, 2,048 wide, in 58 of its 61
    layers (first_k_dense_replace = 3). Counting the 248 idle experts of each MoE layer out of the 671 B
    gives the technical report's "37B activated for each token" (DeepSeek-V3 Technical Report, 2024)."""
    m = ModelShape.from_model("deepseek-v3")
    assert (m.num_experts, m.experts_per_token, m.num_moe_layers) == (256, 8, 58)
    assert m.active_params == pytest.approx(37e9, rel=0.02)
    assert m.experts_touched(1) == pytest.approx(8.0)
    assert 200 < m.experts_touched(64) < 230  # a batch of 64 already reads most of every layer's experts


def test_expert_parallel_all_to_all_moves_each_tokens_hidden_state_to_its_experts_and_back() -> None:
    """DeepSeek-V3: 58 MoE layers, 8 experts per token, hidden 7,168; FP8 out and bf16 back, as its report
    deploys it: ~10 MB per token per step once nearly every expert lives on another GPU."""
    cm = CostModel.create("deepseek-v3", "h200")
    one = cm.all_to_all_cost(1, 320, dispatch_bytes=1)
    assert one.bytes == pytest.approx(58 * 8 * 7168 * 3 * 319 / 320)
    assert 9.9e6 < one.bytes < 10.0e6
    batch = cm.all_to_all_cost(256, 320, link_bandwidth_bytes_per_s=50e9, dispatch_bytes=1)
    assert batch.time == pytest.approx(2 * 58 * 10e-6 + batch.bytes / 50e9)  # InfiniBand: ~51 ms of wire
    assert 0.045 < batch.bytes / 50e9 < 0.055
    assert cm.all_to_all_cost(256, 1).time == 0.0  # every expert at home: nothing crosses a link
    with pytest.raises(ValueError, match="no routed experts"):
        CostModel.create("llama-2-70b", "h100").all_to_all_cost(8, 8)
    with pytest.raises(ValueError, match="at least 1"):
        cm.all_to_all_cost(8, 0)
