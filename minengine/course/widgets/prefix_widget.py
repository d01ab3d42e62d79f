"""Lesson 07's "what if" widget: where the part that changes per request sits, and the block size.

Two requests share a long system prompt; a short per-request text (a request id, a timestamp) is spliced
in at a chosen token position. The first request fills the prefix cache, the second one (another id)
looks it up: the widget shows how many of its tokens came from the cache (measured by the engine, and
the rule ``prefix_lesson.expected_hit_tokens`` beside it), the TTFT of both, and a bar of the prompt
split into cached and computed tokens, with the block boundaries. Moving the id from the front to the
back turns a miss into a hit; a bigger block wastes more at the boundary.

Like the other course widgets: a PNG figure in a ``widgets.Image``, stable CSS classes (``me-prefix-*``)
for the browser tests, friendly messages for bad input, and drivable without a browser (set ``.value``,
read ``.result`` / ``.text`` / ``.error``).
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from minengine.core.sampling_params import SamplingParams
from minengine.course.prefix_lesson import expected_hit_tokens, run_one_by_one
from minengine.course.widgets.common import error_message

BLOCK_SIZES = (8, 16, 32, 64)
DEFAULT_TEMPLATE = "[request {id}, sent 10:31:{id}]\n"
MAX_TEMPLATE_CHARS = 300


@dataclass(frozen=True)
class PrefixResult:
    position: int  # token index where the per-request text was spliced in
    block_size: int
    prompt_len: int  # tokens of the second request's prompt
    cached: int  # of which the engine served from the prefix cache
    expected: int  # what the rule predicts
    ttft_first: float  # seconds: the request that filled the cache
    ttft_second: float  # the request that looked it up


def splice(system_ids: list[int], insert_ids: list[int], position: int) -> list[int]:
    return system_ids[:position] + insert_ids + system_ids[position:]


class PrefixWidget:
    """Position of the per-request text, block size and its template -> cached tokens and TTFT."""

    def __init__(self, model: Any, tokenizer: Any, system: str, position: int = 0, block_size: int = 16,
                 template: str = DEFAULT_TEMPLATE, num_blocks: int = 512) -> None:
        self.model, self.tokenizer, self.num_blocks = model, tokenizer, num_blocks
        self.system_ids = list(tokenizer.encode(system))
        n = len(self.system_ids)
        style, layout = {"description_width": "170px"}, widgets.Layout(width="520px")
        self.position = widgets.IntSlider(value=min(position, n), min=0, max=n, step=1,
                                          description="id inserted at token", continuous_update=False,
                                          style=style, layout=layout).add_class("me-prefix-position")
        self.block = widgets.Dropdown(options=list(BLOCK_SIZES), value=block_size, description="block size",
                                      style=style, layout=widgets.Layout(width="300px")
                                      ).add_class("me-prefix-block")
        self.template = widgets.Text(value=template, description="per-request text", continuous_update=False,
                                     style=style, layout=layout).add_class("me-prefix-template")
        self.message = widgets.HTML().add_class("me-prefix-message")
        self.summary = widgets.HTML().add_class("me-prefix-summary")
        self.plot = widgets.Image(format="png", layout=widgets.Layout(max_width="100%")
                                  ).add_class("me-prefix-plot")
        self.figure = Figure(figsize=(9, 1.9), dpi=90, layout="constrained")
        FigureCanvasAgg(self.figure)
        self.ax = self.figure.subplots()
        self._engines: dict[int, Any] = {}
        self.result: PrefixResult | None = None
        self.error: str | None = None
        self.text = ""
        for control in (self.position, self.block, self.template):
            control.observe(lambda _change: self.update(), names="value")
        self.results = [self.summary, self.plot]
        self.widget = widgets.VBox([self.position, self.block, self.template, self.message, *self.results]
                                   ).add_class("me-prefix-widget")
        self.update()

    def _engine(self, block_size: int) -> Any:
        if block_size not in self._engines:
            from minengine.engine.llm import LLM

            self._engines[block_size] = LLM(self.model, tokenizer=self.tokenizer, block_size=block_size,
                                            num_blocks=self.num_blocks, enable_prefix_caching=True)
        return self._engines[block_size]

    def _check_template(self, template: object) -> str:
        if not isinstance(template, str) or not template.strip():
            raise ValueError("type the text that changes per request, with {id} where the request id goes")
        if "{id}" not in template:
            raise ValueError("the per-request text needs {id} somewhere: without it both requests send the "
                             "same prompt, and there is nothing to compare")
        if len(template) > MAX_TEMPLATE_CHARS:
            raise ValueError(f"keep the per-request text under {MAX_TEMPLATE_CHARS} characters "
                             f"(got {len(template)})")
        return template

    def measure(self, position: int, block_size: int, template: str) -> PrefixResult:
        template = self._check_template(template)
        if block_size not in BLOCK_SIZES:
            raise ValueError(f"block size must be one of {', '.join(map(str, BLOCK_SIZES))}")
        if not 0 <= position <= len(self.system_ids):
            raise ValueError(f"the position must be between 0 and {len(self.system_ids)}")
        first, second = (splice(self.system_ids, list(self.tokenizer.encode(template.replace("{id}", i))),
                                position) for i in ("0041", "0042"))
        params = SamplingParams(max_tokens=1, temperature=0)
        run = run_one_by_one(self._engine(block_size), [first, second], params)
        a, b = run.requests
        return PrefixResult(position, block_size, len(second), b.num_cached_tokens,
                            expected_hit_tokens(first, second, block_size), a.ttft or 0.0, b.ttft or 0.0)

    def update(self) -> None:
        try:
            result = self.measure(self.position.value, self.block.value, self.template.value)
        except ValueError as exc:
            self._show_error(str(exc))
            return
        except Exception as exc:  # a bug, but the learner should still see a sentence
            self._show_error(f"unexpected error ({type(exc).__name__}): {exc}")
            return
        self.error, self.result = None, result
        r = result
        self.text = (f"second request: {r.cached:,} of its {r.prompt_len:,} prompt tokens came from the "
                     f"prefix cache ({100 * r.cached / r.prompt_len:.0f}%; the rule predicts "
                     f"{r.expected:,}), {r.prompt_len - r.cached:,} were computed. TTFT: "
                     f"{1e3 * r.ttft_first:.1f} ms for the request that filled the cache, "
                     f"{1e3 * r.ttft_second:.1f} ms for this one.")
        self.message.value = ""
        self.summary.value = f"<p>{html.escape(self.text)}</p>"
        for part in self.results:
            part.layout.display = None
        self._draw(r)

    def _show_error(self, text: str) -> None:
        self.error, self.result, self.text = text, None, text
        self.message.value = error_message(self.results, "me-prefix-error", "Cannot run this", text)

    def _draw(self, r: PrefixResult) -> None:
        ax = self.ax
        ax.clear()
        ax.barh(0, r.cached, color="tab:green", label=f"from the cache ({r.cached:,})")
        ax.barh(0, r.prompt_len - r.cached, left=r.cached, color="tab:orange",
                label=f"computed ({r.prompt_len - r.cached:,})")
        insert_len = r.prompt_len - len(self.system_ids)
        ax.axvspan(r.position, r.position + insert_len, ymin=0.1, ymax=0.9, color="k", alpha=0.35,
                   label="per-request text")
        for x in range(0, r.prompt_len + 1, r.block_size * max(1, r.prompt_len // (r.block_size * 40))):
            ax.axvline(x, color="white", linewidth=0.5)
        ax.set(xlim=(0, r.prompt_len), yticks=[], xlabel="prompt tokens (white lines: block boundaries)")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.55), ncol=3, frameon=False)
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png")
        self.plot.value = buffer.getvalue()

    def _repr_mimebundle_(self, **kwargs: object) -> dict | None:
        return self.widget._repr_mimebundle_(**kwargs)
