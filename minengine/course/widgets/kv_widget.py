"""KV-cache calculator widget for the notebooks (lab 1): sliders in, a table and two plots out.

The figure is a plain matplotlib ``Figure`` rendered to PNG into a ``widgets.Image``, so it works in any
Jupyter front end without ipympl, and tests can drive it without a browser: set ``.value`` on a control,
then read ``.estimate``, ``.text`` or the figure's line data. Interactive parts carry stable CSS classes
(``me-kv-*``) for browser tests (tests/browser/). The layout is sized for a 1280x900 screen with
JupyterLab's file browser open: two columns of controls, then the answer in a sentence and the plot, so a
learner sees the picture change while moving a slider; the full table follows.
"""

from __future__ import annotations

import html
import io
import math
from pathlib import Path

import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from minengine.course.widgets.common import error_message
from minengine.kvcalc import (
    KV_CACHE_DTYPES,
    GiB,
    KVEstimate,
    estimate,
    format_bytes,
    kv_bytes_per_sequence,
    list_presets,
    load_model_spec,
)
from minengine.kvcalc.report import estimate_rows, explain, format_estimate, title
from minengine.perf.hardware import ACCELERATORS


def _token_label(n: int) -> str:
    if n <= 0:
        return "0"
    if n >= 2**20 and n % 2**19 == 0:
        return f"{n / 2**20:g}M"
    return f"{n // 1024}K" if n % 1024 == 0 else (f"{n / 1024:g}K" if n >= 1024 else str(n))


def _looks_like_hub_id(text: str) -> bool:
    """``org/name`` that is no file here: the calculator will fetch its config.json from the Hub."""
    return (text.count("/") == 1 and all(text.split("/")) and not text.endswith(".json")
            and not text.startswith((".", "/", "~")) and not Path(text).expanduser().exists())


# Log-spaced choices (1, 1.5, 2, 3, 4, 6, ... x): capacity questions span 512 to 1M tokens.
CONTEXT_CHOICES = sorted({m * 2**k for k in range(8, 21) for m in (2, 3)} - {3 * 2**20})
BATCH_CHOICES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]


