"""``POST /v1/chat/completions`` (vLLM's ``serving_chat.py``): messages -> chat template -> tokens.

The prompt is the tokenizer's chat template applied to the messages with the generation prompt
(``<|user|>\\n...\\n<|assistant|>\\n`` for the shipped model), tokenized without adding special tokens
again (the template places them).

Streaming: the ``"role": "assistant"`` delta goes out *together with the first content*, not as a chunk
of its own, so a client timing its first chunk measures the first token (TTFT), not a role-only chunk
sent before the model did any work.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from minengine.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    ChatResponseMessage,
    UsageInfo,
)
from minengine.server.serving_completion import SSE_PING_SECONDS
from minengine.server.serving_engine import (
    OpenAIError,
    OpenAIServing,
    PreparedRequest,
    sse,
    stream_error,
    usage,
)


class OpenAIServingChat(OpenAIServing):
    def render_messages(self, messages: list[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        """Chat template -> token ids; any template problem is the request's fault (400)."""
        plain = [{"role": m.role, "content": _text_of(m)} for m in messages]
        if not getattr(self.tokenizer, "chat_template", None):
            raise OpenAIError("this model's tokenizer has no chat template; use /v1/completions", 400)
        try:
            text = self.tokenizer.apply_chat_template(
                plain, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except Exception as e:  # jinja errors, template-raised exceptions
            raise OpenAIError(f"could not apply the chat template: {e}", 400, "messages") from None
        if not isinstance(text, str):
            raise OpenAIError("the chat template did not produce text", 400, "messages")
        return self.encode(text, add_special_tokens=False)

    async def create_chat_completion(self, request: ChatCompletionRequest, raw_request: Request) -> Response:
        self.check_request(request)
        ids = self.render_messages(request.messages, request.add_generation_prompt)
        max_tokens = request.max_completion_tokens or request.max_tokens
        prepared = self.prepare(request, ids, max_tokens, "chatcmpl")
        model, created = request.model or self.model_name, int(time.time())
        if request.stream:
            return EventSourceResponse(self.stream(prepared, model, created), sep="\n", ping=SSE_PING_SECONDS)
        out = await self.final_output(prepared, raw_request)
        if out is None:
            return Response(status_code=499)
        c = out.outputs[0]
        response = ChatCompletionResponse(
            id=prepared.request_id,
            created=created,
            model=model,
            choices=[
                ChatCompletionResponseChoice(
                    message=ChatResponseMessage(content=c.text),
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                )
            ],
            usage=UsageInfo(**usage(len(prepared.prompt_token_ids), len(c.token_ids))),
        )
        return JSONResponse(response.model_dump())

    async def stream(
        self, prepared: PreparedRequest, model: str, created: int
    ) -> AsyncIterator[dict[str, str]]:
        num_prompt, num_out, role_sent = len(prepared.prompt_token_ids), 0, False
        base = {
            "id": prepared.request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        try:
            async with aclosing(self.generate(prepared)) as outputs:
                async for out in outputs:
                    c = out.outputs[0]
                    num_out += len(c.delta_token_ids)
                    if not c.delta_text and not out.finished:
                        continue
                    delta: dict[str, Any] = {"content": c.delta_text}
                    if not role_sent:
                        delta, role_sent = {"role": "assistant", **delta}, True
                    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": c.finish_reason}
                    chunk = {**base, "choices": [choice]}
                    if prepared.continuous_usage:
                        chunk["usage"] = usage(num_prompt, num_out)
                    yield sse(chunk)
            if prepared.include_usage:
                yield sse({**base, "choices": [], "usage": usage(num_prompt, num_out)})
        except Exception as e:
            yield stream_error(e)
        yield {"data": "[DONE]"}


def _text_of(message: ChatMessage) -> str:
    """A message's text: a string, or its text parts joined by newlines (as vLLM joins them). The protocol
    admits text parts only and a null content only on an assistant message (read as '')."""
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)
