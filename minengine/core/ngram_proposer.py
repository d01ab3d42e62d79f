"""Drafting by prompt lookup (vLLM's ``method="ngram"``): guess the next tokens from the sequence itself.

Why it works: a summary quotes its document, a code edit repeats most of the file, a chat answer reuses
the question's words. When the last few tokens occurred earlier in the same sequence, the tokens that
followed them there are a free guess at what comes next. The target model then checks every guess in one
forward pass (``minengine.engine.rejection_sampler``), so a right guess saves a whole decode step and a
wrong one costs only the extra rows of that pass.

The rule, as vLLM's ``NgramProposer`` applies it: take the **longest** n-gram, ``prompt_lookup_min`` <= n
<= ``prompt_lookup_max``, that ends the sequence and also occurs earlier in it; of its occurrences use the
**earliest**; propose the up to ``num_speculative_tokens`` tokens that followed it (fewer where the
sequence ends first, none past ``max_model_len``). Pure Python over token ids: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from minengine.config import SpeculativeConfig


class Drafter(Protocol):
    """What the scheduler asks for drafts: ``NgramProposer`` here, ``SimDrafter`` in the simulator."""

    def propose(self, token_ids: Sequence[int]) -> list[int]: ...


class NgramProposer:
    def __init__(self, speculative_config: SpeculativeConfig, max_model_len: int) -> None:
        self.k = speculative_config.num_speculative_tokens
        self.min_n = speculative_config.prompt_lookup_min or 1
        self.max_n = speculative_config.prompt_lookup_max or self.min_n
        self.max_model_len = max_model_len

    def propose(self, token_ids: Sequence[int]) -> list[int]:
        """Draft tokens to follow ``token_ids`` (a request's prompt and output so far); [] for no guess."""
        tokens = token_ids if isinstance(token_ids, list) else list(token_ids)  # read, never changed
        num_tokens = len(tokens)
        k = min(self.k, self.max_model_len - num_tokens)  # a draft may not run past the context
        if k <= 0:
            return []
        for n in range(min(self.max_n, num_tokens - 1), self.min_n - 1, -1):  # the longest n-gram first
            start = earliest_occurrence(tokens, tokens[-n:], stop=num_tokens - n)
            if start is not None:
                return tokens[start + n:start + n + k]
        return []


def earliest_occurrence(tokens: list[int], ngram: list[int], stop: int) -> int | None:
    """The smallest i < ``stop`` with ``tokens[i:i + len(ngram)] == ngram``, or None.

    ``list.index`` finds each candidate first token at C speed, so a long context costs little."""
    n, i = len(ngram), 0
    while True:
        try:
            i = tokens.index(ngram[0], i, stop)
        except ValueError:
            return None
        if tokens[i:i + n] == ngram:
            return i
        i += 1
