"""Latency and throughput summaries of a run, computed from RequestRecords (and StepRecords).

The definitions follow vLLM's benchmark client (``vllm bench serve``, formerly
``benchmarks/benchmark_serving.py``) so numbers from minengine, its simulator and its HTTP bench client
compare directly with vLLM's:

- TTFT: arrival (or send) -> first generated token.
- ITL: every gap between consecutive output tokens (streamed chunks) of every request, pooled into one
  distribution, so long requests weigh more (token-weighted).
- TPOT: per request (E2E - TTFT) / (output tokens - 1), then one value per request (request-weighted);
  requests with fewer than 2 output tokens are left out. It excludes the first token.
- E2E: arrival -> last token. Queue time: arrival -> first scheduled (not in vLLM's client; the engine
  knows it).
- Goodput: completed requests meeting every given SLO (ttft / tpot / e2e, in ms) per second. As in vLLM,
  a request with fewer than 2 output tokens has TPOT 0 for the SLO check.

Other tools differ: guidellm's TPOT includes the first token and LLMPerf's ITL includes TTFT. Latency
distributions, token totals and throughput count completed requests only (vLLM counts successful ones);
aborted and unfinished requests appear in the counts and as misses in the SLO attainment.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from minengine.core.records import RequestRecord, StepRecord

SLO_METRICS = ("ttft", "tpot", "e2e")
_SLO_ALIASES = {"e2el": "e2e"}  # vLLM's --goodput calls it e2el
# RunSummary attribute -> vLLM's name in its saved JSON ("mean_ttft_ms", "p99_e2el_ms", ...)
_VLLM_NAMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el", "queue": "queue"}
_STAT_LABELS = {"mean": "Mean", "median": "Median", "p90": "P90", "p95": "P95", "p99": "P99"}


@dataclass
class Distribution:
    """Summary statistics of one latency metric, in seconds (``__str__`` shows milliseconds).

    ``values`` keeps the raw samples so CDFs and SLO checks can be redone later; it is left out of
    ``to_dict`` and the repr. An empty distribution has count 0 and NaN statistics.
    """

    count: int = 0
    mean: float = math.nan
    std: float = math.nan
    median: float = math.nan
    p90: float = math.nan
    p95: float = math.nan
    p99: float = math.nan
    min: float = math.nan
    max: float = math.nan
    values: list[float] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def from_values(cls, values: list[float] | np.ndarray) -> Distribution:
        """Percentiles use numpy's default linear interpolation, as vLLM's client does."""
        a = np.asarray(values, dtype=float)
        if a.size == 0:
            return cls()
        p90, p95, p99 = np.percentile(a, [90, 95, 99])
        return cls(
            count=int(a.size),
            mean=float(a.mean()),
            std=float(a.std()),
            median=float(np.median(a)),
            p90=float(p90),
            p95=float(p95),
            p99=float(p99),
            min=float(a.min()),
            max=float(a.max()),
            values=a.tolist(),
        )

    def to_dict(self) -> dict[str, Any]:
        """Statistics in seconds; NaN becomes None so the dict stays valid JSON."""
        return {f.name: _none_if_nan(getattr(self, f.name)) for f in fields(self) if f.name != "values"}

    def __str__(self) -> str:
        if not self.count:
            return "no samples"
        parts = [f"{k} {1000 * getattr(self, k):.2f}" for k in ("median", "p90", "p95", "p99", "min", "max")]
        return f"mean {1000 * self.mean:.2f} ms, {', '.join(parts)} (n={self.count})"


@dataclass
class RunSummary:
    """What a run achieved: latency distributions, counts, throughput, goodput and engine statistics.

    Throughputs are per second of ``duration``. Engine fields are None when no steps were given;
    ``time_split`` holds total seconds in schedule / prepare / forward / sample, and "other" (step time
    outside those phases: appending tokens, stop checks, freeing blocks).
    """

    ttft: Distribution
    itl: Distribution
    tpot: Distribution
    e2e: Distribution
    queue: Distribution
    num_requests: int
    completed: int
    aborted: int
    total_input_tokens: int
    total_output_tokens: int
    duration: float
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    slo: dict[str, float] | None = None
    request_goodput: float | None = None
    slo_attainment: float | None = None
    num_steps: int | None = None
    mean_batch_tokens: float | None = None
    max_kv_cache_usage: float | None = None
    num_preemptions: int | None = None
    prefix_cache_hit_rate: float | None = None
    # speculative decoding (None when no step verified drafts): drafted tokens, of which kept
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    time_split: dict[str, float] | None = None
    requests: list[RequestRecord] = field(default_factory=list, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Flat dict with vLLM's saved-result keys ("mean_ttft_ms", "p99_itl_ms", "e2el" for E2E)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "requests":
                continue
            if isinstance(value, Distribution):
                name = _VLLM_NAMES[f.name]
                out[f"count_{name}"] = value.count
                for stat, v in value.to_dict().items():
                    if stat != "count":
                        out[f"{stat}_{name}_ms"] = None if v is None else 1000 * v
            else:
                out[f.name] = _none_if_nan(value) if isinstance(value, float) else value
        return out

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) lines of the table; a label ending in "#" is a section header."""
        rows = [
            ("Successful requests:", str(self.completed)),
            ("Aborted requests:", str(self.aborted)),
            ("Benchmark duration (s):", _num(self.duration)),
            ("Total input tokens:", str(self.total_input_tokens)),
            ("Total generated tokens:", str(self.total_output_tokens)),
            ("Request throughput (req/s):", _num(self.request_throughput)),
        ]
        if self.slo is not None:
            slo = ", ".join(f"{k} <= {v:g} ms" for k, v in self.slo.items())
            rows += [
                ("SLO:", slo),
                ("Request goodput (req/s):", _num(self.request_goodput)),
                ("SLO attainment (%):", _num(100 * (self.slo_attainment or 0.0))),
            ]
        rows += [
            ("Output token throughput (tok/s):", _num(self.output_throughput)),
            ("Total Token throughput (tok/s):", _num(self.total_token_throughput)),
        ]
        sections = [
            ("Time to First Token", "TTFT", self.ttft),
            ("Time per Output Token (excl. 1st token)", "TPOT", self.tpot),
            ("Inter-token Latency", "ITL", self.itl),
            ("End-to-end Latency", "E2EL", self.e2e),
            ("Queue Time", "Queue", self.queue),
        ]
        for title, short, dist in sections:
            rows.append((title + "#", ""))
            for stat, label in _STAT_LABELS.items():
                rows.append((f"{label} {short} (ms):", _num(1000 * getattr(dist, stat))))
        if self.num_steps is not None:
            rows += [
                ("Engine#", ""),
                ("Engine steps:", str(self.num_steps)),
                ("Mean batch tokens:", _num(self.mean_batch_tokens)),
                ("Max KV cache usage (%):", _num(100 * (self.max_kv_cache_usage or 0.0))),
                ("Preemptions:", str(self.num_preemptions)),
                (
                    "Prefix cache hit rate (%):",
                    "n/a" if self.prefix_cache_hit_rate is None else _num(100 * self.prefix_cache_hit_rate),
                ),
            ]
            if self.num_draft_tokens:  # vLLM's benchmark prints the same section when it speculates
                rate = (self.num_accepted_tokens or 0) / self.num_draft_tokens
                rows += [
                    ("Speculative Decoding#", ""),
                    ("Acceptance rate (%):", _num(100 * rate)),
                    ("Draft tokens:", str(self.num_draft_tokens)),
                    ("Accepted tokens:", str(self.num_accepted_tokens)),
                ]
            for phase, seconds in (self.time_split or {}).items():
                rows.append((f"Time in {phase} (s):", _num(seconds, 3)))
        return rows

    def format_table(self, title: str = "Serving Benchmark Result") -> str:
        """Text table laid out like vLLM's benchmark summary (40-column labels, 50-column rules)."""
        lines = [f" {title} ".center(50, "=")]
        for label, value in self.rows():
            if label.endswith("#"):
                lines.append(label[:-1].center(50, "-"))
            else:
                lines.append(f"{label:<40} {value}")
        lines.append("=" * 50)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format_table()

    def _repr_html_(self) -> str:
        cells = []
        for label, value in self.rows():
            if label.endswith("#"):
                cells.append(f'<th colspan="2" style="text-align:left">{html.escape(label[:-1])}</th>')
            else:
                cells.append(f"<td>{html.escape(label.rstrip(':'))}</td><td>{html.escape(value)}</td>")
        return "<table>" + "".join(f"<tr>{c}</tr>" for c in cells) + "</table>"


