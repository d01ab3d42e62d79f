"""Lesson 05's helpers (``minengine.course.batching_lesson``): static vs continuous batching on the real
engine, occupancy, preemption, Little's law, and the simulator side."""

from __future__ import annotations

import math
from typing import Any

import pytest

from minengine.core.records import RequestRecord, StepRecord
from minengine.course import batching_lesson as bl


@pytest.fixture(scope="module")
def model(torch_one_thread: None) -> Any:
    from minengine.course.lessons import shipped_llm

    return shipped_llm().llm_engine.model


@pytest.fixture(scope="module")
def pair(model: Any) -> dict[str, bl.BatchingPoint]:
    work = bl.spread_workload(9, seed=3, output=(2, 24))
    return {name: bl.run_batching(model, work, 3, static=name == "static")
            for name in ("static", "continuous")}


def test_static_batches_run_to_their_longest_request(pair: dict[str, bl.BatchingPoint]) -> None:
    records = pair["static"].summary.requests
    batches: dict[float, list[RequestRecord]] = {}
    for r in records:
        batches.setdefault(r.first_scheduled_time, []).append(r)
    starts = sorted(batches)
    assert [len(batches[t]) for t in starts] == [3, 3, 3]  # formed whole, in one step each
    for earlier, later in zip(starts, starts[1:], strict=False):
        assert later >= max(r.finish_time for r in batches[earlier])  # nobody joins a running batch
    # the continuous batcher admits a request the step after a slot frees up
    assert len({r.first_scheduled_time for r in pair["continuous"].summary.requests}) > 3


def test_continuous_needs_fewer_steps_and_gives_the_same_tokens(pair: dict[str, bl.BatchingPoint]) -> None:
    st, co = pair["static"], pair["continuous"]
    assert co.tokens == st.tokens and all(len(t) >= 2 for t in co.tokens)
    assert co.occupancy.steps < st.occupancy.steps
    assert co.occupancy.idle_while_waiting == 0 < st.occupancy.idle_while_waiting
    assert st.config.max_num_seqs == co.config.max_num_seqs == 3
    assert isinstance(st.config.policy, bl.StaticBatchPolicy) and co.config.policy == "decode_first"


def test_repeats_keep_the_fastest_run(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    work = bl.spread_workload(4, seed=3, output=(2, 8))
    real, walls, seen = bl.offline_run, iter([0.3, 0.1, 0.2]), []

    def scripted_wall(llm: Any, w: bl.OfflineWork) -> tuple[list[list[int]], Any]:
        tokens, run = real(llm, w)
        seen.append((llm, tokens))
        run.wall = next(walls)  # as if other programs had slowed the first and last runs
        return tokens, run

    monkeypatch.setattr(bl, "offline_run", scripted_wall)
    point = bl.run_batching(model, work, 2, static=False, repeats=3)
    assert point.wall == 0.1 and point.tokens == seen[1][1]
    assert len({id(llm) for llm, _ in seen}) == 3  # a fresh engine each time: no warm prefix cache
    assert seen[0][1] == seen[1][1] == seen[2][1]  # greedy: the same tokens every run
    with pytest.raises(ValueError, match="repeats"):
        bl.run_batching(model, work, 2, static=False, repeats=0)


def test_occupancy_counts_empty_slots() -> None:
    steps = [StepRecord(i, i, i + 1, num_running=n, num_waiting=w)
             for i, (n, w) in enumerate([(4, 2), (2, 2), (1, 0)])]
    occ = bl.occupancy(steps, 4)
    assert occ.mean_running == pytest.approx(7 / 3) and occ.idle_share == pytest.approx(1 - 7 / 12)
    assert occ.idle_while_waiting == pytest.approx(1 - 6 / 8)
    with pytest.raises(ValueError):
        bl.occupancy([], 4)


def test_littles_law_on_known_records() -> None:
    a = RequestRecord("a", 0.0, first_scheduled_time=0.0, finish_time=1.0)
    b = RequestRecord("b", 0.5, first_scheduled_time=0.5, finish_time=2.0)
    steps = [StepRecord(1, 0.0, 0.5, num_running=1), StepRecord(2, 0.5, 1.0, num_running=2),
             StepRecord(3, 1.0, 2.0, num_running=1)]
    law = bl.littles_law([a, b], steps)
    assert law.in_system == pytest.approx(1.25) and law.predicted_in_system == pytest.approx(1.25)
    assert law.throughput == pytest.approx(1.0) and law.mean_e2e == pytest.approx(1.25)


def test_littles_law_holds_on_an_engine_run(pair: dict[str, bl.BatchingPoint]) -> None:
    p = pair["continuous"]
    law = bl.littles_law(p.summary.requests, p.steps)
    assert law.in_system == pytest.approx(law.predicted_in_system, rel=0.2)


def test_preemption_recomputes_and_loses_nothing(model: Any) -> None:
    work = bl.spread_workload(6, seed=4, prompt=(32, 48), output=(40, 60))
    result = bl.preemption_experiment(model, work, num_blocks_tight=14)
    assert result.roomy.summary.num_preemptions == 0 < result.num_preemptions
    assert result.recomputed_tokens > 0 and result.recompute_s > 0
    assert result.identical


def test_options_validate() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        bl.batching_options(0, True, 64)
    opts = bl.batching_options(4, False, 600)
    assert opts["max_num_batched_tokens"] == 2400 and not opts["enable_chunked_prefill"]


def test_backlog_rates_count_only_the_queued_part() -> None:
    reqs = [RequestRecord("a", 0.0, token_times=[0.5, 1.0], finish_time=1.0),
            RequestRecord("b", 0.0, token_times=[1.5, 3.0], finish_time=3.0)]
    steps = [StepRecord(1, 0.0, 1.0, num_waiting=1), StepRecord(2, 1.0, 3.0, num_waiting=0)]
    assert bl.backlog_rates(reqs, steps) == (pytest.approx(2.0), pytest.approx(1.0))


def test_simulated_static_batching_is_slower() -> None:
    co = bl.simulate_point("h100-sxm", False, 32, math.inf, 200)
    st = bl.simulate_point("h100-sxm", True, 32, math.inf, 200)
    assert co.backlog_tok_s > 1.2 * st.backlog_tok_s
    assert st.occupancy.idle_while_waiting > co.occupancy.idle_while_waiting
    assert co.summary.completed == st.summary.completed == 200


def test_replay_runs_the_engine_config_in_the_simulator(pair: dict[str, bl.BatchingPoint]) -> None:
    from minengine.perf.roofline import CostModel

    p = pair["static"]
    cost = CostModel.create("llama-2-7b", "h100")
    sim = bl.replay(p.config, cost, p.summary.requests)
    assert len(sim.requests) == len(p.summary.requests)
    assert [r.num_output_tokens for r in sim.requests] == [len(t) for t in p.tokens]
