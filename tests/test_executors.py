"""One scheduler, two executors: the real engine and the simulator must make the same decisions.

The same workload (same request ids, prompts, lengths and arrival steps) runs through ``LLMEngine``
(the PyTorch ``ModelRunner`` on the shipped model) and through a ``SimInstance`` (the roofline
executor, a simulated clock). Scheduling depends only on token counts and KV blocks, never on which
tokens were sampled or how long a step took, so every step must schedule the same requests with the
same chunks and preempt the same requests. A small cache, a small budget and shared prefixes make
sure preemption, chunked prefill and prefix-cache hits all happen.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from minengine.config import EngineConfig
from minengine.core.engine_core import EngineCore
from minengine.core.request import Request
from minengine.core.sampling_params import SamplingParams
from minengine.core.sched_output import SchedulerOutput
from minengine.engine.llm_engine import LLMEngine
from minengine.perf.roofline import CostModel
from minengine.sim.executor import RooflineExecutor
from minengine.sim.instance import SimInstance

pytestmark = pytest.mark.usefixtures("torch_one_thread")

Decision = tuple[list[tuple[str, int, int, bool, bool]], list[str]]


def workload(seed: int = 0) -> list[tuple[int, str, list[int], int]]:
    """(arrival step, request id, prompt ids, max_tokens); a third share a 40-token prefix."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 500) for _ in range(40)]
    out = []
    for i in range(14):
        ids = [rng.randrange(3, 500) for _ in range(rng.randrange(5, 90))]
        if i % 3 == 0:
            ids = prefix + ids
        out.append((rng.randrange(0, 25), f"r{i}", ids, rng.randrange(4, 40)))
    return sorted(out)


def decisions(out: SchedulerOutput) -> Decision:
    scheduled = [(s.request_id, s.num_tokens, s.start, s.is_prefill, s.sample) for s in out.scheduled]
    return scheduled, list(out.preempted_request_ids)


def config(policy: str) -> EngineConfig:
    return EngineConfig(model="tinystories-4m", block_size=8, num_blocks=40, max_num_seqs=5,
                        max_num_batched_tokens=48, policy=policy, seed=0)


def drive(core: EngineCore, advance: Callable[[float | None], None] = lambda end: None) -> list[Decision]:
    """Add each request at its arrival step and step the core until all finish; every step's decisions.

    ``advance`` moves a simulated clock to the step's predicted end (the real clock moves by itself).
    """
    arrivals, out, step = workload(), [], 0
    while arrivals or core.has_unfinished_requests():
        while arrivals and arrivals[0][0] <= step:
            _, rid, ids, n = arrivals.pop(0)
            core.add_request(Request(rid, ids, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)))
        inflight = core.start_step()
        if inflight is not None:  # None: nothing has arrived yet
            out.append(decisions(inflight.scheduler_output))
            advance(inflight.end)
            core.finish_step(inflight)
        step += 1
    return out


def run_real(policy: str) -> tuple[list[Decision], int]:
    engine = LLMEngine(config(policy))
    steps = drive(engine.engine_core)
    return steps, engine.scheduler.block_manager.prefix_cache_hits


def run_simulated(policy: str) -> tuple[list[Decision], int]:
    resolved = config(policy).resolved(2048)  # the shipped model's context
    executor = RooflineExecutor(CostModel.create("llama-2-7b", "h100"))  # any cost: only time changes
    inst = SimInstance("sim", resolved, resolved.num_blocks, executor)  # type: ignore[arg-type]

    def advance(end: float | None) -> None:
        assert end is not None, "a simulated step predicts its end"
        inst.now = end

    return drive(inst.core, advance), inst.scheduler.block_manager.prefix_cache_hits


@pytest.mark.parametrize("policy", ["decode_first", "prefill_first"])
def test_real_and_simulated_executors_schedule_the_same_steps(policy: str) -> None:
    real, real_hits = run_real(policy)
    sim, sim_hits = run_simulated(policy)
    assert len(real) == len(sim)
    for i, (a, b) in enumerate(zip(real, sim, strict=True)):
        assert a == b, f"step {i} differs: real {a} vs simulated {b}"
    assert real_hits == sim_hits > 0, "the shared prefix should hit the cache in both"
    assert any(p for _, p in real), "the small cache should force preemptions"
    assert any(start > 0 and pre for sched, _ in real for _, _, start, pre, _ in sched), "no chunked prefill"
