"""Lesson 02's "what if" widget: a GPU, a model, a dtype, a batch and a context in; where each op lands out.

Every change prices one decode step (``batch`` sequences with ``context`` tokens of KV each) and one
prefill of a ``context``-token prompt with the per-op roofline (``minengine.perf.roofline``, the table
efficiencies of ``minengine.perf.efficiency``), and draws two plots: the chosen GPU's roofline with each
op at its arithmetic intensity and attainable FLOP/s, and the decode step's intensity against the batch,
with and without the KV reads, crossing the ridge at the critical batch B*. No torch, no engine: an
update takes a few milliseconds plus the redraw.

Like the other course widgets: figures are PNGs in a ``widgets.Image`` (no ipympl), every part has a
stable CSS class (``me-roof-*``) for the browser tests, bad input becomes a friendly message (never an
exception), and tests drive it without a browser: set ``.value`` on a control, then read ``.view``,
``.text`` or ``.error``.
"""

from __future__ import annotations

import html
import io
import math
from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from minengine.course.roofline_lesson import (
    OpPoint,
    context_limit,
    critical_batch,
    decode_intensity,
    ideal,
    roof,
    scaled_gpu,
    step_points,
)
from minengine.course.widgets.common import error_message
from minengine.perf.hardware import Accelerator, get_accelerator
from minengine.perf.roofline import CostModel, ModelShape

GPU_CHOICES = {"h100-sxm": "H100 SXM", "h200": "H200", "a100-80gb": "A100 80GB", "mi300x": "MI300X",
               "h100-2x-flops": "H100 with 2x FLOP/s (what-if)"}
MACHINE = "this-machine"
MODEL_CHOICES = ("llama-3.1-8b", "llama-2-7b", "qwen3-8b", "mistral-7b", "llama-3.1-70b")
DTYPE_CHOICES = ("bf16", "fp8", "fp32")
CONTEXT_CHOICES = (128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
MAX_BATCH = 65_536
COLORS = {"decode projections": "C0", "decode attention": "C3", "norms, element-wise (decode)": "C7",
          "prefill projections": "C2", "prefill attention": "C1"}


def _accelerator(gpu: str, machines: dict[str, Accelerator], dtype: str) -> Accelerator:
    if gpu == MACHINE:
        if dtype not in machines:
            raise ValueError(f"this machine was measured in {', '.join(machines) or 'no dtype'} only; pick "
                             "one of those, or a datasheet GPU")
        return machines[dtype]
    if dtype == "fp32":
        raise ValueError("the spec table has no fp32 peak (fp32 matmuls run on CUDA cores, not tensor "
                         "cores): pick bf16 or fp8 for a datasheet GPU, or 'this machine' for fp32")
    if gpu == "h100-2x-flops":
        return scaled_gpu("h100-sxm", flops=2.0, name="H100 SXM with 2x FLOP/s (what-if)")
    if gpu not in GPU_CHOICES:
        raise ValueError(f"unknown GPU {gpu!r}: pick one of {', '.join(GPU_CHOICES)}")
    return get_accelerator(gpu)


def _check_batch(batch: object) -> int:
    try:
        value = float(batch)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"the batch must be a whole number of sequences, got {batch!r}") from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise ValueError(f"the batch must be a whole number of sequences, at least 1 (try 1, 16 or 256), "
                         f"got {value:g}")
    if value > MAX_BATCH:
        raise ValueError(f"{value:g} sequences in one decode step is beyond any server; try at most "
                         f"{MAX_BATCH:,}")
    return int(value)


@dataclass(frozen=True)
class RooflineView:
    """One setting, priced: the ops' points, the ridge and the critical batches."""

    gpu: str
    model: str
    dtype: str
    batch: int
    context: int
    cost_model: CostModel
    points: list[OpPoint]
    bstar_weights: float  # weights only: the textbook "memory-bound until batch = ridge"
    bstar_kv: float  # with every byte of the step (KV reads, activations); inf when never
    context_limit: int | None  # longest context at which B* (with KV) is finite; None: any
    memory_needed: float  # weights + the batch's KV cache, bytes

    @property
    def ridge(self) -> float:
        return self.cost_model.ridge_point

    @property
    def fits(self) -> bool:
        return self.memory_needed <= self.cost_model.accelerator.memory_bytes


