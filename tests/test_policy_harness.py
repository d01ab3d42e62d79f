"""Lab 2's grading machinery (minengine.course.policy_harness / policy_scoring) and the seams it needs:
a policy that sizes chunks (``num_new_tokens``, checked by the scheduler) and simulated requests whose
true output length the scheduler cannot see (``RequestSpec.max_tokens``)."""

from __future__ import annotations

import json
import random
import sys
import time

import pytest

from minengine.config import EngineConfig
from minengine.core.engine_core import EngineCore, NullExecutor
from minengine.core.policies import DecodeFirstPolicy, PolicyError, SchedulingPolicy
from minengine.core.request import Request
from minengine.core.sampling_params import SamplingParams
from minengine.core.scheduler import Scheduler
from minengine.course import policy_harness as ph
from minengine.course import policy_scoring as ps
from minengine.sim import RequestSpec, Simulator, with_rate

TOY = [ph.Arrival(0, 40, 5, 8), ph.Arrival(0, 3, 2, 4), ph.Arrival(1, 70, 8, 8), ph.Arrival(2, 12, 3, 16),
       ph.Arrival(2, 25, 1, 4), ph.Arrival(5, 9, 6, 6)]
LIMITS = dict(max_num_batched_tokens=16, max_num_seqs=2, num_blocks=12, block_size=8)
FAMILY = {"name": "t", "model": "llama-3.1-8b", "gpu": "h100",
          "engine": {"max_model_len": 8192, "max_num_batched_tokens": 512, "max_num_seqs": 16},
          "slo": {"ttft": 500.0, "tpot": 30.0}, "num_requests": 40, "rate": 20.0, "burstiness": 0.5,
          "prompt": ["lognormal", 400, 1.0, 3000], "max_tokens": [64, 256], "output_fraction": [0.1, 1.0],
          "seed": 3}


class Chunked(DecodeFirstPolicy):
    """Prefill chunks of at most ``cap`` tokens."""

    admits_in_queue_order = False

    def __init__(self, cap: int = 5) -> None:
        self.cap = cap

    def num_new_tokens(self, request: Request, num_needed: int, budget: int) -> int:
        return min(num_needed, budget, self.cap)


class OverBudget(DecodeFirstPolicy):
    def num_new_tokens(self, request: Request, num_needed: int, budget: int) -> int:
        return num_needed


class ShortestFirst(SchedulingPolicy):
    def order(self, running, waiting):
        return list(running) + sorted(waiting,
                                      key=lambda r: r.num_prompt_tokens + r.sampling_params.max_tokens)


class Peeker(SchedulingPolicy):
    """Reads the executor's hidden lengths through the call stack (what the blindness probe must catch)."""

    def order(self, running, waiting):
        frame, eos_at = sys._getframe(), None
        while frame is not None and eos_at is None:
            eos_at = getattr(getattr(frame.f_locals.get("self"), "executor", None), "eos_at", None)
            frame = frame.f_back
        return list(running) + sorted(waiting, key=lambda r: (eos_at or {}).get(r.request_id, 0))


# ------------------------------------------------------------------------------------ the core's seams
def core_run(policy: SchedulingPolicy, budget: int = 16) -> list[list[int]]:
    config = EngineConfig(num_blocks=64, block_size=4, max_num_batched_tokens=budget, max_num_seqs=4,
                          enable_prefix_caching=False, policy=policy).resolved(256)
    core = EngineCore(Scheduler(config, 64), NullExecutor())
    for i, n in enumerate((23, 3, 11)):
        core.add_request(Request(str(i), [5 + i] * n, SamplingParams(max_tokens=4, ignore_eos=True)))
    steps = []
    while core.has_unfinished_requests():
        steps.append([s.num_tokens for s in core.step().scheduler_output.scheduled])
    return steps


def test_a_policy_sizes_prefill_chunks_and_the_scheduler_refuses_more_than_the_budget() -> None:
    default, chunked = core_run(DecodeFirstPolicy()), core_run(Chunked(5))
    assert max(n for step in default for n in step) == 16  # the first prompt takes the whole budget
    assert max(n for step in chunked for n in step) == 5 and len(chunked) > len(default)
    assert sum(map(sum, chunked)) == sum(map(sum, default))  # same work, smaller pieces
    with pytest.raises(PolicyError, match="23 tokens; it needs 23 and 16 are left"):
        core_run(OverBudget())


