"""Lesson 09's helpers: token-stream statistics, pool comparisons, capacity plans, the diagnosis stages
and the what-if widget (driven without a browser)."""

from __future__ import annotations

import numpy as np
import pytest
from notebook_cells import define

from minengine.core.records import RequestRecord, StepRecord
from minengine.course import capacity_lesson as cl
from minengine.course import diagnosis as dg


def _record(i: int, arrival: float, prompt: int, ttft: float, gaps: list[float], queue: float = 0.0,
            preemptions: int = 0) -> RequestRecord:
    times = [arrival + ttft]
    for g in gaps:
        times.append(times[-1] + g)
    return RequestRecord(str(i), arrival, prompt, arrival + queue, times, times[-1], len(times),
                         num_preemptions=preemptions, finish_reason="length")


def test_stream_stats_counts_tokens_and_weights_steps_by_time() -> None:
    recs = [_record(i, float(i), 100 * (i + 1), 0.1, [0.01] * 9) for i in range(10)]  # 10 tokens each
    steps = [StepRecord(0, 0.0, 1.0, num_decode_seqs=2, kv_blocks_used=1, kv_blocks_total=10),
             StepRecord(1, 1.0, 4.0, num_decode_seqs=6, kv_blocks_used=5, kv_blocks_total=10)]
    st = cl.stream_stats(recs, steps)
    span = recs[-1].token_times[-1] - 0.0
    assert st.duration == pytest.approx(span)
    assert st.input_tokens_per_s == pytest.approx(sum(100 * (i + 1) for i in range(10)) / span)
    assert st.output_tokens_per_s == pytest.approx(100 / span)
    assert st.prompt_pct[50] == pytest.approx(550) and st.output_mean == 10
    assert st.decoding_mean == pytest.approx((2 * 1 + 6 * 3) / 4)  # the 3 s step counts three times
    assert st.kv_mean == pytest.approx((0.1 + 0.5 * 3) / 4) and st.kv_max == 0.5
    assert st.itl_p50 == pytest.approx(0.01) and "input tokens" in st.report()


def test_resampled_workload_keeps_length_pairs_and_rate() -> None:
    recs = [_record(i, float(i), 10 + i, 0.1, [0.01] * i) for i in range(1, 6)]
    st = cl.stream_stats(recs, [StepRecord(0, 0.0, 1.0)])
    w = cl.resampled_workload(st, 50.0, 2000, seed=3)
    pairs = {(int(p), int(o)) for p, o in zip(st.prompt_lens, st.output_lens, strict=True)}
    assert {(s.prompt_len, s.output_len) for s in w} <= pairs
    assert 2000 / w[-1].arrival_time == pytest.approx(50, rel=0.1)


def test_layouts_and_goodput_per_gpu() -> None:
    assert [n for n, _ in cl.layouts(3)] == ["colocated", "1P:2D", "2P:1D"]
    good = [_record(i, 0.0, 10, 0.05, [0.005] * 4) for i in range(10)]
    bad = [_record(i, 0.0, 10, 2.0, [0.005] * 4) for i in range(10)]  # TTFT 2 s
    pools = cl.PoolComparison(2, [10.0, 20.0, 40.0],
                              {"colocated": [good, good, bad], "1P:1D": [good, bad, bad]})
    g = pools.goodput(500, 10)
    # colocated: meets at 20, misses at 40 -> interpolated between them; the split only at 10
    assert 10 < g["colocated"] < 20 and g["1P:1D"] == pytest.approx(10 / 2 + 5 * 1.0 / 2, rel=0.5)
    assert g["colocated"] > g["1P:1D"] and pools.best_split(500, 10)[0] == "1P:1D"
    assert pools.goodput(500, 1) == {"colocated": 0.0, "1P:1D": 0.0}  # TPOT 5 ms > 1 ms everywhere


def test_steady_runs_last_long_enough_at_any_rate() -> None:
    base = cl.document_workload(50)
    assert len(cl.steady(base, 5.0, 4.0)) == 50  # 10 s of arrivals already
    fast = cl.steady(base, 100.0, 4.0)
    assert len(fast) == 400 and fast[-1].arrival_time == pytest.approx(4.0, rel=0.15)
    assert [s.prompt_len for s in fast[:50]] == [s.prompt_len for s in fast[50:100]]


def test_transfer_is_bytes_over_bandwidth() -> None:
    # Llama-3.1-8B bf16: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 128 KiB per token
    assert cl.transfer_seconds(1000, 50) == pytest.approx(1000 * 131072 / 50e9)
    assert cl.prefill_seconds(4096) > 4 * cl.prefill_seconds(512) > 0


def test_token_plan_grows_with_traffic_and_holds_in_the_simulator() -> None:
    g = np.random.default_rng(0)
    recs = [_record(i, 0.1 * i, int(p), 0.05, [0.01] * (int(o) - 1))
            for i, (p, o) in enumerate(zip(np.clip(g.lognormal(5.5, 0.8, 300), 8, 2000),
                                           np.clip(g.lognormal(4.2, 0.6, 300), 4, 300), strict=True))]
    st = cl.stream_stats(recs, [StepRecord(0, 0.0, 1.0)])
    small, big = cl.token_plan(st, 40, 300, 20), cl.token_plan(st, 120, 300, 20)
    assert 1 <= small.gpus < big.gpus and small.step_time < 0.75 * 0.020
    assert small.max_num_seqs >= 2 * small.decoding_per_gpu and small.max_num_batched_tokens >= 256
    attained, _ = cl.check_plan(cl.resampled_workload(st, 120, 700, seed=1), big.gpus, 300, 20,
                                max_num_seqs=big.max_num_seqs, budget=big.max_num_batched_tokens)
    assert attained >= 0.9
    with pytest.raises(ValueError, match="no fleet"):
        cl.token_plan(st, 160, 300, 1.0)  # a 1 ms TPOT is below any decode step of an 8B model


