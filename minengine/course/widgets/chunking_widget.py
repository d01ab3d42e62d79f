"""Lesson 06's "what if" widget: a long prompt joins N decoding streams on a simulated GPU.

Controls: GPU, ``max_num_batched_tokens`` (or chunking off), the policy (decode-first / prefill-first),
how many streams are decoding and how long the new prompt is. Every change runs the scenario of lesson
06 in the simulator (the engine's own scheduler; steps priced by a datasheet roofline) and reads it with
the same ``measure_interference`` the lesson uses on the real engine: the streams' longest gap and p99
ITL, and the long prompt's TTFT. Each setting adds a point to a trade-off plot (TTFT against ITL p99).

Like the other course widgets: PNG figures in a ``widgets.Image``, stable CSS classes (``me-chunk-*``),
bad input becomes a friendly message (never an exception), and tests drive it without a browser: set
``.value`` on a control, then read ``.result``, ``.text``, ``.error`` or ``.history``.
"""

from __future__ import annotations

import html
import io

import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from minengine.course.chunked_prefill_lesson import SIM_MAX_LEN, SIM_MODEL, Interference, sim_interference
from minengine.course.widgets.common import error_message
from minengine.course.widgets.common import ms as _ms
from minengine.course.widgets.latency_widget import GPU_CHOICES, _plain_log_ticks

BUDGET_CHOICES = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
POLICIES = {"decode_first": "decode-first (vLLM V1)", "prefill_first": "prefill-first (vLLM V0)"}
MAX_STREAMS = 256
MIN_PROMPT, MAX_PROMPT = 128, 16_384