def roofline_view(gpu: str = "h100-sxm", model: str = "llama-3.1-8b", dtype: str = "bf16", batch: object = 16,
                  context: int = 4096, machines: dict[str, Accelerator] | None = None) -> RooflineView:
    """Price one decode step and one prefill of ``model`` on ``gpu``; raises ValueError on bad input."""
    b, machines = _check_batch(batch), machines or {}
    acc = _accelerator(gpu, machines, dtype)
    shape = ModelShape.from_model(model, dtype=dtype)
    cm = CostModel(acc, shape)
    if gpu == MACHINE:  # measured peaks: reached by the best kernels of the sweep, so no table efficiency
        cm = cm.with_(compute_efficiency=1.0, memory_efficiency=1.0)
    textbook = ideal(cm)
    memory = shape.weight_bytes + b * context * shape.kv_bytes_per_token
    return RooflineView(gpu, model, dtype, b, context, cm, step_points(cm, b, context, prompt=context),
                        critical_batch(textbook, context, include_kv=False),
                        critical_batch(textbook, context, include_kv=True), context_limit(textbook), memory)


def _count(x: float) -> str:
    return "never" if not math.isfinite(x) else f"{x:,.0f}"


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 else str(n)


def describe(v: RooflineView) -> str:
    """The view in words: ridge, each op's intensity and bound, B* with and without KV reads."""
    acc = v.cost_model.accelerator
    lines = [f"{v.model} ({v.dtype}) on {acc.name}: peak "
             f"{acc.bf16_tflops if v.dtype != 'fp8' else v.cost_model.peak_flops / 1e12:,.0f} TFLOP/s, "
             f"{acc.bandwidth_bytes_per_s / 1e12:.2f} TB/s, ridge {v.ridge:,.0f} FLOP/byte."]
    if v.cost_model.peak_flops < 1e13:  # a measured CPU: TFLOP/s would round to a digit or two
        lines[0] = (f"{v.model} ({v.dtype}) on {acc.name}: peak {v.cost_model.peak_flops / 1e9:,.0f} "
                    f"GFLOP/s, {acc.bandwidth_bytes_per_s / 1e9:.1f} GB/s, ridge {v.ridge:,.1f} FLOP/byte.")
    lines.append(f"Decode step, batch {v.batch}, context {v.context:,}; prefill of a {v.context:,}-token "
                 "prompt:")
    for p in v.points:
        lines.append(f"  {p.name}: {p.intensity:,.1f} FLOP/byte, {p.bound}-bound, {1e3 * p.seconds:,.3f} ms")
    limit = ("at any context" if v.context_limit is None else
             f"only below {v.context_limit:,} tokens of context" if v.context_limit else "at no context")
    lines.append(f"Critical batch B*: {_count(v.bstar_weights)} counting the weights only; "
                 f"{_count(v.bstar_kv)} with the KV reads at this context (decode can turn compute-bound "
                 f"{limit}).")
    if not v.fits:
        lines.append(f"Note: weights + this batch's KV cache need {v.memory_needed / 2**30:,.0f} GiB, more "
                     f"than the {acc.memory_bytes / 2**30:,.0f} GiB of one {acc.name}: the arithmetic holds, "
                     "the batch does not fit.")
    return "\n".join(lines)