def test_simulated_requests_hide_their_true_length_behind_max_tokens() -> None:
    specs = [RequestSpec(0.01 * i, 50, 3 + i, max_tokens=64) for i in range(6)]
    result = Simulator("llama-3.1-8b", "h100").run(specs)
    assert [r.num_output_tokens for r in result.requests] == [3, 4, 5, 6, 7, 8]
    assert {r.finish_reason for r in result.requests} == {"stop"}  # an EOS, not max_tokens
    seen: list[tuple[int | None, bool]] = []

    class Spy(DecodeFirstPolicy):
        def order(self, running, waiting):
            seen.extend((r.sampling_params.max_tokens, r.sampling_params.ignore_eos)
                        for r in [*running, *waiting])
            return super().order(running, waiting)

    Simulator("llama-3.1-8b", "h100", policy=Spy()).run(specs)
    assert set(seen) == {(64, False)}  # all a policy can read: the cap
    old_style = Simulator("llama-3.1-8b", "h100").run([RequestSpec(0.0, 50, 5)])
    assert old_style.requests[0].finish_reason == "length"  # default: the benchmark's ignore_eos way
    assert with_rate(specs, 5.0)[2].max_tokens == 64
    with pytest.raises(ValueError, match="max_tokens"):
        RequestSpec(0.0, 10, 20, max_tokens=8)


# -------------------------------------------------------------------------------------------- guards
def test_broken_policies_fail_fast_with_a_clear_message() -> None:
    class Loops(DecodeFirstPolicy):
        def order(self, running, waiting):
            while True:
                pass

    class LeavesAllOut(SchedulingPolicy):
        def order(self, running, waiting):
            return []

    class Strangers(SchedulingPolicy):
        def order(self, running, waiting):
            return [Request("x", [1])]

    class BadVictim(DecodeFirstPolicy):
        def select_victim(self, candidates):
            return "nobody"

    start = time.process_time()
    with pytest.raises(ph.PolicyFailure, match="infinite loop"):
        ph.run_core(Loops, TOY, **LIMITS)
    assert time.process_time() - start < 4  # one call's second, not the run's budget
    with pytest.raises(ph.PolicyFailure, match="it stalls"):
        ph.run_core(LeavesAllOut, TOY, **LIMITS)
    with pytest.raises(ph.PolicyFailure, match="not one of the requests"):
        ph.run_core(Strangers, TOY, **LIMITS)
    with pytest.raises(ph.PolicyFailure, match="not one of the candidates"):
        ph.run_core(BadVictim, TOY, **dict(LIMITS, num_blocks=10))
    with pytest.raises(ph.PolicyFailure, match="SchedulingPolicy subclass"):
        ph.new_policy(dict)


def test_properties_hold_for_decode_first_and_catch_what_they_should() -> None:
    run = ph.run_core(DecodeFirstPolicy, TOY, **dict(LIMITS, num_blocks=10))
    ph.check_limits(run, 16, 2)
    ph.check_finished(run, TOY)
    assert any(run.preempted)  # the tight cache really preempts
    run.steps[3] = run.steps[3] + [("9", 20)]
    with pytest.raises(ph.PolicyFailure, match="over max_num_batched_tokens"):
        ph.check_limits(run, 16, 2)
    stream = ph.steady_stream(seed=0)
    assert ph.check_no_starvation(DecodeFirstPolicy, stream, **ph.STREAM_LIMITS)["most_overtaken"] == 0
    with pytest.raises(ph.PolicyFailure, match="starves"):
        ph.check_no_starvation(ShortestFirst, stream, **ph.STREAM_LIMITS)
    ph.check_deterministic(ShortestFirst, stream, **ph.STREAM_LIMITS)

    class Shuffles(SchedulingPolicy):
        def order(self, running, waiting):
            return list(running) + random.sample(list(waiting), len(waiting))

    with pytest.raises(ph.PolicyFailure, match="not deterministic"):
        ph.check_deterministic(Shuffles, stream, **ph.STREAM_LIMITS)
    ph.check_properties(DecodeFirstPolicy, "limits", seed=1, max_examples=10)
    ph.check_properties(Chunked, "finishes", seed=2, max_examples=10)
    with pytest.raises(ph.PolicyFailure, match="num_new_tokens gave request"):
        ph.check_properties(OverBudget, "limits", seed=3, max_examples=10)


