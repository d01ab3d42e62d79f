"""A discrete-event simulator serving a workload with the engine's REAL ``Scheduler`` and ``BlockManager``.

Each engine instance (``SimInstance``, ``sim/instance.py``) is an ``EngineCore`` whose executor predicts
each step's time from the roofline instead of running a model: the same ``schedule()`` ->
``execute_model()`` -> ``update_from_output()`` -> ``StepRecord`` loop as the real engine, with a dummy
token for every request that samples. Every request carries the engine's ``RequestRecord``, so
``minengine.metrics.summarize`` reports the simulation exactly like a real run.

Speed: the built-in policies admit in queue order (``SchedulingPolicy.admits_in_queue_order``), so the
scheduler looks only at the head of a long waiting queue; an overloaded run with thousands waiting costs
no more per step than a quiet one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from minengine.config import EngineConfig
from minengine.core.records import RequestRecord, StepRecord
from minengine.core.request import Request
from minengine.core.sampling_params import SamplingParams
from minengine.core.scheduler import check_request_size
from minengine.kvcalc import kv_cache_budget
from minengine.metrics.stats import RunSummary, max_rate_meeting_slo, summarize
from minengine.perf.hardware import Accelerator
from minengine.perf.roofline import CostModel, pipeline_stage_layers
from minengine.sim.executor import EOS_TOKEN, RooflineExecutor
from minengine.sim.instance import EventLoop, SimInstance, make_router
from minengine.sim.pipeline import Pipeline, PipelineExecutor
from minengine.sim.workload import RequestSpec, prompt_token_ids, with_rate


# ------------------------------------------------------------------------------------------ set-up
def resolve_config(cost_model: CostModel, config: EngineConfig | None = None, **kwargs: Any) -> EngineConfig:
    """An ``EngineConfig`` (given, or built from keyword options) resolved for the model's context."""
    if config is None:
        config = EngineConfig.from_kwargs(**kwargs)
    elif kwargs:
        config = dataclasses.replace(config, **kwargs)
    context = cost_model.model.max_position_embeddings or config.max_model_len or 4096
    return config.resolved(context)


def kv_cache_blocks(cost_model: CostModel, config: EngineConfig) -> int:
    """KV blocks of one instance, by the engine's own rule (``EngineConfig.num_kv_blocks``):
    ``num_blocks``, ``kv_cache_memory_bytes``, or (on a datasheet GPU) ``kvcalc.kv_cache_budget``:
    memory x gpu_memory_utilization - weights - activation reserve, as vLLM and ``minengine kv`` size
    it. A measured CPU gets the engine's fixed CPU budget. Under tensor parallelism, one GPU's share:
    its slice of the weights against its slice of every token's K/V (the same blocks on every GPU).
    Under pipeline parallelism the fullest stage decides: its layers' weights (plus the embedding or the
    LM head) against its layers' K/V of each token; every stage holds its layers of the same blocks."""
    shape, acc = cost_model.model.sharded(cost_model.tensor_parallel_size), cost_model.accelerator
    layers = pipeline_stage_layers(shape.num_layers, cost_model.pipeline_parallel_size)
    last = len(layers) - 1
    weights = max(shape.stage_weight_bytes(n, i == 0, i == last) for i, n in enumerate(layers))
    kv_per_token = shape.kv_bytes_per_token * max(layers) / shape.num_layers
    gpu_budget = None
    if not acc.key.startswith("this-machine-cpu"):
        gpu_budget = kv_cache_budget(acc.memory_bytes, config.gpu_memory_utilization, weights)
    return config.num_kv_blocks(
        kv_per_token, gpu_budget,
        context=f"{shape.name} ({weights / 2**30:.1f} GiB of weights) on {acc.name} "
                f"({acc.memory_bytes / 2**30:.0f} GiB): ",
        hint="pick a bigger GPU, more GPUs, set kv_cache_memory_bytes or set num_blocks",
    )


_PARAMS: dict[int, SamplingParams] = {}


