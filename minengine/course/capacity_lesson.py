"""Lesson 09's measuring code: disaggregated pools vs colocation, and capacity plans from token streams.

Why a module: the notebook compares several cluster layouts at several request rates, derives a fleet
plan from the engine's records and checks it in the simulator; that logic is tested here
(tests/test_capacity_lesson.py) and reused by the lesson's widget, so the notebook stays a sequence of
short predict -> measure -> explain cells. Nothing here imports torch: every GPU-scale number comes from
``minengine.sim`` (the engine's own scheduler, each step priced by the roofline).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from minengine.core.records import RequestRecord, StepRecord
from minengine.metrics.stats import max_rate_meeting_slo, slo_attainment
from minengine.perf.roofline import CostModel
from minengine.sim.cluster import DisaggregatedCluster
from minengine.sim.simulator import SimResult, Simulator, kv_cache_blocks
from minengine.sim.workload import LogNormal, RequestSpec, synthetic_workload, with_rate

MODEL, GPU = "llama-3.1-8b", "h100-sxm"
LINKS_GB_S = {"NVLink (H100, one direction)": 450.0, "InfiniBand NDR 400G": 50.0, "100 GbE": 12.5,
              "25 GbE": 3.125, "10 GbE": 1.25}


# ------------------------------------------------------------------------------ token-stream statistics
@dataclass(frozen=True)
class StreamStats:
    """The seeds' capacity checklist, read off one run's records (rates per second of the run)."""

    duration: float
    request_rate: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    prompt_pct: dict[int, float]  # percentile -> tokens
    output_pct: dict[int, float]
    prompt_mean: float
    output_mean: float
    decoding_mean: float  # concurrent decoding sequences, time-weighted over steps
    decoding_p90: float
    kv_mean: float  # KV cache usage (0-1), time-weighted
    kv_max: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    prompt_lens: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    output_lens: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))

    def report(self) -> str:
        def pct(d: dict[int, float]) -> str:
            return ", ".join(f"p{q} {v:,.0f}" for q, v in d.items())

        return "\n".join([
            f"requests:           {self.request_rate:8.2f} /s over {self.duration:.1f} s",
            f"input tokens:       {self.input_tokens_per_s:8,.0f} /s   prompt lengths {pct(self.prompt_pct)}",
            f"output tokens:      {self.output_tokens_per_s:8,.0f} /s   output lengths "
            f"{pct(self.output_pct)}",
            f"decoding sequences: {self.decoding_mean:8.1f} on average, p90 {self.decoding_p90:.0f}",
            f"KV cache usage:     {100 * self.kv_mean:7.1f} % on average, max {100 * self.kv_max:.1f} %",
            f"TTFT p50 / p99:     {1e3 * self.ttft_p50:8.1f} / {1e3 * self.ttft_p99:.1f} ms;  ITL p50 / p99 "
            f"{1e3 * self.itl_p50:.1f} / {1e3 * self.itl_p99:.1f} ms",
        ])

    def with_prompts_scaled(self, factor: float) -> StreamStats:
        """The same traffic with every prompt ``factor`` times as long (twice the retrieved documents, a
        longer system prompt), answers and rates unchanged: what a prompt-design decision does to the plan."""
        prompts = np.maximum(1, np.rint(self.prompt_lens * factor)).astype(int)
        return replace(self, prompt_lens=prompts, prompt_mean=float(prompts.mean()),
                       input_tokens_per_s=self.input_tokens_per_s * factor,
                       prompt_pct={q: float(np.percentile(prompts, q)) for q in self.prompt_pct})


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, q * cum[-1])])


def stream_stats(requests: Sequence[RequestRecord], steps: Sequence[StepRecord]) -> StreamStats:
    """Token rates, length percentiles, decoding concurrency and KV usage from a run's records.

    Concurrency and KV usage are weighted by step duration (a 100 ms step holds its batch ten times
    longer than a 10 ms one), like a gauge sampled at a fixed interval would see them.
    """
    done = [r for r in requests if r.token_times]
    if not done or not steps:
        raise ValueError("need finished requests and their steps")
    start = min(r.arrival_time for r in done)
    end = max(r.token_times[-1] for r in done)
    span = max(end - start, 1e-9)
    prompts = np.array([r.num_prompt_tokens for r in done], float)
    outputs = np.array([r.num_output_tokens or len(r.token_times) for r in done], float)
    w = np.array([max(s.duration, 0.0) for s in steps])
    w = w if w.sum() > 0 else np.ones(len(steps))
    dec = np.array([s.num_decode_seqs for s in steps], float)
    kv = np.array([s.kv_usage for s in steps])
    ttft = np.array([r.ttft for r in done])
    itl = np.array([g for r in done for g in r.itls] or [math.nan])
    qs = (50, 90, 99)
    return StreamStats(
        duration=span, request_rate=len(done) / span, input_tokens_per_s=prompts.sum() / span,
        output_tokens_per_s=outputs.sum() / span,
        prompt_pct=dict(zip(qs, np.percentile(prompts, qs).tolist(), strict=True)),
        output_pct=dict(zip(qs, np.percentile(outputs, qs).tolist(), strict=True)),
        prompt_mean=float(prompts.mean()), output_mean=float(outputs.mean()),
        decoding_mean=float(np.average(dec, weights=w)), decoding_p90=_weighted_quantile(dec, w, 0.9),
        kv_mean=float(np.average(kv, weights=w)), kv_max=float(kv.max()),
        ttft_p50=float(np.median(ttft)), ttft_p99=float(np.percentile(ttft, 99)),
        itl_p50=float(np.nanmedian(itl)), itl_p99=float(np.nanpercentile(itl, 99)),
        prompt_lens=prompts.astype(int), output_lens=outputs.astype(int))


def resampled_workload(stats: StreamStats, rate: float, num_requests: int,
                       seed: int = 0) -> list[RequestSpec]:
    """The recorded traffic's lengths (drawn with replacement, pairs kept together) at Poisson ``rate``."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(stats.prompt_lens), num_requests)
    base = [RequestSpec(0.0, int(stats.prompt_lens[i]), int(stats.output_lens[i])) for i in idx]
    return with_rate(base, rate, seed=seed)


