"""Lesson 10's "what if" widget: speculative decoding on a simulated GPU, over drafts, acceptance and batch.

Controls: GPU, drafts per step (``num_speculative_tokens``), the chance that each draft is kept, and the
batch size. Every change draws the roofline's closed form (``minengine.perf.speculative.estimate``) over
batch sizes 1 to 1,024 for that k and acceptance, and runs the simulator (the engine's own scheduler,
drafting and rollback; each verify step priced by the same roofline) at the chosen batch, so the curve
and one scheduled run sit side by side. The summary says where speculation stops paying.

Like the other course widgets: a PNG figure in a ``widgets.Image``, stable CSS classes (``me-spec-*``),
bad input becomes a sentence (never an exception), and tests drive it without a browser: set ``.value``
on a control, then read ``.result``, ``.text`` or ``.error``.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from minengine.course.widgets.common import error_message
from minengine.course.widgets.latency_widget import GPU_CHOICES
from minengine.perf.roofline import CostModel
from minengine.perf.speculative import breakeven_batch, estimate
from minengine.sim import RequestSpec, Simulator

MODEL = "llama-3.1-8b"
PROMPT, OUTPUT = 512, 128  # tokens per request of the simulated batch (all arrive together)
MAX_DRAFTS, MAX_BATCH = 8, 1024
CURVE_BATCHES = np.unique(np.geomspace(1, MAX_BATCH, 41).round().astype(int))


@dataclass(frozen=True)
class SpeculativeWhatIf:
    """One setting's answer: the closed form over batches, and the simulated run at the chosen batch."""

    gpu: str
    k: int
    acceptance_rate: float
    batch: int
    kv_capacity: int  # requests of this size the GPU's KV cache holds (the closed form ignores memory)
    curve: list[float]  # closed-form speedup at each of CURVE_BATCHES
    closed_form: float  # at the chosen batch
    simulated: float  # output tok/s with drafts / without, the chosen batch simulated
    tokens_per_step: float
    verify_over_decode: float  # the verify step's cost in decode steps, at the chosen batch
    breakeven: int | None  # the first power-of-two batch where it no longer pays


def check_drafts(k: object) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_DRAFTS:
        raise ValueError(f"drafts per step must be a whole number from 1 to {MAX_DRAFTS}, got {k!r}")
    return k


def check_acceptance(a: object) -> float:
    if not isinstance(a, (int, float)) or isinstance(a, bool) or not 0.0 <= a <= 1.0:
        raise ValueError(f"the acceptance rate is a chance per draft, from 0 to 1, got {a!r}")
    return float(a)


def check_batch(b: object) -> int:
    if not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= MAX_BATCH:
        raise ValueError(f"the batch must be a whole number of requests from 1 to {MAX_BATCH:,}, got {b!r}")
    return b


def decode_throughput(steps: list) -> float:
    """Output tokens per second over the steps that only decode (prefill left out: the same in both runs,
    it would dilute the comparison): each decode yields its own token plus the drafts it kept."""
    decode = [s for s in steps if s.num_decode_seqs and not s.num_prefill_tokens]
    tokens = sum(s.num_decode_seqs + s.num_accepted_tokens for s in decode)
    return tokens / sum(s.end - s.start for s in decode)


def kv_capacity(gpu: str, k: int) -> int:
    """How many requests of PROMPT + OUTPUT tokens (and k drafts) the simulated GPU's KV cache holds."""
    sim = Simulator(MODEL, gpu)
    return sim.num_blocks * sim.config.block_size // (PROMPT + OUTPUT + k)


def simulated_speedup(gpu: str, k: int, acceptance_rate: float, batch: int) -> float:
    """Decode-phase output tokens per second with drafts over without, ``batch`` requests arriving together
    (the requests that finish early leave a smaller batch behind: the simulator keeps that, the closed form
    does not)."""
    engine = dict(max_num_seqs=batch, max_num_batched_tokens=max(8192, (k + 1) * batch))
    work = [RequestSpec(0.0, PROMPT, OUTPUT) for _ in range(batch)]
    plain = decode_throughput(Simulator(MODEL, gpu, **engine).run(work).steps)
    spec = Simulator(MODEL, gpu, speculative_config={"method": "ngram", "num_speculative_tokens": k},
                     acceptance_rate=acceptance_rate, **engine)
    return decode_throughput(spec.run(work).steps) / plain


def what_if(gpu: str, k: int, acceptance_rate: float, batch: int) -> SpeculativeWhatIf:
    fits = kv_capacity(gpu, k)
    if batch > fits:
        raise ValueError(f"the KV cache of a simulated {GPU_CHOICES[gpu]} holds at most {fits:,} requests of "
                         f"{PROMPT + OUTPUT:,} tokens next to {MODEL}'s weights: pick a batch up to {fits:,}")
    cost_model = CostModel.create(MODEL, gpu)
    context = PROMPT + OUTPUT // 2
    curve = [estimate(cost_model, int(b), context, k, acceptance_rate).speedup for b in CURVE_BATCHES]
    at = estimate(cost_model, batch, context, k, acceptance_rate)
    return SpeculativeWhatIf(gpu, k, acceptance_rate, batch, fits, curve, at.speedup,
                             simulated_speedup(gpu, k, acceptance_rate, batch), at.tokens_per_step,
                             at.verify_time / at.decode_time,
                             breakeven_batch(cost_model, context, k, acceptance_rate, max_batch=MAX_BATCH))