def make_request(spec: RequestSpec, index: int, max_tokens: int | None = None) -> Request:
    """The engine request for a spec: dummy prompt ids, stops after exactly ``output_len`` tokens.

    Without ``spec.max_tokens`` it stops by ``ignore_eos`` + ``max_tokens = output_len`` (the benchmark
    client's way); with it the request asks for ``spec.max_tokens`` and the executor ends it with an
    EOS at ``output_len`` (``RooflineExecutor.eos_at``), so the scheduler never sees the true length.
    """
    if max_tokens is None and spec.max_tokens is not None:
        return Request(str(index), prompt_token_ids(spec, index),
                       SamplingParams(temperature=0.0, max_tokens=spec.max_tokens),
                       arrival_time=spec.arrival_time, eos_token_ids=(EOS_TOKEN,))
    n = spec.output_len if max_tokens is None else max_tokens
    if n not in _PARAMS:
        _PARAMS[n] = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return Request(str(index), prompt_token_ids(spec, index), _PARAMS[n], arrival_time=spec.arrival_time)


# ------------------------------------------------------------------------------------------ results
@dataclass
class SimResult:
    """Records of one simulated run, as the real engine would have written them."""

    requests: list[RequestRecord]
    steps: list[StepRecord]
    instance_steps: dict[str, list[StepRecord]] = field(default_factory=dict, repr=False)
    label: str = ""
    # pipeline parallelism: per replica, the share of the run each stage spent working (1 - the bubble)
    stage_utilization: list[list[float]] = field(default_factory=list)

    def summary(self, slo: dict[str, float] | None = None) -> RunSummary:
        return summarize(self.requests, self.steps, slo=slo)

    @property
    def num_preemptions(self) -> int:
        return sum(s.num_preempted for s in self.steps)


class SimulatorBase:
    """What the colocated simulator and the disaggregated cluster share: set-up, stepping, arrivals."""

    cost_model: CostModel
    config: EngineConfig
    num_blocks: int

    def _setup(self, model: Any, gpu: str | Accelerator, config: EngineConfig | None,
               cost_model: CostModel | None, dtype: str | None, engine_kwargs: dict[str, Any],
               acceptance_rate: float | None = None, seed: int = 0) -> None:
        self.cost_model = cost_model if cost_model is not None else CostModel.create(model, gpu, dtype)
        self.config = resolve_config(self.cost_model, config, **engine_kwargs)
        spec = self.config.speculative_config
        if spec is not None and acceptance_rate is None:
            raise ValueError("speculative_config in the simulator needs acceptance_rate=, the chance that "
                             "each draft is kept (0 to 1; e.g. 0.6 for prose, 0.8+ for edits of a given "
                             "text): no model runs here to check the drafts")
        if spec is None and acceptance_rate is not None:
            raise ValueError("acceptance_rate only means something with speculative decoding on: add "
                             "speculative_config={'method': 'ngram', 'num_speculative_tokens': k}")
        self.num_blocks = kv_cache_blocks(self.cost_model, self.config)
        self.executor = RooflineExecutor(self.cost_model, acceptance_rate, seed)

    def _instance(self, name: str, config: EngineConfig | None = None) -> SimInstance:
        return SimInstance(name, config or self.config, self.num_blocks, self.executor)

    def _validate(self, specs: Sequence[RequestSpec]) -> list[RequestSpec]:
        """Check every request against the scheduler's own size rule before simulating anything."""
        if not specs:
            raise ValueError("the workload has no requests")
        limit, bs = self.config.max_model_len, self.config.block_size
        assert limit is not None
        blocks = self.num_blocks // self.cost_model.pipeline_parallel_size  # one engine's share
        for i, s in enumerate(specs):
            check_request_size(str(i), s.prompt_len, s.max_output_len, limit, blocks, bs)
        return sorted(specs, key=lambda s: s.arrival_time)

    def _kick(self, loop: EventLoop, inst: SimInstance, on_done: Callable[[SimInstance, list[Request]], None]
              ) -> None:
        """Start a step on an idle instance; when it ends, hand its finished requests to ``on_done``."""
        if inst.busy:
            return
        end = inst.start_step(loop.now)
        if end is None:
            return
        inst.busy = True

        def done() -> None:
            inst.busy = False
            on_done(inst, inst.finish_step(end))
            self._kick(loop, inst, on_done)

        loop.at(end, done)

    def _arrivals(self, loop: EventLoop, specs: Sequence[RequestSpec], arrive: Callable[[int], None]) -> None:
        """Schedule arrival ``i`` as an event; each arrival schedules the next (one pending at a time)."""
        def step(i: int) -> None:
            arrive(i)
            if i + 1 < len(specs):
                loop.at(specs[i + 1].arrival_time, lambda: step(i + 1))

        loop.at(specs[0].arrival_time, lambda: step(0))


