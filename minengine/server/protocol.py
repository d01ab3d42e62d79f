"""Request and response bodies of the OpenAI API, as pydantic models (the names follow vLLM's protocol.py).

The models double as the server's OpenAPI schema, which schemathesis fuzzes in the tests.

Unknown request fields are *accepted and ignored* (the server logs a warning naming them), as vLLM does:
SDKs and benchmark tools add vendor fields freely, and rejecting them would break those tools. Fields we
know but do not implement (``n`` > 1, ``logprobs``, ``echo``, penalties, tools, ...) are a 400 when set to
anything but their neutral value, so a client never silently gets something other than what it asked.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# torch.Generator seeds are 64-bit; vLLM bounds the seed to a signed long the same way.
_SEED_MIN, _SEED_MAX = -(2**63), 2**63 - 1

NonNegInt = Annotated[int, Field(ge=0)]


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")

    @property
    def ignored_fields(self) -> list[str]:
        """Fields the client sent that this server does not know (they are ignored)."""
        return sorted(self.model_extra or {})


# ---- errors ----
class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


# ---- requests ----
class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM extension: usage in every chunk


class SamplingRequest(OpenAIBaseModel):
    """The fields completions and chat share: model, sampling, stopping, streaming."""

    model: str | None = None  # None: the one model this server serves
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)  # None: generation_config.json
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1)  # vLLM extension; 0 / -1 = off
    seed: int | None = Field(None, ge=_SEED_MIN, le=_SEED_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[NonNegInt] | None = None  # vLLM extension
    ignore_eos: bool = False  # vLLM extension
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Known, not implemented: a 400 unless neutral (see OpenAIServing.check_unsupported).
    presence_penalty: float | None = Field(None, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, reason) for every known-but-unimplemented field set to a non-neutral value."""
        out = []
        if self.n != 1:
            out.append(("n", f"n must be 1 (one completion per request), got {self.n}"))
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0):
                out.append((name, f"{name} is not supported (use 0)"))
        if self.repetition_penalty not in (None, 1):
            out.append(("repetition_penalty", "repetition_penalty is not supported (use 1)"))
        if self.logit_bias:
            out.append(("logit_bias", "logit_bias is not supported"))
        return out


class CompletionRequest(SamplingRequest):
    """POST /v1/completions. ``prompt``: text or token ids (one prompt per request)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.echo:
            out.append(("echo", "echo is not supported"))
        if self.logprobs is not None:
            out.append(("logprobs", "logprobs are not supported"))
        if self.suffix:
            out.append(("suffix", "suffix is not supported"))
        if self.best_of not in (None, 1):
            out.append(("best_of", "best_of must be 1"))
        return out


class ContentPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions. ``max_tokens`` None: until EOS or the context is full (vLLM)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True  # vLLM extension

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.logprobs or self.top_logprobs:
            out.append(("logprobs", "logprobs are not supported"))
        if self.tools:
            out.append(("tools", "tool calling is not supported"))
        if self.tool_choice not in (None, "none", "auto"):
            out.append(("tool_choice", "tool calling is not supported"))
        if self.response_format and self.response_format.get("type", "text") != "text":
            out.append(("response_format", "only response_format type 'text' is supported"))
        return out


# ---- responses ----
class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionResponseChoice(OpenAIBaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM extension: the stop string / token that ended it


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


class ChatResponseMessage(OpenAIBaseModel):
    role: str = "assistant"
    content: str | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int = 0
    message: ChatResponseMessage
    logprobs: None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo | None = None


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None


class ChatCompletionStreamChoice(OpenAIBaseModel):
    index: int = 0
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: str | None = None


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "minengine"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
