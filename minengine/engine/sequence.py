"""A request as the scheduler sees it: tokens, progress, status, KV blocks, sampling params, timestamps.

vLLM v1 calls this ``Request`` (nano-vllm calls it ``Sequence``; both names work here). Its one number
that drives scheduling is ``num_computed_tokens``: how many of ``token_ids`` (prompt + output) already
have their K/V in the cache. Each step gives a request tokens until computed catches up with
``num_tokens``; then its last position's logits give the next token.

No torch here: the simulator drives the same requests with a fake executor.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from minengine.metrics.records import RequestRecord


class RequestStatus(enum.Enum):
    """Where a request is in its life (vLLM v1's names; FINISHED_LENGTH is vLLM's FINISHED_LENGTH_CAPPED)."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # was running, lost its KV blocks, waits (at the front) to be recomputed
    FINISHED_STOPPED = "finished_stopped"  # EOS, a stop token id or a stop string
    FINISHED_LENGTH = "finished_length"  # max_tokens or max_model_len reached
    FINISHED_ABORTED = "finished_aborted"

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI-style reason: "stop" | "length" | "abort" (None while unfinished)."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


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

    @property
    def greedy(self) -> bool:
        # Below vLLM's _SAMPLING_EPS (1e-5) dividing by the temperature overflows: treat it as greedy.
        return self.temperature < SAMPLING_EPS


@dataclass(eq=False)  # identity semantics: two requests are never "equal"
class Request:
    """One generation request. The scheduler, block manager and engine all update it in place."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0
    prompt: str | None = None
    eos_token_ids: Iterable[int] = ()

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r}: the prompt is empty")
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.eos_token_ids = frozenset(self.eos_token_ids)
        self.token_ids: list[int] = list(self.prompt_token_ids)  # prompt + output, append-only
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V is in the cache
        self.block_table: list[int] = []  # KV block ids, in order (block i holds tokens i*bs..)
        self.block_hashes: list[int] = []  # chained hashes of the full blocks of token_ids (prefix cache)
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at first admission
        self.num_preemptions = 0
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it
        self.record = RequestRecord(
            request_id=self.request_id,
            arrival_time=self.arrival_time,
            num_prompt_tokens=self.num_prompt_tokens,
        )

    # ---- sizes ----
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_prefill(self) -> bool:
        """Still computing its prompt (or recomputing prompt + outputs after a preemption).

        Decoding means: the prompt is done and only the last sampled token is left to compute.
        """
        return self.num_computed_tokens < max(self.num_prompt_tokens, self.num_tokens - 1)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.finish_reason

    def max_total_tokens(self, max_model_len: int) -> int:
        """The most tokens this request can ever hold: what its KV cache may grow to."""
        max_tokens = self.sampling_params.max_tokens
        if max_tokens is None:
            return max_model_len
        return min(max_model_len, self.num_prompt_tokens + max_tokens)

    # ---- updates ----
    def append_output_token(self, token_id: int, now: float) -> None:
        self.token_ids.append(int(token_id))
        self.record.token_times.append(now)
        self.record.num_output_tokens = self.num_output_tokens

    def check_stop(self, max_model_len: int) -> RequestStatus | None:
        """After appending a token: the finished status it causes, or None (stop strings: see engine)."""
        params, last = self.sampling_params, self.token_ids[-1]
        if not params.ignore_eos and last in self.eos_token_ids:
            return RequestStatus.FINISHED_STOPPED
        if last in params.stop_token_ids:  # type: ignore[operator]  # a list after __post_init__
            self.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
        if params.max_tokens is not None and self.num_output_tokens >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if self.num_tokens >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens} "
            f"(prompt {self.num_prompt_tokens}), computed={self.num_computed_tokens}, "
            f"blocks={len(self.block_table)})"
        )


Sequence = Request  # nano-vllm's name for the same thing
SequenceStatus = RequestStatus
