"""What a simulated service costs per token: its GPU time split between prompts and answers.

``minengine.perf.prices`` turns a GPU-hour price and a load into dollars per million tokens; this module
supplies the two things a run knows: the load (requests per second, tokens per request) and how the GPU
time divided between prompt work and generation (``prefill_time_share``).
"""

from __future__ import annotations

from collections.abc import Iterable

from minengine.core.records import StepRecord
from minengine.perf.prices import TokenCosts, token_costs
from minengine.perf.roofline import CostModel
from minengine.sim.simulator import SimResult


def prefill_time_share(steps: Iterable[StepRecord], cost_model: CostModel) -> float:
    """The share of a run's step time spent on prompts. A mixed step is split between its prompt chunks
    and its decodes in proportion to what the cost model prices each part at on its own (its weight
    reads, shared in truth, split the same way); a pure step counts whole."""
    total = prompts = 0.0
    for s in steps:
        duration = s.end - s.start
        chunks = [c for c in s.prefill_chunks if c[0] > 1]
        if not chunks:
            total += duration
            continue
        decodes = [(1, n - 1) for n in s.decode_context_lens] + [c for c in s.prefill_chunks if c[0] == 1]
        p = cost_model.step_time(chunks)
        d = cost_model.step_time(decodes) if decodes else 0.0
        prompts += duration * p / (p + d)
        total += duration
    return prompts / total if total else 0.0


def serving_cost(result: SimResult, cost_model: CostModel, usd_per_gpu_hour: float, num_replicas: int = 1,
                 request_rate: float | None = None) -> TokenCosts:
    """Dollars per million input and output tokens of a simulated run on ``num_replicas`` instances of
    ``cost_model.num_gpus`` GPUs each. ``request_rate``: the load the fleet is sold at (e.g. the goodput
    within an SLO); default the run's own completed requests per second."""
    done = [r for r in result.requests if r.finish_time is not None]
    if not done:
        raise ValueError("no request finished in this run: nothing to price")
    rate = result.summary().request_throughput if request_rate is None else request_rate
    mean_in = sum(r.num_prompt_tokens for r in done) / len(done)
    mean_out = sum(r.num_output_tokens for r in done) / len(done)
    return token_costs(num_replicas * cost_model.num_gpus, usd_per_gpu_hour, rate, mean_in, mean_out,
                       prefill_time_share(result.steps, cost_model))
