"""Smoke tests: every benchmark script runs end to end at a tiny size (``--smoke``); no timing asserted.

The scripts are imported and their ``main(argv)`` called in this process (one torch import for all of
them); each returns its results, so the tests check shapes and invariants, not speed. Tiny random models
are built under a temporary folder, not ``benchmarks/out``.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Models in a temp folder; torch's thread count restored (the scripts may set it)."""
    monkeypatch.setattr(common, "MODELS_DIR", tmp_path_factory.getbasetemp() / "bench-models")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_decode_floor_smoke(tmp_path: Path) -> None:
    from benchmarks import decode_floor

    out = tmp_path / "decode.json"
    (r,) = decode_floor.main(["--smoke", "--json", str(out)])
    assert r["floor"] > 0 and r["minengine"] > 0 and r["hf"] > 0
    assert r["bytes_per_step"] >= r["weight_bytes"]
    assert out.is_file() and '"machine"' in out.read_text()


def test_decode_floor_breakdown_smoke() -> None:
    # Every variant runs, and every patched part (the model's methods, F.linear, the Linear kernels) is put
    # back.
    import torch.nn.functional as F

    from benchmarks import decode_floor
    from minengine.models import linear_kernels, llama

    before = (F.linear, linear_kernels._gemv, linear_kernels.onednn_linear, llama.RMSNorm.forward,
              llama.RotaryEmbedding.forward)
    (r,) = decode_floor.main(["--smoke", "--breakdown", "--overhead"])
    assert len(r["breakdown"]) == 8 and all(t > 0 for t in r["breakdown"].values())
    assert {"RMSNorm as F.rms_norm, not the C++ call (before)",
            "RoPE as 4 ops, not the C++ call (before)"} <= set(r["breakdown"])
    assert (F.linear, linear_kernels._gemv, linear_kernels.onednn_linear, llama.RMSNorm.forward,
            llama.RotaryEmbedding.forward) == before


def test_small_ops_smoke() -> None:
    # Each kernel and the PyTorch ops it replaces are timed at every row count asked for.
    from benchmarks import small_ops
    from minengine.models import cpu_kernels

    if not cpu_kernels.load():
        pytest.skip(f"the CPU kernels are not built here: {cpu_kernels.build_error()}")
    r = small_ops.main(["--smoke"])
    assert set(r) == {"RMSNorm", "SwiGLU activation", "RoPE (q and k)"}
    for by_rows in r.values():
        assert set(by_rows) == {"1", "8"}
        assert all(set(t) == {"PyTorch ops", "C++ kernel"} and min(t.values()) > 0 for t in by_rows.values())


def test_kernel_ab_smoke() -> None:
    # The other source compiles into its own op namespace, both halves give the same tokens, and the
    # engine's GEMV is put back afterwards.
    from benchmarks import kernel_ab
    from minengine.models import linear_kernels

    before = linear_kernels._gemv
    r = kernel_ab.main(["--smoke", "--rev", "HEAD"])
    assert r["current_ms"] > 0 and r["other_ms"] > 0 and r["ratio"] > 0 and r["rounds"] == 2
    assert r["other"] == "minengine/models/csrc/gemv.cpp at HEAD"
    assert linear_kernels._gemv is before


def test_attention_ab_smoke() -> None:
    # The workload's own kernel calls are captured and replayed through both builds (the other compiled
    # into the minengine_ab namespace beside kernel_ab's GEMV); the engine's kernel is put back.
    from benchmarks import attention_ab
    from minengine.models import cpu_kernels

    before = cpu_kernels.paged_decode_attention
    r = attention_ab.main(["--smoke", "--rev", "HEAD"])
    assert r["calls"] > 0 and r["current_s"] > 0 and r["other_s"] > 0 and r["rounds"] == 2
    assert r["other"] == "minengine/models/csrc/paged_attention.cpp at HEAD"
    assert cpu_kernels.paged_decode_attention is before


