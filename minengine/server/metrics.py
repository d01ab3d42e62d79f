"""Prometheus metrics for ``/metrics``, named like vLLM v1's so its dashboards and alerts carry over.

Names are vLLM's suffixes under the prefix ``minengine:`` (``minengine:time_to_first_token_seconds``,
``minengine:kv_cache_usage_perc``, ...); ``create_app(metrics_prefix="vllm")`` (``minengine serve
--metrics-prefix vllm``) exposes the exact ``vllm:`` names instead. Every metric carries vLLM's
``model_name`` label. Counters get prometheus' ``_total`` suffix on the wire, as vLLM's do.

Where the numbers come from (vLLM v1's definitions, ``vllm/v1/metrics/loggers.py``):

- request histograms (TTFT, ITL, TPOT, E2E, queue, prefill, decode, inference time) and the token
  counters are observed from each request's ``RequestRecord`` as its outputs stream out, so they use the
  engine's own timestamps: TTFT = engine arrival -> first token, like vLLM (arrival is stamped after the
  API server tokenized the prompt);
- running / waiting / KV usage / preemptions / prefix-cache queries and hits are read from the engine at
  scrape time, and ``iteration_tokens_total`` from the engine's step records since the last scrape.

Latency buckets are vLLM's with finer buckets added below its smallest one: a tiny model on a CPU has
millisecond latencies that would all land in vLLM's first bucket. Each app gets its own
``CollectorRegistry``, so several apps (tests, notebooks) can live in one process.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from minengine.engine.outputs import RequestOutput

_FINE = [0.001, 0.0025, 0.005]
TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
ITL_BUCKETS = _FINE + [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
]  # fmt: skip
REQUEST_LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.2] + [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
]  # fmt: skip
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def _1_2_5_buckets(limit: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to ``limit`` (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return out
            out.append(float(m * scale))
        scale *= 10


@dataclass
class RequestStats:
    """Per-request progress of the metrics: how many token stamps were already observed."""

    num_seen: int = 0
    finished: bool = False


class ServerMetrics:
    """All metrics of one app, in a registry of its own. ``render()`` is the /metrics body."""

    def __init__(self, engine: Any, model_name: str, prefix: str = "minengine") -> None:
        self.engine = engine
        self.prefix = prefix
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model_name}
        max_len = int(getattr(engine.config, "max_model_len", None) or 2048)

        def hist(name: str, doc: str, buckets: list[float]) -> Any:
            h = Histogram(f"{prefix}:{name}", doc, ["model_name"], buckets=buckets, registry=self.registry)
            return h.labels(model_name)

        def counter(name: str, doc: str) -> Any:
            return Counter(f"{prefix}:{name}", doc, ["model_name"], registry=self.registry).labels(model_name)

        self.ttft = hist(
            "time_to_first_token_seconds", "Time to first token (arrival -> first token).", TTFT_BUCKETS
        )
        self.itl = hist("inter_token_latency_seconds", "Gap between consecutive output tokens.", ITL_BUCKETS)
        self.tpot = hist(
            "request_time_per_output_token_seconds",
            "Per request (E2E - TTFT) / (output tokens - 1).",
            ITL_BUCKETS,
        )
        self.e2e = hist("e2e_request_latency_seconds", "Arrival -> last token.", REQUEST_LATENCY_BUCKETS)
        self.queue = hist(
            "request_queue_time_seconds",
            "Time in the WAITING state (arrival -> scheduled).",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill = hist(
            "request_prefill_time_seconds", "First scheduled -> first token.", REQUEST_LATENCY_BUCKETS
        )
        self.decode = hist(
            "request_decode_time_seconds", "First token -> last token.", REQUEST_LATENCY_BUCKETS
        )
        self.inference = hist(
            "request_inference_time_seconds", "First scheduled -> last token.", REQUEST_LATENCY_BUCKETS
        )
        self.request_prompt_tokens = hist(
            "request_prompt_tokens", "Prompt tokens per request.", _1_2_5_buckets(max_len)
        )
        self.request_generation_tokens = hist(
            "request_generation_tokens", "Output tokens per request.", _1_2_5_buckets(max_len)
        )
        self.iteration_tokens = hist(
            "iteration_tokens_total", "Tokens per engine step.", ITERATION_TOKENS_BUCKETS
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of requests that got a first token.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.request_success = Counter(
            f"{prefix}:request_success",
            "Finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        for reason in ("stop", "length", "abort"):
            self.request_success.labels(model_name, reason)
        self._last_step = 0
        self.registry.register(_EngineCollector(engine, prefix, model_name))

    # ---- per request ----
    def observe(self, out: RequestOutput, stats: RequestStats) -> None:
        """Record what is new in this output of a request (call for every output, in order)."""
        record, seen = out.record, stats.num_seen
        # Only the stamps since the last output (plus the one before, for the first gap); slicing is safe
        # while the engine thread appends, and keeps a long request from being copied at every token.
        recent = record.token_times[max(seen - 1, 0) :]
        new = recent[1:] if seen else recent
        if new:
            if seen == 0:
                self.ttft.observe(recent[0] - record.arrival_time)
                self.prompt_tokens.inc(record.num_prompt_tokens)
            for a, b in zip(recent, recent[1:], strict=False):
                self.itl.observe(b - a)
            self.generation_tokens.inc(len(new))
            stats.num_seen = seen + len(new)
        if out.finished and not stats.finished:
            self.finish(out, stats)

    def finish(self, out: RequestOutput, stats: RequestStats) -> None:
        stats.finished = True
        record = out.record
        reason = out.outputs[0].finish_reason or "abort"
        self.request_success.labels(self.labels["model_name"], reason).inc()
        if reason == "abort":
            return
        times = record.token_times  # final: the engine appends no more
        self.request_prompt_tokens.observe(record.num_prompt_tokens)
        self.request_generation_tokens.observe(len(times))
        if record.e2e is not None:
            self.e2e.observe(record.e2e)
        if record.tpot is not None:
            self.tpot.observe(record.tpot)
        scheduled = record.first_scheduled_time
        if record.queue_time is not None:
            self.queue.observe(record.queue_time)
        if times and scheduled is not None:
            self.prefill.observe(max(0.0, times[0] - scheduled))
            self.decode.observe(times[-1] - times[0])
            self.inference.observe(max(0.0, times[-1] - scheduled))

    def abort(self, stats: RequestStats) -> None:
        """A request that ended without a finished output (client gone): count it as aborted."""
        if not stats.finished:
            stats.finished = True
            self.request_success.labels(self.labels["model_name"], "abort").inc()

    # ---- scrape ----
    def render(self) -> bytes:
        self._observe_new_steps()
        return generate_latest(self.registry)

    def _observe_new_steps(self) -> None:
        """Feed steps finished since the last scrape into iteration_tokens_total (newest first, stopping
        at the last one seen, so a scrape costs the new steps only)."""
        records = getattr(self.engine, "step_records", None)
        if not records:
            return
        for _ in range(3):  # the engine thread may append while we read; then read again
            try:
                new = []
                for step in reversed(records):
                    if step.step <= self._last_step:
                        break
                    new.append(step)
                break
            except RuntimeError:
                continue
        else:
            return
        for step in new:
            self.iteration_tokens.observe(step.num_tokens)
        if new:
            self._last_step = new[0].step


class _EngineCollector(Collector):
    """Engine state read at scrape time: gauges and the engine's own cumulative counters."""

    def __init__(self, engine: Any, prefix: str, model_name: str) -> None:
        self.engine, self.prefix, self.model_name = engine, prefix, model_name

    def collect(self) -> Iterator[Metric]:
        engine, p, labels = self.engine, self.prefix, [self.model_name]
        scheduler = engine.scheduler
        gauges = [
            ("num_requests_running", "Requests in the running batch.", len(scheduler.running)),
            ("num_requests_waiting", "Requests waiting to be scheduled.", len(scheduler.waiting)),
            ("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).", engine.kv_cache_usage),
        ]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(f"{p}:{name}", doc, labels=["model_name"])
            g.add_metric(labels, float(value))
            yield g
        prefix_stats = engine.prefix_cache_stats
        counters = [
            ("num_preemptions", "Preemptions since start.", engine.num_preemptions),
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", prefix_stats["queries"]),
            ("prefix_cache_hits", "Prompt tokens found in the prefix cache.", prefix_stats["hits"]),
        ]
        spec = getattr(engine, "spec_decode_stats", None)
        if spec is not None:  # vLLM's names, exported only when speculative decoding is on
            counters += [
                ("spec_decode_num_drafts", "Decodes that verified drafts.", spec["num_drafts"]),
                ("spec_decode_num_draft_tokens", "Drafted tokens verified.", spec["num_draft_tokens"]),
                ("spec_decode_num_accepted_tokens", "Drafted tokens kept.", spec["num_accepted_tokens"]),
            ]
        for name, doc, value in counters:
            c = CounterMetricFamily(f"{p}:{name}", doc, labels=["model_name"])
            c.add_metric(labels, float(value))
            yield c
