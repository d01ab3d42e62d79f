"""``POST /v1/completions`` (vLLM's ``serving_completion.py``): text in, text out, streamed or whole.

A stream is one ``data:`` event per engine output that carries text (an output whose text the
detokenizer holds back, e.g. half a UTF-8 character, is skipped), the last one with ``finish_reason``,
then an optional usage chunk (``"choices": []``) and ``data: [DONE]``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from minengine.server.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    UsageInfo,
)
from minengine.server.serving_engine import (
    OpenAIError,
    OpenAIServing,
    PreparedRequest,
    sse,
    stream_error,
    usage,
)

SSE_PING_SECONDS = 15  # a ": ping" comment keeps idle proxies from closing a slow stream


class OpenAIServingCompletion(OpenAIServing):
    def prompt_ids(self, prompt: str | list[int] | list[str] | list[list[int]]) -> list[int]:
        """One prompt per request: text, token ids, or a one-element list of either."""
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise OpenAIError(
                    f"got {len(prompt)} prompts; this server takes one prompt per request", 400, "prompt"
                )
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.encode(prompt)
        return list(prompt)  # type: ignore[arg-type]  # token ids, range-checked by the engine

    async def create_completion(self, request: CompletionRequest, raw_request: Request) -> Response:
        self.check_request(request)
        prepared = self.prepare(request, self.prompt_ids(request.prompt), request.max_tokens, "cmpl")
        model, created = request.model or self.model_name, int(time.time())
        if request.stream:
            return EventSourceResponse(self.stream(prepared, model, created), sep="\n", ping=SSE_PING_SECONDS)
        out = await self.final_output(prepared, raw_request)
        if out is None:  # the client is gone; nobody reads this
            return Response(status_code=499)
        c = out.outputs[0]
        response = CompletionResponse(
            id=prepared.request_id,
            created=created,
            model=model,
            choices=[
                CompletionResponseChoice(
                    text=c.text, finish_reason=c.finish_reason, stop_reason=c.stop_reason
                )
            ],
            usage=UsageInfo(**usage(len(prepared.prompt_token_ids), len(c.token_ids))),
        )
        return JSONResponse(response.model_dump())

    async def stream(
        self, prepared: PreparedRequest, model: str, created: int
    ) -> AsyncIterator[dict[str, str]]:
        num_prompt, num_out = len(prepared.prompt_token_ids), 0
        base = {"id": prepared.request_id, "object": "text_completion", "created": created, "model": model}
        try:
            async with aclosing(self.generate(prepared)) as outputs:
                async for out in outputs:
                    c = out.outputs[0]
                    num_out += len(c.delta_token_ids)
                    if not c.delta_text and not out.finished:
                        continue
                    choice = {
                        "index": 0,
                        "text": c.delta_text,
                        "logprobs": None,
                        "finish_reason": c.finish_reason,
                        "stop_reason": c.stop_reason,
                    }
                    chunk = {**base, "choices": [choice]}
                    if prepared.continuous_usage:
                        chunk["usage"] = usage(num_prompt, num_out)
                    yield sse(chunk)
            if prepared.include_usage:
                yield sse({**base, "choices": [], "usage": usage(num_prompt, num_out)})
        except Exception as e:
            yield stream_error(e)
        yield {"data": "[DONE]"}
