"""Lesson 09's "what if" widget: prompt and output lengths, SLOs, GPUs and link in; goodput per GPU of
colocated serving and of every prefill:decode split out.

Each click on *Simulate* runs ``capacity_lesson.compare_pools`` (the engine's scheduler in the simulator,
Llama-3.1-8B on simulated H100s) at a handful of rates around a rough capacity guess, so one answer takes
a few seconds: a button, not live sliders. Like the other course widgets: the figure is a PNG in a
``widgets.Image``, every part has a stable CSS class (``me-cap-*``) for the browser tests, bad input is a
friendly message (never an exception), and tests drive it without a browser (set ``.value``, call
``.simulate()``, read ``.goodput``, ``.text`` or ``.error``).
"""

from __future__ import annotations

import html
import io
import math

import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from minengine.course import capacity_lesson as cl
from minengine.course.widgets.common import error_message

LOADS = (0.3, 0.6, 0.9, 1.2, 1.6, 2.2, 3.0)  # rates tried, as multiples of the capacity guess


def capacity_guess(prompt_mean: float, output_mean: float, gpus: int) -> float:
    """Requests/s of ``gpus`` GPUs from the roofline alone: prefill the prompt in a step of 8 prompts, then
    decode in a batch of 128 (rough middles of the range; only used to place the rates the simulator
    tries)."""
    cost = cl.CostModel.create(cl.MODEL, cl.GPU)
    prefill = cost.prefill_cost(int(prompt_mean), num_seqs=8).time / 8
    decode = cl.CostModel.create(cl.MODEL, cl.GPU).decode_cost(128, int(prompt_mean + output_mean / 2)).time
    return gpus / (prefill + output_mean * decode / 128)


def _number(value: object, what: str, low: float, high: float) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(x) or not low <= x <= high:
        raise ValueError(f"{what} must be between {low:g} and {high:g}, got {x:g}")
    return x


class CapacityWidget:
    """P:D split what-if. ``w.widget`` is the box; ``w.goodput`` maps layout -> req/s per GPU."""

    def __init__(self, prompt_mean: int = 1024, output_mean: int = 128, ttft_ms: float = 400,
                 tpot_ms: float = 10, gpus: int = 4, link_gb_s: float = 50.0, num_requests: int = 300,
                 run: bool = False) -> None:
        style, layout = {"description_width": "150px"}, widgets.Layout(width="330px")

        def box(cls: type, value: float, desc: str, css: str, **kw: object) -> widgets.Widget:
            return cls(value=value, description=desc, style=style, layout=layout, **kw).add_class(css)

        self.prompt = box(widgets.IntText, prompt_mean, "Mean prompt (tokens)", "me-cap-prompt")
        self.output = box(widgets.IntText, output_mean, "Mean output (tokens)", "me-cap-output")
        self.ttft = box(widgets.FloatText, ttft_ms, "TTFT SLO (ms)", "me-cap-ttft")
        self.tpot = box(widgets.FloatText, tpot_ms, "TPOT SLO (ms)", "me-cap-tpot")
        self.gpus = box(widgets.IntSlider, gpus, "GPUs in all", "me-cap-gpus", min=2, max=6)
        self.link = box(widgets.Dropdown, link_gb_s, "KV link", "me-cap-link",
                        options=[(f"{k} ({v:g} GB/s)", v) for k, v in cl.LINKS_GB_S.items()])
        self.button = widgets.Button(description="Simulate", button_style="primary").add_class("me-cap-run")
        self.message = widgets.HTML().add_class("me-cap-message")
        self.summary = widgets.HTML().add_class("me-cap-summary")
        self.plot = widgets.Image(format="png",
                                  layout=widgets.Layout(max_width="100%")).add_class("me-cap-plot")
        self.figure = Figure(figsize=(8, 3.0), dpi=90, layout="constrained")
        FigureCanvasAgg(self.figure)
        self.num_requests = num_requests
        self.goodput: dict[str, float] | None = None
        self.error: str | None = None
        self.text = ""
        self.button.on_click(lambda _b: self.simulate())
        controls = widgets.HBox([widgets.VBox([self.prompt, self.output, self.gpus]),
                                 widgets.VBox([self.ttft, self.tpot, self.link])],
                                layout=widgets.Layout(flex_flow="row wrap"))
        self.results = [self.summary, self.plot]
        self.widget = widgets.VBox([controls, self.button, self.message,
                                    *self.results]).add_class("me-cap-widget")
        for part in self.results:
            part.layout.display = "none"
        if run:
            self.simulate()

    def simulate(self) -> None:
        """Simulate the current setting; bad input becomes a message, never an exception."""
        try:
            prompt = int(_number(self.prompt.value, "the mean prompt", 16, 4096))
            output = int(_number(self.output.value, "the mean output", 2, 2048))
            ttft = _number(self.ttft.value, "the TTFT SLO", 10, 60_000)
            tpot = _number(self.tpot.value, "the TPOT SLO", 1, 1000)
            gpus = int(_number(self.gpus.value, "the number of GPUs", 2, 6))
            self.message.value = "<i>simulating…</i>"
            guess = capacity_guess(prompt, output, gpus)
            workload = cl.document_workload(self.num_requests, prompt, output)
            pools = cl.compare_pools(workload, [x * guess for x in LOADS], gpus, 512,
                                     link_gb_s=float(self.link.value), progress=False, min_seconds=2.5)
            good = pools.goodput(ttft, tpot)
            top = max(pools.rates) / gpus
        except ValueError as exc:
            self._show_error(str(exc))
            return
        except Exception as exc:  # a bug, but a notebook user should still see a sentence
            self._show_error(f"unexpected error ({type(exc).__name__}): {exc}")
            return
        self.error, self.goodput = None, good
        best = max(good, key=lambda k: good[k])
        lines = [f"{cl.MODEL} on {gpus} simulated H100s, {self.num_requests} requests (prompts ~{prompt}, "
                 f"outputs ~{output} tokens), SLO: 90 % within TTFT {ttft:g} ms and TPOT {tpot:g} ms.",
                 "goodput per GPU: " + ", ".join(f"{k} {'≥ ' if v >= top - 1e-9 else ''}{v:.1f}"
                                                 for k, v in good.items()) + " req/s"
                 + (" (≥: met the SLO at every rate tried)" if any(v >= top - 1e-9 for v in good.values())
                    else "")
                 + ".",
                 f"best: {best}" + ("" if good[best] > 0 else " (none meets the SLO even at the lowest rate "
                                                              "tried: loosen the SLO)")]
        self.text = "\n".join(lines)
        self.message.value = ""
        self.summary.value = "<p>" + html.escape(self.text).replace("\n", "<br>") + "</p>"
        for part in self.results:
            part.layout.display = None
        self._draw(good, best)

    def _show_error(self, text: str) -> None:
        self.error, self.goodput, self.text = text, None, text
        self.message.value = error_message(self.results, "me-cap-error", "Cannot simulate", text)

    def _draw(self, good: dict[str, float], best: str) -> None:
        self.figure.clear()
        ax = self.figure.subplots()
        names = list(good)
        colors = ["tab:gray" if n == "colocated" else "tab:blue" for n in names]
        bars = ax.bar(names, [good[n] for n in names], color=colors)
        bars[names.index(best)].set_edgecolor("k")
        bars[names.index(best)].set_linewidth(2)
        ax.set(ylabel="goodput per GPU (req/s)", title="highest rate with 90 % of requests inside both SLOs")
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        self.plot.value = buffer.getvalue()

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        return self.widget._repr_mimebundle_(**kwargs)
