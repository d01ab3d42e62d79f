"""Lesson 08's "what if" widget: the same measured rate sweep, read against SLOs of your choice.

A load test's records do not change when the SLO does, so this widget re-reads the requests that
``minengine bench`` measured at each rate (``RunSummary.requests``): for a TTFT and a TPOT limit and an
attainment target it shows the share of requests meeting both at each rate and the *goodput*
(DistServe's: the highest rate at which at least the target share meets them,
``metrics.max_rate_meeting_slo``). Tight SLOs move the knee to lower rates; loose ones up to the
throughput limit. Nothing is re-run, so it answers at once and needs no server.

Course-widget conventions: PNG figure in a ``widgets.Image``, ``me-goodput-*`` CSS classes for the
browser tests, friendly messages for bad input; drive it in tests by setting ``.value`` and reading
``.goodput`` / ``.text`` / ``.error``.
"""

from __future__ import annotations

import html
import io
import math
from collections.abc import Sequence

import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from minengine.course.widgets.common import error_message
from minengine.metrics.stats import RunSummary, max_rate_meeting_slo, slo_attainment


def _positive_ms(value: object, what: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value <= 0):
        raise ValueError(f"the {what} SLO must be a positive number of milliseconds, got {value!r}")
    return float(value)


class GoodputWidget:
    """TTFT SLO, TPOT SLO and target -> attainment per rate and goodput, from a measured sweep."""

    def __init__(self, rates: Sequence[float], summaries: Sequence[RunSummary], ttft_ms: float = 100.0,
                 tpot_ms: float = 20.0, target_percent: int = 90) -> None:
        if len(rates) != len(summaries) or not rates:
            raise ValueError("give one summary per rate (and at least one rate)")
        order = sorted(range(len(rates)), key=lambda i: rates[i])
        self.rates = [float(rates[i]) for i in order]
        self.summaries = [summaries[i] for i in order]
        style, layout = {"description_width": "140px"}, widgets.Layout(width="300px")
        self.ttft = widgets.FloatText(value=ttft_ms, description="TTFT SLO (ms)", continuous_update=False,
                                      style=style, layout=layout).add_class("me-goodput-ttft")
        self.tpot = widgets.FloatText(value=tpot_ms, description="TPOT SLO (ms)", continuous_update=False,
                                      style=style, layout=layout).add_class("me-goodput-tpot")
        self.target = widgets.IntSlider(value=target_percent, min=50, max=99, step=1,
                                        description="target (%)", continuous_update=False, style=style,
                                        layout=layout
                                        ).add_class("me-goodput-target")
        self.message = widgets.HTML().add_class("me-goodput-message")
        self.summary = widgets.HTML().add_class("me-goodput-summary")
        self.plot = widgets.Image(format="png", layout=widgets.Layout(max_width="100%")
                                  ).add_class("me-goodput-plot")
        self.figure = Figure(figsize=(7.5, 3), dpi=90, layout="constrained")
        FigureCanvasAgg(self.figure)
        self.ax = self.figure.subplots()
        self.goodput: float | None = None
        self.attainment: list[float] = []
        self.error: str | None = None
        self.text = ""
        for control in (self.ttft, self.tpot, self.target):
            control.observe(lambda _change: self.update(), names="value")
        self.results = [self.summary, self.plot]
        self.widget = widgets.VBox([widgets.HBox([self.ttft, self.tpot, self.target],
                                                 layout=widgets.Layout(flex_flow="row wrap")),
                                    self.message, *self.results]).add_class("me-goodput-widget")
        self.update()

    def update(self) -> None:
        try:
            ttft, tpot = _positive_ms(self.ttft.value, "TTFT"), _positive_ms(self.tpot.value, "TPOT")
        except ValueError as exc:
            self._show_error(str(exc))
            return
        target = self.target.value / 100
        slo = {"ttft": ttft, "tpot": tpot}
        self.attainment = [slo_attainment(s, slo) for s in self.summaries]
        self.goodput = max_rate_meeting_slo(self.rates, list(self.summaries), ttft, tpot, target)
        self.error = None
        met = ", ".join(f"{r:g}/s: {100 * a:.0f}%" for r, a in zip(self.rates, self.attainment, strict=True))
        if self.goodput is None:
            verdict = (f"no rate tested meets the SLOs for {self.target.value}% of requests, not even the "
                       f"lowest ({self.rates[0]:g} req/s): the SLO is tighter than this server's idle "
                       "latency")
        elif self.goodput >= self.rates[-1]:
            verdict = (f"every rate tested meets them: goodput is at least {self.rates[-1]:g} req/s (test "
                       "higher rates to find the knee)")
        else:
            verdict = f"goodput ≈ {self.goodput:.1f} req/s: above that, too many requests miss an SLO"
        self.text = (f"SLOs TTFT ≤ {ttft:g} ms and TPOT ≤ {tpot:g} ms for {self.target.value}% of requests: "
                     f"{verdict}. Requests meeting both, per rate: {met}.")
        self.message.value = ""
        self.summary.value = f"<p>{html.escape(self.text)}</p>"
        for part in self.results:
            part.layout.display = None
        self._draw(target)

    def _show_error(self, text: str) -> None:
        self.error, self.goodput, self.text = text, None, text
        self.message.value = error_message(self.results, "me-goodput-error", "Cannot compute", text)

    def _draw(self, target: float) -> None:
        ax = self.ax
        ax.clear()
        ax.plot(self.rates, [100 * a for a in self.attainment], "o-", label="requests meeting both SLOs")
        ax.axhline(100 * target, color="k", linestyle=":", label=f"target {100 * target:.0f}%")
        if self.goodput is not None:
            ax.axvline(self.goodput, color="tab:green", linestyle="--",
                       label=f"goodput {self.goodput:.1f} req/s")
        ax.set(xlabel="request rate (req/s)", ylabel="% of requests", ylim=(-3, 103),
               title="SLO attainment of the measured sweep")
        ax.legend(fontsize=8, loc="best")
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        self.plot.value = buffer.getvalue()

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        return self.widget._repr_mimebundle_(**kwargs)
