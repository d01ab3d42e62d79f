"""Lab 2's policy served from the kernel, checked in the grader (minengine/course/policy_bridge.py). The
whole path, lab 2 autograded through nbgrader by a student who replaces every check, is
tests/test_grading.py (fixture lab2_batching_scheduler/patched_checks.txt). Here: the bridge on its own,
with a stand-in kernel that is a thread serving a namespace over a socket pair."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from minengine.core.policies import DecodeFirstPolicy
from minengine.course import policy_bridge as pb
from minengine.course import policy_harness as ph
from minengine.course import policy_scoring as ps
from minengine.course.grader_side_tests import MARKER, run_test_cell
from minengine.course.own_code import policy_findings

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.policy_bridge import lab_params  # noqa: E402 - the lab's params.py, loaded once

LAB2 = ROOT / "labs" / "lab2_batching_scheduler"
SMALL = {"name": "small", "model": "llama-3.1-8b", "gpu": "h100",
         "engine": {"max_model_len": 4096, "max_num_batched_tokens": 256, "max_num_seqs": 16,
                    "num_blocks": 300},
         "slo": {"ttft": 500.0, "tpot": 30.0}, "num_requests": 60, "rate": 20.0, "burstiness": 0.5,
         "prompt": ["lognormal", 400, 1.0, 2000], "max_tokens": [64, 256], "output_fraction": [0.2, 1.0],
         "seed": 11}


class AgingPolicy(lab_params().tuned_policy(2.0, 1.0, 24)):  # type: ignore[misc]
    """The lab's tuned baseline with chunks capped and its own victim rule: state, sorting, a victim rule
    and chunk sizes all cross the bridge."""

    def select_victim(self, candidates: list) -> Any:
        return min(candidates, key=lambda r: (r.num_computed_tokens, r.num_preemptions, r.request_id))


def thread_kernel(namespace: dict[str, Any]) -> pb.Connect:
    """A bridge's ``connect`` whose far end is serve_policies in a thread, on ``namespace``."""

    @contextlib.contextmanager
    def connect() -> Iterator[socket.socket]:
        grader, kernel = socket.socketpair()
        thread = threading.Thread(target=pb.serve_policies, args=(kernel, namespace), daemon=True)
        thread.start()
        with grader:
            yield grader
        thread.join(timeout=5)

    return connect


@contextlib.contextmanager
def remote(cls: type, name: str = "MyPolicy") -> Iterator[pb.RemotePolicyFactory]:
    bridge = pb.PolicyBridge(thread_kernel({name: cls}), {})
    factory = bridge.factory(name)
    with bridge.serving([factory]):
        yield factory


def test_a_policy_across_the_bridge_decides_exactly_as_in_process() -> None:
    stream = ph.steady_stream(num_steps=120, seed=4)
    with remote(AgingPolicy) as factory:
        for arrivals, limits in ((ph.TOY, ph.TOY_LIMITS), (stream, ph.STREAM_LIMITS),
                                 (stream, dict(ph.STREAM_LIMITS, num_blocks=20))):  # preemptions
            here = ph.run_core(AgingPolicy, arrivals, **limits)
            there = ph.run_core(factory, arrivals, **limits)
            assert there.preempted == here.preempted and any(here.preempted) == (limits["num_blocks"] == 20)
            assert (there.steps, there.log, there.finished) == (here.steps, here.log, here.finished)
        assert ps.simulate(factory, SMALL) == ps.simulate(AgingPolicy, SMALL)
    with remote(DecodeFirstPolicy) as factory:  # a built-in's subclass, which reads views the same way
        assert ps.simulate(factory, SMALL) == ps.simulate(DecodeFirstPolicy, SMALL)


