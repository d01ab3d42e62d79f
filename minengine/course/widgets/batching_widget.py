"""Lesson 05's "what if" widget: scheduler, ``max_num_seqs``, request rate and answer spread in,
throughput, latency and empty slots out, on a simulated GPU.

Every change runs the simulator (the engine's own scheduler with the same ``StaticBatchPolicy`` or
decode-first policy the lesson measured on the real engine; steps priced by a datasheet roofline), a few
hundred requests in well under a second. Each setting is added to a frontier plot (throughput against
median TPOT), so a few changes trace lesson 05's throughput-latency curve for your own settings.

Like the other course widgets: PNG figures in a ``widgets.Image``, stable CSS classes (``me-bat-*``),
bad input becomes a friendly message (never an exception), and tests drive it without a browser: set
``.value`` on a control, then read ``.result``, ``.text``, ``.error`` or ``.history``.
"""

from __future__ import annotations

import html
import io
import math

import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from minengine.course.batching_lesson import SIM_MODEL, SimPoint, simulate_point
from minengine.course.widgets.common import error_message
from minengine.course.widgets.common import ms as _ms
from minengine.course.widgets.latency_widget import GPU_CHOICES

SEQS_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SCHEDULERS = {"continuous": "continuous (vLLM)", "static": "static (batch by batch)"}
MAX_RATE = 10_000.0
COLORS = {"continuous": "tab:blue", "static": "tab:red"}


def check_rate(rate: object) -> float:
    """A request rate in req/s: 0 means everything queued at once (returned as inf)."""
    try:
        value = float(rate)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"the request rate must be a number of requests per second, got {rate!r}") from None
    if math.isnan(value) or value < 0:
        raise ValueError(f"the request rate must be 0 (everything at once) or a positive number of requests "
                         f"per second, got {value:g}")
    if value > MAX_RATE:
        raise ValueError(f"{value:g} requests per second is beyond any single GPU; try a rate below "
                         f"{MAX_RATE:g}")
    return math.inf if value == 0 else value


def check_sigma(sigma: object) -> float:
    value = float(sigma)  # type: ignore[arg-type]
    if not math.isfinite(value) or not 0 <= value <= 2:
        raise ValueError(f"the answer-length spread σ must be between 0 and 2, got {value:g}")
    return value



