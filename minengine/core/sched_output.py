"""``SchedulerOutput``: what one step runs (which requests, how many tokens each, who was preempted).

It is the whole contract between the scheduler and an executor: the real model runner packs it into
tensors, the simulator's roofline executor prices it, and neither needs anything else to run the step
(vLLM v1 passes the same kind of object from its scheduler to its workers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minengine.core.records import StepRecord
from minengine.core.request import Request


@dataclass(slots=True)  # one per scheduled request per step: slots make it cheaper to build and read
class ScheduledRequest:
    """One request's share of a step: compute tokens ``start .. start + num_tokens - 1``."""

    request: Request
    num_tokens: int
    start: int  # num_computed_tokens before this step (the context already in the KV cache)
    is_prefill: bool
    sample: bool  # True when this step computes the request's last token: a new token will be sampled

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass
class SchedulerOutput:
    """What to run in one step (batch order = ``scheduled`` order) and the numbers a StepRecord needs."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)
    num_running: int = 0  # after scheduling
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_cache_queries: int = 0  # tokens looked up by requests admitted in this step
    prefix_cache_hits: int = 0
    # Requests that finished or were aborted since the previous step: an executor that keeps per-request
    # state (the sampler's seeded generators) drops it (vLLM's ``finished_req_ids``).
    finished_req_ids: set[str] = field(default_factory=set)

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {s.request_id: s.num_tokens for s in self.scheduled}

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def prefill_request_ids(self) -> list[str]:
        return [s.request_id for s in self.scheduled if s.is_prefill]

    @property
    def decode_request_ids(self) -> list[str]:
        return [s.request_id for s in self.scheduled if not s.is_prefill]

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled if s.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled if not s.is_prefill)

    def to_step_record(self, step: int, start: float, end: float, **times: float) -> StepRecord:
        """A StepRecord of this batch (one pass); ``times`` are t_schedule / t_prepare / t_forward / t_sample."""
        decode_lens: list[int] = []
        chunks: list[tuple[int, int]] = []
        prefill_tokens = 0
        for s in self.scheduled:
            if s.is_prefill:
                chunks.append((s.num_tokens, s.start))
                prefill_tokens += s.num_tokens
            else:
                decode_lens.append(s.start + 1)
        return StepRecord(
            step=step,
            start=start,
            end=end,
            num_prefill_tokens=prefill_tokens,
            num_decode_tokens=len(self.scheduled) - len(chunks),  # a decode computes one token
            num_prefill_seqs=len(chunks),
            num_decode_seqs=len(decode_lens),
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_preempted=len(self.preempted_request_ids),
            kv_blocks_used=self.kv_blocks_used,
            kv_blocks_total=self.kv_blocks_total,
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            decode_context_lens=decode_lens,
            prefill_chunks=chunks,
            **times,
        )
