"""What the engine returns per request (vLLM's ``RequestOutput`` / ``CompletionOutput`` names).

What ``text`` and ``token_ids`` hold depends on the request's ``SamplingParams.output_kind``: everything
generated so far (CUMULATIVE, the default; FINAL_ONLY, which sends only the last output), or only what
is new since the previous output (DELTA). ``delta_text`` / ``delta_token_ids`` are always the new part,
which is what a streaming client sends. ``record`` is the request's live ``RequestRecord`` with every
timestamp, so metrics come straight from the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minengine.core.records import RequestRecord


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it (None for EOS)
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    record: RequestRecord
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    time: float = 0.0  # perf_counter() when this output's newest token was sampled

    @property
    def text(self) -> str:
        """Shortcut for ``outputs[0].text``."""
        return self.outputs[0].text
