"""A request as the scheduler sees it: tokens, progress, status, KV blocks, sampling params, timestamps.

vLLM v1 calls this ``Request`` (nano-vllm calls the same thing ``Sequence``). Its one number
that drives scheduling is ``num_computed_tokens``: how many of ``token_ids`` (prompt + output) already
have their K/V in the cache. Each step gives a request tokens until computed catches up with
``num_tokens``; then its last position's logits give the next token.

No torch here: the simulator drives the same requests with a simulated executor. Only the scheduler
changes ``status`` and ``num_computed_tokens`` (and the block manager the block table).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from minengine.core.records import RequestRecord
from minengine.core.sampling_params import SamplingParams


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
        self.spec_token_ids: list[int] = []  # drafts to verify in its next step (speculative decoding)
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it
        # Set by ``prepare_stops`` when the scheduler takes the request: what lets it append most tokens
        # without the full stop checks (see ``Scheduler.update_from_output``).
        self.stop_token_set: frozenset[int] = frozenset()
        self.max_num_tokens = 0
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
        return self.num_computed_tokens < max(self.num_prompt_tokens, len(self.token_ids) - 1)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    # The record is the one place these counts live (the scheduler writes them there).
    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens found in the prefix cache when the request was first admitted."""
        return self.record.num_cached_tokens

    @property
    def num_preemptions(self) -> int:
        return self.record.num_preemptions

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
    def prepare_stops(self, max_model_len: int) -> None:
        """Precompute the stop rule for a scheduler with this ``max_model_len``: the token ids that can
        stop it (EOS unless ``ignore_eos``, plus ``stop_token_ids``) and the length it stops at."""
        params = self.sampling_params
        stops = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stops.update(self.eos_token_ids)
        self.stop_token_set = frozenset(stops)
        self.max_num_tokens = self.max_total_tokens(max_model_len)

    def append_output_token(self, token_id: int, now: float,
                            max_model_len: int | None = None) -> RequestStatus | None:
        """Append a sampled token; with ``max_model_len``, also return the finished status it causes (or
        None): EOS, a stop token id, max_tokens, the context limit (stop strings: see the engine). One
        call, not two: the scheduler makes it for every running request at every step."""
        token_ids = self.token_ids
        last = int(token_id)
        token_ids.append(last)
        num_output = len(token_ids) - self.num_prompt_tokens
        record = self.record
        record.token_times.append(now)
        record.num_output_tokens = num_output
        if max_model_len is None:
            return None
        params = self.sampling_params
        if last in self.eos_token_ids and not params.ignore_eos:
            return RequestStatus.FINISHED_STOPPED
        if params.stop_token_ids and last in params.stop_token_ids:
            self.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
        if params.max_tokens is not None and num_output >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if len(token_ids) >= max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, tokens={self.num_tokens} "
            f"(prompt {self.num_prompt_tokens}), computed={self.num_computed_tokens}, "
            f"blocks={len(self.block_table)})"
        )