def summarize(
    requests: list[RequestRecord],
    steps: list[StepRecord] | None = None,
    *,
    duration: float | None = None,
    slo: dict[str, float] | None = None,
) -> RunSummary:
    """Summarize a run. ``duration`` defaults to first arrival -> last token or finish of any request.

    ``slo`` maps "ttft" / "tpot" / "e2e" to milliseconds (see :func:`parse_slo`); with it the summary
    reports vLLM's goodput and the fraction of all requests meeting every SLO.
    """
    done = [r for r in requests if _is_completed(r)]
    aborted = sum(r.finish_reason == "abort" for r in requests)
    if duration is None:
        duration = _default_duration(requests)
    total_in = sum(r.num_prompt_tokens for r in done)
    total_out = sum(_num_output(r) for r in done)

    def per_second(x: float) -> float:
        return x / duration if duration > 0 else math.nan

    summary = RunSummary(
        ttft=Distribution.from_values([r.ttft for r in done if r.ttft is not None]),
        itl=Distribution.from_values([gap for r in done for gap in r.itls]),
        tpot=Distribution.from_values([r.tpot for r in done if r.tpot is not None]),
        e2e=Distribution.from_values([r.e2e for r in done if r.e2e is not None]),
        queue=Distribution.from_values([r.queue_time for r in done if r.queue_time is not None]),
        num_requests=len(requests),
        completed=len(done),
        aborted=aborted,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        duration=duration,
        request_throughput=per_second(len(done)),
        output_throughput=per_second(total_out),
        total_token_throughput=per_second(total_in + total_out),
        requests=list(requests),
    )
    if slo is not None:
        slo = _check_slo(slo)
        good = sum(meets_slo(r, slo) for r in requests)
        summary.slo = slo
        summary.request_goodput = per_second(good)
        summary.slo_attainment = good / len(requests) if requests else math.nan
    if steps is not None:
        _add_step_stats(summary, steps)
    return summary