# ------------------------------------------------------------------------------------------ diagnosis
def test_engine_options_name_the_problem() -> None:
    assert dg.engine_options("interference")["enable_chunked_prefill"] is False
    assert dg.engine_options("thrashing")["num_blocks"] < 200
    with pytest.raises(ValueError, match="unknown problem"):
        dg.engine_options("slow disks")


def lesson_stages() -> dict:
    """The five diagnosis stages as the notebook's cells define them."""
    import math

    namespace = {"np": np, "math": math, "dg": dg}
    define("09_disaggregation_capacity", ["import math"], namespace)  # its ms()
    return define("09_disaggregation_capacity", [f"def {name}(" for name in STAGES], namespace)


STAGES = ("worst_trace", "length_groups", "quiet_vs_loaded", "mixed_batches", "cache_pressure")


def test_stages_flag_their_own_problem() -> None:
    st = lesson_stages()
    quiet = [_record(i, float(i), 50, 0.01, [0.002] * 5) for i in range(5)]
    queued = [_record(i, 0.0, 50, 0.5, [0.002] * 5, queue=0.45) for i in range(5)]
    f3 = st["quiet_vs_loaded"](quiet, queued)
    assert f3.flagged and "p50 TTFT 50.0x" in f3.text and "90 % of it spent waiting" in f3.text
    assert not st["quiet_vs_loaded"](quiet, quiet).flagged
    pure = [StepRecord(i, i, i + 0.002, num_decode_seqs=8) for i in range(20)]
    spike = StepRecord(99, 30, 30.2, num_prefill_tokens=900, num_decode_seqs=8, num_prefill_seqs=1)
    assert st["mixed_batches"]([*pure, spike]).flagged and not st["mixed_batches"](pure).flagged
    assert st["mixed_batches"]([spike]).text == "no mixed steps to compare"
    full = [StepRecord(0, 0, 1, kv_blocks_used=10, kv_blocks_total=10, num_preempted=2)]
    assert st["cache_pressure"](full, queued).flagged and not st["cache_pressure"](pure, queued).flagged
    r, f1 = st["worst_trace"](queued + quiet)
    assert r in queued and "queue" in f1.text.split("most of its time: ")[1]
    groups = st["length_groups"](quiet + [_record(9, 9.0, 900, 0.3, [0.01] * 3)]).text
    assert "short prompts (5)" in groups and "long prompts (1)" in groups


def test_verdict_prefers_the_most_specific_stage() -> None:
    f = [dg.Finding(s, flag, "") for s, flag in (("1 trace", False), ("2 length groups", False),
                                                 ("3 quiet vs loaded", True), ("4 mixed batches", False),
                                                 ("5 cache pressure", False))]
    assert dg.verdict(f) == "queueing"
    f[4] = dg.Finding("5 cache pressure", True, "")
    assert dg.verdict(f) == "thrashing"  # a full cache also makes requests queue
    assert dg.verdict([dg.Finding("1 trace", False, "")]) == "none found"


@pytest.mark.slow
def test_thrashing_run_is_found_on_the_real_engine() -> None:
    pytest.importorskip("torch")
    from minengine.course import lessons as lu

    llm = lu.shipped_llm(**dg.engine_options("thrashing"))
    # Everything at t = 0, so whether the cache overflows depends on the scheduler only, not on how fast
    # this machine happens to be (Poisson arrivals at 3/s never overflowed it on a quiet CI machine);
    # 10 requests, 3 of them long documents: ~4 s.
    work = dg.traffic(10, float("inf"), seed=2, long_fraction=0.4)
    run = lu.run_requests(llm, work)
    quiet = lu.run_requests(lu.shipped_llm(**dg.engine_options("queueing")), dg.quiet_traffic(work, 4, 0.2))
    st = lesson_stages()
    findings = [st["worst_trace"](run.requests)[1], st["length_groups"](run.requests),
                st["quiet_vs_loaded"](quiet.requests, run.requests), st["mixed_batches"](run.steps),
                st["cache_pressure"](run.steps, run.requests)]
    assert findings[4].flagged and dg.verdict(findings) == "thrashing"


# ------------------------------------------------------------------------------------------ the widget
def test_widget_simulates_and_reports_bad_input() -> None:
    pytest.importorskip("ipywidgets")
    from minengine.course.widgets.capacity_widget import CapacityWidget

    w = CapacityWidget(prompt_mean=512, output_mean=64, gpus=2, num_requests=60)
    assert w.goodput is None and w.summary.layout.display == "none"
    w.simulate()
    assert w.error is None and set(w.goodput) == {"colocated", "1P:1D"}
    assert all(v >= 0 for v in w.goodput.values()) and "goodput per GPU" in w.text
    assert w.plot.value[:4] == b"\x89PNG" and "me-cap-run" in w.button._dom_classes
    w.tpot.value = -3
    w.simulate()
    assert w.goodput is None and "TPOT SLO" in w.error and "me-cap-error" in w.message.value
    assert w.summary.layout.display == "none"
