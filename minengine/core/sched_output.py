"""``SchedulerOutput``: what one step runs (which requests, how many tokens each, who was preempted).

It is the whole contract between the scheduler and an executor: the real model runner packs it into
tensors, the simulator's roofline executor prices it, and neither needs anything else to run the step
(vLLM v1 passes the same kind of object from its scheduler to its workers).

Speed: the scheduler writes each request's share as a plain tuple (``entries``; a tuple costs a fifth
of an object to build) plus the two lists a ``StepRecord`` and a cost model need
(``decode_context_lens``, ``prefill_chunks``). ``scheduled``, the list of ``ScheduledRequest`` objects,
is built from the tuples the first time someone asks (the model runner does; the simulator never
does), so a simulated step with 256 decodes builds no per-request objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from minengine.core.records import StepRecord
from minengine.core.request import Request

# One request's share of a step, as the scheduler writes it: (request, num_tokens, start, is_prefill, sample).
Entry = tuple[Request, int, int, bool, bool]


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


class SchedulerOutput:
    """What to run in one step (batch order = ``scheduled`` order) and the numbers a StepRecord needs.

    The scheduler builds it from ``entries``; tests and hand-made batches may pass ``scheduled``
    instead. Either way ``entries``, ``scheduled``, ``decode_context_lens`` and ``prefill_chunks`` agree.
    """

    def __init__(
        self, scheduled: list[ScheduledRequest] | None = None, *, entries: list[Entry] | None = None,
        decode_context_lens: list[int] | None = None, prefill_chunks: list[tuple[int, int]] | None = None,
        preempted_request_ids: list[str] | None = None, num_running: int = 0, num_waiting: int = 0,
        kv_blocks_used: int = 0, kv_blocks_total: int = 0, prefix_cache_queries: int = 0,
        prefix_cache_hits: int = 0, finished_req_ids: set[str] | None = None,
        scheduled_spec_decode_tokens: dict[str, list[int]] | None = None,
    ) -> None:
        self.entries: list[Entry] = [] if entries is None else entries
        # KV length (context + the new token) of each decode, and (chunk tokens, context before it) of
        # each prefill chunk, in batch order: the StepRecord's fields, written as the scheduler schedules.
        self.decode_context_lens: list[int] = [] if decode_context_lens is None else decode_context_lens
        self.prefill_chunks: list[tuple[int, int]] = [] if prefill_chunks is None else prefill_chunks
        self.preempted_request_ids: list[str] = preempted_request_ids or []
        self.num_running = num_running  # after scheduling
        self.num_waiting = num_waiting
        self.kv_blocks_used = kv_blocks_used
        self.kv_blocks_total = kv_blocks_total
        self.prefix_cache_queries = prefix_cache_queries  # tokens looked up by requests admitted in this step
        self.prefix_cache_hits = prefix_cache_hits
        # Requests that finished or were aborted since the previous step: an executor that keeps
        # per-request state (the sampler's seeded generators) drops it (vLLM's ``finished_req_ids``).
        self.finished_req_ids: set[str] = set() if finished_req_ids is None else finished_req_ids
        # Speculative decoding (vLLM's name): the drafts a decode verifies in this step. Such a decode
        # computes 1 + len(drafts) tokens: its last token, then the drafts; the executor returns the
        # tokens it keeps as a list, and ``update_from_output`` counts them here.
        self.scheduled_spec_decode_tokens: dict[str, list[int]] = (
            {} if scheduled_spec_decode_tokens is None else scheduled_spec_decode_tokens)
        self.num_accepted_tokens = 0
        self._scheduled: list[ScheduledRequest] | None = None
        if scheduled is not None:
            self.scheduled = scheduled

    def __repr__(self) -> str:
        batch = ", ".join(f"{e[0].request_id}:{e[1]}" for e in self.entries)
        return (f"SchedulerOutput([{batch}], preempted={self.preempted_request_ids}, "
                f"running={self.num_running}, waiting={self.num_waiting})")

    @property
    def scheduled(self) -> list[ScheduledRequest]:
        """The batch as ``ScheduledRequest`` objects, in order (built once, from ``entries``)."""
        if self._scheduled is None:
            self._scheduled = [ScheduledRequest(*e) for e in self.entries]
        return self._scheduled

    @scheduled.setter
    def scheduled(self, value: list[ScheduledRequest]) -> None:
        self._scheduled = value
        self.entries = [(s.request, s.num_tokens, s.start, s.is_prefill, s.sample) for s in value]
        self.decode_context_lens = [s.start + 1 for s in value if not s.is_prefill]
        self.prefill_chunks = [(s.num_tokens, s.start) for s in value if s.is_prefill]

    @property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return {e[0].request_id: e[1] for e in self.entries}

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(e[1] for e in self.entries)

    @property
    def prefill_request_ids(self) -> list[str]:
        return [e[0].request_id for e in self.entries if e[3]]

    @property
    def decode_request_ids(self) -> list[str]:
        return [e[0].request_id for e in self.entries if not e[3]]

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c for c, _ in self.prefill_chunks)

    @property
    def num_decode_tokens(self) -> int:
        return sum(e[1] for e in self.entries if not e[3])

    def to_step_record(self, step: int, start: float, end: float, **times: float) -> StepRecord:
        """A StepRecord of this batch; ``times`` are t_schedule / t_prepare / t_forward / t_sample."""
        chunks, decode_lens = self.prefill_chunks, self.decode_context_lens
        drafts = sum(len(d) for d in self.scheduled_spec_decode_tokens.values()) if (
            self.scheduled_spec_decode_tokens) else 0
        return StepRecord(
            step=step,
            start=start,
            end=end,
            num_prefill_tokens=sum(c for c, _ in chunks),
            num_decode_tokens=len(self.entries) - len(chunks) + drafts,  # a decode: 1 token + its drafts
            num_prefill_seqs=len(chunks),
            num_decode_seqs=len(decode_lens),
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_preempted=len(self.preempted_request_ids),
            kv_blocks_used=self.kv_blocks_used,
            kv_blocks_total=self.kv_blocks_total,
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            num_draft_tokens=drafts,
            num_accepted_tokens=self.num_accepted_tokens,
            decode_context_lens=decode_lens,
            prefill_chunks=chunks,
            **times,
        )