def test_the_blindness_probe_catches_a_policy_that_reads_the_hidden_lengths() -> None:
    ps.check_blind(DecodeFirstPolicy, FAMILY)
    ps.check_blind(ShortestFirst, FAMILY)  # max_tokens is fair game
    with pytest.raises(ph.PolicyFailure, match="hidden true output lengths"):
        ps.check_blind(Peeker, FAMILY)


def test_simulate_scores_goodput_and_the_cache_reuses_a_run() -> None:
    got = ps.simulate(ShortestFirst, FAMILY)
    assert 0 < got["slo_attainment"] <= 1 and got["goodput"] > 0
    assert ps.simulate_cached(ShortestFirst, FAMILY) == got
    scored = {"family": FAMILY,
              "goodput": {"prefill_first": 0.5 * got["goodput"], "decode_first": got["goodput"],
                                            "tuned": 2 * got["goodput"]}}
    figures: dict = {}
    ps.expect_beats(ShortestFirst, [scored], "prefill_first", figures)
    with pytest.raises(ph.PolicyFailure, match="not above decode_first"):
        ps.expect_beats(ShortestFirst, [scored], "decode_first", figures)
    with pytest.raises(ph.PolicyFailure, match="90% of the tuned baseline's"):
        ps.expect_near_tuned(ShortestFirst, scored, figures)
    assert figures["ratio_to_tuned"] == pytest.approx(0.5)


def test_grading_helpers_in_a_policy_are_found_and_the_interface_is_not() -> None:
    class UsesHarness(SchedulingPolicy):
        def order(self, running, waiting):
            ps.simulate("decode_first", FAMILY)
            return list(running) + list(waiting)

    class ImportsIt(SchedulingPolicy):
        def order(self, running, waiting):
            __import__("minengine.course.policy_harness")
            return list(running)

    class Subclass(DecodeFirstPolicy):
        def order(self, running, waiting):
            return super().order(running, waiting)

    assert ps.grading_helper_calls(UsesHarness) and ps.grading_helper_calls(ImportsIt)
    assert ps.grading_helper_calls(Subclass) == [] and ps.grading_helper_calls(Peeker) == []
    with pytest.raises(ph.PolicyFailure, match="grading helpers"):
        ps.require_own_policy(UsesHarness, "part 1")


def test_same_tokens_on_the_real_engine() -> None:
    case = {"prompt_lens": [5, 30, 12], "max_tokens": [8, 12, 6], "num_blocks": 12, "block_size": 4,
            "max_num_batched_tokens": 16, "max_num_seqs": 2, "seed": 1}
    ph.check_same_tokens(Chunked, case)


# ------------------------------------------------------------------------------- results, leaderboard
def test_results_json_while_autograding_and_the_leaderboard(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    with ps.graded("limits"):
        pass
    assert not (tmp_path / ph.RESULTS_FILE).exists()  # only the grader writes it
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    for student, ratio in (("alice", 0.8), ("bob", 1.1)):
        folder = tmp_path / "course" / "autograded" / student / "lab2_batching_scheduler"
        folder.mkdir(parents=True)
        monkeypatch.chdir(folder)
        with ps.graded("limits"):
            pass
        with pytest.raises(ph.PolicyFailure), ps.graded("quality_bursty") as figures:
            figures["ratio_to_tuned"] = ratio
            raise ph.PolicyFailure("too slow")
    data = json.loads((folder / ph.RESULTS_FILE).read_text())
    assert data["parts"]["quality_bursty"] == {"passed": False, "message": "too slow",
                                               "ratio_to_tuned": 1.1}
    rows = ps.leaderboard(tmp_path / "course")
    assert [r["student"] for r in rows] == ["bob", "alice"] and rows[0]["properties_passed"] == 1
    assert ps.main(["leaderboard", str(tmp_path / "course"), "--csv", str(tmp_path / "board.csv")]) == 0
    assert "bob" in capsys.readouterr().out and "alice" in (tmp_path / "board.csv").read_text()
