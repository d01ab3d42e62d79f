"""Chatting with the real model in a lesson: chat prompts, a streamed reply and its timings, two models side
by side.

Why a module: lesson 00 asks the installed SmolLM2-135M-Instruct a real question and compares its pause
and stream with the tiny shipped model's. The engine takes text or token ids, not chat messages (like
vLLM's ``LLM.generate``), so the prompt goes through the model's own chat template here (the tiny model
has a minimal one, so a lesson that falls back to it runs the same code), with a plain-text fallback for a
model that has none. Every number comes
from the engine's ``RequestRecord`` (arrival, token times), never from timing around a call.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minengine.core.sampling_params import SamplingParams

# A few paragraphs the project wrote, for a question that needs the text (and for a pause worth seeing).
SERVING_NOTES = (
    "Notes from the operations team of a small chatbot service.\n\n"
    "When a user sends a message, the server does not start writing at once. It first reads the whole "
    "conversation, every earlier message and the new one, in a single pass through the model. This pass "
    "is called prefill. It is heavy arithmetic: every token of the prompt is multiplied through every "
    "layer, so a prompt of two thousand tokens costs roughly twice the work of a prompt of one thousand. "
    "While prefill runs the user sees nothing at all; the wait they notice before the first word is "
    "almost entirely this pass. We call that wait the time to first token.\n\n"
    "After prefill, the model writes its answer one token at a time. Each new token needs a full trip "
    "through the model again, but only for that single token, so the arithmetic is small. What takes "
    "the time now is reading the model's weights from memory: every step must stream all of them past "
    "the processor, whether the answer is short or long. This phase is called decode, and the gap "
    "between two tokens of the answer is the inter-token latency. A bigger model has more weights to "
    "read, so each of its steps takes longer, and its stream of words is slower.\n\n"
    "To avoid redoing work, the server keeps the keys and values that prefill computed for every token. "
    "This store is the KV cache. Decode reads it at every step, so a very long conversation makes each "
    "step a little slower, but far less than it makes the first pause longer. The cache also takes "
    "memory: on our graphics cards it is the cache, not the weights, that limits how many users we can "
    "serve at the same time.\n\n"
    "Our users care about two numbers. The first is how long they wait before anything appears; they "
    "start to complain after about one second. The second is how fast the words then flow; anything "
    "faster than people read, about five words per second, feels instant. So we watch the time to first "
    "token and the inter-token latency separately, and never only the average time per request, which "
    "hides both. When the first pause grows, we look at prompt lengths and at queues in front of "
    "prefill. When the stream slows down, we look at how many users share each decode step and at the "
    "size of the model.\n\n"
    "A last rule of thumb from the team: shorten what you send before you buy a bigger machine. A "
    "system prompt that repeats the same long instructions in every request makes every user wait for "
    "them, unless the server caches that shared beginning once and reuses it for everyone.\n"
)
QUESTION = "What are the two numbers the users care about?"  # answered from the notes, in one sentence
SHORT_QUESTION = "Why is the sky blue?"  # a short prompt with a long answer


def has_chat_template(tokenizer: Any) -> bool:
    """True when the tokenizer carries a chat template (SmolLM2 and the tiny model do; base models may
    not)."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_prompt(tokenizer: Any, question: str, context: str | None = None, system: str | None = None) -> str:
    """The prompt text for one user turn: ``context`` (if any) then ``question``, through the chat template.

    Without a template (a base model) the same parts are joined as plain text ending in "Answer:", so the
    lesson still runs, on a prompt of the same shape.
    """
    user = f"{context.strip()}\n\n{question}" if context else question
    if has_chat_template(tokenizer):
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}]
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return (f"{system.strip()}\n\n" if system else "") + f"{user}\nAnswer:"


@dataclass
class StreamedReply:
    """One streamed request: its final output and every piece of text with the time it was sampled."""

    output: Any  # the last RequestOutput (its ``record`` holds every timestamp)
    pieces: list[tuple[float, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(piece for _, piece in self.pieces)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.output.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output.outputs[0].token_ids)

    @property
    def ttft(self) -> float:
        return float(self.output.record.ttft)

    @property
    def itls(self) -> list[float]:
        return list(self.output.record.itls)

    @property
    def median_itl(self) -> float:
        return statistics.median(self.itls) if self.itls else float("nan")

    @property
    def ttft_per_prompt_token(self) -> float:
        """Seconds of the pause per prompt token: comparable across tokenizers and prompt lengths."""
        return self.ttft / max(1, self.num_prompt_tokens)


async def stream_reply(llm: Any, prompt: Any, params: SamplingParams,
                       show: Callable[[str], None] | None = None) -> StreamedReply:
    """Stream ``prompt`` through an ``AsyncLLM``, handing each new piece of text to ``show`` on arrival."""
    reply: StreamedReply | None = None
    async for out in llm.generate(prompt, params):
        piece = out.outputs[0].delta_text
        if reply is None:
            reply = StreamedReply(out)
        reply.output = out
        reply.pieces.append((out.time, piece))
        if show is not None:
            show(piece)
    if reply is None:
        raise RuntimeError("the engine returned no output for this prompt")
    return reply


def print_piece(piece: str) -> None:
    """``show`` for :func:`stream_reply`: print at once, as a terminal would."""
    print(piece, end="", flush=True)


def engine_weight_bytes(llm: Any) -> int:
    """Bytes of the weights an engine's decode step streams (an ``LLM``, ``AsyncLLM`` or ``LLMEngine``)."""
    engine = getattr(llm, "llm_engine", None) or getattr(llm, "engine", None) or llm
    return sum(p.nbytes for p in engine.model.parameters())


@dataclass(frozen=True)
class ModelComparison:
    """What changes from a small model to a bigger one: the pause per prompt token (from each model's reply
    to a long prompt; the prompts differ in length and tokenizer) and the gap between tokens (from each
    model's reply to a short prompt, so attention over a long context does not blur the weights' share)."""

    small_pause: StreamedReply
    small_stream: StreamedReply
    big_pause: StreamedReply
    big_stream: StreamedReply
    small_bytes: int
    big_bytes: int

    @property
    def bytes_ratio(self) -> float:
        return self.big_bytes / self.small_bytes

    @property
    def ttft_ratio(self) -> float:
        return self.big_pause.ttft_per_prompt_token / self.small_pause.ttft_per_prompt_token

    @property
    def itl_ratio(self) -> float:
        return self.big_stream.median_itl / self.small_stream.median_itl

    def table(self, small_name: str, big_name: str) -> str:
        """Three rows, one per figure, with the ratio big / small: printed by the lesson."""
        rows = [("weights read per decode step", f"{self.small_bytes / 1e6:,.0f} MB",
                 f"{self.big_bytes / 1e6:,.0f} MB", self.bytes_ratio),
                ("pause per prompt token (TTFT / n)",
                 f"{1e3 * self.small_pause.ttft_per_prompt_token:.3f} ms",
                 f"{1e3 * self.big_pause.ttft_per_prompt_token:.3f} ms", self.ttft_ratio),
                ("median gap between tokens (ITL)", f"{1e3 * self.small_stream.median_itl:.2f} ms",
                 f"{1e3 * self.big_stream.median_itl:.2f} ms", self.itl_ratio)]
        lines = [f"{'':34} {small_name:>15} {big_name:>15}   {'ratio':>8}"]
        lines += [f"{what:34} {a:>15} {b:>15}   {ratio:7.1f}x" for what, a, b, ratio in rows]
        return "\n".join(lines)
