"""What grading a lab 2 policy in the grader costs: one simulated workload, the policy in this process
against the same policy served from another process over the policy bridge (as autograde serves it from
the student's kernel).

    .venv/bin/python benchmarks/policy_bridge.py
    .venv/bin/python benchmarks/policy_bridge.py --smoke

Why: lab 2's checks run in the grader and the student's policy in their kernel
(``minengine/course/policy_bridge.py``), so every ``order()`` call is a round trip over a Unix socket.
The workload is the lab's graded long-outputs family at the course seed (the most steps of the four); the
policies are two of the lab's tuned baselines, one that sizes prefill chunks (``num_new_tokens``) and one
that does not. The serving process is forked, like a kernel it holds only the policy. Reported: wall
seconds per simulation (median of the rounds, interleaved), the extra milliseconds per ``order()``
call, and whether the goodput is identical (it must be).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import random
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from minengine.course import policy_bridge as pb
from minengine.course import policy_scoring as ps

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/policy_bridge.py
    import common  # type: ignore[no-redef]

LAB2 = Path(__file__).resolve().parents[1] / "labs" / "lab2_batching_scheduler"
SEED = 2026  # the course seed the grading tests use


def lab_params() -> Any:
    sys.path.insert(0, str(LAB2))
    try:
        import params  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(LAB2))
    return params


def _serve(sock: socket.socket, parents_end: socket.socket, grid_point: tuple) -> None:
    parents_end.close()  # the fork's copy of it: else the parent closing its end never reaches us as EOF
    pb.serve_policies(sock, {"MyPolicy": lab_params().tuned_policy(*grid_point)})


def forked_kernel(grid_point: tuple) -> pb.Connect:
    """A bridge ``connect`` whose far end is a forked process serving the tuned policy ``grid_point``."""
    context = multiprocessing.get_context("fork")

    @contextlib.contextmanager
    def connect() -> Iterator[socket.socket]:
        ours, theirs = socket.socketpair()
        process = context.Process(target=_serve, args=(theirs, ours, grid_point))
        process.start()
        theirs.close()
        with ours:
            yield ours
        process.join(timeout=10)

    return connect


def measure(local_cls: type, connect: pb.Connect, family: dict[str, Any], rounds: int) -> dict[str, Any]:
    """One policy: simulated in this process and through the bridge, interleaved ``rounds`` times."""
    bridge = pb.PolicyBridge(connect, {})
    factory = bridge.factory("MyPolicy")
    calls = {"order": 0}

    class Counted(local_cls):  # type: ignore[misc, valid-type]
        def order(self, running: list, waiting: list) -> list:
            calls["order"] += 1
            return super().order(running, waiting)

    results: dict[str, Any] = {}

    def in_process() -> float:
        start = time.perf_counter()
        results["in_process"] = ps.simulate(Counted, family, cpu_s=60.0)
        return time.perf_counter() - start

    def bridged() -> float:
        with bridge.serving([factory]):
            start = time.perf_counter()
            results["bridged"] = ps.simulate(factory, family, cpu_s=60.0)
            return time.perf_counter() - start

    timed = common.interleave({"in_process": in_process, "bridged": bridged}, rounds)
    order_calls = calls["order"] // rounds
    here, there = timed["in_process"].median, timed["bridged"].median
    row = {"policy": local_cls.name, "order_calls": order_calls, "in_process_s": here, "bridged_s": there,
           "extra_ms_per_order_call": 1e3 * (there - here) / max(order_calls, 1),
           "same_goodput": results["in_process"] == results["bridged"]}
    print(f"{row['policy']:>42}: {order_calls:5d} order() calls; in process {here:5.2f} s, bridged "
          f"{there:5.2f} s (+{row['extra_ms_per_order_call']:.3f} ms a call); same results: "
          f"{row['same_goodput']}")
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="save the results here")
    parser.add_argument("--smoke", action="store_true", help="a tiny workload, one round")
    args = parser.parse_args(argv)
    params = lab_params()
    if args.smoke:  # one small family drawn the lab's way, without the baselines' simulations
        family = dict(params._family(random.Random(SEED), "long_outputs"), num_requests=12,
                      max_tokens=[32, 64])
    else:  # the graded family with the most steps at this seed
        family = params.params(SEED)["hidden_long_outputs"]["family"]
    rounds = 1 if args.smoke else args.rounds
    print(common.machine_line())
    print(f"workload: {family['name']} at seed {SEED}, {family['num_requests']} requests")
    rows = [measure(params.tuned_policy(*grid_point), forked_kernel(grid_point), family, rounds)
            for grid_point in ((2.0, 1.0, 256), (2.0, 1.0, None))]
    common.save_json(args.json, {"family": family["name"], "seed": SEED, "rounds": rounds, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
