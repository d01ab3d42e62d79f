"""Lesson 03's "what if" widget: request rate and prompt-length spread in, p50 / p99 TTFT out.

Every change runs the simulator (``minengine.sim``: the engine's own scheduler, each step priced by the
roofline of a datasheet GPU), so an answer for a few hundred requests takes a fraction of a second on a
laptop. Prompt lengths are log-normal with a fixed mean: the spread ``sigma`` changes the tail and not the
average, so what moves when you drag it is what averages hide. Each setting is also added to a history
plot (p50 and p99 TTFT against the load), so a few changes trace the curve of the lesson.

Like the other course widgets: figures are PNGs in a ``widgets.Image`` (no ipympl), every part has a
stable CSS class (``me-lat-*``) for the browser tests, bad input becomes a friendly message (never an
exception), and tests drive it without a browser: set ``.value`` on a control, then read ``.result``,
``.text``, ``.error`` or ``.history``.
"""

from __future__ import annotations

import html
import io
import math
from dataclasses import dataclass
from functools import lru_cache

import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from minengine.course.widgets.common import error_message
from minengine.course.widgets.common import ms as _ms
from minengine.sim.simulator import Simulator
from minengine.sim.workload import LogNormal, synthetic_workload

GPU_CHOICES = {"h100-sxm": "H100 SXM", "a100-80gb": "A100 80GB", "h200": "H200", "l4": "L4"}
PROMPT_CHOICES = (128, 256, 512, 1024, 2048)
MODEL = "llama-3.1-8b"
OUTPUT_MEAN = 128  # tokens, log-normal with sigma 0.5 (kept fixed: this widget is about prompts)
MAX_PROMPT = 16_384
MAX_RATE = 10_000.0


@dataclass(frozen=True)
class LatencyResult:
    """One simulated setting; latencies in seconds."""

    gpu: str
    rate: float
    sigma: float
    prompt_mean: int
    num_requests: int
    capacity: float  # requests/s the simulated GPU sustains for this mix (everything sent at once)
    ttft: np.ndarray
    ttft_mean: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float

    @property
    def load(self) -> float:
        return self.rate / self.capacity


@lru_cache(maxsize=16)
def _simulator(gpu: str) -> Simulator:
    return Simulator(MODEL, gpu, max_num_batched_tokens=2048)


def _workload(num_requests: int, rate: float, prompt_mean: int, sigma: float, seed: int) -> list:
    return synthetic_workload(num_requests, rate, input_len=LogNormal(prompt_mean, sigma, max_len=MAX_PROMPT),
                              output_len=LogNormal(OUTPUT_MEAN, 0.5, max_len=1024), seed=seed)


@lru_cache(maxsize=64)
def capacity(gpu: str, prompt_mean: int, sigma: float, num_requests: int = 1000, seed: int = 0) -> float:
    """Requests per second served when ``num_requests`` are sent at once (the run's makespan includes the
    drain of the last long answers, so steady Poisson traffic saturates somewhat above it)."""
    result = _simulator(gpu).run(_workload(num_requests, math.inf, prompt_mean, sigma, seed))
    return result.summary().request_throughput


def simulate_latency(gpu: str = "h100-sxm", rate: float = 20.0, sigma: float = 1.0, prompt_mean: int = 512,
                     num_requests: int = 1000, seed: int = 0) -> LatencyResult:
    """Simulate ``num_requests`` Poisson arrivals at ``rate`` req/s of ``MODEL`` on ``gpu``."""
    rate, sigma = _check_rate(rate), _check_sigma(sigma)
    if gpu not in GPU_CHOICES:
        raise ValueError(f"unknown GPU {gpu!r}: pick one of {', '.join(GPU_CHOICES)}")
    summary = _simulator(gpu).run(_workload(num_requests, rate, prompt_mean, sigma, seed)).summary()
    ttft = np.asarray(summary.ttft.values)
    return LatencyResult(gpu, rate, sigma, prompt_mean, num_requests, capacity(gpu, prompt_mean, sigma), ttft,
                         summary.ttft.mean, summary.ttft.median, summary.ttft.p90, summary.ttft.p99,
                         summary.tpot.median, summary.tpot.p99)