def check_streams(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_STREAMS:
        raise ValueError(f"the number of decoding streams must be a whole number from 1 to {MAX_STREAMS}, "
                         f"got {n!r}")
    return n


def check_prompt(n: object) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not MIN_PROMPT <= n <= MAX_PROMPT:
        raise ValueError(f"the long prompt must be {MIN_PROMPT:,} to {MAX_PROMPT:,} tokens, got {n!r}")
    return n



class ChunkingWidget:
    """GPU, budget, policy, streams, prompt length -> the simulated spike and TTFT. ``w.widget`` is the
    box."""

    def __init__(self, gpu: str = "h100-sxm", budget: int | None = 2048, policy: str = "decode_first",
                 n_streams: int = 40, long_len: int = 8192) -> None:
        style, layout = {"description_width": "150px"}, widgets.Layout(width="380px")
        self.gpu = widgets.Dropdown(options=[(v, k) for k, v in GPU_CHOICES.items()], value=gpu,
                                    description="GPU (simulated)", style=style,
                                    layout=layout).add_class("me-chunk-gpu")
        self.budget = widgets.Dropdown(options=[("off (whole prompt in one step)", 0)]
                                       + [(f"{b:,} tokens", b) for b in BUDGET_CHOICES], value=budget or 0,
                                       description="Chunked prefill", style=style,
                                       layout=layout).add_class("me-chunk-budget")
        self.policy = widgets.Dropdown(options=[(v, k) for k, v in POLICIES.items()], value=policy,
                                       description="Policy", style=style,
                                       layout=layout).add_class("me-chunk-policy")
        self.streams = widgets.IntText(value=n_streams, description="Decoding streams",
                                       continuous_update=False, style=style,
                                       layout=layout).add_class("me-chunk-streams")
        self.prompt = widgets.IntText(value=long_len, description="Long prompt (tokens)",
                                      continuous_update=False, style=style,
                                      layout=layout).add_class("me-chunk-prompt")
        self.message = widgets.HTML().add_class("me-chunk-message")
        self.summary = widgets.HTML().add_class("me-chunk-summary")
        self.plot = widgets.Image(format="png",
                                  layout=widgets.Layout(max_width="100%")).add_class("me-chunk-plot")
        self.figure = Figure(figsize=(10, 3.3), dpi=90, layout="constrained")
        FigureCanvasAgg(self.figure)
        self.ax_run, self.ax_trade = self.figure.subplots(1, 2)

        self.result: Interference | None = None
        self.error: str | None = None
        self.text = ""
        self.history: list[tuple[tuple, Interference]] = []  # ((gpu, streams, prompt, policy), result)
        self.controls = [self.gpu, self.budget, self.policy, self.streams, self.prompt]
        for control in self.controls:
            control.observe(lambda _change: self.update(), names="value")
        inputs = widgets.HBox([widgets.VBox(self.controls[:3]), widgets.VBox(self.controls[3:])],
                              layout=widgets.Layout(flex_flow="row wrap"))
        self.results = [self.summary, self.plot]
        self.widget = widgets.VBox([inputs, self.message, *self.results]).add_class("me-chunk-widget")
        self.update()

    def _key(self) -> tuple:
        return (self.gpu.value, self.streams.value, self.prompt.value, self.policy.value)

    def update(self) -> None:
        """Simulate the current setting; bad input becomes a message, never an exception."""
        try:
            n, long_len = check_streams(self.streams.value), check_prompt(self.prompt.value)
            budget = int(self.budget.value) or None
            if budget is not None and budget <= n:
                raise ValueError(f"a budget of {budget} tokens leaves nothing for the prompt next to {n} "
                                 "decodes (they go first): pick a larger budget or fewer streams")
            if long_len >= SIM_MAX_LEN:
                raise ValueError(f"the prompt must be shorter than the context ({SIM_MAX_LEN:,} tokens)")
            result = sim_interference(self.gpu.value, budget, self.policy.value, n, long_len)
        except ValueError as exc:
            self._show_error(str(exc))
            return
        except Exception as exc:  # a bug, but a notebook user should still see a sentence
            self._show_error(f"unexpected error ({type(exc).__name__}): {exc}")
            return
        self.error, self.result = None, result
        self.history.append((self._key(), result))
        self.text = self._describe(result, n, long_len)
        self.message.value = ""
        self.summary.value = "<p>" + html.escape(self.text).replace("\n", "<br>") + "</p>"
        for part in self.results:
            part.layout.display = None
        self._draw(result)

    def _describe(self, r: Interference, n: int, long_len: int) -> str:
        chunking = "chunking off" if r.label == "off" else f"budget {int(r.label):,} tokens per step"
        return (f"{SIM_MODEL} on a simulated {GPU_CHOICES[self.gpu.value]}, {POLICIES[self.policy.value]}, "
                f"{chunking}: {n} streams decoding when a new prompt of {long_len:,} tokens arrives.\n"
                f"streams: normal gap {_ms(r.baseline_itl)}, longest gap {_ms(r.spike)} "
                f"({r.spike / r.baseline_itl:.1f}x), ITL p99 {_ms(r.itl_p99)}.\n"
                f"long prompt: first token after {_ms(r.long_ttft)}, in {len(r.prefill_steps)} steps.")

    def _show_error(self, text: str) -> None:
        self.error, self.result, self.text = text, None, text
        self.message.value = error_message(self.results, "me-chunk-error", "Cannot simulate", text)

    def _draw(self, r: Interference) -> None:
        ax = self.ax_run
        ax.clear()
        t0 = r.arrival
        for rec in r.streams:
            t = np.array(rec.token_times) - t0
            keep = t[1:] > -0.1 * max(r.long_ttft, 0.05)
            ax.plot(t[1:][keep], 1000 * np.diff(t)[keep], ".", color="tab:blue", markersize=2, alpha=0.4)
        ax.axvline(0, color="tab:red", linestyle=":", label="prompt arrives")
        ax.axvline(r.long_ttft, color="tab:green", linestyle="--", label="its first token")
        ax.set(xlabel="time since the prompt arrived (s)", ylabel="gap between tokens (ms)",
               title="this run: the streams' gaps",
               xlim=(-0.1 * max(r.long_ttft, 0.05), (r.window_end - t0) * 1.05), ylim=(0, None))
        ax.legend(fontsize=8)

        ax = self.ax_trade
        ax.clear()
        same = [(k, h) for k, h in self.history if k == self._key()]
        for _k, h in same:
            mine = h is r
            ax.plot([1000 * h.itl_p99], [1000 * h.long_ttft], "o", color="tab:purple",
                    markersize=8 if mine else 5, markeredgecolor="k" if mine else "none")
            ax.annotate(h.label, (1000 * h.itl_p99, 1000 * h.long_ttft), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        ax.set(xscale="log", yscale="log", xlabel="streams' ITL p99 (ms)", ylabel="long prompt's TTFT (ms)",
               title="your budgets so far (this scenario)")
        ax.margins(0.3)
        _plain_log_ticks(ax.xaxis)
        _plain_log_ticks(ax.yaxis)
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        self.plot.value = buffer.getvalue()

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        return self.widget._repr_mimebundle_(**kwargs)