def test_the_kernel_sees_only_what_a_scheduler_sees() -> None:
    seen: list[dict[str, Any]] = []

    class Snooping(DecodeFirstPolicy):
        def order(self, running: list, waiting: list) -> list:
            for r in [*running, *waiting]:
                seen.append({"type": type(r).__name__, "len_blocks": len(r.block_table),
                             "attrs": sorted(a for a in dir(r) if not a.startswith("_")),
                             "max_tokens": r.sampling_params.max_tokens})
            return super().order(running, waiting)

    with remote(Snooping) as factory:
        ph.run_core(factory, ph.TOY, **ph.TOY_LIMITS)
    assert {s["type"] for s in seen} == {"RequestView"}
    attrs = set(seen[0]["attrs"])
    lab_lists = {"request_id", "arrival_time", "num_prompt_tokens", "num_tokens", "num_computed_tokens",
                 "num_output_tokens", "is_prefill", "num_preemptions", "block_table", "sampling_params"}
    assert lab_lists <= attrs and not attrs & {"token_ids", "prompt_token_ids", "output_token_ids", "record"}
    assert {s["max_tokens"] for s in seen} == {a.max_tokens for a in ph.TOY}

    class ReadsTokens(DecodeFirstPolicy):
        def order(self, running: list, waiting: list) -> list:
            return sorted(running + waiting, key=lambda r: r.token_ids[0])

    with remote(ReadsTokens) as factory, pytest.raises(ph.PolicyFailure, match="AttributeError.*token_ids"):
        ph.run_core(factory, ph.TOY, **ph.TOY_LIMITS)


def test_a_broken_policy_fails_with_its_reason_and_the_grader_never_hangs(monkeypatch: Any) -> None:
    class Foreign(DecodeFirstPolicy):
        def order(self, running: list, waiting: list) -> list:
            return [object()]

    class BadChunk(DecodeFirstPolicy):
        def num_new_tokens(self, request: Any, num_needed: int, budget: int) -> Any:
            return 2.5

    class NotAPolicy:
        pass

    release = threading.Event()

    class Loops(DecodeFirstPolicy):
        def order(self, running: list, waiting: list) -> list:
            release.wait(30)
            return super().order(running, waiting)

    for cls, message in ((Foreign, "not one of the requests"), (BadChunk, "num_new_tokens gave"),
                         (NotAPolicy, "must be a SchedulingPolicy subclass")):
        with remote(cls) as factory, pytest.raises(ph.PolicyFailure, match=message):
            ph.run_core(factory, ph.TOY, **ph.TOY_LIMITS)
    monkeypatch.setattr(pb, "CALL_WALL_S", 0.2)
    try:
        with remote(Loops) as factory, pytest.raises(ph.PolicyFailure, match="infinite loop"):
            ph.run_core(factory, ph.TOY, **ph.TOY_LIMITS)
    finally:
        release.set()
    with pytest.raises(ph.PolicyFailure, match="outside the test cell"):
        pb.RemotePolicyFactory("MyPolicy", [])()


def test_a_test_cell_in_the_grader_gets_the_policy_from_the_kernel() -> None:
    """run_test_cell with a bridge: the class the cell names comes from the kernel, is served while the
    cell runs, and require_own_policy judges the answer's source (the grader's findings)."""
    source = (f"# Test\n{MARKER}\nfrom minengine.course import policy_harness as ph\n"
              "from minengine.course import policy_scoring as ps\n"
              "ps.require_own_policy(MyPolicy, 'limits')\n"
              "ph.check_limits(ph.run_core(MyPolicy, ph.TOY, **ph.TOY_LIMITS), 16, 2)\n")
    kernel = {"MyPolicy": AgingPolicy}

    def describe(request: dict[str, Any]) -> dict[str, Any]:
        return {"names": {n: {"callable": True, "is_class": True} if n in kernel else {"missing": True}
                          for n in request["describe"]}}

    assert run_test_cell(source, describe, {}, pb.PolicyBridge(thread_kernel(kernel), {})) == []
    flagged = pb.PolicyBridge(thread_kernel(kernel), {"MyPolicy": ["import minengine.course.policy_scoring"]})
    (error,) = run_test_cell(source, describe, {}, flagged)
    assert "calls grading helpers" in error["evalue"]


