"""Lesson 06's experiment: one long prompt next to decoding streams, on the real engine (the notebook's own
``interference`` loop, taken from its cell) and in the simulator (``chunked_prefill_lesson``), read from the
records."""

from __future__ import annotations

import math
from typing import Any

import pytest
from notebook_cells import run_cells

from minengine.core.records import RequestRecord, StepRecord
from minengine.course import chunked_prefill_lesson as cp

STREAMS, LONG = 6, 400


@pytest.fixture(scope="module")
def model(torch_one_thread: None) -> Any:
    from minengine.course.lessons import shipped_llm

    return shipped_llm().llm_engine.model


def lesson_interference() -> Any:
    """The lesson's ``interference`` (its scenario run twice on one engine, the faster run kept), as its
    cell defines it, with this test's sizes: so the second run on a reused engine is checked as well."""
    import random

    import minengine
    from minengine.course import lessons as lu
    from minengine.engine.gc_heap import gc_heap_frozen

    namespace = {"random": random, "minengine": minengine, "lu": lu, "cp": cp,
                 "gc_heap_frozen": gc_heap_frozen, "STREAMS": STREAMS, "LONG": LONG}
    return run_cells("06_chunked_prefill", ["def interference_once("], namespace)["interference"]


@pytest.fixture(scope="module")
def runs(model: Any) -> dict[str, cp.Interference]:
    interference = lesson_interference()
    return {name: interference(cp.budget_engine(model, budget, policy, STREAMS), name)
            for name, budget, policy in (("off", None, "decode_first"), ("64", 64, "decode_first"),
                                         ("pf", 64, "prefill_first"))}


def test_chunking_off_computes_the_prompt_in_one_step_next_to_the_decodes(
        runs: dict[str, cp.Interference]) -> None:
    off = runs["off"]
    (step,) = off.prefill_steps
    assert step.num_prefill_tokens == LONG and step.num_decode_seqs == STREAMS
    assert all(len(r.token_times) >= 3 for r in off.streams) and off.long.num_prompt_tokens == LONG
    assert off.spike >= off.long_ttft * 0.5  # the streams waited for that one step


def test_chunks_fit_the_budget_and_the_work_is_the_same(runs: dict[str, cp.Interference]) -> None:
    on = runs["64"]
    assert len(on.prefill_steps) == math.ceil(LONG / (64 - STREAMS))
    assert all(s.num_tokens <= 64 and s.num_decode_seqs == STREAMS for s in on.prefill_steps)
    assert on.prompt_tokens_computed == runs["off"].prompt_tokens_computed == LONG
    assert len(on.window_gaps) >= STREAMS * len(on.prefill_steps)  # every stream kept producing tokens


def test_prefill_first_stalls_the_streams(runs: dict[str, cp.Interference]) -> None:
    pf = runs["pf"]
    assert all(s.num_decode_seqs == 0 for s in pf.prefill_steps)
    assert math.isnan(pf.typical_gap)  # no stream produced a token while the prompt was prefilled
    assert pf.spike >= pf.prefill_busy_s


def test_measure_interference_on_known_records() -> None:
    streams = [RequestRecord("s", 0.0, token_times=[1.0, 1.1, 1.2, 1.3, 2.3, 2.4, 2.5])]
    long = RequestRecord("l", 1.25, token_times=[2.3])
    steps = [StepRecord(i, t, t + 0.1) for i, t in enumerate([1.0, 1.1, 1.2])]
    steps += [StepRecord(3, 1.3, 2.3, num_prefill_tokens=500), StepRecord(4, 2.3, 2.4),
              StepRecord(5, 2.4, 2.5)]
    got = cp.measure_interference("x", streams, long, steps, tail_steps=2)
    assert got.long_ttft == pytest.approx(1.05) and got.window_end == pytest.approx(2.5)
    assert got.spike == pytest.approx(1.0) and got.baseline_itl == pytest.approx(0.1)
    assert [s.step for s in got.prefill_steps] == [3] and got.prompt_tokens_computed == 500
    assert got.prompt_cost_s == pytest.approx(0.9)
    with pytest.raises(ValueError, match="never produced"):
        cp.measure_interference("x", streams, RequestRecord("l", 1.25), steps)


def test_options_refuse_a_budget_without_room_for_the_prompt() -> None:
    with pytest.raises(ValueError, match="leaves nothing"):
        cp.interference_options(16, n_streams=16)
    assert cp.interference_options(None)["max_num_batched_tokens"] == 2048


def test_simulated_h100_spike_and_chunks() -> None:
    off, on = cp.sim_interference(budget=None), cp.sim_interference(budget=2048)
    assert off.spike > 10 * off.baseline_itl
    assert on.spike < 0.5 * off.spike and len(on.prefill_steps) == math.ceil(8192 / (2048 - 40))
    tiny = cp.sim_interference(budget=64)
    assert tiny.long_ttft > 5 * on.long_ttft and tiny.itl_p99 < on.itl_p99


def test_unchunked_gap_while_prefilling_is_the_one_long_step():
    # The long prompt arrives in the middle of a simulated decode step; that step's ordinary gap must not
    # count as "while prefilling" (it halved the median: 127 ms instead of the 248 ms freeze).
    r = cp.sim_interference(budget=None)
    assert len(r.prefill_steps) == 1
    assert r.typical_gap == pytest.approx(r.spike, rel=0.05)
    assert r.typical_gap > 10 * r.baseline_itl


@pytest.mark.parametrize("overhead_ms", [0.2, 1.0, 5.0, 20.0])
def test_a_replay_keeps_every_stream_going_however_fast_the_fitted_steps_are(model: Any,
                                                                             overhead_ms: float) -> None:
    # Lesson 06 replays its engine runs in a simulator fitted to this machine. A fixed "5 ms a step"
    # guess ran the streams dry once the engine got faster (CI: "a stream finished inside the measured
    # window"); the warm-up and the outputs are now sized from the cost model the replay uses.
    from minengine.perf.roofline import CostModel

    cost_model = CostModel.create(model, "h100", "fp32", overhead_s=overhead_ms / 1e3)
    for budget in (None, 256, 32):
        config = cp.budget_engine(model, budget, n_streams=16).config
        # (sim_interference itself raises if a stream was not decoding yet or ran dry inside the window)
        got = cp.sim_interference(n_streams=16, long_len=1500, stream_prompt=32, config=config,
                                  cost_model=cost_model)
        per_step = 1500 if budget is None else budget - 16  # the streams' 16 decodes share each step
        assert len(got.prefill_steps) == math.ceil(1500 / per_step)
        assert got.long_ttft > 0
