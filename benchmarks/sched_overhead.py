"""Scheduler overhead: steps per second of schedule + bookkeeping with a null executor.

    .venv/bin/python benchmarks/sched_overhead.py                  # 16, 64, 256 running sequences
    .venv/bin/python benchmarks/sched_overhead.py --seqs 256 --steps 2000
    .venv/bin/python benchmarks/sched_overhead.py --smoke

Why: on a GPU a decode step of a small model takes a few milliseconds, so a scheduler that spends one of
them in Python caps throughput by itself (vLLM v1 rewrote its scheduler for that reason). Here the model
is replaced by nothing: each step is ``EngineCore.step()`` (the same loop the engine and the simulator
run) with a ``NullExecutor``: ``Scheduler.schedule()``, then ``update_from_output()`` with one dummy
token per request (append, stop checks, prefix-cache hashing of newly full blocks), then the
``StepRecord``. All N requests are decoding (their prompts were prefilled before timing), which is the
steady state of a busy server.
Engine options are the defaults (decode-first, chunked prefill and prefix caching on).
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

from tqdm.auto import tqdm

from minengine.config import EngineConfig
from minengine.core.engine_core import EngineCore, NullExecutor, StepInFlight
from minengine.core.request import Request
from minengine.core.sampling_params import SamplingParams
from minengine.core.scheduler import Scheduler
from minengine.utils import cdiv

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/sched_overhead.py
    import common  # type: ignore[no-redef]


class NullEngine:
    """``EngineCore`` with a ``NullExecutor``: the engine's step loop with no forward pass or sampling."""

    def __init__(self, num_seqs: int, prompt_len: int, max_steps: int) -> None:
        budget = max(2048, 2 * num_seqs)
        # Requests decode during the prefill steps too (taking up to num_seqs of each step's budget), so
        # they need that many extra tokens of room.
        max_tokens = max_steps + cdiv(num_seqs * prompt_len, budget - num_seqs) + 8
        config = EngineConfig(max_num_seqs=num_seqs, max_num_batched_tokens=budget)
        config = config.resolved(prompt_len + max_tokens)
        blocks = num_seqs * cdiv(prompt_len + max_tokens, config.block_size)
        self.scheduler = Scheduler(config, blocks)
        self.num_steps = 0
        self.executor = NullExecutor(token=3)
        self.core = EngineCore(self.scheduler, self.executor, max_step_records=1)
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        for i in range(num_seqs):
            prompt = [(i * 131 + j) % 30000 + 3 for j in range(prompt_len)]
            self.core.add_request(Request(str(i), prompt, params))
        while any(r.is_prefill for r in self.scheduler.running) or self.scheduler.waiting:
            self.step()  # prefill everything: timing starts with N decoding requests

    def step(self) -> tuple[float, float, int]:
        """One step; returns (schedule seconds, update + record seconds, requests scheduled)."""
        self.executor.token = 3 + self.num_steps % 30000  # a new token each step, as the old loop had
        t0 = time.perf_counter()
        inflight: StepInFlight | None = self.core.start_step()  # schedule + the null executor
        t1 = time.perf_counter()
        assert inflight is not None, "every request finished early"
        self.core.finish_step(inflight)
        self.num_steps += 1
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, len(inflight.scheduler_output.scheduled)


def measure(seqs: list[int], steps: int, chunk: int, prompt_len: int, bar: Any) -> dict[int, dict[str, Any]]:
    """Time ``steps`` steps per size, in chunks rotated across sizes so load drift hits all alike."""
    engines = {n: NullEngine(n, prompt_len, steps) for n in seqs}
    samples: dict[int, dict[str, list[float]]] = {n: {"sched": [], "update": [], "load": []} for n in seqs}
    gc.collect()
    for _ in range(cdiv(steps, chunk)):
        for n, engine in engines.items():
            for _ in range(chunk):
                s, u, k = engine.step()
                assert k == n, f"expected {n} decoding requests, got {k}"
                samples[n]["sched"].append(s)
                samples[n]["update"].append(u)
            samples[n]["load"].append(common.loadavg()[0])
            bar.update(chunk)
    out = {}
    for n, s in samples.items():
        total = [a + b for a, b in zip(s["sched"], s["update"], strict=True)]
        out[n] = {
            "steps": len(total), "ms_per_step": 1e3 * common.median(total),
            "p99_ms": 1e3 * common.percentile(total, 99), "steps_per_s": len(total) / sum(total),
            "schedule_ms": 1e3 * common.median(s["sched"]), "update_ms": 1e3 * common.median(s["update"]),
            "us_per_seq": 1e6 * common.median(total) / n, "load": common.median(s["load"]),
        }
    return out


def main(argv: list[str] | None = None) -> dict[int, dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="16,64,256,1024", help="running sequences (comma-separated)")
    ap.add_argument("--steps", type=int, default=1000, help="timed steps per size")
    ap.add_argument("--chunk", type=int, default=50, help="steps per size before rotating to the next")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="sizes 4 and 16, 20 steps")
    args = ap.parse_args(argv)
    if args.smoke:
        args.seqs, args.steps, args.chunk = "4,16", 20, 10
    seqs = [int(x) for x in args.seqs.split(",")]
    print(common.machine_line())
    with tqdm(total=len(seqs) * args.steps, desc="null-executor steps", dynamic_ncols=True) as bar:
        results = measure(seqs, args.steps, args.chunk, args.prompt_len, bar)
    print(f"\ncommand: {common.command_line()}")
    print(common.machine_line())
    print(f"all requests decoding, prompt {args.prompt_len} tokens; decode-first, prefix caching on; "
          "medians over steps\n")
    rows = [[n, r["steps"], f"**{r['ms_per_step']:.3f}**", f"{r['p99_ms']:.3f}", f"{r['steps_per_s']:,.0f}",
             f"{r['schedule_ms']:.3f}", f"{r['update_ms']:.3f}", f"{r['us_per_seq']:.2f}", f"{r['load']:.2f}"]
            for n, r in results.items()]
    print(common.md_table(["running seqs", "steps", "ms/step (median)", "p99 ms", "steps/s",
                           "schedule() ms", "update + record ms", "us per seq", "load avg"], rows))
    common.save_json(args.json, {"results": results})
    return results


if __name__ == "__main__":
    main()
