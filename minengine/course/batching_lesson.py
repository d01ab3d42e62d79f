"""Lesson 05's measuring code: static vs continuous batching, batch-size sweeps, preemption, Little's law.

Why a module: the notebook should show experiments, not bookkeeping. Everything here drives the real
engine (``LLM``) or the simulator (``minengine.sim``) and reads only their ``StepRecord`` and
``RequestRecord``s, so the same function measures this machine and predicts an H100.

Static batching is a *policy* (``StaticBatchPolicy``): the scheduler admits a new batch only when the
previous one has completely finished, so every batch runs as long as its longest request. It is the
same engine, the same kernels and the same token budget as continuous (iteration-level) batching;
only the admission rule differs, which is exactly the comparison Orca made against FasterTransformer.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minengine.core.policies import SchedulingPolicy
from minengine.core.records import RequestRecord, StepRecord
from minengine.core.sampling_params import SamplingParams
from minengine.course.lessons import SHIPPED_VOCAB, ModelShape, RunResult, random_prompt
from minengine.metrics.stats import RunSummary, summarize

BLOCK = 16  # the engine's default KV block size (tokens)
# A random-weight Llama for decode-vs-batch on a CPU: ~94 MB of fp32 weights (out of the L2 caches, so a
# decode step streams them) and steps of tens of ms, so a sweep to batch 64 takes seconds.
MEDIUM_SHAPE = ModelShape(hidden=512, layers=8, heads=8, kv_heads=2, intermediate=1408)


class StaticBatchPolicy(SchedulingPolicy):
    """Request-level ("static") batching: while any request of the current batch runs, nobody new is
    admitted; when the batch is empty, the next ``max_num_seqs`` waiting requests form the next one.

    It never looks inside a request, so it works unchanged with any request view. Use it with chunked
    prefill off and a budget that holds a whole batch's prompts (``batching_options`` does), so a batch
    is formed in one step, as a static batcher would pad and launch it.
    """

    name = "static"
    admits_in_queue_order = True

    def order(self, running: Sequence[Any], waiting: Sequence[Any]) -> list[Any]:
        return list(running) if running else list(waiting)


def batching_options(batch: int, static: bool, max_prompt: int, max_model_len: int = 2048,
                     num_blocks: int | None = None) -> dict[str, Any]:
    """Engine options for a static or continuous batcher of ``batch`` slots; everything else equal.

    Both run with chunked prefill off (a prompt is one unit of work, as in Orca) and a budget that holds
    ``batch`` whole prompts, so the only difference is *when* a free slot may be refilled.
    """
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    options: dict[str, Any] = dict(
        max_num_seqs=batch, enable_chunked_prefill=False, enable_prefix_caching=False,
        max_num_batched_tokens=max(max_model_len, batch * max_prompt), max_model_len=max_model_len,
        policy=StaticBatchPolicy() if static else "decode_first")
    if num_blocks is not None:
        options["num_blocks"] = num_blocks
    return options


def blocks_for(batch: int, max_tokens_per_request: int, spare: int = 8) -> int:
    """KV blocks for ``batch`` requests of up to that many tokens each (no preemption)."""
    return batch * math.ceil(max_tokens_per_request / BLOCK) + spare


# -------------------------------------------------------------------------------------- workloads
@dataclass
class OfflineWork:
    """Requests that all arrive at once: prompts (token ids) and their sampling params."""

    prompts: list[list[int]]
    params: list[SamplingParams]

    @property
    def max_prompt(self) -> int:
        return max(len(p) for p in self.prompts)

    @property
    def max_total(self) -> int:
        return max(len(p) + (sp.max_tokens or 0) for p, sp in zip(self.prompts, self.params, strict=True))


def spread_workload(n: int, seed: int = 0, prompt: tuple[int, int] = (16, 64),
                    output: tuple[int, int] = (4, 128), vocab: int = SHIPPED_VOCAB) -> OfflineWork:
    """``n`` requests with short prompts and output lengths spread log-uniformly over ``output``.

    Real answers vary from a word to a page; that spread is what a static batch wastes: the short
    answers finish and their slots wait for the longest one. Greedy (temperature 0), fixed lengths.
    """
    rng = random.Random(seed)
    lo, hi = output
    prompts = [random_prompt(rng.randint(*prompt), rng, vocab) for _ in range(n)]
    lengths = [round(math.exp(rng.uniform(math.log(lo), math.log(hi)))) for _ in range(n)]
    params = [SamplingParams(max_tokens=o, ignore_eos=True, temperature=0) for o in lengths]
    return OfflineWork(prompts, params)


def offline_run(llm: Any, work: OfflineWork) -> tuple[list[list[int]], RunResult]:
    """All requests at once through ``llm.generate``: (output token ids per request, the run's records)."""
    outputs = llm.generate(work.prompts, work.params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    records, steps = list(llm.request_records), list(llm.step_records)
    start = min(r.arrival_time for r in records)
    end = max(r.token_times[-1] for r in records if r.token_times)
    return tokens, RunResult(records, steps, end - start)


# ------------------------------------------------------------------------------------- occupancy
@dataclass(frozen=True)
class Occupancy:
    """How full the batch was: slots are ``max_num_seqs``; a slot is idle in a step when no request holds
    it."""

    slots: int
    steps: int
    mean_running: float  # requests in the batch per step
    idle_share: float  # fraction of slot-steps nobody used
    idle_while_waiting: float  # the same, counting only steps after which requests were still waiting

    @property
    def used_share(self) -> float:
        return 1.0 - self.idle_share


def occupancy(steps: Sequence[StepRecord], slots: int) -> Occupancy:
    """Batch occupancy from the StepRecords (``num_running`` after scheduling). ``idle_while_waiting``
    is the scheduler's own waste: empty slots while requests queued for one (the end of a run, when
    nobody is left to admit, is idle for every scheduler)."""
    if not steps:
        raise ValueError("no steps to read")
    running = np.array([min(s.num_running, slots) for s in steps], float)
    backlog = np.array([s.num_waiting > 0 for s in steps])
    waiting_idle = float(1 - running[backlog].mean() / slots) if backlog.any() else 0.0
    return Occupancy(slots, len(steps), float(running.mean()), float(1 - running.mean() / slots),
                     waiting_idle)


@dataclass
class BatchingPoint:
    """One run of a sweep: its setting, summary and occupancy."""

    label: str
    value: int
    summary: RunSummary
    occupancy: Occupancy
    wall: float
    tokens: list[list[int]]
    steps: list[StepRecord]
    config: Any = None  # the engine's EngineConfig, for replaying the run in the simulator

    @property
    def throughput(self) -> float:
        """Output tokens per second of the run's makespan."""
        return self.summary.total_output_tokens / self.wall


def run_batching(model: Any, work: OfflineWork, batch: int, static: bool, label: str = "",
                 repeats: int = 1) -> BatchingPoint:
    """Build an engine for ``model`` (a loaded model) and run the offline work through it.

    With ``repeats`` > 1 the work runs that many times, each on a fresh engine, and the fastest run is
    kept: other programs on a laptop (or a browser beside the notebook) slow some runs down, never
    speed one up, so the fastest is the closest to what the engine itself costs. Greedy tokens are the
    same every time.
    """
    from minengine.engine.llm import LLM

    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    best: BatchingPoint | None = None
    for _ in range(repeats):
        llm = LLM(model, **batching_options(batch, static, work.max_prompt,
                                            num_blocks=blocks_for(batch, work.max_total)))
        tokens, run = offline_run(llm, work)
        if best is None or run.wall < best.wall:
            best = BatchingPoint(label or ("static" if static else "continuous"), batch,
                                 summarize(run.requests, run.steps), occupancy(run.steps, batch), run.wall,
                                 tokens, run.steps, llm.config)
    assert best is not None
    return best


# ------------------------------------------------------------------------------------- preemption
@dataclass
class PreemptionResult:
    """The same requests with a roomy and with a tight KV cache."""

    roomy: BatchingPoint
    tight: BatchingPoint
    num_blocks_roomy: int
    num_blocks_tight: int
    num_preemptions: int
    recomputed_tokens: int  # prefill tokens beyond each prompt once: recomputed after preemption
    prefill_s_per_token: float  # from the roomy run: forward time of its prefill steps / prompt tokens

    @property
    def identical(self) -> bool:
        return self.roomy.tokens == self.tight.tokens

    @property
    def extra_s(self) -> float:
        return self.tight.wall - self.roomy.wall

    @property
    def recompute_s(self) -> float:
        """Estimated time the recomputation cost: recomputed tokens at the roomy run's prefill rate."""
        return self.recomputed_tokens * self.prefill_s_per_token


def preemption_experiment(model: Any, work: OfflineWork, num_blocks_tight: int, budget: int = 256
                          ) -> PreemptionResult:
    """Run ``work`` (continuous batching, chunked prefill) with room for everyone, then with a cache so
    small that running requests outgrow it and get preempted (recompute: KV dropped, recomputed later)."""
    from minengine.engine.llm import LLM

    n = len(work.prompts)
    roomy_blocks = blocks_for(n, work.max_total)
    points = []
    for blocks in (roomy_blocks, num_blocks_tight):
        llm = LLM(model, max_num_seqs=n, max_num_batched_tokens=budget, num_blocks=blocks,
                  enable_prefix_caching=False, max_model_len=2048)
        tokens, run = offline_run(llm, work)
        points.append(BatchingPoint(f"{blocks} blocks", blocks, summarize(run.requests, run.steps),
                                    occupancy(run.steps, n), run.wall, tokens, run.steps,
                                    llm.config))
    roomy, tight = points
    prompt_tokens = sum(len(p) for p in work.prompts)
    recomputed = sum(s.num_prefill_tokens for s in tight.steps) - prompt_tokens
    prefill_steps = [s for s in roomy.steps if s.num_prefill_tokens]
    per_token = (sum(s.duration for s in prefill_steps)
                 / max(1, sum(s.num_prefill_tokens for s in prefill_steps)))
    return PreemptionResult(roomy, tight, roomy_blocks, num_blocks_tight, tight.summary.num_preemptions or 0,
                            recomputed, per_token)


# ------------------------------------------------------------------------------------ Little's law
@dataclass(frozen=True)
class LittlesLaw:
    """L = λ·W, two ways: L from the StepRecords (requests in the engine, time-averaged), λ and W from
    the RequestRecords (completion rate, mean time in the system). Two independent records, one law."""

    in_system: float  # L: waiting + running, time-averaged over the run
    in_batch: float  # running only
    throughput: float  # λ: completed requests per second
    mean_e2e: float  # W: arrival -> finish
    mean_in_batch: float  # first scheduled -> finish

    @property
    def predicted_in_system(self) -> float:
        return self.throughput * self.mean_e2e

    @property
    def predicted_in_batch(self) -> float:
        return self.throughput * self.mean_in_batch


def littles_law(requests: Sequence[RequestRecord], steps: Sequence[StepRecord]) -> LittlesLaw:
    """Check Little's law on one run (``RunResult.requests`` and ``.steps``)."""
    done = [r for r in requests if r.finish_time is not None and r.first_scheduled_time is not None]
    if not done or not steps:
        raise ValueError("need finished requests and steps")
    start = min(r.arrival_time for r in done)
    end = max(r.finish_time for r in done)  # type: ignore[type-var]
    span = end - start
    in_system = sum((s.num_running + s.num_waiting) * s.duration for s in steps) / span
    in_batch = sum(s.num_running * s.duration for s in steps) / span
    lam = len(done) / span
    w = float(np.mean([r.finish_time - r.arrival_time for r in done]))  # type: ignore[operator]
    wb = float(np.mean([r.finish_time - r.first_scheduled_time for r in done]))  # type: ignore[operator]
    return LittlesLaw(in_system, in_batch, lam, w, wb)


# ------------------------------------------------------------------------------- the simulator side
SIM_MODEL = "llama-3.1-8b"
SIM_MAX_LEN = 8192


def sim_workload(num_requests: int, rate: float = math.inf, seed: int = 0, prompt_mean: int = 512,
                 output_mean: int = 128, sigma: float = 1.0) -> list:
    """Chat-like traffic for the simulator: log-normal prompts and outputs (a long tail of long answers)."""
    from minengine.sim.workload import LogNormal, synthetic_workload

    return synthetic_workload(num_requests, rate, input_len=LogNormal(prompt_mean, 1.0, max_len=4096),
                              output_len=LogNormal(output_mean, sigma, max_len=2048), seed=seed)


def simulator(gpu: str = "h100-sxm", static: bool = False, max_num_seqs: int = 256, budget: int = 2048,
              model: str = SIM_MODEL) -> Any:
    """A simulated GPU serving ``model``: continuous batching (decode-first, chunked prefill with
    ``budget``) or static batching (``StaticBatchPolicy``, no chunking, a batch's prompts in one step)."""
    from minengine.sim.simulator import Simulator

    if static:
        return Simulator(model, gpu, policy=StaticBatchPolicy(), max_num_seqs=max_num_seqs,
                         enable_chunked_prefill=False, max_model_len=SIM_MAX_LEN,
                         max_num_batched_tokens=max(SIM_MAX_LEN, max_num_seqs * 4096))
    return Simulator(model, gpu, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                     max_model_len=SIM_MAX_LEN)


@dataclass
class SimPoint:
    """One simulated run: setting, summary, occupancy."""

    static: bool
    max_num_seqs: int
    rate: float
    summary: RunSummary
    occupancy: Occupancy
    steps: list[StepRecord] = field(default_factory=list, repr=False)
    backlog_tok_s: float = math.nan  # output tokens/s while requests were queued (``backlog_rates``)
    backlog_req_s: float = math.nan

    @property
    def label(self) -> str:
        return "static" if self.static else "continuous"


def simulate_point(gpu: str, static: bool, max_num_seqs: int, rate: float, num_requests: int, seed: int = 0,
                   slo: dict[str, float] | None = None, sigma: float = 1.0) -> SimPoint:
    """Simulate ``num_requests`` of ``sim_workload`` (answers spread by ``sigma``) at ``rate`` req/s."""
    result = simulator(gpu, static, max_num_seqs).run(sim_workload(num_requests, rate, seed, sigma=sigma))
    tok_s, req_s = backlog_rates(result.requests, result.steps)
    return SimPoint(static, max_num_seqs, rate, result.summary(slo), occupancy(result.steps, max_num_seqs),
                    result.steps, tok_s, req_s)


def backlog_rates(requests: Sequence[RequestRecord], steps: Sequence[StepRecord]) -> tuple[float, float]:
    """(output tokens/s, completed requests/s) while requests were still queued: the server's sustained
    rate. A finite run's average also counts its drain, when the last long answers run almost alone,
    which hides what the scheduler achieves with a full queue. No backlog: the whole run."""
    if not steps:
        raise ValueError("no steps to read")
    queued = [s for s in steps if s.num_waiting > 0]
    start, end = steps[0].start, (queued[-1] if queued else steps[-1]).end
    span = end - start
    tokens = sum(sum(start <= t <= end for t in r.token_times) for r in requests)
    done = sum(r.finish_time is not None and start <= r.finish_time <= end for r in requests)
    return tokens / span, done / span


def replay(config: Any, cost_model: Any, requests: Sequence[RequestRecord]) -> Any:
    """The same requests (arrival offsets, prompt and output lengths) through a simulator that uses the
    engine's own config and ``cost_model`` (a calibrated one): the check that the simulator is right."""
    from minengine.sim.simulator import Simulator
    from minengine.sim.workload import RequestSpec

    t0 = min(r.arrival_time for r in requests)
    specs = [RequestSpec(r.arrival_time - t0, r.num_prompt_tokens, max(1, r.num_output_tokens))
             for r in requests]
    return Simulator(config=config, cost_model=cost_model).run(specs)