def _add_step_stats(summary: RunSummary, steps: list[StepRecord]) -> None:
    """Engine-side numbers that only StepRecords know: batch sizes, KV pressure, where time went."""
    summary.num_steps = len(steps)
    summary.mean_batch_tokens = float(np.mean([s.num_tokens for s in steps])) if steps else 0.0
    summary.max_kv_cache_usage = max((s.kv_usage for s in steps), default=0.0)
    summary.num_preemptions = sum(s.num_preempted for s in steps)
    queries = sum(s.prefix_cache_queries for s in steps)
    summary.prefix_cache_hit_rate = sum(s.prefix_cache_hits for s in steps) / queries if queries else None
    drafted = sum(s.num_draft_tokens for s in steps)
    if drafted:
        summary.num_draft_tokens = drafted
        summary.num_accepted_tokens = sum(s.num_accepted_tokens for s in steps)
    split = {
        "schedule": sum(s.t_schedule for s in steps),
        "prepare": sum(s.t_prepare for s in steps),
        "forward": sum(s.t_forward for s in steps),
        "sample": sum(s.t_sample for s in steps),
    }
    split["other"] = max(0.0, sum(s.duration for s in steps) - sum(split.values()))
    summary.time_split = split


def meets_slo(record: RequestRecord, slo: dict[str, float]) -> bool:
    """Whether a completed request meets every SLO in ``slo`` (ms), with vLLM's goodput rules.

    A request with fewer than 2 output tokens counts TPOT as 0; one without any token has no TTFT and
    misses a TTFT SLO. Aborted and unfinished requests never meet it.
    """
    if not _is_completed(record):
        return False
    values = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2e": record.e2e}
    for metric, limit_ms in _check_slo(slo).items():
        value = values[metric]
        if value is None or value * 1000 > limit_ms:
            return False
    return True


