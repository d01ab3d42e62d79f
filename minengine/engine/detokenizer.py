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
    """Per-token work is O(1) in the output's length: what a 4,096-token stream costs per step does not
    grow with it. The text is kept as a list of pieces (joined only when someone asks for all of it),
    stop strings are searched in the last few characters only, and the decode window drops tokens it no
    longer needs. (A ``str +=`` on an attribute copies the whole string every token.)"""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        stop: list[str] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # the decode window (from prefix_offset)
        self.tokens = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)
        self._pieces: list[str] = []  # output text so far, in pieces (cut before a stop string)
        self._length = 0  # characters in _pieces
        self._pending: list[str] = []  # the text after the first num_emitted characters, in pieces
        self._tail = ""  # the last stop_buffer characters: where a stop string may have begun
        self.num_emitted = 0  # characters of the output already handed out as deltas
        self.stop = list(stop or [])
        self.stop_buffer = max((len(s) for s in self.stop), default=1) - 1
        self.stopped = False

    @property
    def output_text(self) -> str:
        """Everything decoded so far (cut before a stop string). O(length): ask at the end, not per token."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

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
        piece = full[len(prefix) :]
        # The window now starts where the last read ended: drop the tokens before it.
        del self.tokens[: self.read_offset]
        self.prefix_offset, self.read_offset = 0, len(self.tokens)
        return self._append(piece)

    def _append(self, piece: str) -> str | None:
        """Add decoded text; if it completes a stop string, cut the text before it and return the string."""
        start = self._length
        window = self._tail + piece  # a stop string that ends in `piece` begins at most stop_buffer before it
        base = start - len(self._tail)
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = window.find(s, max(0, len(self._tail) - len(s) + 1))
            if i != -1 and (best is None or base + i < best[0]):
                best = (base + i, s)
        self._pieces.append(piece)
        self._pending.append(piece)
        self._length += len(piece)
        if self.stop_buffer:
            self._tail = window[-self.stop_buffer :]
        if best is None:
            return None
        cut = best[0]
        self._pieces = [self.output_text[:cut]]
        pending = "".join(self._pending)
        self._pending = [pending[: max(0, cut - self.num_emitted)]]
        self._length = cut
        self.stopped = True
        return best[1]

    def get_delta(self, finished: bool) -> str:
        """New text since the last call (holding back a possible stop-string prefix unless finished)."""
        end = self._length if finished or self.stopped else self._length - self.stop_buffer
        if end <= self.num_emitted:
            return ""
        pending = "".join(self._pending)
        delta, rest = pending[: end - self.num_emitted], pending[end - self.num_emitted :]
        self._pending = [rest] if rest else []
        self.num_emitted = end
        return delta

    @property
    def emitted_text(self) -> str:
        """The text handed out as deltas so far. O(length): the engine asks only for cumulative outputs."""
        return self.output_text[: self.num_emitted]
