"""Run records and what is computed from them: summaries (vLLM's metric conventions) and traces.

The plotting helpers need matplotlib (the ``course`` extra), so they load on first use:
``from minengine.metrics import plot_latency_cdf`` works, and importing this package does not pull in
matplotlib.
"""

from __future__ import annotations

from typing import Any

from minengine.core.records import RequestRecord, StepRecord
from minengine.metrics.stats import (
    Distribution,
    RunSummary,
    max_rate_meeting_slo,
    meets_slo,
    parse_slo,
    slo_attainment,
    summarize,
)
from minengine.metrics.trace import to_chrome_trace

_PLOTS = ("plot_request_timeline", "plot_step_gantt", "plot_kv_usage", "plot_latency_cdf")

__all__ = [
    "Distribution",
    "RequestRecord",
    "RunSummary",
    "StepRecord",
    "max_rate_meeting_slo",
    "meets_slo",
    "parse_slo",
    "slo_attainment",
    "summarize",
    "to_chrome_trace",
    *_PLOTS,
]


def __getattr__(name: str) -> Any:
    if name in _PLOTS:
        from minengine.metrics import plots

        return getattr(plots, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