def answer_cell(fixture: str) -> str:
    text = (ROOT / "tests" / "fixtures" / "grading" / "lab2_batching_scheduler" / fixture).read_text()
    return text.split("# %% answer_policy\n", 1)[1].split("# %% ", 1)[0]


def test_the_grader_reads_whether_a_policy_is_its_own() -> None:
    nb = json.loads((LAB2 / "lab2_batching_scheduler.ipynb").read_text())
    solution = next("".join(c["source"]) for c in nb["cells"]
                    if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "answer_policy")
    assert policy_findings([solution])["MyPolicy"] == []
    assert policy_findings([answer_cell("returns_baseline.txt")])["MyPolicy"] == []
    assert policy_findings([answer_cell("calls_grading_helper.txt")])["MyPolicy"]
    assert "'_getframe'" in policy_findings([answer_cell("peeking.txt")])["MyPolicy"]
    ordinary = ("from minengine.core.policies import SchedulingPolicy\n\n"
                "class MyPolicy(SchedulingPolicy):\n    def __init__(self):\n        super().__init__()\n"
                "    def order(self, running, waiting):\n"
                "        return sorted(running + waiting, key=lambda r: getattr(r, 'num_preemptions', 0))\n")
    assert policy_findings([ordinary])["MyPolicy"] == []
    for imported, used in (("import minengine", "minengine"), ("from minengine import sim", "sim"),
                           ("import sys", "sys.modules"),
                           ("from minengine.sim import Simulator", "Simulator")):
        reaching = f"{imported}\n{ordinary}        helper = {used}\n"
        assert policy_findings([reaching])["MyPolicy"], reaching


def test_the_results_file_holds_only_what_the_grader_recorded(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    path = tmp_path / ph.RESULTS_FILE
    path.write_text(json.dumps({"parts": {"quality_forged": {"passed": True, "ratio_to_tuned": 9.0}}}))
    ps.record("limits", True, path=path)
    path.write_text(json.dumps({"parts": {"quality_forged": {"passed": True, "ratio_to_tuned": 9.0}}}))
    ps.rewrite_results(tmp_path)  # after the kernel is gone
    assert set(json.loads(path.read_text())["parts"]) == {"limits"}
    path.write_text("{}")
    ps.rewrite_results(tmp_path)  # a file the grader never wrote is removed
    assert not path.exists()


def test_the_notebooks_toy_workload_is_the_one_the_test_cells_use() -> None:
    nb = json.loads((LAB2 / "lab2_batching_scheduler.ipynb").read_text())
    (cell,) = [c for c in nb["cells"] if "toy = [" in "".join(c["source"])]
    namespace: dict[str, Any] = {}
    code = "".join(cell["source"]).split("\n\n\ndef show_steps")[0]
    exec(compile(code, "<lab 2 toy cell>", "exec"), namespace)  # noqa: S102 - the lab's own cell
    assert tuple(namespace["toy"]) == ph.TOY and namespace["TOY_LIMITS"] == ph.TOY_LIMITS


def test_a_kernel_that_never_serves_fails_each_cell_once_not_each_time_it_waits() -> None:
    attempts = []

    @contextlib.contextmanager
    def never_connects() -> Iterator[socket.socket]:
        attempts.append(1)
        raise pb.BridgeError("your kernel did not start serving your policy")
        yield  # pragma: no cover - a generator that never gets here

    bridge = pb.PolicyBridge(never_connects, {})
    factory = bridge.factory("MyPolicy")
    for _ in range(3):
        with pytest.raises(pb.BridgeError, match="did not start serving"), bridge.serving([factory]):
            pass
    assert attempts == [1]  # later cells fail at once instead of waiting CONNECT_S each
    with bridge.serving([]):  # a cell that needs no policy is not affected
        pass