# ----------------------------------------------------------------------------- colocated vs disaggregated
def layouts(total_gpus: int) -> list[tuple[str, int]]:
    """("colocated", 0) and every prefill:decode split ("2P:2D", 2) of ``total_gpus`` GPUs."""
    return [("colocated", 0)] + [(f"{p}P:{total_gpus - p}D", p) for p in range(1, total_gpus)]


@dataclass
class PoolComparison:
    """Every layout run at every rate on the same requests; SLOs are applied afterwards, so one set of
    runs answers any (TTFT, TPOT) pair."""

    total_gpus: int
    rates: list[float]
    runs: dict[str, list[list[RequestRecord]]]  # layout -> records per rate

    def attainment(self, name: str, ttft_ms: float, tpot_ms: float) -> list[float]:
        return [slo_attainment(recs, {"ttft": ttft_ms, "tpot": tpot_ms}) for recs in self.runs[name]]

    def goodput(self, ttft_ms: float, tpot_ms: float, target: float = 0.9) -> dict[str, float]:
        """DistServe's goodput (highest rate with >= target meeting both SLOs) per GPU, per layout;
        0 where even the lowest rate misses."""
        out = {}
        for name, runs in self.runs.items():
            g = max_rate_meeting_slo(self.rates, runs, ttft_ms, tpot_ms, target)
            out[name] = (g or 0.0) / self.total_gpus
        return out

    def best_split(self, ttft_ms: float, tpot_ms: float) -> tuple[str, float]:
        g = {k: v for k, v in self.goodput(ttft_ms, tpot_ms).items() if k != "colocated"}
        name = max(g, key=lambda k: g[k])
        return name, g[name]

    def table(self, slos: Sequence[tuple[float, float]]) -> str:
        head = f"{'layout':>10} " + " ".join(f"{f'TTFT {a:g} / TPOT {b:g} ms':>24}" for a, b in slos)
        rows = [head, f"{'':>10} " + " ".join(f"{'goodput per GPU (req/s)':>24}" for _ in slos)]
        good = [self.goodput(a, b) for a, b in slos]
        for name in self.runs:
            rows.append(f"{name:>10} " + " ".join(f"{g[name]:>24.1f}" for g in good))
        return "\n".join(rows)


def make_layout(name: str, prefill: int, total_gpus: int, budget: int = 512, *, model: str = MODEL,
                gpu: str = GPU, link_gb_s: float = 50.0) -> Callable[[Sequence[RequestSpec]], SimResult]:
    """A ``run(workload)`` for a layout: ``total_gpus`` colocated replicas with chunked prefill at
    ``budget`` tokens, or ``prefill`` prefill + the rest decode instances (least-loaded routing)."""
    if prefill == 0:
        return Simulator(model, gpu, num_replicas=total_gpus, router="least_loaded",
                         max_num_batched_tokens=budget).run
    return DisaggregatedCluster(model, gpu, prefill, total_gpus - prefill, router="least_loaded",
                                link_bandwidth=link_gb_s * 1e9, max_num_batched_tokens=max(budget, 2048)).run