class KVCalculatorWidget:
    """Pick a model, context, batch, KV dtype and GPU; see bytes, capacity, and where memory goes.

    Display it by leaving it last in a cell (or ``display(w)``); ``w.widget`` is the ipywidgets box.
    """

    def __init__(self, model: str = "llama-3.1-8b", context_len: int = 8192, batch_size: int = 16,
                 kv_cache_dtype: str = "auto", gpu: str = "h100-sxm", gpu_memory_utilization: float = 0.9,
                 tensor_parallel_size: int = 1) -> None:
        style = {"description_width": "110px"}
        layout = widgets.Layout(width="400px")
        self.model = widgets.Dropdown(options=list_presets(), value=model, description="Model",
                                      style=style, layout=layout).add_class("me-kv-model")
        self.config = widgets.Text(value="", description="or config.json", continuous_update=False,
                                   placeholder="path to config.json, or a hub id (org/name)",
                                   style=style, layout=layout).add_class("me-kv-config")
        self.context = widgets.SelectionSlider(options=[(_token_label(n), n) for n in CONTEXT_CHOICES],
                                               value=context_len, description="Context (tokens)",
                                               continuous_update=False, style=style,
                                               layout=layout).add_class("me-kv-context")
        self.batch = widgets.SelectionSlider(options=BATCH_CHOICES, value=batch_size, description="Batch",
                                             continuous_update=False, style=style,
                                             layout=layout).add_class("me-kv-batch")
        self.kv_dtype = widgets.Dropdown(options=list(KV_CACHE_DTYPES), value=kv_cache_dtype,
                                         description="KV dtype", style=style,
                                         layout=layout).add_class("me-kv-dtype")
        self.gpu = widgets.Dropdown(options=[(acc.name, key) for key, acc in ACCELERATORS.items()], value=gpu,
                                    description="GPU", style=style, layout=layout).add_class("me-kv-gpu")
        self.tp = widgets.Dropdown(options=[1, 2, 4, 8, 16], value=tensor_parallel_size,
                                   description="Tensor parallel", style=style,
                                   layout=layout).add_class("me-kv-tp")
        self.utilization = widgets.FloatSlider(value=gpu_memory_utilization, min=0.5, max=1.0, step=0.01,
                                               description="GPU mem. util.", continuous_update=False,
                                               readout_format=".2f", style=style,
                                               layout=layout).add_class("me-kv-utilization")
        self.message = widgets.HTML().add_class("me-kv-message")
        self.summary = widgets.HTML().add_class("me-kv-summary")
        self.table = widgets.HTML().add_class("me-kv-table")
        self.plot = widgets.Image(format="png",
                                  layout=widgets.Layout(max_width="100%")).add_class("me-kv-plot")

        self.figure = Figure(figsize=(10, 3.4), dpi=90, layout="constrained")
        FigureCanvasAgg(self.figure)
        self.ax_kv, self.ax_mem = self.figure.subplots(1, 2, width_ratios=[3, 2])

        self.estimate: KVEstimate | None = None
        self.error: str | None = None
        self.text = ""
        self.memory_parts: dict[str, float] = {}
        self.controls = [self.model, self.config, self.context, self.batch, self.kv_dtype, self.gpu, self.tp,
                         self.utilization]
        for control in self.controls:
            control.observe(self._on_change, names="value")
        # Two columns (they wrap on a narrow screen): what is served, then where it runs.
        inputs = widgets.HBox([widgets.VBox(self.controls[:4]), widgets.VBox(self.controls[4:])],
                              layout=widgets.Layout(flex_flow="row wrap"))
        self.results = [self.summary, self.plot, self.table]  # hidden while the input is unusable
        self.widget = widgets.VBox([inputs, self.message, *self.results]).add_class("me-kv-calculator")
        self.update()

    def _on_change(self, _change: dict) -> None:
        self.update()

    def update(self) -> None:
        """Recompute from the controls; bad input becomes a message, never an exception."""
        source = self.config.value.strip()
        if _looks_like_hub_id(source):  # fetching config.json can take seconds online: say what is happening
            self.message.value = (f"<div class='me-kv-busy'>looking up {html.escape(source)} on the Hugging "
                                  "Face Hub...</div>")
        try:
            spec = load_model_spec(source or self.model.value)
            est = estimate(spec, self.context.value, self.batch.value, kv_cache_dtype=self.kv_dtype.value,
                           tensor_parallel_size=self.tp.value, gpu=self.gpu.value,
                           gpu_memory_utilization=self.utilization.value)
        except ValueError as exc:  # KVCalcError and unknown accelerators: worded for people
            self._show_error(str(exc))
            return
        except Exception as exc:  # a bug, but a notebook user should still see a sentence
            self._show_error(f"unexpected error ({type(exc).__name__}): {exc}")
            return
        self.error, self.estimate = None, est
        self.text = format_estimate(est) + "\n\n" + explain(est)
        self.message.value = "".join(f"<div class='me-kv-warning'>note: {html.escape(w)}</div>"
                                     for w in est.warnings)
        self.summary.value = f"<b>{html.escape(title(est))}</b><p>{html.escape(explain(est))}</p>"
        self.table.value = "<table>" + "".join(self._row(*row) for row in estimate_rows(est)) + "</table>"
        for part in self.results:
            part.layout.display = None
        self._draw(est)

    @staticmethod
    def _row(label: str, value: str, note: str) -> str:
        """One table row; a batch that does not fit is red, the first thing a learner should notice."""
        alarm = " style='color:#b00020;font-weight:bold'" if label == "fits" and value == "NO" else ""
        return ("<tr><th style='text-align:left;padding-right:1em;white-space:nowrap'>"
                f"{html.escape(label)}</th>"
                f"<td style='padding-right:1em'{alarm}>{html.escape(value)}</td>"
                f"<td style='color:#666'>{html.escape(note)}</td></tr>")

    def _show_error(self, text: str) -> None:
        self.error, self.estimate, self.text = text, None, text
        self.message.value = error_message(self.results, "me-kv-error", "Cannot compute", text)

    def _draw(self, est: KVEstimate) -> None:
        ax = self.ax_kv
        ax.clear()
        top = max(est.context_len * 2, 16384)
        xs = [0] + [n for n in CONTEXT_CHOICES if n <= top]
        kw = dict(kv_cache_dtype=est.kv_cache_dtype, tensor_parallel_size=est.tensor_parallel_size,
                  block_size=est.block_size)
        ys = [est.batch_size * kv_bytes_per_sequence(est.spec, n, **kw) / GiB for n in xs]
        ax.plot(xs, ys, marker=".", label=f"KV cache, batch {est.batch_size}")
        ax.plot([est.context_len], [est.total_bytes / GiB], "o", color="C3", label="your setting")
        if est.kv_budget_bytes is not None:
            ax.axhline(est.kv_budget_bytes / GiB, color="C2", linestyle="--",
                       label=f"KV budget {format_bytes(est.kv_budget_bytes)}")
        # Linear axes on purpose: the cache grows linearly with context (and flattens under a window).
        step = 2 ** max(int(math.log2(top / 5)), 0)
        ax.set_xticks(range(0, top + 1, step), [_token_label(n) for n in range(0, top + 1, step)])
        ax.set_xlim(0, None)
        ax.set_ylim(0, None)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("GiB per GPU")
        ax.set_title("KV cache vs context")
        ax.legend(fontsize=8)

        ax = self.ax_mem
        ax.clear()
        total = est.gpu.memory_bytes / GiB if est.gpu else 0.0
        weights = (est.weight_bytes or 0) / GiB
        reserve = est.activation_reserve_bytes / GiB
        budget = (est.kv_budget_bytes or 0) / GiB
        kv = est.total_bytes / GiB
        parts = [("weights", weights, "C0"), ("activations reserve", reserve, "C7"),
                 ("KV in use", min(kv, budget), "C1"), ("KV free", max(budget - kv, 0.0), "C2"),
                 ("not used (utilisation)", max(total - weights - reserve - budget, 0.0), "0.85")]
        self.memory_parts = {label: width for label, width, _ in parts}  # GiB per GPU, for tests and lessons
        left = 0.0
        for label, width, color in parts:
            ax.barh([0], [width], left=left, color=color, label=f"{label} {width:.1f}")
            left += width
        if kv > budget:
            ax.barh([0], [kv - budget], left=weights + reserve + budget, color="C3", hatch="//", alpha=0.6,
                    label=f"KV over budget {kv - budget:.1f}")
        ax.axvline(total, color="k", linewidth=1)
        ax.set_yticks([])
        ax.set_xlabel("GiB per GPU")
        ax.set_title(f"{est.gpu.name if est.gpu else 'GPU'} memory ({total:.0f} GiB)")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        self.plot.value = buffer.getvalue()

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        return self.widget._repr_mimebundle_(**kwargs)


def kv_calculator(**kwargs: object) -> KVCalculatorWidget:
    """Build the widget (a function for notebooks: ``kv_calculator(model="qwen3-8b")``)."""
    return KVCalculatorWidget(**kwargs)  # type: ignore[arg-type]
