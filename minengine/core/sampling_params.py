"""``SamplingParams``: how to pick each next token and when to stop, with vLLM's names and defaults.

Torch-free: the scheduler reads ``max_tokens`` and the stop rules, the simulator builds requests with
it, and only the engine's sampler turns temperature / top-k / top-p into tensor operations.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class RequestOutputKind(enum.Enum):
    """What each ``RequestOutput`` of a request carries (vLLM's names).

    CUMULATIVE: everything generated so far, every step (copies grow with the output: O(L^2) in all).
    DELTA: only what is new since the previous output (streaming: AsyncLLM, the server, the CLI).
    FINAL_ONLY: nothing until the request finishes, then everything (``LLM.generate``).
    """

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


SAMPLING_EPS = 1e-5  # temperatures below this mean greedy (as in vLLM)

@dataclass
class SamplingParams:
    """How to pick each next token and when to stop (vLLM's names and defaults).

    temperature 0 means greedy. ``top_k`` 0 (or -1) and ``top_p`` 1 switch those filters off. ``seed``
    gives the request its own random generator, so its samples do not depend on what else was batched.
    ``max_tokens`` None means "until EOS or max_model_len". Stop strings are cut from the returned text.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = 16
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ValueError(f"temperature must be a number, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be an int >= 1, or 0 / -1 to disable, got {self.top_k!r}")
        if self.top_k == -1:
            self.top_k = 0
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            raise ValueError(f"max_tokens must be a positive int or None, got {self.max_tokens!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        self.stop = stop
        ids = list(self.stop_token_ids or [])
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        self.stop_token_ids = ids
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")

    @property
    def greedy(self) -> bool:
        # Below vLLM's _SAMPLING_EPS (1e-5) dividing by the temperature overflows: treat it as greedy.
        return self.temperature < SAMPLING_EPS