class Simulator(SimulatorBase):
    """Colocated serving: ``num_replicas`` identical engines (each its own scheduler and KV cache)
    behind a router. ``Simulator("llama-2-7b", "h100", max_num_batched_tokens=512).run(workload)``.

    Engine options are ``EngineConfig`` fields (policy, enable_chunked_prefill, max_num_seqs, ...);
    ``cost_model`` replaces the datasheet roofline (e.g. a calibrated one). With ``speculative_config``,
    ``acceptance_rate`` is the chance that each draft is kept (drawn per draft from ``seed``).
    """

    def __init__(self, model: Any = "llama-2-7b", gpu: str | Accelerator = "h100",
                 config: EngineConfig | None = None, *, cost_model: CostModel | None = None,
                 num_replicas: int = 1, router: str = "round_robin", dtype: str | None = None,
                 acceptance_rate: float | None = None, seed: int = 0, **engine_kwargs: Any) -> None:
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self._setup(model, gpu, config, cost_model, dtype, engine_kwargs, acceptance_rate, seed)
        self.num_replicas = num_replicas
        self.router_name = router
        make_router(router)  # validate now

    def describe(self) -> str:
        c = self.config
        chunk = f"chunked prefill {c.max_num_batched_tokens}" if c.enable_chunked_prefill else "no chunking"
        policy = c.policy if isinstance(c.policy, str) else type(c.policy).__name__
        reps = f"{self.num_replicas} x " if self.num_replicas > 1 else ""
        cm = self.cost_model
        spec = ""
        if c.speculative_config is not None:
            spec = (f", {c.speculative_config.num_speculative_tokens} drafts a step kept at "
                    f"{self.executor.acceptance_rate:g}")
        gpus = f"{cm.num_gpus} x " if cm.num_gpus > 1 else ""
        split = [f"TP {cm.tensor_parallel_size}"] if cm.tensor_parallel_size > 1 else []
        split += [f"PP {cm.pipeline_parallel_size}"] if cm.pipeline_parallel_size > 1 else []
        split_text = f" ({' x '.join(split)})" if split else ""
        return (f"{reps}{cm.model.name} on {gpus}{cm.accelerator.name}{split_text}: {policy}, {chunk}{spec}, "
                f"{self.num_blocks * c.block_size:,} KV tokens")

    def run(self, workload: Sequence[RequestSpec]) -> SimResult:
        specs = self._validate(workload)
        loop, records = EventLoop(), []
        instances, pipelines = self._replicas(loop)
        router = make_router(self.router_name)
        self.executor.reset()

        def arrive(i: int) -> None:
            req = make_request(specs[i], i)
            records.append(req.record)
            if specs[i].max_tokens is not None:
                self.executor.eos_at[req.request_id] = specs[i].output_len
            inst = router(instances)
            inst.add_request(req)
            self._kick(loop, inst, lambda inst, finished: None)

        self._arrivals(loop, specs, arrive)
        loop.run()
        result = collect_result(records, instances, self.describe())
        if pipelines and result.steps:
            span = max(s.end for s in result.steps) - min(s.start for s in result.steps)
            result.stage_utilization = [p.utilization(span) for p in pipelines]
        return result

    def _replicas(self, loop: EventLoop) -> tuple[list[SimInstance], list[Pipeline]]:
        """One engine per replica; under pipeline parallelism, p virtual engines per replica sharing its
        stages, each with 1/p of its KV blocks (vLLM V0's split), listed engine-major so that the router
        deals requests over replicas first."""
        p = self.cost_model.pipeline_parallel_size
        if p == 1:
            return [self._instance(f"replica-{i}") for i in range(self.num_replicas)], []
        pipelines = [Pipeline(p) for _ in range(self.num_replicas)]
        clock = lambda: loop.now  # noqa: E731  (a virtual engine's step starts at the loop's time)
        instances = [SimInstance(f"replica-{i}/engine-{v}", self.config, self.num_blocks // p,
                                 PipelineExecutor(self.executor, pipelines[i], clock))
                     for v in range(p) for i in range(self.num_replicas)]
        return instances, pipelines


