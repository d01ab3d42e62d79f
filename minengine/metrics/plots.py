"""matplotlib figures the lessons use to look inside a run.

Every function builds a ``matplotlib.figure.Figure`` directly (no pyplot): nothing global is touched, it
works headless, and a notebook shows the returned figure exactly once. Pass ``ax`` to draw into an axes
of your own (the function then returns that axes' figure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from minengine.core.records import RequestRecord, StepRecord
from minengine.metrics.stats import Distribution, RunSummary, summarize

PHASE_COLORS = {
    "schedule": "tab:purple",
    "prepare": "tab:orange",
    "forward": "tab:blue",
    "sample": "tab:green",
    "other": "tab:gray",
}
SEGMENT_COLORS = {"queue": "tab:gray", "prefill": "tab:orange", "decode": "tab:blue"}
METRIC_LABELS = {
    "ttft": "TTFT (ms)",
    "itl": "ITL (ms)",
    "tpot": "TPOT (ms)",
    "e2e": "E2E latency (ms)",
    "queue": "queue time (ms)",
}


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> Axes:
    return Figure(figsize=figsize, layout="constrained").add_subplot() if ax is None else ax


def plot_request_timeline(
    requests: Sequence[RequestRecord], *, max_requests: int | None = 100, ax: Axes | None = None
) -> Figure:
    """One row per request: queue, then prefill until the first token, then decode, with a tick per token.

    Rows follow arrival order (the first ``max_requests``); times are seconds from the first arrival.
    Shows how continuous batching overlaps requests and where a request waited.
    """
    rows = sorted(requests, key=lambda r: r.arrival_time)[:max_requests]
    height = 1.0 + 0.25 * len(rows)
    ax = _axes(ax, (9, min(max(height, 2.5), 12)))
    t0 = rows[0].arrival_time if rows else 0.0
    segments: dict[str, tuple[list[int], list[float], list[float]]] = {
        k: ([], [], []) for k in SEGMENT_COLORS
    }
    tick_x, tick_y = [], []
    for y, r in enumerate(rows):
        end = r.token_times[-1] if r.token_times else r.finish_time
        scheduled, first = r.first_scheduled_time, r.first_token_time
        spans = {
            "queue": (r.arrival_time, scheduled if scheduled is not None else end),
            "prefill": (scheduled, first if first is not None else end),
            "decode": (first, end),
        }
        for kind, (a, b) in spans.items():
            if a is not None and b is not None and b > a:
                ys, lefts, widths = segments[kind]
                ys.append(y)
                lefts.append(a - t0)
                widths.append(b - a)
        tick_x += [t - t0 for t in r.token_times]
        tick_y += [y] * len(r.token_times)
    for kind, (ys, lefts, widths) in segments.items():
        if ys:
            ax.barh(ys, widths, left=lefts, height=0.6, color=SEGMENT_COLORS[kind], label=kind)
    if tick_x:
        ax.scatter(tick_x, tick_y, marker="|", s=60, color="black", linewidths=0.8, label="token", zorder=3)
    ax.set_yticks(range(len(rows)), [r.request_id for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time since first arrival (s)")
    ax.set_ylabel("request")
    shown = f" (first {len(rows)} of {len(requests)})" if len(rows) < len(requests) else ""
    ax.set_title("Request timeline" + shown)
    if rows:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return ax.figure


def plot_step_gantt(steps: Sequence[StepRecord]) -> Figure:
    """Per step: where its time went (stacked phases, ms) and what it computed (prefill vs decode tokens).

    "other" is step time outside the four phases (bookkeeping). A long prefill step next to short decode
    steps is the stall chunked prefill removes.
    """
    fig = Figure(figsize=(10, 6), layout="constrained")
    ax_time, ax_tok = fig.subplots(2, 1, sharex=True)
    x = np.array([s.step for s in steps])
    bottom = np.zeros(len(steps))
    for phase, color in PHASE_COLORS.items():
        if phase == "other":
            busy = [s.t_schedule + s.t_prepare + s.t_forward + s.t_sample for s in steps]
            ms = np.array([max(0.0, s.duration - b) for s, b in zip(steps, busy, strict=True)]) * 1000
        else:
            ms = np.array([getattr(s, f"t_{phase}") for s in steps]) * 1000
        ax_time.bar(x, ms, bottom=bottom, color=color, label=phase, width=0.9)
        bottom += ms
    ax_time.set_ylabel("step time (ms)")
    ax_time.set_title("Engine steps")
    ax_time.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    prefill = np.array([s.num_prefill_tokens for s in steps])
    decode = np.array([s.num_decode_tokens for s in steps])
    ax_tok.bar(x, prefill, color="tab:orange", label="prefill tokens", width=0.9)
    ax_tok.bar(x, decode, bottom=prefill, color="tab:blue", label="decode tokens", width=0.9)
    ax_tok.set_ylabel("tokens in batch")
    ax_tok.set_xlabel("step")
    ax_tok.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return fig


def plot_kv_usage(steps: Sequence[StepRecord], *, ax: Axes | None = None) -> Figure:
    """KV-cache usage (% of blocks) over time, with a red x at each step that preempted a request."""
    ax = _axes(ax, (9, 3.5))
    t0 = steps[0].start if steps else 0.0
    t = np.array([s.end - t0 for s in steps])
    usage = np.array([100 * s.kv_usage for s in steps])
    ax.step(t, usage, where="post", color="tab:blue", label="KV cache usage")
    preempted = [i for i, s in enumerate(steps) if s.num_preempted]
    if preempted:
        ax.scatter(t[preempted], usage[preempted], marker="x", color="tab:red", label="preemption", zorder=3)
    ax.set_ylim(0, 105)
    ax.set_xlabel("time since first step (s)")
    ax.set_ylabel("KV blocks used (%)")
    ax.set_title("KV cache usage")
    ax.legend(loc="lower right", fontsize="small")
    return ax.figure


def plot_latency_cdf(
    runs: RunSummary
    | Sequence[RequestRecord]
    | Sequence[RunSummary]
    | Mapping[str, RunSummary | Sequence[RequestRecord]],
    metric: str = "ttft",
    *,
    slo_ms: float | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Empirical CDF of one metric ("ttft", "itl", "tpot", "e2e" or "queue") for one or several runs.

    ``runs`` is a summary, a list of records, a list of summaries, or a dict name -> either. ITL is the
    pooled per-token gaps (token-weighted), TPOT one value per request, as in :mod:`.stats`. A dashed
    line marks ``slo_ms``. Comparing whole curves shows tail effects that a mean hides.
    """
    if metric not in METRIC_LABELS:
        raise ValueError(f"unknown metric {metric!r}: use one of {', '.join(METRIC_LABELS)}")
    ax = _axes(ax, (7, 4))
    for name, dist in _named_distributions(runs, metric).items():
        values = np.sort(np.asarray(dist.values)) * 1000
        if values.size:
            frac = np.arange(values.size + 1) / values.size  # starts at 0 just before the smallest value
            ax.step(np.r_[values[0], values], frac, where="post", label=f"{name} (n={values.size})")
    if slo_ms is not None:
        ax.axvline(slo_ms, color="black", linestyle="--", linewidth=1, label=f"SLO {slo_ms:g} ms")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(METRIC_LABELS[metric])
    ax.set_ylabel("fraction of samples")
    ax.set_title(f"{metric.upper()} CDF")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    return ax.figure


def _named_distributions(runs: object, metric: str) -> dict[str, Distribution]:
    """Normalize the accepted inputs of :func:`plot_latency_cdf` to {name: distribution}."""
    if isinstance(runs, Mapping):
        named = dict(runs)
    elif isinstance(runs, RunSummary):
        named = {"run": runs}
    elif isinstance(runs, Sequence) and runs and all(isinstance(r, RunSummary) for r in runs):
        named = {f"run {i}": s for i, s in enumerate(runs)}
    elif isinstance(runs, Sequence):
        named = {"run": list(runs)}
    else:
        raise TypeError(f"expected summaries or request records, got {type(runs).__name__}")
    out = {}
    for name, run in named.items():
        summary = run if isinstance(run, RunSummary) else summarize(list(run))
        out[str(name)] = getattr(summary, metric)
    return out