def steady(workload: Sequence[RequestSpec], rate: float, min_seconds: float,
           seed: int = 0) -> list[RequestSpec]:
    """The workload re-timed to ``rate``, repeated until arrivals span at least ``min_seconds``: a run
    shorter than a request's own life measures a burst, not a steady load."""
    n = max(len(workload), math.ceil(rate * min_seconds))
    specs = [workload[i % len(workload)] for i in range(n)]
    return with_rate(specs, rate, seed=seed)


def compare_pools(workload: Sequence[RequestSpec], rates: Sequence[float], total_gpus: int = 4,
                  budget: int = 512, *, model: str = MODEL, gpu: str = GPU, link_gb_s: float = 50.0,
                  names: Sequence[str] | None = None, progress: bool = True, min_seconds: float = 4.0
                  ) -> PoolComparison:
    """Run each layout (all, or those in ``names``) at each rate: the same requests re-timed, repeated
    so that arrivals last at least ``min_seconds`` (``steady``)."""
    from tqdm.auto import tqdm

    chosen = [(n, p) for n, p in layouts(total_gpus) if names is None or n in names]
    rates = sorted(float(r) for r in rates)
    runs: dict[str, list[list[RequestRecord]]] = {}
    bar = tqdm(total=len(chosen) * len(rates), desc="simulating layouts", disable=not progress)
    for name, prefill in chosen:
        run = make_layout(name, prefill, total_gpus, budget, model=model, gpu=gpu, link_gb_s=link_gb_s)
        runs[name] = []
        for i, rate in enumerate(rates):
            runs[name].append(run(steady(workload, rate, min_seconds, seed=i)).requests)
            bar.update()
    bar.close()
    return PoolComparison(total_gpus, rates, runs)


def document_workload(num_requests: int, prompt_mean: float = 1024, output_mean: float = 128,
                      seed: int = 0) -> list[RequestSpec]:
    """Long-tailed prompts and outputs (log-normal, sigma 1 and 0.8), timed later by ``with_rate``."""
    return synthetic_workload(num_requests, 1.0, LogNormal(prompt_mean, 1.0, 6000),
                              LogNormal(output_mean, 0.8, 1500), seed=seed)


def transfer_seconds(prompt_tokens: float, link_gb_s: float, model: str = MODEL) -> float:
    """One request's KV cache over the link: prompt tokens x KV bytes per token / bandwidth."""
    shape = CostModel.create(model, GPU).model
    return prompt_tokens * shape.kv_bytes_per_token / (link_gb_s * 1e9)


def prefill_seconds(prompt_tokens: int, model: str = MODEL, gpu: str = GPU) -> float:
    """Roofline time of the prompt prefilled alone in one step (the work the transfer follows)."""
    return CostModel.create(model, gpu).prefill_cost(int(prompt_tokens)).time


# ------------------------------------------------------------------------------------- capacity plans
@dataclass(frozen=True)
class Plan:
    """A fleet for a traffic forecast: how many replicas, and each one's engine settings."""

    gpus: int
    max_num_seqs: int
    max_num_batched_tokens: int
    step_time: float  # predicted steady-state step (= TPOT) per replica
    decoding_per_gpu: float
    kv_tokens_per_gpu: float
    kv_capacity_tokens: int

    def describe(self) -> str:
        return (f"{self.gpus} GPUs, max_num_seqs {self.max_num_seqs}, max_num_batched_tokens "
                f"{self.max_num_batched_tokens}: predicted step {1e3 * self.step_time:.1f} ms with "
                f"{self.decoding_per_gpu:.0f} sequences decoding per GPU, KV "
                f"{100 * self.kv_tokens_per_gpu / self.kv_capacity_tokens:.0f} % full")


def steady_step(cost: CostModel, decoding: float, context: float, prefill_tokens_per_s: float,
                iterations: int = 40) -> float:
    """The step time t at which a replica keeps up: each step carries ``decoding`` decodes at KV length
    ``context`` and the prompt tokens that arrived during the previous step (prefill_tokens_per_s x t).
    Solved by fixed-point iteration; inf when prefill alone needs more than the whole GPU."""
    t = cost.decode_cost(max(1, round(decoding)), max(2, round(context))).time
    for _ in range(iterations):
        chunk = prefill_tokens_per_s * t
        chunks = ([(1, max(1, round(context)))] * max(1, round(decoding))
                  + ([(round(chunk), 0)] if chunk >= 1 else []))
        new = cost.step_time(chunks)
        if new > 10:  # diverging: the GPU cannot absorb the prompt stream
            return math.inf
        t = 0.5 * (t + new)
    return t