class RooflineWidget:
    """GPU, model, dtype, batch and context -> each op on the roofline, and B*. ``w.widget`` is the box."""

    def __init__(self, gpu: str = "h100-sxm", model: str = "llama-3.1-8b", dtype: str = "bf16",
                 batch: int = 16, context: int = 4096,
                 machines: dict[str, Accelerator] | None = None) -> None:
        self.machines = dict(machines or {})
        style, layout = {"description_width": "120px"}, widgets.Layout(width="330px")
        gpus = [(label, key) for key, label in GPU_CHOICES.items()]
        if self.machines:
            gpus.append(("this machine (measured)", MACHINE))
        self.gpu = widgets.Dropdown(options=gpus, value=gpu, description="GPU", style=style,
                                    layout=layout).add_class("me-roof-gpu")
        self.model = widgets.Dropdown(options=list(MODEL_CHOICES), value=model, description="Model",
                                      style=style, layout=layout).add_class("me-roof-model")
        self.dtype = widgets.Dropdown(options=list(DTYPE_CHOICES), value=dtype, description="Weights dtype",
                                      style=style, layout=layout).add_class("me-roof-dtype")
        self.batch = widgets.IntText(value=batch, description="Batch (decode)", style=style,
                                     layout=layout).add_class("me-roof-batch")
        self.context = widgets.SelectionSlider(options=[(_tokens(c), c) for c in CONTEXT_CHOICES],
                                               value=context, description="Context (tokens)",
                                               continuous_update=False, style=style,
                                               layout=layout).add_class("me-roof-context")
        self.message = widgets.HTML().add_class("me-roof-message")
        self.summary = widgets.HTML().add_class("me-roof-summary")
        self.plot = widgets.Image(format="png",
                                  layout=widgets.Layout(max_width="100%")).add_class("me-roof-plot")
        self.figure = Figure(figsize=(10.5, 3.6), dpi=90, layout="constrained")
        FigureCanvasAgg(self.figure)
        self.ax_roof, self.ax_batch = self.figure.subplots(1, 2)

        self.view: RooflineView | None = None
        self.error: str | None = None
        self.text = ""
        self.controls = [self.gpu, self.model, self.dtype, self.batch, self.context]
        for control in self.controls:
            control.observe(self._on_change, names="value")
        inputs = widgets.HBox([widgets.VBox(self.controls[:3]), widgets.VBox(self.controls[3:])],
                              layout=widgets.Layout(flex_flow="row wrap"))
        self.results = [self.summary, self.plot]
        self.widget = widgets.VBox([inputs, self.message, *self.results]).add_class("me-roof-widget")
        self.update()

    def _on_change(self, _change: dict) -> None:
        self.update()

    def update(self) -> None:
        """Price the current setting; bad input becomes a message, never an exception."""
        try:
            view = roofline_view(self.gpu.value, self.model.value, self.dtype.value, self.batch.value,
                                 self.context.value, self.machines)
        except ValueError as exc:
            self._show_error(str(exc))
            return
        except Exception as exc:  # a bug, but a notebook user should still see a sentence
            self._show_error(f"unexpected error ({type(exc).__name__}): {exc}")
            return
        self.error, self.view, self.text = None, view, describe(view)
        self.message.value = ""
        self.summary.value = "<p>" + html.escape(self.text).replace("\n", "<br>") + "</p>"
        for part in self.results:
            part.layout.display = None
        self._draw(view)

    def _show_error(self, text: str) -> None:
        self.error, self.view, self.text = text, None, text
        self.message.value = error_message(self.results, "me-roof-error", "Cannot place this setting", text)

    def _draw(self, v: RooflineView) -> None:
        cm, acc = v.cost_model, v.cost_model.accelerator
        peak, bw = cm.peak_flops, acc.bandwidth_bytes_per_s
        ax = self.ax_roof
        ax.clear()
        xs = np.geomspace(0.05, 1e5, 200)
        ax.plot(xs, roof(xs, peak, bw), "k-", label=f"{acc.name} roof")
        if v.gpu != "h100-sxm" and v.gpu != MACHINE:
            h100 = get_accelerator("h100-sxm")
            ax.plot(xs, roof(xs, h100.bf16_tflops * 1e12, h100.bandwidth_bytes_per_s), ":", color="0.5",
                    label="H100 SXM roof")
        ax.axvline(v.ridge, color="k", linewidth=0.6, linestyle="--")
        ax.annotate(f"ridge {v.ridge:,.0f}", (v.ridge, peak), xytext=(4, -12), textcoords="offset points",
                    fontsize=8)
        for p in v.points:
            ax.plot([p.intensity], [p.flops_per_s], "o", color=COLORS.get(p.name, "C4"), markersize=8,
                    markeredgecolor="k", label=f"{p.name} ({p.bound})")
        ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)",
               ylabel="FLOP/s (attainable)", title=f"batch {v.batch}, context {v.context:,}")
        ax.set_ylim(peak * 1e-4, peak * 3)
        ax.legend(fontsize=7, loc="lower right")

        ax = self.ax_batch
        ax.clear()
        batches = np.unique(np.geomspace(1, 4096, 40).astype(int))
        textbook = ideal(cm)
        for include_kv, style, label in ((False, "--", "weights only"),
                                         (True, "-", f"with KV reads ({_tokens(v.context)})")):
            ax.plot(batches, [decode_intensity(textbook, int(b), v.context, include_kv) for b in batches],
                    style, color="C0", label=label)
        ax.axhline(v.ridge, color="k", linewidth=0.8, linestyle=":", label="ridge")
        for bstar, marker in ((v.bstar_weights, "v"), (v.bstar_kv, "o")):
            if math.isfinite(bstar) and bstar <= batches[-1]:
                ax.plot([bstar], [v.ridge], marker, color="C3", markersize=8)
                ax.annotate(f"B* {bstar:,.0f}", (bstar, v.ridge), xytext=(4, 6), textcoords="offset points",
                            fontsize=8, color="C3")
        ax.axvline(v.batch, color="C2", linewidth=1.0, label=f"your batch ({v.batch})")
        ax.set(xscale="log", yscale="log", xlabel="decode batch", ylabel="decode step FLOP/byte",
               title="decode step intensity vs batch")
        ax.legend(fontsize=7, loc="upper left")
        for axis in (*self.ax_roof._axis_map.values(), *self.ax_batch._axis_map.values()):
            axis.set_minor_locator(NullLocator())  # log axes' minor ticks cost most of a redraw
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        self.plot.value = buffer.getvalue()

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        return self.widget._repr_mimebundle_(**kwargs)