def collect_result(records: list[RequestRecord], instances: Sequence[SimInstance], label: str) -> SimResult:
    steps = [s for inst in instances for s in inst.steps]
    if len(instances) > 1:
        steps.sort(key=lambda s: s.start)
    return SimResult(records, steps, {inst.name: inst.steps for inst in instances}, label)


def simulate(workload: Sequence[RequestSpec], model: Any = "llama-2-7b", gpu: str | Accelerator = "h100",
             **kwargs: Any) -> SimResult:
    """One-call form of ``Simulator(model, gpu, **kwargs).run(workload)``."""
    return Simulator(model, gpu, **kwargs).run(workload)


# ------------------------------------------------------------------------------------------- sweeps
@dataclass
class SweepResult:
    """One run per request rate, same requests re-timed (``workload.with_rate``)."""

    rates: list[float]
    results: list[SimResult]
    slo: dict[str, float] | None = None

    @property
    def summaries(self) -> list[RunSummary]:
        return [r.summary(self.slo) for r in self.results]

    def goodput(self, ttft_ms: float | None = None, tpot_ms: float | None = None, target: float = 0.9
                ) -> float | None:
        """DistServe's goodput: the highest rate with >= ``target`` of requests meeting both SLOs
        (``metrics.max_rate_meeting_slo``; interpolated between the swept rates)."""
        slo = self.slo or {}
        ttft, tpot = ttft_ms or slo.get("ttft"), tpot_ms or slo.get("tpot")
        if ttft is None or tpot is None:
            raise ValueError("goodput needs both a TTFT and a TPOT SLO (e.g. ttft:500,tpot:50)")
        return max_rate_meeting_slo(self.rates, [r.requests for r in self.results], ttft, tpot, target)

    def table(self) -> str:
        """Rate, throughput, p99 TTFT / TPOT / ITL and SLO attainment, one line per rate."""
        head = f"{'rate':>8} {'req/s':>8} {'out tok/s':>10} {'p99 TTFT':>10} {'p99 TPOT':>10} {'p99 ITL':>9}"
        head += f" {'SLO met':>8}" if self.slo else ""
        lines = [head + "   (latencies in ms)"]
        for rate, s in zip(self.rates, self.summaries, strict=True):
            line = (f"{rate:>8g} {s.request_throughput:>8.2f} {s.output_throughput:>10.0f} "
                    f"{1e3 * s.ttft.p99:>10.1f} {1e3 * s.tpot.p99:>10.1f} {1e3 * s.itl.p99:>9.1f}")
            if self.slo:
                line += f" {100 * (s.slo_attainment or 0.0):>7.1f}%"
            lines.append(line)
        return "\n".join(lines)


def sweep(run: Callable[[Sequence[RequestSpec]], SimResult], workload: Sequence[RequestSpec],
          rates: Sequence[float], *, burstiness: float = 1.0, seed: int = 0,
          slo: dict[str, float] | None = None, progress: bool = True) -> SweepResult:
    """Run ``run`` (``Simulator.run`` or ``DisaggregatedCluster.run``) at each rate, with a progress bar."""
    from tqdm.auto import tqdm

    rates = sorted(float(r) for r in rates)
    results = [run(with_rate(workload, rate, burstiness, seed))
               for rate in tqdm(rates, desc="Simulating rates", disable=not progress, dynamic_ncols=True)]
    return SweepResult(rates, results, slo)
