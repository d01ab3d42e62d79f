"""Lesson 01's experiment widget: choose prompt length, output length and batch, run, see both phases.

One click runs a batch of identical-shape requests through the real engine and reads its StepRecords:
the first steps hold the prompts (prefill), the rest are decode steps. Each run is also added to two
history plots (TTFT against prompt tokens, decode step time against batch), so a few clicks trace the
curves of the lesson. Like the KV widget, figures are PNGs in a ``widgets.Image`` (no ipympl), every part
has a stable CSS class (``me-exp-*``), and tests drive it without a browser: set ``.value`` on the
controls, call ``.run_button.click()``, then read ``.result``, ``.text``, ``.error`` or ``.history``.
"""

from __future__ import annotations

import html
import io
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minengine.core.sampling_params import SamplingParams
from minengine.metrics.stats import summarize

if TYPE_CHECKING:  # course.lessons imports torch: load it when a widget is built, not on import
    from minengine.course.lessons import DeviceProfile, RunResult

MODEL_CHOICES = {"shipped": "shipped (3.5M params)", "random": "random Llama (bigger)"}
MAX_TOKENS_PER_RUN = {"cpu": 65_536, "mps": 131_072, "cuda": 4_194_304}  # batch x (prompt + output)


@dataclass
class ExperimentResult:
    """What one click measured (times in seconds)."""

    model: str
    prompt_len: int
    output_len: int
    batch: int
    threads: int
    ttft_p50: float
    ttft_max: float
    itl_p50: float
    itl_p95: float
    decode_step: float  # median forward time of the pure decode steps (nan if output_len == 1)
    prefill_time: float  # forward time of the steps holding prompt tokens
    wall: float
    output_tokens: int

    @property
    def naive_ms_per_token(self) -> float:
        return 1000 * self.wall / max(self.output_tokens, 1)