class BatchingWidget:
    """GPU, scheduler, max_num_seqs, rate, spread -> a simulated run. ``w.widget`` is the box."""

    def __init__(self, gpu: str = "h100-sxm", scheduler: str = "continuous", max_num_seqs: int = 64,
                 rate: float = 0.0, sigma: float = 1.0, num_requests: int = 500) -> None:
        style, layout = {"description_width": "150px"}, widgets.Layout(width="380px")
        self.num_requests = num_requests
        self.gpu = widgets.Dropdown(options=[(v, k) for k, v in GPU_CHOICES.items()], value=gpu,
                                    description="GPU (simulated)", style=style,
                                    layout=layout).add_class("me-bat-gpu")
        self.scheduler = widgets.Dropdown(options=[(v, k) for k, v in SCHEDULERS.items()], value=scheduler,
                                          description="Scheduler", style=style,
                                          layout=layout).add_class("me-bat-scheduler")
        self.max_num_seqs = widgets.Dropdown(options=list(SEQS_CHOICES), value=max_num_seqs,
                                             description="max_num_seqs", style=style,
                                             layout=layout).add_class("me-bat-seqs")
        self.rate = widgets.FloatText(value=rate, description="Rate (req/s, 0 = all)",
                                      continuous_update=False, style=style,
                                      layout=layout).add_class("me-bat-rate")
        self.sigma = widgets.FloatSlider(value=sigma, min=0.0, max=2.0, step=0.25,
                                         description="Answer spread σ", continuous_update=False,
                                         readout_format=".2f", style=style,
                                         layout=layout).add_class("me-bat-sigma")
        self.clear_button = widgets.Button(description="Clear history").add_class("me-bat-clear")
        self.message = widgets.HTML().add_class("me-bat-message")
        self.summary = widgets.HTML().add_class("me-bat-summary")
        self.plot = widgets.Image(format="png",
                                  layout=widgets.Layout(max_width="100%")).add_class("me-bat-plot")
        self.figure = Figure(figsize=(10, 3.3), dpi=90, layout="constrained")
        FigureCanvasAgg(self.figure)
        self.ax_run, self.ax_frontier = self.figure.subplots(1, 2)

        self.result: SimPoint | None = None
        self.error: str | None = None
        self.text = ""
        self.history: list[tuple[str, SimPoint]] = []  # (gpu, point)
        self.controls = [self.gpu, self.scheduler, self.max_num_seqs, self.rate, self.sigma]
        for control in self.controls:
            control.observe(lambda _change: self.update(), names="value")
        self.clear_button.on_click(lambda _b: self.clear())
        inputs = widgets.HBox([widgets.VBox(self.controls[:3]),
                               widgets.VBox([*self.controls[3:], self.clear_button])],
                              layout=widgets.Layout(flex_flow="row wrap"))
        self.results = [self.summary, self.plot]
        self.widget = widgets.VBox([inputs, self.message, *self.results]).add_class("me-bat-widget")
        self.update()

    def update(self) -> None:
        """Simulate the current setting; bad input becomes a message, never an exception."""
        try:
            rate, sigma = check_rate(self.rate.value), check_sigma(self.sigma.value)
            if self.gpu.value not in GPU_CHOICES:
                raise ValueError(f"unknown GPU {self.gpu.value!r}: pick one of {', '.join(GPU_CHOICES)}")
            point = simulate_point(self.gpu.value, self.scheduler.value == "static",
                                   int(self.max_num_seqs.value), rate, self.num_requests, sigma=sigma)
        except ValueError as exc:
            self._show_error(str(exc))
            return
        except Exception as exc:  # a bug, but a notebook user should still see a sentence
            self._show_error(f"unexpected error ({type(exc).__name__}): {exc}")
            return
        self.error, self.result = None, point
        self.history.append((self.gpu.value, point))
        self.text = self._describe(point)
        self.message.value = ""
        self.summary.value = "<p>" + html.escape(self.text).replace("\n", "<br>") + "</p>"
        for part in self.results:
            part.layout.display = None
        self._draw(point)

    def clear(self) -> None:
        self.history = self.history[-1:]
        if self.result is not None:
            self._draw(self.result)

    def _describe(self, p: SimPoint) -> str:
        s, o = p.summary, p.occupancy
        rate = "all queued at once" if math.isinf(p.rate) else f"Poisson at {p.rate:g} req/s"
        return (f"{SIM_MODEL} on a simulated {GPU_CHOICES[self.gpu.value]}, {SCHEDULERS[p.label]} batching, "
                f"max_num_seqs {p.max_num_seqs}: {s.num_requests} requests, {rate}.\n"
                f"throughput {p.backlog_tok_s:,.0f} output tokens/s while requests queued "
                f"({s.output_throughput:,.0f} over the whole run, its drain included); "
                f"TTFT p50 {_ms(s.ttft.median)}, p99 {_ms(s.ttft.p99)}; TPOT p50 {_ms(s.tpot.median)}, "
                f"p99 {_ms(s.tpot.p99)}.\n"
                f"batch: {o.mean_running:.1f} requests per step on average; empty slots while requests "
                f"waited: {o.idle_while_waiting:.0%}; preemptions: {s.num_preemptions}.")

    def _show_error(self, text: str) -> None:
        self.error, self.result, self.text = text, None, text
        self.message.value = error_message(self.results, "me-bat-error", "Cannot simulate", text)

    def _draw(self, p: SimPoint) -> None:
        ax = self.ax_run
        ax.clear()
        steps = p.steps
        if steps:
            t0 = steps[0].start
            ax.step([s.start - t0 for s in steps], [s.num_running for s in steps], where="post",
                    color=COLORS[p.label], linewidth=0.8)
        ax.axhline(p.max_num_seqs, color="gray", linestyle=":", label=f"max_num_seqs {p.max_num_seqs}")
        ax.set(xlabel="simulated time (s)", ylabel="requests in the batch",
               title="this run: how full the batch is", ylim=(0, p.max_num_seqs * 1.1))
        ax.legend(fontsize=8, loc="lower right")

        ax = self.ax_frontier
        ax.clear()
        same = [q for gpu, q in self.history if gpu == self.gpu.value]
        for q in same:
            mine = q is p
            ax.plot([1000 * q.summary.tpot.median], [q.backlog_tok_s], "o", color=COLORS[q.label],
                    markersize=8 if mine else 5, markeredgecolor="k" if mine else "none")
            ax.annotate(str(q.max_num_seqs), (1000 * q.summary.tpot.median, q.backlog_tok_s),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")
        for name, color in COLORS.items():
            ax.plot([], [], "o", color=color, label=name)
        ax.set(xlabel="median TPOT (ms)", ylabel="output tokens/s (while queued)",
               title="your settings so far (labels: max_num_seqs)")
        ax.set_xlim(0, None)
        ax.set_ylim(0, None)
        ax.legend(fontsize=8, loc="lower right")
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        self.plot.value = buffer.getvalue()

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        return self.widget._repr_mimebundle_(**kwargs)
