"""Request and response bodies of the OpenAI API, as pydantic models (the names follow vLLM's protocol.py).

The models double as the server's OpenAPI schema, which schemathesis fuzzes in the tests.

Unknown request fields are *accepted and ignored* (the server logs a warning naming them), as vLLM does:
SDKs and benchmark tools add vendor fields freely, and rejecting them would break those tools. Fields we
know but do not implement (``n`` > 1, ``logprobs``, ``echo``, penalties, tools, ...) are a 400 when set to
anything but their neutral value, so a client never silently gets something other than what it asked.

The schema is the truth (``/openapi.json``, fuzzed by schemathesis): known types are *strict* (``true`` is
not the token id 1, ``0`` is not ``false``), and a not-implemented field's schema allows only its neutral
value (``_only``), while ``unsupported()`` still gives the specific 400 message for it.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

# torch.Generator seeds are 64-bit; vLLM bounds the seed to a signed long the same way.
_SEED_MIN, _SEED_MAX = -(2**63), 2**63 - 1

NonNegInt = Annotated[StrictInt, Field(ge=0)]


def _only(schema: dict[str, Any], why: str) -> dict[str, Any]:
    """Schema keywords for a known-but-unimplemented field: only its neutral value is accepted."""
    return {"json_schema_extra": {**schema, "description": f"Not supported by minengine: {why}."}}


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

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
    n: int = Field(1, **_only({"minimum": 1, "maximum": 1}, "one completion per request"))
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Known, not implemented: a 400 unless neutral (see OpenAIServing.check_unsupported).
    presence_penalty: float | None = Field(
        None, allow_inf_nan=False, **_only({"minimum": 0, "maximum": 0}, "0 only")
    )
    frequency_penalty: float | None = Field(
        None, allow_inf_nan=False, **_only({"minimum": 0, "maximum": 0}, "0 only")
    )
    repetition_penalty: float | None = Field(
        None, allow_inf_nan=False, **_only({"minimum": 1, "maximum": 1}, "1 only")
    )
    logit_bias: dict[str, float] | None = Field(None, **_only({"maxProperties": 0}, "empty only"))

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

    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    echo: bool = Field(False, **_only({"enum": [False]}, "false only"))
    logprobs: int | None = Field(None, **_only({"type": "null"}, "null only"))
    suffix: str | None = Field(None, **_only({"maxLength": 0}, "empty only"))
    best_of: int | None = Field(None, **_only({"minimum": 1, "maximum": 1}, "1 only"))

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
    """A part of a message's content; only text parts exist here (no images or audio)."""

    type: Literal["text"]
    text: str


MessageContent = str | list[ContentPart]


class _Message(OpenAIBaseModel):
    name: str | None = None


class SystemMessage(_Message):
    role: Literal["system"]
    content: MessageContent


class DeveloperMessage(_Message):
    role: Literal["developer"]
    content: MessageContent


class UserMessage(_Message):
    role: Literal["user"]
    content: MessageContent


class AssistantMessage(_Message):
    """``content`` may be null here only (OpenAI's rule: it stands for a tool call, which minengine
    does not make; the chat template sees an empty string)."""

    role: Literal["assistant"]
    content: MessageContent | None = None


class ToolMessage(_Message):
    role: Literal["tool"]
    content: MessageContent
    tool_call_id: str | None = None


ROLES = ("system", "developer", "user", "assistant", "tool")
# One message, told apart by its role (the shape of OpenAI's own spec): an unknown or empty role is a 400.
ChatMessage = Annotated[
    SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage,
    Field(discriminator="role"),
]


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions. ``max_tokens`` None: until EOS or the context is full (vLLM)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool | None = Field(False, **_only({"enum": [False, None]}, "false only"))
    top_logprobs: int | None = Field(None, **_only({"minimum": 0, "maximum": 0}, "0 only"))
    tools: list[dict[str, Any]] | None = Field(None, **_only({"maxItems": 0}, "no tools"))
    tool_choice: str | dict[str, Any] | None = Field(
        None, **_only({"enum": ["none", "auto", None]}, "none or auto")
    )
    response_format: dict[str, Any] | None = Field(
        None, **_only({"properties": {"type": {"enum": ["text"]}}}, "type text only")
    )
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
