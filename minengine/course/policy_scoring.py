"""Lab 2's simulator side: workload families, goodput under SLOs, the blindness probe, the leaderboard.

Generic like ``policy_harness`` (which runs and guards the policy): the families' parameters and the
goodput of the baselines (prefill-first, decode-first and a tuned baseline, the best of a grid of simple
fair policies on each family) come from the lab's ``params.py`` per course seed.

* ``family_workload`` builds a family's requests; each asks for ``max_tokens`` (what the scheduler sees)
  and really generates a share of it, hidden in the simulator (``RequestSpec.max_tokens``).
* ``simulate`` scores a policy on a family by vLLM's goodput under SLOs, checking that every request
  produced exactly its true output (a policy must not change results).
* ``check_blind`` runs the policy on two workloads that look the same to a scheduler and differ only in
  the true output lengths: its decisions must not differ before anything finishes.
* ``require_own_policy`` fails a policy whose methods call grading helpers or the simulator.
* ``graded`` wraps a test cell's body and ``record``s its outcome and figures in ``lab2_results.json``
  next to the notebook while autograding; ``leaderboard`` ranks a course's ``lab2_results.json`` files
  (``python -m minengine.course.policy_scoring leaderboard build/course``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from minengine.course.policy_harness import RESULTS_FILE, PolicyFailure, cpu_limit, explain, guard, new_policy


# ------------------------------------------------------------------------------------------- simulator
def family_workload(family: dict[str, Any]) -> list:
    """The requests of one workload family (its parameters come from the lab's ``params.py``):
    ``num_requests``, ``rate`` (req/s), ``burstiness`` (vLLM's), ``prompt`` (``["lognormal", mean, sigma,
    max]`` or ``["bimodal", [lo, hi], [lo, hi], long_fraction]``), ``max_tokens`` (caps a client picks
    from), ``output_fraction`` ([lo, hi]: the true length is that share of the cap) and ``seed``."""
    import numpy as np

    from minengine.sim.workload import RequestSpec, arrival_times

    rng = np.random.default_rng(family["seed"])
    n = family["num_requests"]
    times = arrival_times(family["rate"], n, family.get("burstiness", 1.0), rng)
    kind, *shape = family["prompt"]
    if kind == "lognormal":
        mean, sigma, top = shape
        prompts = np.clip(np.rint(rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, n)), 4, top)
    elif kind == "bimodal":
        (slo, shi), (llo, lhi), frac = shape
        prompts = np.where(rng.random(n) < frac, rng.integers(llo, lhi + 1, n), rng.integers(slo, shi + 1, n))
    else:
        raise ValueError(f"unknown prompt law {kind!r}")
    caps = rng.choice(family["max_tokens"], n)
    lo, hi = family["output_fraction"]
    outputs = np.maximum(1, np.rint(caps * rng.uniform(lo, hi, n)))
    return [RequestSpec(float(t), int(p), int(o), max_tokens=int(c))
            for t, p, o, c in zip(times, prompts, outputs, caps, strict=True)]


def _run_sim(factory: Any, family: dict[str, Any], specs: list, what: str, cpu_s: float, max_steps: int,
             log: list | None = None, probe: bool = False) -> Any:
    from minengine.sim import Simulator

    sim = Simulator(family["model"], family["gpu"], policy=guard(new_policy(factory), max_steps, log),
                    **family["engine"])
    try:
        with cpu_limit(cpu_s):
            return sim.run(specs)
    except Exception as exc:
        if probe and str(exc).startswith("__stall__"):
            return None  # the probe stops after its steps on purpose
        raise explain(exc, what, cpu_s, max_steps) from None


def simulate(factory: Any, family: dict[str, Any], *, cpu_s: float = 10.0, max_steps: int = 200_000
             ) -> dict[str, Any]:
    """Goodput (vLLM's: requests meeting every SLO per second) of the policy on one family, simulated."""
    what = f"the {family.get('name', 'simulated')} workload"
    specs = family_workload(family)
    result = _run_sim(factory, family, specs, what, cpu_s, max_steps)
    by_arrival = sorted(specs, key=lambda s: s.arrival_time)
    for i, (spec, rec) in enumerate(zip(by_arrival, result.requests, strict=True)):
        if rec.num_output_tokens != spec.output_len or rec.arrival_time != spec.arrival_time:
            raise PolicyFailure(f"{what}: request {i} produced {rec.num_output_tokens} tokens instead of "
                                f"{spec.output_len} (or its record changed): a policy must not change "
                                "requests")
    summary = result.summary(slo=family["slo"])
    return {"goodput": summary.request_goodput, "slo_attainment": summary.slo_attainment,
            "preemptions": result.num_preemptions, "ttft_p99_ms": 1e3 * summary.ttft.p99,
            "tpot_p99_ms": 1e3 * summary.tpot.p99}


def check_blind(factory: Any, family: dict[str, Any], min_len: int = 24) -> None:
    """Two workloads alike in all a scheduler sees (arrivals, prompts, max_tokens) whose true output
    lengths differ (all >= ``min_len``): the policy's first ``min_len`` steps must be the same in both."""
    import dataclasses
    import random

    base = family_workload({**family, "num_requests": 24, "rate": math.inf})
    logs = []
    for world in (1, 2):
        rng = random.Random(world)
        specs = [dataclasses.replace(s, output_len=rng.randrange(min_len, s.max_tokens + 1))
                 if s.max_tokens > min_len else s for s in base]
        log: list = []
        _run_sim(factory, family, specs, "the blindness probe", 5.0, min_len, log, probe=True)
        logs.append(log)
    for a, b in zip(*logs, strict=False):
        if a != b:
            raise PolicyFailure(f"the policy decided differently ({str(a)[:60]}... vs {str(b)[:60]}...) on "
                                "two workloads that differ only in the hidden true output lengths: it reads "
                                "what a real scheduler cannot know. Use max_tokens, never the true length")


# ------------------------------------------------------------------------------------------- scoring
_SIM_CACHE: dict[tuple[Any, str], dict[str, Any]] = {}
_BLIND_CACHE: dict[tuple[Any, str], bool] = {}


def _cache_key(factory: Any, family: dict[str, Any]) -> tuple[Any, str]:
    # In the grader a policy class is a per-notebook RemotePolicyFactory with its own token (an id could
    # be reused by the next student's); in a kernel, the class itself.
    return getattr(factory, "cache_token", None) or id(factory), json.dumps(family, sort_keys=True)


def simulate_cached(factory: Any, family: dict[str, Any]) -> dict[str, Any]:
    """``simulate``, once per (policy class, family) in a kernel: several graded cells share one run."""
    key = _cache_key(factory, family)
    if key not in _SIM_CACHE:
        _SIM_CACHE[key] = simulate(factory, family)
    return _SIM_CACHE[key]


def check_blind_cached(factory: Any, family: dict[str, Any]) -> None:
    key = _cache_key(factory, family)
    if key not in _BLIND_CACHE:
        check_blind(factory, family)
        _BLIND_CACHE[key] = True


def expect_beats(factory: Any, scored: Sequence[dict[str, Any]], baseline: str,
                 figures: dict[str, Any]) -> None:
    """Higher goodput than ``baseline`` (by 1%) on every family; ``scored``: params.py's families with the
    baselines' goodput."""
    short = []
    for s in scored:
        fam = s["family"]
        check_blind_cached(factory, fam)
        got, base = simulate_cached(factory, fam)["goodput"], s["goodput"][baseline]
        figures[fam["name"]] = {"goodput": got, baseline: base}
        if not got >= 1.01 * base:
            short.append(f"{fam['name']}: {got:.2f} req/s vs {base:.2f}")
    if short:
        raise PolicyFailure(f"goodput not above {baseline}'s on: {'; '.join(short)}")


def expect_near_tuned(factory: Any, scored: dict[str, Any], figures: dict[str, Any],
                      share: float = 0.9) -> None:
    """At least ``share`` of the tuned baseline's goodput on one family (params.py tunes a grid of simple
    fair policies on it; the published solution is not the bar)."""
    fam, want = scored["family"], scored["goodput"]
    check_blind_cached(factory, fam)
    got = simulate_cached(factory, fam)
    ratio = got["goodput"] / want["tuned"]
    figures.update(got, ratio_to_tuned=ratio, **{f"{k}_goodput": v for k, v in want.items()})
    if ratio < share:
        raise PolicyFailure(f"{fam['name']}: goodput {got['goodput']:.2f} req/s "
                            f"({100 * got['slo_attainment']:.0f}% of requests within TTFT "
                            f"{fam['slo']['ttft']:g} ms and TPOT {fam['slo']['tpot']:g} ms); decode-first "
                            f"{want['decode_first']:.2f}, prefill-first {want['prefill_first']:.2f}; full "
                            f"marks from {share:.0%} of the tuned baseline's {want['tuned']:.2f} "
                            f"({scored.get('tuned', 'a simple policy tuned for this workload')})")


# -------------------------------------------------------------------------------------- own code only
_HELPER_NAMES = {"policy_harness", "autocheck", "grading", "__import__", "importlib", "import_module"}


def grading_helper_calls(policy_cls: Any) -> list[str]:
    """Names in the policy's methods that reach grading helpers (``minengine.course``) or import machinery.
    The scheduling interface (``minengine.core``) is fine; the built-in policies are fine too (and score
    as the baselines they are)."""
    import inspect

    from minengine.course.autocheck import _code_objects

    cls = policy_cls if inspect.isclass(policy_cls) else type(policy_cls)
    found = []
    for klass in cls.__mro__:
        if (klass.__module__ or "").startswith("minengine") or klass is object:
            continue
        for name, fn in vars(klass).items():
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if code is None:
                continue
            namespace = getattr(fn, "__globals__", {})
            for co in _code_objects(code):
                for n in co.co_names:
                    obj = namespace.get(n)
                    mod = (getattr(obj, "__name__", "") if inspect.ismodule(obj)
                           else getattr(obj, "__module__", ""))
                    if n in _HELPER_NAMES or (mod or "").startswith(("minengine.course", "minengine.sim")):
                        found.append(f"{n!r} in {klass.__name__}.{name}")
    return sorted(set(found))


def require_own_policy(policy_cls: Any, part: str) -> None:
    """Fail a policy that calls grading helpers or the simulator. In the grader the class is in the
    student's kernel, so what its answer cell's source reaches is read instead
    (``own_code.policy_findings``)."""
    found = getattr(policy_cls, "grader_findings", None)
    if found is None:
        found = grading_helper_calls(policy_cls)
    if found:
        raise PolicyFailure(f"{part}: the policy calls grading helpers or the simulator "
                            f"({'; '.join(found[:3])}). A policy decides from the requests it is given: "
                            "remove those calls.")




# ------------------------------------------------------------------------------------- graded parts
@contextlib.contextmanager
def graded(part: str) -> Iterator[dict[str, Any]]:
    """A test cell's body: its figures (the dict it yields) and outcome go to the results JSON."""
    figures: dict[str, Any] = {}
    try:
        yield figures
    except BaseException as exc:
        record(part, False, message=str(exc)[:500], **figures)
        raise
    record(part, True, **figures)


# Results recorded in this process, by file: each write is the whole file from here, never what is on
# disk (the student's kernel can write in the notebook's folder; in the grader, nothing it wrote counts).
_RESULTS: dict[str, dict[str, Any]] = {}


def record(part: str, passed: bool, path: str | Path = RESULTS_FILE, **figures: Any) -> None:
    """Add one graded part's outcome to the results JSON (only while autograding: it is the instructor's)."""
    if os.environ.get("NBGRADER_EXECUTION") != "autograde":
        return
    path = Path(path).resolve()
    data = _RESULTS.setdefault(str(path), {"assignment": "lab2_batching_scheduler", "parts": {}})
    data["parts"][part] = {"passed": bool(passed), **figures}
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=float))


