"""The token-budget scheduler (vLLM v1's rule) and its pluggable policies.

Every request has ``num_computed_tokens`` and ``num_tokens`` (prompt + output). Each step hands out at
most ``max_num_batched_tokens`` tokens so that computed catches up with total; a decoding request needs
1 token, a prefill needs its whole prompt (or, with chunked prefill, as much as fits: Sarathi-Serve's
chunks). At most ``max_num_seqs`` requests run at once. One ``schedule()`` call:

1. asks the policy for the order in which requests are offered the budget (``SchedulingPolicy.order``);
2. a *running* request gets its tokens if its KV blocks can be allocated; when they cannot, the
   policy's victim (by default the most recently admitted running request not yet scheduled in this
   step) is preempted by recompute: its blocks are freed, it goes back to the FRONT of the waiting queue
   and will recompute prompt + output later. Repeat until the allocation succeeds or the request itself
   was the victim;
3. a *waiting* request is admitted only if nothing was preempted in this step and fewer than
   ``max_num_seqs`` run: look up the prefix cache, take the rest (chunked to the remaining budget, or
   the whole remainder when chunked prefill is off), allocate, leaving free the blocks that running
   requests later in the order need for this step (so an admission never causes a preemption, even
   when a policy puts waiting requests first). The first waiting request that does not fit (budget or
   blocks) stops admissions for this step: no overtaking, like vLLM's FCFS queue.

Chunked prefill off: ``EngineConfig`` guarantees ``max_num_batched_tokens >= max_model_len``, so any
prompt fits an empty step; it waits while the remaining budget is too small.

No torch and no model here: the engine's model runner and the simulator's cost model both consume the
``SchedulerOutput``, and ``update_from_output`` takes plain token ids back.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from minengine.config import EngineConfig
from minengine.engine.block_manager import BlockManager
from minengine.engine.sequence import Request, RequestStatus
from minengine.metrics.records import StepRecord


# ---- policies ----
class SchedulingPolicy:
    """Who is offered the step's token budget first. Subclass it to write your own policy.

    The interface is two methods and one flag; the scheduler enforces budget, ``max_num_seqs`` and
    memory, so a policy cannot break the engine, only be slow or unfair:

    - ``order(running, waiting)`` returns the requests to offer tokens to, in order. ``running`` is in
      admission order, ``waiting`` in queue order (preempted requests at the front). Leaving a request
      out skips it for this step. Each running request gets all the tokens it needs if they fit
      (a decode: 1; an unfinished prefill: the rest of its prompt, chunked to the remaining budget);
      each waiting one is admitted if it fits, and the first that does not fit stops admissions.
    - ``select_victim(candidates)`` picks whom to preempt when a running request needs a KV block and
      none is free; ``candidates`` are the running requests not yet scheduled in this step (the needy
      request included), in admission order. Default: the last one (most recently admitted), as vLLM.
    - ``decode_with_prefill``: if False, a step that has already scheduled prompt tokens skips the
      decodes that come after them in the order (vLLM V0's default: prefill steps and decode steps).
    """

    name = "custom"
    decode_with_prefill: bool = True

    def order(self, running: Sequence[Request], waiting: Sequence[Request]) -> list[Request]:
        raise NotImplementedError

    def select_victim(self, candidates: Sequence[Request]) -> Request:
        return candidates[-1]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class DecodeFirstPolicy(SchedulingPolicy):
    """vLLM v1 / Sarathi-Serve "stall-free" order: running decodes, then running prefill chunks, then
    new requests. Decodes are never delayed by a long prompt, which keeps inter-token latency flat."""

    name = "decode_first"

    def order(self, running: Sequence[Request], waiting: Sequence[Request]) -> list[Request]:
        decodes = [r for r in running if not r.is_prefill]
        prefills = [r for r in running if r.is_prefill]
        return decodes + prefills + list(waiting)


class PrefillFirstPolicy(SchedulingPolicy):
    """The classic vLLM V0 order: admit waiting requests first (FCFS), then running prefill chunks, then
    decodes. With ``decode_with_prefill=False`` (default) a step that schedules any prompt tokens runs no
    decodes, so decodes only run in steps with no prefill work: new requests get their first token
    sooner (lower TTFT) and running ones stall while prompts are processed (higher ITL). With True,
    decodes fill whatever budget the prefills left in the same step."""

    name = "prefill_first"

    def __init__(self, decode_with_prefill: bool = False) -> None:
        self.decode_with_prefill = decode_with_prefill

    def order(self, running: Sequence[Request], waiting: Sequence[Request]) -> list[Request]:
        prefills = [r for r in running if r.is_prefill]
        decodes = [r for r in running if not r.is_prefill]
        return list(waiting) + prefills + decodes


POLICIES = {"decode_first": DecodeFirstPolicy, "prefill_first": PrefillFirstPolicy}


def make_policy(policy: str | SchedulingPolicy) -> SchedulingPolicy:
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
        return POLICIES[policy]()
    return policy


# ---- scheduler output ----
@dataclass
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
        """A StepRecord of this batch; ``times`` are t_schedule / t_prepare / t_forward / t_sample."""
        return StepRecord(
            step=step,
            start=start,
            end=end,
            num_prefill_tokens=self.num_prefill_tokens,
            num_decode_tokens=self.num_decode_tokens,
            num_prefill_seqs=sum(s.is_prefill for s in self.scheduled),
            num_decode_seqs=sum(not s.is_prefill for s in self.scheduled),
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_preempted=len(self.preempted_request_ids),
            kv_blocks_used=self.kv_blocks_used,
            kv_blocks_total=self.kv_blocks_total,
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            decode_context_lens=[s.start + 1 for s in self.scheduled if not s.is_prefill],
            prefill_chunks=[(s.num_tokens, s.start) for s in self.scheduled if s.is_prefill],
            **times,
        )


# ---- scheduler ----
class Scheduler:
    """Owns the waiting queue, the running list and the block manager; decides every step's batch."""

    def __init__(
        self, config: EngineConfig, num_blocks: int, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        if not config.is_resolved:
            raise ValueError(
                "Scheduler needs a resolved EngineConfig: call config.resolved(max_position_embeddings)"
            )
        self.config = config
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens: int = config.max_num_batched_tokens  # type: ignore[assignment]
        self.max_model_len: int = config.max_model_len  # type: ignore[assignment]
        self.enable_chunked_prefill = config.enable_chunked_prefill
        self.policy = make_policy(config.policy)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.clock = clock
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.num_preemptions = 0  # total, like vllm:num_preemptions

    # ---- requests in and out ----
    def check_request(self, request: Request) -> None:
        """Raise ValueError if the request can never run (too long for the model or the KV cache)."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        n, limit = request.num_prompt_tokens, self.max_model_len
        if n >= limit:
            raise ValueError(
                f"request {request.request_id!r}: the prompt has {n} tokens but max_model_len is {limit}, "
                "which leaves no room for an output token; shorten the prompt or raise max_model_len"
            )
        need, bm = request.max_total_tokens(limit), self.block_manager
        if bm.blocks_needed(need - 1) > bm.num_blocks:  # the last sampled token's K/V is never stored
            raise ValueError(
                f"request {request.request_id!r} may grow to {need} tokens (prompt {n} + max_tokens "
                f"{request.sampling_params.max_tokens}, at most max_model_len {limit}) but the whole KV "
                f"cache holds {bm.num_blocks * bm.block_size} tokens ({bm.num_blocks} blocks of "
                f"{bm.block_size}); lower max_tokens or give the cache more blocks (num_blocks / "
                "kv_cache_memory_bytes)"
            )

    def add_request(self, request: Request) -> None:
        self.check_request(request)
        request.status = RequestStatus.WAITING
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def finish_request(
        self, request_id: str, status: RequestStatus, now: float | None = None
    ) -> Request | None:
        """End a request (abort, or a stop string found by the engine): free its blocks at once."""
        assert status.is_finished
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._finish(request, status, self.clock() if now is None else now)
        return request

    def abort_request(self, request_id: str) -> Request | None:
        return self.finish_request(request_id, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # ---- one step ----
    def schedule(self) -> SchedulerOutput:
        """Pick this step's batch (see the module docstring for the rule)."""
        bm, now = self.block_manager, self.clock()
        queries0, hits0 = bm.prefix_cache_queries, bm.prefix_cache_hits
        budget = self.max_num_batched_tokens
        out = SchedulerOutput()
        scheduled: set[str] = set()
        preempted: list[Request] = []
        admitting = True
        prefill_scheduled = False

        for req in self.policy.order(self.running, self.waiting):
            if budget == 0:
                break
            if req.status == RequestStatus.RUNNING:
                if req.request_id in scheduled:
                    continue
                if not req.is_prefill and prefill_scheduled and not self.policy.decode_with_prefill:
                    continue
                num_new = min(req.num_tokens - req.num_computed_tokens, budget)
                while not bm.allocate_slots(req, num_new):
                    victims = [r for r in self.running if r.request_id not in scheduled]
                    victim = self.policy.select_victim(victims)
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is req:
                        break
                if req.status != RequestStatus.RUNNING:
                    continue  # it preempted itself
            elif req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                if not admitting or preempted or len(self.running) >= self.max_num_seqs:
                    admitting = False
                    continue
                hits, num_cached = bm.get_computed_blocks(req)
                num_new = req.num_tokens - num_cached
                if num_new > budget and not self.enable_chunked_prefill:
                    admitting = False
                    continue
                num_new = min(num_new, budget)
                if not bm.allocate_slots(
                    req, num_new, hits, reserve=self._reserve(scheduled, budget - num_new)
                ):
                    admitting = False
                    continue
                self._admit(req, num_cached, now)
            else:
                continue  # finished, or preempted earlier in this loop
            is_prefill, sample = req.is_prefill, req.num_computed_tokens + num_new == req.num_tokens
            out.scheduled.append(ScheduledRequest(req, num_new, req.num_computed_tokens, is_prefill, sample))
            scheduled.add(req.request_id)
            budget -= num_new
            prefill_scheduled |= is_prefill

        out.preempted_request_ids = [r.request_id for r in preempted]
        out.num_running, out.num_waiting = len(self.running), len(self.waiting)
        out.kv_blocks_used, out.kv_blocks_total = bm.num_used_blocks, bm.num_blocks
        out.prefix_cache_queries = bm.prefix_cache_queries - queries0
        out.prefix_cache_hits = bm.prefix_cache_hits - hits0
        return out

    def update_from_output(
        self, output: SchedulerOutput, sampled_token_ids: dict[str, int], now: float | None = None
    ) -> list[Request]:
        """After the forward pass: advance computed tokens, cache full blocks, append sampled tokens,
        stop finished requests (EOS, stop token ids, max_tokens, max_model_len) and free their blocks.

        Returns the requests that finished. Stop *strings* need text: the engine checks them and calls
        ``finish_request``.
        """
        now = self.clock() if now is None else now
        finished = []
        for s in output.scheduled:
            req = s.request
            if req.status != RequestStatus.RUNNING:
                continue  # aborted while the step ran
            req.num_computed_tokens += s.num_tokens
            self.block_manager.cache_blocks(req)
            token = sampled_token_ids.get(s.request_id)
            if token is None:
                continue  # a prefill chunk that did not reach the end of the prompt
            req.append_output_token(token, now)
            status = req.check_stop(self.max_model_len)
            if status is not None:
                self.requests.pop(req.request_id)
                self.running.remove(req)
                self._finish(req, status, now)
                finished.append(req)
        return finished

    # ---- helpers ----
    def _reserve(self, scheduled: set[str], budget: int) -> int:
        """Blocks that running requests not yet scheduled in this step may still need (for their next
        token or chunk). An admission must leave them free, so admitting never causes a preemption."""
        bm, total = self.block_manager, 0
        for r in self.running:
            if r.request_id not in scheduled:
                n = min(r.num_tokens - r.num_computed_tokens, max(budget, 1))
                total += max(0, bm.blocks_needed(r.num_computed_tokens + n) - len(r.block_table))
        return total

    def _admit(self, req: Request, num_cached: int, now: float) -> None:
        self.waiting.remove(req)  # usually the head: O(1)
        self.running.append(req)
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = num_cached
        if req.record.first_scheduled_time is None:
            req.record.first_scheduled_time = now
            req.num_cached_tokens = req.record.num_cached_tokens = num_cached

    def _preempt(self, req: Request) -> None:
        """Recompute-style preemption: drop its KV, send it to the front of the waiting queue."""
        self.block_manager.free(req)
        self.running.remove(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.record.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _finish(self, req: Request, status: RequestStatus, now: float) -> None:
        self.block_manager.free(req)
        req.status = status
        req.record.finish_time = now
        req.record.finish_reason = status.finish_reason