def token_plan(stats: StreamStats, rate: float, ttft_ms: float, tpot_ms: float, *, model: str = MODEL,
               gpu: str = GPU, headroom: float = 0.75, max_gpus: int = 64) -> Plan:
    """The smallest fleet whose replicas' steady step stays under ``headroom`` x the TPOT SLO.

    From the token streams: per GPU, prompt tokens arrive at rate x mean prompt / N per second, and by
    Little's law rate x mean output x step / N sequences are decoding (each gets one token per step),
    holding mean (prompt + output / 2) tokens of KV. The step time solves that fixed point on the roofline.
    max_num_seqs is twice the mean decoding count (steps carrying a prompt chunk are longer, so more
    sequences are decoding at once than the mean step suggests); the budget is the smallest one
    whose steps take prompt tokens 1.5x faster than they arrive and prefill the p90 prompt within a third
    of the TTFT SLO.
    """
    cost = CostModel.create(model, gpu)
    sim = Simulator(model, gpu)
    kv_cap = kv_cache_blocks(cost, sim.config) * sim.config.block_size
    context = stats.prompt_mean + stats.output_mean / 2
    for n in range(1, max_gpus + 1):
        prompt_tps = rate * stats.prompt_mean / n
        t = cost.decode_cost(1, int(context)).time
        decoding = 1.0
        for _ in range(30):  # concurrency depends on the step time and vice versa
            decoding = max(1.0, rate * stats.output_mean * t / n)
            t = steady_step(cost, decoding, context, prompt_tps)
            if not math.isfinite(t):
                break
        kv_tokens = decoding * context
        if math.isfinite(t) and t <= headroom * tpot_ms / 1e3 and kv_tokens <= 0.8 * kv_cap:
            seqs = 8 * math.ceil(2 * decoding / 8)  # twice the mean: steps with a prompt chunk run longer
            for budget in (256, 512, 1024, 2048, 4096):
                room = budget - seqs  # prompt tokens a full step can take next to its decodes
                full = cost.step_time([(1, int(context))] * seqs + [(max(1, room), 0)])
                keeps_up = room >= 1.5 * prompt_tps * full  # prompts arrive slower than steps take them
                if keeps_up and math.ceil(stats.prompt_pct[90] / room) * full <= ttft_ms / 1e3 / 3:
                    return Plan(n, seqs, budget, t, decoding, kv_tokens, kv_cap)
            # no budget both keeps up with the prompts and meets the TTFT SLO here: one more GPU
    raise ValueError(f"no fleet of up to {max_gpus} GPUs keeps TPOT under {tpot_ms} ms for this traffic")


def benchmark_capacity(ttft_ms: float, tpot_ms: float, prompt_len: int = 128, output_len: int = 128,
                       num_requests: int = 300,
                       rates: Sequence[float] = (20, 40, 60, 80, 100, 120, 150, 200, 260, 340),
                       *, model: str = MODEL, gpu: str = GPU, min_seconds: float = 3.0) -> float:
    """A "requests per second per GPU" figure as a benchmark reports it: the goodput of one GPU on
    fixed-length requests (vendor-style 128 in / 128 out), each rate run for ``min_seconds``."""
    base = synthetic_workload(num_requests, 1.0, prompt_len, output_len, seed=0)
    run = Simulator(model, gpu, max_num_batched_tokens=512).run
    records = [run(steady(base, r, min_seconds, seed=i)).requests for i, r in enumerate(rates)]
    return max_rate_meeting_slo(list(rates), records, ttft_ms, tpot_ms) or 0.0


def check_plan(workload: Sequence[RequestSpec], gpus: int, ttft_ms: float, tpot_ms: float, *,
               max_num_seqs: int = 256, budget: int = 512, model: str = MODEL, gpu: str = GPU
               ) -> tuple[float, SimResult]:
    """Simulate the fleet (``gpus`` colocated replicas, least-loaded routing): SLO attainment, result."""
    sim = Simulator(model, gpu, num_replicas=gpus, router="least_loaded", max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max(budget, max_num_seqs))
    result = sim.run(workload)
    return slo_attainment(result.requests, {"ttft": ttft_ms, "tpot": tpot_ms}), result