def _check_rate(rate: object) -> float:
    try:
        value = float(rate)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"the request rate must be a number of requests per second, got {rate!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"the request rate must be a positive number of requests per second (try 10 or 40),"
                         f" got {value:g}")
    if value > MAX_RATE:
        raise ValueError(f"{value:g} requests per second is beyond any single GPU; try a rate below "
                         f"{MAX_RATE:g} (the capacity shown below is a good guide)")
    return value


def _check_sigma(sigma: object) -> float:
    value = float(sigma)  # type: ignore[arg-type]
    if not math.isfinite(value) or not 0 <= value <= 3:
        raise ValueError(f"the spread sigma must be between 0 and 3, got {value:g}")
    return value


def _plain_log_ticks(axis: object) -> None:
    """1, 2, 5, 10, 20, 50... on a log axis, written as plain numbers (not 2x10^1)."""
    axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # type: ignore[attr-defined]
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # type: ignore[attr-defined]
    axis.set_minor_formatter(NullFormatter())  # type: ignore[attr-defined]



class LatencyWidget:
    """Rate, prompt spread, mean prompt and GPU -> simulated TTFT percentiles. ``w.widget`` is the box."""

    def __init__(self, rate: float = 20.0, sigma: float = 1.0, prompt_mean: int = 512, gpu: str = "h100-sxm",
                 num_requests: int = 1000) -> None:
        style, layout = {"description_width": "150px"}, widgets.Layout(width="380px")
        self.num_requests = num_requests
        self.rate = widgets.FloatText(value=rate, description="Request rate (req/s)", continuous_update=False,
                                      style=style, layout=layout).add_class("me-lat-rate")
        self.sigma = widgets.FloatSlider(value=sigma, min=0.0, max=2.0, step=0.1,
                                         description="Prompt spread σ", continuous_update=False,
                                         readout_format=".1f", style=style,
                                         layout=layout).add_class("me-lat-sigma")
        self.prompt = widgets.Dropdown(options=list(PROMPT_CHOICES), value=prompt_mean,
                                       description="Mean prompt (tokens)", style=style,
                                       layout=layout).add_class("me-lat-prompt")
        self.gpu = widgets.Dropdown(options=[(v, k) for k, v in GPU_CHOICES.items()], value=gpu,
                                    description="GPU (simulated)", style=style,
                                    layout=layout).add_class("me-lat-gpu")
        self.message = widgets.HTML().add_class("me-lat-message")
        self.summary = widgets.HTML().add_class("me-lat-summary")
        self.plot = widgets.Image(format="png",
                                  layout=widgets.Layout(max_width="100%")).add_class("me-lat-plot")
        self.figure = Figure(figsize=(10, 3.3), dpi=90, layout="constrained")
        FigureCanvasAgg(self.figure)
        self.ax_hist, self.ax_hist_rate = self.figure.subplots(1, 2)

        self.result: LatencyResult | None = None
        self.error: str | None = None
        self.text = ""
        self.history: list[LatencyResult] = []
        self.controls = [self.rate, self.sigma, self.prompt, self.gpu]
        for control in self.controls:
            control.observe(self._on_change, names="value")
        inputs = widgets.HBox([widgets.VBox(self.controls[:2]), widgets.VBox(self.controls[2:])],
                              layout=widgets.Layout(flex_flow="row wrap"))
        self.results = [self.summary, self.plot]
        self.widget = widgets.VBox([inputs, self.message, *self.results]).add_class("me-lat-widget")
        self.update()

    def _on_change(self, _change: dict) -> None:
        self.update()

    def update(self) -> None:
        """Simulate the current setting; bad input becomes a message, never an exception."""
        try:
            result = simulate_latency(self.gpu.value, self.rate.value, self.sigma.value, self.prompt.value,
                                      self.num_requests)
        except ValueError as exc:
            self._show_error(str(exc))
            return
        except Exception as exc:  # a bug, but a notebook user should still see a sentence
            self._show_error(f"unexpected error ({type(exc).__name__}): {exc}")
            return
        self.error, self.result = None, result
        self.history.append(result)
        self.text = self._describe(result)
        note = ""
        if result.load > 1.1:
            note = ("<div class='me-lat-warning'>note: this rate is above what the GPU serves with "
                    "everything sent at once, so the queue grows for as long as requests keep coming: these "
                    f"percentiles depend on how many requests the benchmark sends ({result.num_requests} "
                    "here), not on the server alone.</div>")
        self.message.value = note
        self.summary.value = "<p>" + html.escape(self.text).replace("\n", "<br>") + "</p>"
        for part in self.results:
            part.layout.display = None
        self._draw(result)

    def _describe(self, r: LatencyResult) -> str:
        gpu = GPU_CHOICES[r.gpu]
        return (f"{MODEL} on a simulated {gpu}: {r.num_requests} requests at {r.rate:g} req/s, prompts "
                f"log-normal with mean {r.prompt_mean} tokens and σ = {r.sigma:.1f}; load "
                f"{100 * r.load:.0f}% of the {r.capacity:.1f} req/s this GPU serves for this mix.\n"
                f"TTFT: mean {_ms(r.ttft_mean)}, p50 {_ms(r.ttft_p50)}, p90 {_ms(r.ttft_p90)}, "
                f"p99 {_ms(r.ttft_p99)} (p99 / p50 = {r.ttft_p99 / r.ttft_p50:.1f}x). "
                f"TPOT: p50 {_ms(r.tpot_p50)}, p99 {_ms(r.tpot_p99)}.")

    def _show_error(self, text: str) -> None:
        self.error, self.result, self.text = text, None, text
        self.message.value = error_message(self.results, "me-lat-error", "Cannot simulate", text)

    def _draw(self, r: LatencyResult) -> None:
        ax = self.ax_hist
        ax.clear()
        ms = 1000 * r.ttft
        bins = np.geomspace(max(ms.min(), 0.1), ms.max() * 1.01 + 0.1, 40)
        ax.hist(ms, bins=bins, color="0.7")
        for value, label, color in ((r.ttft_mean, "mean", "C3"), (r.ttft_p50, "p50", "C0"),
                                    (r.ttft_p99, "p99", "C1")):
            ax.axvline(1000 * value, color=color, linestyle="--", label=f"{label} {_ms(value)}")
        ax.set(xscale="log", xlabel="TTFT (ms, log scale)", ylabel="requests",
               title=f"this setting: {r.rate:g} req/s, σ = {r.sigma:.1f}")
        _plain_log_ticks(ax.xaxis)
        ax.legend(fontsize=8)

        ax = self.ax_hist_rate
        ax.clear()
        same = [h for h in self.history if (h.gpu, h.prompt_mean) == (r.gpu, r.prompt_mean)]
        for h in same:
            mine = h is r
            ax.plot([h.load], [1000 * h.ttft_p99], "o", color="C1", markersize=8 if mine else 5,
                    markeredgecolor="k" if mine else "none")
            ax.plot([h.load], [1000 * h.ttft_p50], "s", color="C0", markersize=7 if mine else 4,
                    markeredgecolor="k" if mine else "none")
            ax.annotate(f"σ {h.sigma:.1f}", (h.load, 1000 * h.ttft_p99), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        ax.plot([], [], "o", color="C1", label="p99 TTFT")
        ax.plot([], [], "s", color="C0", label="p50 TTFT")
        ax.axvline(1.0, color="k", linewidth=0.8, linestyle=":")
        ax.set(yscale="log", xlabel="load (rate / capacity)", ylabel="TTFT (ms, log scale)",
               title=f"your settings so far ({GPU_CHOICES[r.gpu]}, mean prompt {r.prompt_mean})")
        ax.set_xlim(0, max(1.2, max(h.load for h in same) * 1.1))
        ax.margins(y=0.25)
        _plain_log_ticks(ax.yaxis)
        ax.legend(fontsize=8, loc="upper left")
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        self.plot.value = buffer.getvalue()

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        return self.widget._repr_mimebundle_(**kwargs)
