"""``OpenAIServing``: what completions and chat share (vLLM's ``serving_engine.py``).

Every check that can fail runs *before* a response starts: model name, unsupported fields, tokenizing,
context length, sampling parameters and the engine's own admission check. Once a stream has begun the
status line is sent, so a failure can only be reported in-band (an SSE error event); doing the checks
first keeps that path for genuine surprises.

Tokenization happens here, in the API server, on a private copy of the tokenizer (the engine thread
detokenizes with its own at the same time); the engine receives token ids, as in vLLM.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastapi import Request

from minengine.core.sampling_params import RequestOutputKind, SamplingParams
from minengine.engine.async_llm import AsyncLLM
from minengine.engine.outputs import RequestOutput
from minengine.server.metrics import RequestStats, ServerMetrics
from minengine.server.protocol import SamplingRequest

logger = logging.getLogger("minengine.server")
T = TypeVar("T")

SAMPLING_EPS = 1e-5  # a temperature below this is greedy (vLLM's rule; 1/T would overflow to inf)
# The top token's probability is at least 1/vocab, so any top_p below that keeps just the top token; raising
# a smaller top_p to this floor changes nothing, and keeps it from rounding to 0 in float32 (where the
# sampler would drop every token and its NaNs would fail the engine loop for all requests).
MIN_TOP_P = 1e-6


class OpenAIError(Exception):
    """An error the client caused (or may retry), sent as an OpenAI error body with ``status``."""

    TYPES = {
        400: "BadRequestError",
        401: "AuthenticationError",
        404: "NotFoundError",
        405: "MethodNotAllowedError",
        500: "InternalServerError",
        503: "ServiceUnavailableError",
    }

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status_code, self.param = message, status, param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status_code, self.param)


def error_body(message: str, status: int = 400, param: str | None = None) -> dict[str, Any]:
    kind = OpenAIError.TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass
class PreparedRequest:
    """A validated request, ready for the engine."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    include_usage: bool
    continuous_usage: bool