def test_linear_layers_smoke() -> None:
    # Every variant ran at each row count, the GEMV at one row only, the exact-count packing off 64 rows.
    from benchmarks import linear_layers
    from minengine.models import linear_kernels

    if not linear_kernels.onednn_available():
        pytest.skip("this torch has no oneDNN")
    r = linear_layers.main(["--smoke"])
    assert set(r["results"]) == {"1", "8"}
    assert {"F.linear", "oneDNN", "oneDNN packed", "packed for 8"} == set(r["results"]["8"])
    assert {"F.linear", "oneDNN", "oneDNN packed", "packed for 1"} <= set(r["results"]["1"])
    assert all(t > 0 for times in r["results"].values() for t in times.values())
    shape = common.SHAPES["llama-100m"]
    shapes = linear_layers.step_shapes(shape)
    assert len(shapes) == 4 * shape["num_hidden_layers"] + 1 and shapes[-1] == (32000, 768)
    assert shapes[0] == (768 + 2 * 256, 768) and shapes[2] == (2 * 2048, 768)  # fused q/k/v, gate/up


def test_throughput_breakdown_counts_every_matmul_once() -> None:
    """The clocked run charges the Linear layers exactly the workload's projection, MLP and LM-head FLOPs
    (every computed token once, logits only for the rows that sample), SDPA exactly the causal pairs of
    the longer prompt chunks and the kernel the K/V rows of the rest; the parts fit inside the wall
    time."""
    from benchmarks import mixed_workload, throughput_breakdown

    r = throughput_breakdown.main(["--smoke"])
    parts, work = r["parts"], r["work"]
    config = common.hf_llama_config("llama-tiny")
    linear, q, _, head = mixed_workload.per_token_shape(config)
    computed = sum(len(p) + o - 1 for p, o in work)  # the last output token is sampled, never computed
    expected = 2 * linear * computed + 2 * head * sum(o for _, o in work)
    charged = sum(v["work"] for k, v in parts.items() if k.startswith("linear"))
    assert charged == pytest.approx(expected, rel=1e-9)
    from minengine.models import cpu_kernels
    from minengine.models.attention.backends import SHORT_CHUNK_TOKENS

    # prompt chunks (the run's own, from its step records) cover every prompt token once; each chunk's
    # queries attend to its context and, causally, to itself, in every layer (4 x head_dim FLOPs a pair
    # and query head: q is head_dim x query heads). Chunks of at most SHORT_CHUNK_TOKENS go to the kernel.
    chunks = r["prefill_chunks"]
    assert sum(n for n, _ in chunks) == sum(len(p) for p, _ in work)
    short = SHORT_CHUNK_TOKENS if cpu_kernels.load() else 0
    assert any(n <= SHORT_CHUNK_TOKENS for n, _ in chunks) and any(n > SHORT_CHUNK_TOKENS for n, _ in chunks)
    pairs = sum(n * ctx + n * (n + 1) // 2 for n, ctx in chunks if n > short)
    assert parts["SDPA (prompt chunks)"]["work"] == pytest.approx(4 * q * pairs * config.num_hidden_layers,
                                                                  rel=1e-9)
    if cpu_kernels.load():  # every kernel row (decodes, short chunks' tokens) charged its context's K and V
        contexts = sum(len(p) + t for p, o in work for t in range(1, o))
        contexts += sum(ctx + j for n, ctx in chunks if n <= short for j in range(1, n + 1))
        kv_row = 2 * 4 * config.num_key_value_heads * (q // config.num_attention_heads)  # K and V, fp32
        assert parts["decode attention (C++ kernel)"]["work"] == kv_row * contexts * config.num_hidden_layers
    assert sum(v["seconds"] for v in parts.values()) < r["wall_s"]
    assert throughput_breakdown.table(r).count("\n") == len(parts) + 2  # header, rule, parts, the rest


def test_throughput_smoke() -> None:
    from benchmarks import throughput

    results = throughput.main(["--smoke"])
    assert set(throughput.DEFAULT_ENGINES) - set(results) <= {"hf-cb"}  # hf-cb needs transformers >= 5
    for name, r in results.items():
        assert r["output_tok_s"] > 0, name
        # every engine computes the same greedy tokens as HF generate(), one request at a time
        assert r["same_as_hf_sequential"] == 6, name
        if name.startswith("minengine"):
            # where its time went: steps with prompt tokens, then all-decode ones
            assert r["prefill_steps"] > 0 and r["decode_steps"] > 0 and r["compiled_steps"] == 0, name


def test_throughput_rounds_run_the_same_workload() -> None:
    """Every round computes every prompt again: the engines send the same prompts each round, and a
    prefix cache kept between rounds would skip their prefills (it did until 2026-12-02)."""
    import argparse

    from benchmarks import common, mixed_workload, throughput

    args = argparse.Namespace(chunk=32, max_model_len=64, max_num_seqs=8, kv_tokens=2048)
    run = throughput.run_minengine(str(common.model_dir("llama-tiny")), "decode_first", True, False, None,
                                   None, None, args)
    work = mixed_workload.make_workload(4, (20, 40), (2, 4), 2048, 0)
    computed = []
    for _ in range(2):
        run(work)
        computed.append(run.steps["prompt_tokens_computed"])
    assert computed == [sum(len(p) for p, _ in work)] * 2


def test_sched_overhead_smoke() -> None:
    from benchmarks import sched_overhead

    results = sched_overhead.main(["--smoke"])
    assert set(results) == {4, 16}
    assert all(r["steps"] == 20 and r["ms_per_step"] > 0 for r in results.values())


def test_prefix_cache_smoke() -> None:
    from benchmarks import prefix_cache

    r = prefix_cache.main(["--smoke"])
    assert r["seq_on_p50"] > 0 and r["seq_off_p50"] > 0 and set(r["burst"]) == {"True", "False"}


def test_sim_bench_smoke() -> None:
    from benchmarks import sim_bench

    r = sim_bench.main(["--smoke"])
    assert r["poisson"]["steps"] > 0 and r["offline"]["steps"] > 0
    assert 0 <= r["calibration"]["mape"] < 10


def test_grouped_cpu_decode_attention_matches_one_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU decode path cuts the batch into length-sorted groups (benchmarks/RESULTS.md §2, engine
    changes); with groups of one sequence each it must give what one padded SDPA call over all decodes
    gives."""
    from minengine.models.attention import reference as attn

    torch.manual_seed(0)
    bs, n_kv, n_q, d, num_blocks = 4, 2, 4, 8, 64
    seq_lens = [3, 17, 9, 1, 30, 12]
    perm = torch.randperm(num_blocks).tolist()
    tables, used = [], 0
    for n in seq_lens:
        tables.append(perm[used:used + -(-n // bs)])
        used += len(tables[-1])
    cache = (torch.randn(num_blocks, bs, n_kv, d), torch.randn(num_blocks, bs, n_kv, d))
    b = len(seq_lens)
    q, k, v = torch.randn(b, n_q, d), torch.randn(b, n_kv, d), torch.randn(b, n_kv, d)
    for window in (None, 5):
        outs = []
        for group_tokens in (10**9, 1):  # one group, then one group per sequence
            monkeypatch.setattr(attn, "CPU_DECODE_GROUP_TOKENS", group_tokens)
            meta = attn.AttentionMetadata.build([1] * len(seq_lens), seq_lens, tables, bs)
            kv = (cache[0].clone(), cache[1].clone())
            outs.append(attn.paged_attention(q, k, v, kv, meta, d**-0.5, sliding_window=window))
            groups = meta.decode_groups[window]
            assert len(groups) == (1 if group_tokens > 1 else len(seq_lens))
        torch.testing.assert_close(outs[0], outs[1])


def test_decode_steps_smoke() -> None:
    from benchmarks import decode_steps

    results = decode_steps.main(["--smoke"])
    assert set(results) == {1, 4} and all(step > 0 for step, _ in results.values())


def test_attention_decode_smoke() -> None:
    from benchmarks import attention_decode
    from minengine.models.attention import reference as attn

    before = attn.CPU_DECODE_GROUP_TOKENS
    r = attention_decode.main(["--smoke"])  # also checks that every variant gives the same output
    assert len(r["ms"]) == 4 and "C++ paged kernel (in place)" in r["ms"] and r["ideal"] > 0
    assert attn.CPU_DECODE_GROUP_TOKENS == before  # restored
    for layout in ("consecutive", "cached"):  # the kernel alone, its output still checked against the gather
        r = attention_decode.main(["--smoke", "--kernel-only", "--block-layout", layout, "--block-size", "8"])
        assert list(r["ms"]) == ["C++ paged kernel (in place)"]


def test_output_kinds_smoke() -> None:
    from benchmarks import output_kinds

    results = output_kinds.main(["--smoke"])
    assert set(results) == {"CUMULATIVE", "DELTA", "FINAL_ONLY"}
    assert all(r["steps"] >= 64 and r["early_ms"] > 0 for r in results.values())


def test_client_offset_smoke() -> None:
    from benchmarks import client_offset

    result = client_offset.main(["--smoke"])
    assert (result["n"] == len(result["rows_ms"]) == 5
            and set(result["medians_ms"]) == set(result["rows_ms"][0]))
    # One clock across the two processes and the right handler stamp for each request: every stage of every
    # request is a step forward in time (the check that can fail on a wrong offset or a mismatched stamp).
    # The sum only guards how the rows are built (stages telescope: none dropped or counted twice).
    # (Comparing the *medians'* sum with the median TTFT is no check: over 5 requests on a busy machine they
    # differed by 29 % in CI on 2026-12-02 with every request's stages in order.)
    for row in result["rows_ms"]:
        assert all(v >= 0 for v in row.values()), row
        parts = sum(v for k, v in row.items() if k != "client TTFT")
        assert parts == pytest.approx(row["client TTFT"], rel=1e-6, abs=1e-6), row


def test_llamacpp_smoke() -> None:
    """minengine's side of the llama.cpp yardstick (the llama.cpp build itself takes minutes: not in CI)."""
    from benchmarks import llamacpp

    result = llamacpp.main(["--smoke"])
    r = result["minengine float32"]
    assert r["decode_ms"] > 0 and r["prefill_tok_s"] > 0
    assert 500e6 < r["weight_bytes"] < 600e6  # SmolLM2-135M in fp32, the tied LM head counted once


def test_batched_yardstick_runs_llama_batched_benchs_shape() -> None:
    """minengine's side of the batched yardstick: prefill-first runs llama-batched-bench's order (one step
    for the 4 x 16 prompt tokens, then exactly G decode steps of every row), no engine beats its floor,
    and the two phases' FLOPs are the mixed workload's count for the same requests (G + 1 outputs each)."""
    from benchmarks import batched_yardstick, mixed_workload

    r = batched_yardstick.main(["--smoke"])
    phased = r["summary"]["minengine prefill-first"]
    assert (phased["prefill_steps"], phased["decode_steps"]) == (1, r["args"]["gen"])
    # Above 0.8, not 1: the floor's peak is a reading taken beside the run, and under the suite's load a
    # smoke run's readings can all come out low (89 GFLOP/s against ~210 idle at 2 threads; the 64-token
    # prompt phase then read 0.98x its floor, CI 2026-12-07). A FLOP count off by 2x would read 0.5-0.7x.
    assert all(s["wall_s / floor"] > 0.8 and s["prefill_s / floor"] > 0.8 for s in r["summary"].values())
    config = common.hf_llama_config("llama-100m")
    prefill, decode = batched_yardstick.phase_flops(config, 3, 40, 7)
    expected = mixed_workload.workload_flops(config, [([5] * 40, 8)] * 3)
    assert prefill + decode == pytest.approx(expected, rel=1e-12)
    assert decode == pytest.approx(mixed_workload.workload_flops(config, [([5] * 40, 8)] * 3)
                                   - mixed_workload.workload_flops(config, [([5] * 40, 1)] * 3), rel=1e-12)


def test_llamacpp_builds_only_the_instruction_sets_the_cpu_lists() -> None:
    # Switching every x86 extension on made llama-bench die with SIGILL on an AMD EPYC (AVX-512 VNNI, but
    # not the 256-bit AVX-VNNI); AMX stays off everywhere (SIGILL in a VM on the Xeon).
    import platform

    from benchmarks import llamacpp

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 switches only")
    flags = llamacpp.cpu_flags("processor : 0\n"
                               "flags : fpu avx avx2 fma f16c avx512f avx512_vnni avx512_bf16\n")
    assert "-DGGML_AVX512_VNNI=ON" in flags and "-DGGML_AVX512_BF16=ON" in flags and "-DGGML_AVX2=ON" in flags
    assert "-DGGML_AVX_VNNI=OFF" in flags and "-DGGML_AVX512_VBMI=OFF" in flags
    assert "-DGGML_NATIVE=OFF" in flags and all(f.endswith("=OFF") for f in flags if "AMX" in f)


def test_with_tree_runs_a_script_against_another_checkout(tmp_path):
    # A copy of the package under another folder: the script must import that copy, not the editable one.
    import shutil
    import subprocess
    import sys

    shutil.copytree(ROOT / "minengine", tmp_path / "minengine",
                    ignore=shutil.ignore_patterns("assets", "__pycache__"))
    probe = tmp_path / "probe.py"
    probe.write_text("import minengine, sys; print('IMPORTED', minengine.__file__, sys.argv[1:])\n")
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "with_tree.py"), str(tmp_path),
                          str(probe), "x"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"IMPORTED {tmp_path}" in out.stdout and "['x']" in out.stdout


def test_read_aware_floor_adds_the_reads_to_the_compute_floor() -> None:
    """With unlimited bandwidth it is the compute floor exactly; with a real one, small batches cost more."""
    from types import SimpleNamespace

    from benchmarks import mixed_workload

    config = SimpleNamespace(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                             num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                             tie_word_embeddings=True)
    work = mixed_workload.make_workload(5, (4, 20), (2, 9), 100)
    peak = 1e9
    compute = mixed_workload.workload_flops(config, work) / peak
    assert mixed_workload.read_aware_floor(config, work, peak, float("inf")) == pytest.approx(compute)
    slow = mixed_workload.read_aware_floor(config, work, peak, 1e6)
    steps = max(o for _, o in work) - 1
    weights = 4 * (2 * (64 * (64 + 64) + 64 * 64 + 3 * 64 * 128) + 64 * 100)
    assert slow > compute + steps * weights / 1e6 * 0.99  # every decode step reads every weight at least


def test_speculative_smoke() -> None:
    from benchmarks import speculative

    r = speculative.main(["--smoke"])
    assert [x["batch"] for x in r["results"]] == [1, 2]
    assert [x["requests"] for x in r["results"]] == [4, 4]  # every batch size runs all four paragraphs
    assert "verify_cost" in r["results"][0] and "verify_cost" not in r["results"][1]  # batch 1 only
    assert all(x["simulated_speedup"] > 0 for x in r["results"]) and r["calibration"]["steps"] >= 8
    assert all(x["identical"] for x in r["results"])  # greedy tokens unchanged by the drafts


def test_speculative_verify_cost_compares_batch_1_verify_steps_with_plain_decode_steps() -> None:
    from types import SimpleNamespace

    from benchmarks import speculative
    from minengine.core.records import StepRecord

    def engine(*steps: StepRecord) -> SimpleNamespace:
        return SimpleNamespace(llm_engine=SimpleNamespace(step_records=list(steps)))

    def step(forward: float, seqs: int = 1, drafts: int = 0, prefill: int = 0) -> StepRecord:
        return StepRecord(0, 0.0, 1.0, num_decode_seqs=seqs, num_draft_tokens=drafts,
                          num_prefill_tokens=prefill, t_forward=forward)

    plain = engine(step(0.020), step(0.022), step(0.5, prefill=40), step(0.9, seqs=4))
    ngram = engine(step(0.030, drafts=4), step(0.026, drafts=2), step(0.021), step(0.9, seqs=2, drafts=8))
    cost = speculative.verify_cost(plain, ngram)
    assert cost["verify_steps"] == 2 and cost["verify_ms"] == pytest.approx(0.028)
    assert cost["decode_ms"] == pytest.approx(0.021) and cost["ratio"] == pytest.approx(0.028 / 0.021)
    assert speculative.verify_cost(plain, plain)["verify_steps"] == 0  # no drafts: nothing to compare


def test_a_recorded_verify_step_is_priced_as_a_chunk_of_one_plus_its_drafts() -> None:
    from benchmarks import speculative
    from minengine.core.records import StepRecord
    from minengine.perf.roofline import CostModel

    cost = CostModel.create("llama-3.1-8b", "h100-sxm", dtype="bf16")
    one = StepRecord(0, 0.0, 1.0, num_decode_seqs=1, num_draft_tokens=4, decode_context_lens=[100])
    assert speculative.priced_seconds(cost, one) == cost.step_cost([(5, 99)], 5).time
    two = StepRecord(0, 0.0, 1.0, num_decode_seqs=2, num_draft_tokens=3, decode_context_lens=[50, 70],
                     prefill_chunks=[(16, 0)])
    assert speculative.priced_seconds(cost, two) == cost.step_cost([(16, 0), (3, 49), (2, 69)], 6).time
    plain = StepRecord(0, 0.0, 1.0, num_decode_seqs=1, decode_context_lens=[100])
    assert speculative.priced_seconds(cost, plain) == cost.decode_cost(1, 100).time
    assert speculative.priced_seconds(cost, one) > speculative.priced_seconds(cost, plain)


def test_verify_step_smoke_runs_both_paths_with_the_same_tokens() -> None:
    from benchmarks import verify_step
    from minengine.models.attention import backends

    before = backends.SHORT_CHUNK_TOKENS
    r = verify_step.main(["--smoke"])
    assert backends.SHORT_CHUNK_TOKENS == before  # restored
    assert r["identical"] and set(r["summary"]) == {"in place", "gathered"}
    assert all(s["verify_steps"] > 0 and s["verify_ms"] > 0 for s in r["summary"].values())


def test_sim_speculative_smoke() -> None:
    from benchmarks import sim_speculative

    r = sim_speculative.main(["--smoke"])
    assert r["table"]["0.6"]["1"] > r["table"]["0.6"]["8"] > 1.0  # pays at batch 1, less at batch 8
    rate = r["acceptance_rate"]  # solves the published mean accepted length
    assert sim_speculative.expected_tokens_per_step(rate, 3) == pytest.approx(2.39, abs=1e-6)


def test_lab3_relay_smoke(tmp_path: Path) -> None:
    from benchmarks import lab3_relay

    before = set(Path(tempfile.gettempdir()).glob("lab3-relay-*"))
    rows = lab3_relay.main(["--smoke", "--json", str(tmp_path / "relay.json")])
    assert set(Path(tempfile.gettempdir()).glob("lab3-relay-*")) <= before  # its socket folder is gone
    assert [r["path"] for r in rows] == ["direct TCP", "through the relay"]
    assert all(0 < r["median_extra_ms"] < 1000 for r in rows)  # a client is never ahead of the engine
    assert (tmp_path / "relay.json").is_file()


def test_policy_bridge_smoke(tmp_path: Path) -> None:
    from benchmarks import policy_bridge

    rows = policy_bridge.main(["--smoke", "--json", str(tmp_path / "bridge.json")])
    assert [r["same_goodput"] for r in rows] == [True, True]  # the bridge changes no decision
    assert all(r["order_calls"] > 0 and r["bridged_s"] > 0 for r in rows)
    assert (tmp_path / "bridge.json").is_file()


def test_tensor_parallel_smoke_gives_the_same_tokens_and_times_the_all_reduces() -> None:
    import torch

    from benchmarks import tensor_parallel

    threads = torch.get_num_threads()
    before = set(Path(tempfile.gettempdir()).glob("minengine-tp-trace-*"))
    r = tensor_parallel.main(["--smoke", "--trace"])
    assert set(Path(tempfile.gettempdir()).glob("minengine-tp-trace-*")) <= before  # read, then removed
    assert torch.get_num_threads() == threads  # the engines gave the process its threads back
    assert r["identical"]
    assert "MINENGINE_TP_TRACE" not in os.environ
    # Both ranks traced the same calls (rows per call: 1 and 8 for the decodes); each call's time splits
    # exactly into waiting for the other rank and the rest.
    assert {"1", "8"} <= set(r["trace"])
    for split in r["trace"].values():
        assert split["calls"] > 0 and split["waiting_us"] >= 0 and split["after_both_arrived_mean_us"] > 0
        parts = split["waiting_us"] + split["after_both_arrived_mean_us"]
        assert math.isclose(split["inside_mean_us"], parts, rel_tol=1e-6)
    assert set(r["summary"]) == {"decode batch 1", "prefill batch 1", "decode batch 8", "prefill batch 8"}
    for cell in r["summary"].values():
        assert cell["tp1"]["steps"] > 0 and cell["tp2"]["steps"] > 0
        assert cell["tp1"]["all_reduce_ms"] == 0  # one rank: nothing to join
        assert 0 < cell["tp2"]["all_reduce_ms"] < cell["tp2"]["forward_ms"]