def rewrite_results(folder: str | Path) -> None:
    """After a notebook's kernel is shut down: write its results file once more from what the grader
    recorded (or remove one the grader never wrote), so nothing the kernel left there is read."""
    path = (Path(folder) / RESULTS_FILE).resolve()
    data = _RESULTS.pop(str(path), None)
    if data is not None:
        path.write_text(json.dumps(data, indent=1, sort_keys=True, default=float))
    else:
        path.unlink(missing_ok=True)


def leaderboard(course_dir: str | Path, assignment: str = "lab2_batching_scheduler") -> list[dict[str, Any]]:
    """One row per autograded submission: goodput / the tuned baseline's per family and their mean, best
    first."""
    rows = []
    for path in sorted(Path(course_dir).glob(f"autograded/*/{assignment}/{RESULTS_FILE}")):
        parts = json.loads(path.read_text())["parts"]
        ratios = {p.removeprefix("quality_"): v.get("ratio_to_tuned", 0.0) for p, v in parts.items()
                  if p.startswith("quality_") and "ratio_to_tuned" in v}
        rows.append({"student": path.parent.parent.name, **ratios,
                     "mean_ratio": sum(ratios.values()) / len(ratios) if ratios else 0.0,
                     "properties_passed": sum(v["passed"] for p, v in parts.items()
                                              if not p.startswith("quality_"))})
    return sorted(rows, key=lambda r: -r["mean_ratio"])


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import csv

    parser = argparse.ArgumentParser(prog="python -m minengine.course.policy_scoring")
    parser.add_argument("command", choices=["leaderboard"])
    parser.add_argument("course_dir", nargs="?", default="build/course")
    parser.add_argument("--csv", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    rows = leaderboard(args.course_dir)
    if not rows:
        print(f"no {RESULTS_FILE} under {args.course_dir}/autograded/: run make autograde first")
        return 1
    cols = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols]
             for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    for row in [cols, *cells]:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=cols)
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