class SpeculativeWidget:
    """GPU, drafts, acceptance, batch -> the speedup curve and one simulated run. ``w.widget`` is the box."""

    def __init__(self, gpu: str = "h100-sxm", k: int = 3, acceptance_rate: float = 0.7,
                 batch: int = 1) -> None:
        style, layout = {"description_width": "170px"}, widgets.Layout(width="380px")
        self.gpu = widgets.Dropdown(options=[(v, key) for key, v in GPU_CHOICES.items()], value=gpu,
                                    description="GPU (simulated)", style=style,
                                    layout=layout).add_class("me-spec-gpu")
        self.k = widgets.IntText(value=k, description="Drafts per step (k)", continuous_update=False,
                                 style=style, layout=layout).add_class("me-spec-k")
        self.acceptance = widgets.FloatText(value=acceptance_rate, description="Chance a draft is kept",
                                            continuous_update=False, style=style,
                                            layout=layout).add_class("me-spec-acceptance")
        self.batch = widgets.IntText(value=batch, description="Batch (requests)", continuous_update=False,
                                     style=style, layout=layout).add_class("me-spec-batch")
        self.message = widgets.HTML().add_class("me-spec-message")
        self.summary = widgets.HTML().add_class("me-spec-summary")
        self.plot = widgets.Image(format="png",
                                  layout=widgets.Layout(max_width="100%")).add_class("me-spec-plot")
        self.figure = Figure(figsize=(8, 3.3), dpi=90, layout="constrained")
        FigureCanvasAgg(self.figure)
        self.ax = self.figure.subplots()

        self.result: SpeculativeWhatIf | None = None
        self.error: str | None = None
        self.text = ""
        self.controls = [self.gpu, self.k, self.acceptance, self.batch]
        for control in self.controls:
            control.observe(lambda _change: self.update(), names="value")
        inputs = widgets.HBox([widgets.VBox(self.controls[:2]), widgets.VBox(self.controls[2:])],
                              layout=widgets.Layout(flex_flow="row wrap"))
        self.results = [self.summary, self.plot]
        self.widget = widgets.VBox([inputs, self.message, *self.results]).add_class("me-spec-widget")
        self.update()

    def update(self) -> None:
        """Answer the current setting; bad input becomes a message, never an exception."""
        try:
            result = what_if(self.gpu.value, check_drafts(self.k.value),
                             check_acceptance(self.acceptance.value), check_batch(self.batch.value))
        except ValueError as exc:
            self._show_error(str(exc))
            return
        except Exception as exc:  # a bug, but a notebook user should still see a sentence
            self._show_error(f"unexpected error ({type(exc).__name__}): {exc}")
            return
        self.error, self.result = None, result
        self.text = self._describe(result)
        self.message.value = ""
        self.summary.value = "<p>" + html.escape(self.text).replace("\n", "<br>") + "</p>"
        for part in self.results:
            part.layout.display = None
        self._draw(result)

    @staticmethod
    def _describe(r: SpeculativeWhatIf) -> str:
        verdict = "pays" if r.simulated > 1.0 else "costs"
        stops = (f"it stops paying from batch {r.breakeven:,} (closed form)" if r.breakeven is not None
                 else f"it still pays at batch {MAX_BATCH:,} (closed form)")
        return (f"{MODEL} on a simulated {GPU_CHOICES[r.gpu]}, {r.k} drafts a step, each kept with chance "
                f"{r.acceptance_rate:g}: {r.tokens_per_step:.2f} tokens per request per verify step.\n"
                f"batch {r.batch:,}: a verify step costs {r.verify_over_decode:.2f} decode steps; speedup "
                f"{r.closed_form:.2f}x (closed form), {r.simulated:.2f}x simulated with the engine's "
                f"scheduler: speculation {verdict} here.\n{stops}.")

    def _show_error(self, text: str) -> None:
        self.error, self.result, self.text = text, None, text
        self.message.value = error_message(self.results, "me-spec-error", "Cannot answer", text)

    def _draw(self, r: SpeculativeWhatIf) -> None:
        ax = self.ax
        ax.clear()
        ax.plot(CURVE_BATCHES, r.curve, "-", color="tab:blue", label="closed form (roofline)")
        ax.plot([r.batch], [r.simulated], "o", color="tab:orange", markeredgecolor="k", markersize=8,
                label="simulated run at your batch")
        ax.axhline(1.0, color="gray", linestyle=":", label="no speedup")
        if r.kv_capacity < MAX_BATCH:
            ax.axvspan(r.kv_capacity, MAX_BATCH, color="tab:red", alpha=0.1, label="KV cache too small")
        ax.set(xscale="log", xlabel="batch (requests decoding together)", ylabel="speedup (tok/s ratio)",
               title=f"k = {r.k}, acceptance {r.acceptance_rate:g}, {GPU_CHOICES[r.gpu]}",
               ylim=(0, max(max(r.curve), r.simulated) * 1.15))
        ax.legend(fontsize=8)
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        self.plot.value = buffer.getvalue()

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        return self.widget._repr_mimebundle_(**kwargs)