class TwoPhasesWidget:
    """Run one batch on the engine and see prefill and decode separately. ``w.widget`` is the box."""

    def __init__(self, prompt_len: int = 256, output_len: int = 32, batch: int = 4, model: str = "shipped",
                 profile: DeviceProfile | None = None,
                 llm_factory: Callable[[str], Any] | None = None) -> None:
        from minengine.course.lessons import device_profile

        self.profile = profile or device_profile()
        self._factory = llm_factory or self._default_factory
        self._engines: dict[str, Any] = {}
        style, layout = {"description_width": "120px"}, widgets.Layout(width="360px")
        self.model = widgets.Dropdown(options=[(v, k) for k, v in MODEL_CHOICES.items()], value=model,
                                      description="Model", style=style,
                                      layout=layout).add_class("me-exp-model")
        self.prompt_len = widgets.IntText(value=prompt_len, description="Prompt tokens", style=style,
                                          layout=layout).add_class("me-exp-prompt")
        self.output_len = widgets.IntText(value=output_len, description="Output tokens", style=style,
                                          layout=layout).add_class("me-exp-output")
        self.batch = widgets.IntText(value=batch, description="Batch (requests)", style=style,
                                     layout=layout).add_class("me-exp-batch")
        threads = [("auto", 0)] + [(str(n), n) for n in (1, 2, 4, 8)
                                   if n <= max(self.profile.threads_compute, 1)]
        self.threads = widgets.Dropdown(options=threads, value=0, description="Torch threads", style=style,
                                        layout=layout).add_class("me-exp-threads")
        self.run_button = widgets.Button(description="Run", button_style="primary",
                                         icon="play").add_class("me-exp-run")
        self.clear_button = widgets.Button(description="Clear history").add_class("me-exp-clear")
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="",
                                            layout=widgets.Layout(width="360px",
                                                                  visibility="hidden")).add_class("me-exp-progress")
        self.status_line = widgets.HTML().add_class("me-exp-status")
        self.message = widgets.HTML().add_class("me-exp-message")
        self.results = widgets.HTML().add_class("me-exp-results")
        self.plot = widgets.Image(format="png").add_class("me-exp-plot")
        self.figure = Figure(figsize=(12, 3.6), dpi=80, layout="constrained")
        FigureCanvasAgg(self.figure)
        self.ax_steps, self.ax_ttft, self.ax_decode = self.figure.subplots(1, 3)

        self.result: ExperimentResult | None = None
        self.last_run: RunResult | None = None
        self.history: list[ExperimentResult] = []
        self.error: str | None = None
        self.text = ""
        self.run_button.on_click(lambda _b: self.run())
        self.clear_button.on_click(lambda _b: self.clear())
        controls = widgets.VBox([self.model, self.prompt_len, self.output_len, self.batch, self.threads,
                                 widgets.HBox([self.run_button, self.clear_button]), self.progress,
                                 self.status_line, self.message])
        self.widget = widgets.VBox([widgets.HBox([controls, self.results]), self.plot]).add_class(
            "me-exp-two-phases")
        self._draw()

    # ---- engines ----
    def _default_factory(self, model: str) -> Any:
        from minengine.course.lessons import make_engine_options, random_llama, shipped_llm
        from minengine.engine.llm import LLM

        if model == "shipped":
            return shipped_llm()
        shape = self.profile.big_shape
        return LLM(random_llama(shape), **make_engine_options(self.profile, shape.max_len))

    def _engine(self, model: str) -> Any:
        if model not in self._engines:
            if model == "random":
                self.status_line.value = (f"building a random {self.profile.big_shape.describe()} (a few "
                                          "seconds)...")
            self._engines[model] = self._factory(model)
        return self._engines[model]

    def _threads_for(self, model: str) -> int:
        if self.threads.value:
            return int(self.threads.value)
        return self.profile.threads_small if model == "shipped" else self.profile.threads_compute

    # ---- running ----
    def _check(self, llm: Any) -> tuple[int, int, int]:
        """Read and validate the controls; raise ValueError with a sentence a learner can act on."""
        p, o, b = self.prompt_len.value, self.output_len.value, self.batch.value
        for name, v in (("prompt tokens", p), ("output tokens", o), ("batch", b)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number of at least 1 (got {v!r})")
        max_len = llm.llm_engine.config.max_model_len
        if p + o > max_len:
            raise ValueError(f"prompt + output = {p + o} tokens, but this model's context holds {max_len}: "
                             "shorten one of them")
        limit = MAX_TOKENS_PER_RUN.get(self.profile.device, MAX_TOKENS_PER_RUN["cpu"])
        if b * (p + o) > limit:
            raise ValueError(f"batch x (prompt + output) = {b * (p + o):,} tokens is more than this widget "
                             f"runs on {self.profile.device} ({limit:,}): lower the batch or the lengths")
        blocks = llm.llm_engine.scheduler.block_manager
        need = b * blocks.blocks_needed(p + o)
        if need > blocks.num_blocks:
            raise ValueError(f"{b} requests of {p + o} tokens need {need:,} KV blocks but this engine has "
                             f"{blocks.num_blocks:,}: lower the batch or the lengths")
        if b > llm.llm_engine.config.max_num_seqs:
            raise ValueError(f"batch {b} is more than this engine runs at once "
                             f"(max_num_seqs={llm.llm_engine.config.max_num_seqs})")
        return p, o, b

    def run(self) -> ExperimentResult | None:
        """Validate, run the batch, update text and plots. Errors become a message, never an exception."""
        from minengine.course.lessons import WorkRequest, random_prompt, run_requests, torch_threads

        self.error = None
        self.message.value = ""
        self.run_button.disabled = True
        try:
            model = self.model.value
            llm = self._engine(model)
            p, o, b = self._check(llm)
            threads = self._threads_for(model)
            self.status_line.value = f"running {b} request(s) of {p} + {o} tokens on {threads} thread(s)..."
            expected = math.ceil(b * p / llm.llm_engine.config.max_num_batched_tokens) + o - 1
            self.progress.max, self.progress.value = max(expected, 1), 0
            self.progress.layout.visibility = "visible"
            rng = random.Random(len(self.history))
            params = SamplingParams(max_tokens=o, ignore_eos=True, temperature=0)
            vocab = llm.llm_engine.model_config.vocab_size
            work = [WorkRequest(0.0, random_prompt(p, rng, vocab), params) for _ in range(b)]
            with torch_threads(threads):
                run = run_requests(llm, work, on_step=self._tick)
            self.progress.value = self.progress.max
            self.last_run, self.result = run, self._summarise(model, p, o, b, threads, run)
            self.history.append(self.result)
            self.status_line.value = f"done in {run.wall:.2f} s"
        except ValueError as exc:
            self._fail(str(exc))
        except Exception as exc:  # an engine bug or out of memory: still a sentence, not a traceback
            self._fail(f"the run failed ({type(exc).__name__}): {exc}")
        finally:
            self.run_button.disabled = False
            self.progress.layout.visibility = "hidden"
        if self.error is None:
            self._draw()
        return self.result if self.error is None else None

    def _tick(self, _step: Any) -> None:
        self.progress.value = min(self.progress.value + 1, self.progress.max)

    def _fail(self, text: str) -> None:
        self.error = text
        self.status_line.value = ""
        self.message.value = (f"<div class='me-exp-error' style='color:#b00020'><b>Cannot run:</b> "
                              f"{html.escape(text)}</div>")

    def clear(self) -> None:
        self.history.clear()
        self.result, self.last_run, self.text = None, None, ""
        self._draw()

    @staticmethod
    def _summarise(model: str, p: int, o: int, b: int, threads: int, run: RunResult) -> ExperimentResult:
        s = summarize(run.requests, run.steps)
        decode = [st.t_forward for st in run.steps if st.num_decode_seqs and not st.num_prefill_tokens]
        return ExperimentResult(
            model=model, prompt_len=p, output_len=o, batch=b, threads=threads, ttft_p50=s.ttft.median,
            ttft_max=s.ttft.max, itl_p50=s.itl.median, itl_p95=s.itl.p95,
            decode_step=float(np.median(decode)) if decode else math.nan,
            prefill_time=sum(st.t_forward for st in run.steps if st.num_prefill_tokens), wall=run.wall,
            output_tokens=s.total_output_tokens)

    # ---- drawing ----
    def _draw(self) -> None:
        r = self.result
        rows = [] if r is None else [
            ("prefill (forward)", f"{1000 * r.prefill_time:.1f} ms for {r.batch} x {r.prompt_len} tokens"),
            ("TTFT p50 / max", f"{1000 * r.ttft_p50:.1f} / {1000 * r.ttft_max:.1f} ms"),
            ("decode step (median)",
             "n/a" if math.isnan(r.decode_step) else f"{1000 * r.decode_step:.2f} ms"),
            ("ITL p50 / p95", "n/a" if math.isnan(r.itl_p50) else f"{1000 * r.itl_p50:.2f} / "
                                                                  f"{1000 * r.itl_p95:.2f} ms"),
            ("output tokens/s", f"{r.output_tokens / r.wall:,.0f}"),
            ("naive wall / output tokens", f"{r.naive_ms_per_token:.2f} ms per token"),
        ]
        self.text = "\n".join(f"{k}: {v}" for k, v in rows)
        self.results.value = "<table>" + "".join(
            f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
            f"<td>{html.escape(v)}</td></tr>" for k, v in rows) + "</table>"
        ax = self.ax_steps
        ax.clear()
        if self.last_run is not None:
            steps = self.last_run.steps
            colors = ["tab:orange" if s.num_prefill_tokens else "tab:blue" for s in steps]
            ax.bar(range(1, len(steps) + 1), [1000 * s.duration for s in steps], color=colors, width=1.0)
            ax.legend(handles=[Patch(color="tab:orange", label="holds prompt tokens (prefill)"),
                               Patch(color="tab:blue", label="decode only")], fontsize=8)
        ax.set_xlabel("engine step")
        ax.set_ylabel("step time (ms)")
        ax.set_title("this run, step by step")
        self._draw_history()
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        self.plot.value = buffer.getvalue()

    def _draw_history(self) -> None:
        for ax in (self.ax_ttft, self.ax_decode):
            ax.clear()
            ax.grid(alpha=0.3)
        for i, (key, label) in enumerate(MODEL_CHOICES.items()):
            runs = [h for h in self.history if h.model == key]
            if not runs:
                continue
            self.ax_ttft.plot([h.batch * h.prompt_len for h in runs], [1000 * h.ttft_max for h in runs], "o",
                              color=f"C{i + 2}", label=label)
            dec = [h for h in runs if not math.isnan(h.decode_step)]
            self.ax_decode.plot([h.batch for h in dec], [1000 * h.decode_step for h in dec], "s",
                                color=f"C{i + 2}", label=label)
        self.ax_ttft.set_xlabel("prompt tokens in the batch (batch x prompt)")
        self.ax_ttft.set_ylabel("slowest TTFT (ms)")
        self.ax_ttft.set_title("all runs: the pause grows with prompt work")
        self.ax_decode.set_xlabel("batch")
        self.ax_decode.set_ylabel("decode step (ms)")
        self.ax_decode.set_title("all runs: decode step vs batch")
        for ax in (self.ax_ttft, self.ax_decode):
            ax.set_xlim(0, None)
            ax.set_ylim(0, None)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        return self.widget._repr_mimebundle_(**kwargs)