def slo_attainment(requests: RunSummary | list[RequestRecord], slo: dict[str, float]) -> float:
    """Fraction (0-1) of all requests that completed and met every SLO (DistServe's SLO attainment)."""
    records = requests.requests if isinstance(requests, RunSummary) else requests
    if not records:
        return math.nan
    return sum(meets_slo(r, slo) for r in records) / len(records)


def max_rate_meeting_slo(
    rates: list[float],
    summaries: list[RunSummary] | list[list[RequestRecord]],
    ttft_ms: float,
    tpot_ms: float,
    target: float = 0.9,
    *,
    interpolate: bool = True,
) -> float | None:
    """DistServe's goodput: the highest request rate at which >= ``target`` of requests meet both SLOs.

    ``summaries[i]`` is the run at ``rates[i]``. Rates are walked in increasing order up to the first
    one that misses the target (later recoveries are treated as noise). With ``interpolate`` the answer
    is the linear interpolation, between that rate and the last one that met the target, of where
    attainment crosses ``target``; without it, the last measured rate that met it. If every rate meets
    the target, the highest rate is returned (no extrapolation); if the lowest misses, None.
    (Zhong et al., "DistServe", OSDI 2024, section 2.)
    """
    slo = {"ttft": ttft_ms, "tpot": tpot_ms}
    curve = sorted((rate, slo_attainment(s, slo)) for rate, s in zip(rates, summaries, strict=True))
    best: tuple[float, float] | None = None
    for rate, attained in curve:
        if attained >= target:
            best = (rate, attained)
            continue
        if best is None:
            return None
        if not interpolate:
            return best[0]
        (r0, a0), (r1, a1) = best, (rate, attained)
        return r0 + (a0 - target) / (a0 - a1) * (r1 - r0)
    return None if best is None else best[0]


def parse_slo(text: str) -> dict[str, float]:
    """Parse "ttft:200,tpot:50" (or vLLM's space-separated "ttft:200 tpot:50") into {metric: ms}."""
    slo: dict[str, float] = {}
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        key, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"bad SLO item {item!r}: expected metric:milliseconds, e.g. 'ttft:200'")
        key = _SLO_ALIASES.get(key.strip().lower(), key.strip().lower())
        if key in slo:
            raise ValueError(f"SLO for {key!r} given twice in {text!r}")
        try:
            slo[key] = float(value)
        except ValueError:
            raise ValueError(f"bad SLO value {value!r} for {key!r}: expected milliseconds") from None
    if not slo:
        raise ValueError(f"empty SLO {text!r}: expected e.g. 'ttft:200,tpot:50'")
    return _check_slo(slo)


def _check_slo(slo: dict[str, float]) -> dict[str, float]:
    out = {}
    for key, value in slo.items():
        key = _SLO_ALIASES.get(key, key)
        if key not in SLO_METRICS:
            raise ValueError(f"unknown SLO metric {key!r}: use one of {', '.join(SLO_METRICS)}")
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"SLO for {key!r} must be a positive number of milliseconds, got {value}")
        out[key] = float(value)
    return out


def _is_completed(r: RequestRecord) -> bool:
    return r.finish_reason is not None and r.finish_reason != "abort"


def _num_output(r: RequestRecord) -> int:
    return r.num_output_tokens or len(r.token_times)


def _default_duration(requests: list[RequestRecord]) -> float:
    if not requests:
        return 0.0
    start = min(r.arrival_time for r in requests)
    ends = [t for r in requests for t in (r.finish_time, r.token_times[-1] if r.token_times else None)]
    ends = [t for t in ends if t is not None]
    return max(ends, default=start) - start


def _none_if_nan(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else x


def _num(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.{digits}f}"
