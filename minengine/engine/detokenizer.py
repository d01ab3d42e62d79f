"""Incremental detokenization: turn each new token into the text it adds, never half a character.

Byte-level BPE tokens are bytes, and one UTF-8 character (an emoji, an accented letter) may span
several tokens. Decoding token by token would print U+FFFD for the pieces, so we decode a small window
``tokens[prefix_offset:]`` and emit only what it adds beyond ``tokens[prefix_offset:read_offset]``,
and only when it does not end in U+FFFD (HF's TextStreamer and vLLM use the same two offsets).

Stop strings are searched in the new text and the output is cut before them. While a request runs,
the last ``len(longest stop string) - 1`` characters are held back, so a streamed delta never shows
the first half of a stop string that the next token completes.
"""

from __future__ import annotations

from typing import Any

PROMPT_CONTEXT_TOKENS = 5  # prompt tokens decoded along with the first outputs (spacing depends on them)


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        stop: list[str] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.tokens = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)
        self.output_text = ""  # everything decoded so far (cut before a stop string)
        self.num_emitted = 0  # characters of output_text already handed out as deltas
        self.stop = list(stop or [])
        self.stop_buffer = max((len(s) for s in self.stop), default=1) - 1
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def update(self, new_token_ids: list[int]) -> str | None:
        """Decode new tokens; return the stop string if one appeared (text is cut before it)."""
        for token in new_token_ids:
            self.tokens.append(token)
            stop = self._advance(final=False)
            if stop is not None:
                return stop
        return None

    def flush(self) -> str | None:
        """At finish: decode tokens held back by an incomplete character (they become U+FFFD)."""
        return None if self.stopped or self.read_offset == len(self.tokens) else self._advance(final=True)

    def _advance(self, final: bool) -> str | None:
        if self.stopped:
            return None
        prefix = self._decode(self.tokens[self.prefix_offset : self.read_offset])
        full = self._decode(self.tokens[self.prefix_offset :])
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return None  # nothing printable yet: wait for the rest of the character
        start = len(self.output_text)
        self.output_text += full[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        return self._find_stop(start)

    def _find_stop(self, start: int) -> str | None:
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = self.output_text.find(s, max(0, start - len(s) + 1))
            if i != -1 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        self.output_text = self.output_text[: best[0]]
        self.stopped = True
        return best[1]

    def get_delta(self, finished: bool) -> str:
        """New text since the last call (holding back a possible stop-string prefix unless finished)."""
        end = len(self.output_text) if finished or self.stopped else len(self.output_text) - self.stop_buffer
        if end <= self.num_emitted:
            return ""
        delta = self.output_text[self.num_emitted : end]
        self.num_emitted = end
        return delta

    @property
    def emitted_text(self) -> str:
        return self.output_text[: self.num_emitted]