class OpenAIServing:
    def __init__(self, llm: AsyncLLM, model_name: str, metrics: ServerMetrics) -> None:
        self.llm = llm
        self.engine = llm.engine
        self.model_name = model_name
        self.metrics = metrics
        self.max_model_len: int = self.engine.config.max_model_len
        tokenizer = self.engine.tokenizer
        try:
            self.tokenizer = copy.deepcopy(tokenizer)
        except Exception:  # an exotic tokenizer that cannot be copied: share it
            self.tokenizer = tokenizer
        self.defaults = _generation_defaults(getattr(self.engine.model, "model_path", None))

    # ---- checks ----
    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise OpenAIError(
                f"The model `{model}` does not exist; this server serves `{self.model_name}`.", 404, "model"
            )

    def check_request(self, request: SamplingRequest) -> None:
        self.check_model(request.model)
        problems = request.unsupported()
        if problems:
            param, message = problems[0]
            raise OpenAIError(message, 400, param)
        if request.stream_options is not None and not request.stream:
            raise OpenAIError("stream_options is only allowed when stream is true", 400, "stream_options")
        if request.ignored_fields:
            logger.warning("ignoring unknown request fields: %s", ", ".join(request.ignored_fields))
        if self.tokenizer is None:
            raise OpenAIError("this model has no tokenizer, so it cannot serve the text API", 400)

    def prepare(
        self, request: SamplingRequest, prompt_ids: list[int], max_tokens: int | None, prefix: str
    ) -> PreparedRequest:
        """Context-length check, SamplingParams, the engine's admission check; raises OpenAIError(400)."""
        n = len(prompt_ids)
        if n == 0:
            raise OpenAIError("the prompt is empty", 400, "prompt")
        if max_tokens is None:  # chat without max_tokens: whatever room the context leaves (vLLM)
            max_tokens = self.max_model_len - n
        if n + max_tokens > self.max_model_len or max_tokens < 1:
            raise OpenAIError(
                f"This model's maximum context length is {self.max_model_len} tokens, but the request needs "
                f"{n + max(max_tokens, 1)} ({n} in the prompt, {max(max_tokens, 1)} to generate). Shorten "
                "the prompt or lower max_tokens.",
                400,
                "max_tokens",
            )
        temperature = request.temperature
        if temperature is None:
            temperature = self.defaults.get("temperature", 1.0)
        top_p = request.top_p if request.top_p is not None else self.defaults.get("top_p", 1.0)
        top_k = request.top_k if request.top_k is not None else int(self.defaults.get("top_k", 0))
        try:
            params = SamplingParams(
                temperature=0.0 if temperature < SAMPLING_EPS else float(temperature),
                top_p=max(MIN_TOP_P, float(top_p)),
                top_k=top_k,
                max_tokens=max_tokens,
                seed=request.seed,
                stop=request.stop,
                stop_token_ids=request.stop_token_ids,
                ignore_eos=request.ignore_eos,
                # a stream sends what is new; a plain response needs only the end (as vLLM's server)
                output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
            )
        except ValueError as e:
            raise OpenAIError(str(e), 400) from None
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        try:  # reads only: tokens in range, fits max_model_len and the whole KV cache
            self.engine.process_inputs(request_id, {"prompt_token_ids": prompt_ids}, params)
        except (ValueError, TypeError) as e:
            raise OpenAIError(str(e), 400, "prompt" if "prompt" in str(e) else None) from None
        options = request.stream_options
        return PreparedRequest(
            request_id=request_id,
            prompt_token_ids=prompt_ids,
            params=params,
            include_usage=bool(options and options.include_usage),
            continuous_usage=bool(options and options.include_usage and options.continuous_usage_stats),
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        except Exception as e:  # the tokenizer rejected the text
            raise OpenAIError(f"could not tokenize the prompt: {e}", 400, "prompt") from None

    def check_health(self) -> None:
        if self.llm.error is not None:
            raise OpenAIError("the engine loop failed; restart the server", 503)

    # ---- running ----
    async def generate(self, prepared: PreparedRequest) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one request, feeding the metrics on the way."""
        self.check_health()
        stats = RequestStats()
        stream = self.llm.generate(
            {"prompt_token_ids": prepared.prompt_token_ids}, prepared.params, prepared.request_id
        )
        try:
            async with aclosing(stream):
                async for out in stream:
                    self.metrics.observe(out, stats)
                    yield out
        finally:
            self.metrics.abort(stats)  # no-op when the request finished

    async def final_output(self, prepared: PreparedRequest, raw_request: Request) -> RequestOutput | None:
        """Run a non-streaming request to the end; None if the client went away (the request is aborted)."""

        async def run() -> RequestOutput:
            last = None
            async with aclosing(self.generate(prepared)) as stream:
                async for out in stream:
                    last = out
            assert last is not None
            return last

        return await cancel_on_disconnect(run(), raw_request)


async def cancel_on_disconnect(coro: Awaitable[T], raw_request: Request) -> T | None:
    """Await ``coro`` unless the client disconnects first; then cancel it (which aborts its request).

    Starlette does not cancel a handler when its client leaves, so a non-streaming request would
    otherwise keep its KV blocks until it finished (vLLM wraps its handlers the same way).
    """
    task = asyncio.ensure_future(coro)

    async def wait_disconnect() -> None:
        while (await raw_request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():  # the client left (or this handler was cancelled): stop the work
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        return None
    return task.result()


def sse(obj: Any) -> dict[str, str]:
    """One SSE event (sse-starlette writes ``data: <json>`` and the blank line)."""
    return {"data": json.dumps(obj, ensure_ascii=False, separators=(",", ":"))}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def stream_error(e: BaseException) -> dict[str, str]:
    """An error after the stream began: it can only travel as an event (then [DONE])."""
    logger.exception("error while streaming", exc_info=e)
    status = e.status_code if isinstance(e, OpenAIError) else 500
    return sse(error_body(str(e) or type(e).__name__, status))


def _generation_defaults(model_path: str | Path | None) -> dict[str, Any]:
    """temperature / top_p / top_k from the model's generation_config.json: vLLM's defaults when a request
    leaves them out (its ``--generation-config auto``)."""
    if model_path is None:
        return {}
    path = Path(model_path) / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {
        k: config[k] for k in ("temperature", "top_p", "top_k") if isinstance(config.get(k), (int, float))
    }
