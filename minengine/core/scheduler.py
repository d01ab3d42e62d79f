"""The token-budget scheduler (vLLM v1's rule): the only writer of who runs and how far each request got.

Every request has ``num_computed_tokens`` and ``num_tokens`` (prompt + output). Each step hands out at
most ``max_num_batched_tokens`` tokens so that computed catches up with total; a decoding request needs
1 token, a prefill needs its whole prompt (or, with chunked prefill, as much as fits: Sarathi-Serve's
chunks). At most ``max_num_seqs`` requests run at once. One ``schedule()`` call:

1. asks the policy (``core/policies.py``) for the order in which requests are offered the budget;
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

No torch and no model here: ``EngineCore`` hands the ``SchedulerOutput`` to an executor (the engine's
model runner or the simulator's cost model) and gives the sampled token ids back to
``update_from_output``. Nothing outside this class writes ``running``, ``waiting``, a request's
``status`` or its ``num_computed_tokens``; the public seams below are how everyone else asks:
``add_request`` (optionally with KV that was computed elsewhere, as a disaggregated decode instance
receives it), ``finish_request`` / ``abort_request``, and ``update_from_output``.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable

from minengine.config import EngineConfig
from minengine.core.block_manager import BlockManager
from minengine.core.ngram_proposer import Drafter, NgramProposer
from minengine.core.policies import (
    DecodeFirstPolicy,
    PolicyError,
    PrefillFirstPolicy,
    SchedulingPolicy,
    make_policy,
)
from minengine.core.request import Request, RequestStatus
from minengine.core.sched_output import Entry, SchedulerOutput
from minengine.utils import cdiv

# Called after each sampled token is appended: (request, finishing) -> the stop string it completed, or
# None. The engine's detokenizer answers it (stop strings need text; the scheduler only sees ids).
StopChecker = Callable[[Request, bool], "str | None"]


def check_request_size(
    request_id: str, num_prompt_tokens: int, max_tokens: int | None, max_model_len: int, num_blocks: int,
    block_size: int,
) -> None:
    """Raise ValueError if a request of this size can never run (too long for the model or the cache).

    Plain numbers in, so the simulator can check a whole workload before it builds any request.
    """
    if num_prompt_tokens >= max_model_len:
        raise ValueError(
            f"request {request_id!r} can never run: the prompt has {num_prompt_tokens} tokens but "
            f"max_model_len is {max_model_len}, which leaves no room for an output token; shorten the prompt "
            "or raise max_model_len"
        )
    need = max_model_len if max_tokens is None else min(max_model_len, num_prompt_tokens + max_tokens)
    if cdiv(need - 1, block_size) > num_blocks:  # the last sampled token's K/V is never stored
        raise ValueError(
            f"request {request_id!r} can never run: it may grow to {need} tokens (prompt {num_prompt_tokens} "
            f"+ max_tokens {max_tokens}, at most max_model_len {max_model_len}) but the whole KV cache holds "
            f"{num_blocks * block_size} tokens ({num_blocks} blocks of {block_size}); lower max_tokens "
            "or give the cache more blocks (num_blocks / kv_cache_memory_bytes)"
        )


class Scheduler:
    """Owns the waiting queue, the running list and the block manager; decides every step's batch."""

    def __init__(
        self, config: EngineConfig, num_blocks: int, clock: Callable[[], float] = time.perf_counter,
        drafter: Drafter | None = None,
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
        # Only a policy that sizes chunks itself pays for the call (the hot loop stays plain arithmetic).
        self._policy_sizes = type(self.policy).num_new_tokens is not SchedulingPolicy.num_new_tokens
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.clock = clock
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.num_preemptions = 0  # total, like vllm:num_preemptions
        self._num_external_computed: dict[str, int] = {}  # waiting request id -> tokens whose KV came in
        self._finished_req_ids: set[str] = set()  # since the last schedule(), for the executor
        # Speculative decoding: drafts for each decoding request, proposed after every step it samples in:
        # by n-gram lookup, or by ``drafter`` (the simulator's, which has no real tokens to look up).
        spec = config.speculative_config
        if drafter is not None and spec is None:
            raise ValueError("a drafter needs speculative_config (it says how many tokens to draft)")
        if drafter is None and spec is not None:
            drafter = NgramProposer(spec, self.max_model_len)
        self.drafter = drafter
        # Totals since start, like vLLM's spec_decode counters: decodes that verified drafts, drafts, kept.
        self.spec_decode_stats = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}

    # ---- requests in and out ----
    def check_request(self, request: Request) -> None:
        """Raise ValueError if the request can never run (too long for the model or the KV cache)."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        bm = self.block_manager
        check_request_size(request.request_id, request.num_prompt_tokens, request.sampling_params.max_tokens,
                           self.max_model_len, bm.num_blocks, bm.block_size)

    def add_request(self, request: Request, num_computed_tokens: int = 0) -> None:
        """Queue a new request. ``num_computed_tokens`` > 0 says that the KV of its first tokens was
        computed elsewhere and will be in its blocks when it is admitted: a disaggregated decode
        instance receives requests that way (vLLM's KV-connector seam). At least the last token is
        always left to compute here: its logits give the next token."""
        self.check_request(request)
        if request.status != RequestStatus.WAITING or request.block_table:
            raise ValueError(f"request {request.request_id!r} is not new (status {request.status.name})")
        if num_computed_tokens:
            if not 0 < num_computed_tokens < request.num_tokens:
                raise ValueError(
                    f"request {request.request_id!r}: num_computed_tokens must be in [0, "
                    f"{request.num_tokens - 1}] (its last token is computed here), got {num_computed_tokens}"
                )
            self._num_external_computed[request.request_id] = num_computed_tokens
        request.prepare_stops(self.max_model_len)
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def finish_request(
        self, request_id: str, status: RequestStatus, now: float | None = None
    ) -> Request | None:
        """End a request now (abort, or a stop the engine found): free its blocks at once."""
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
        block_size = bm.block_size
        queries0, hits0 = bm.prefix_cache_queries, bm.prefix_cache_hits
        budget = self.max_num_batched_tokens
        entries: list[Entry] = []
        decode_lens: list[int] = []
        chunks: list[tuple[int, int]] = []
        spec_tokens: dict[str, list[int]] = {}
        out = SchedulerOutput(entries=entries, decode_context_lens=decode_lens, prefill_chunks=chunks,
                              finished_req_ids=self._finished_req_ids,
                              scheduled_spec_decode_tokens=spec_tokens)
        self._finished_req_ids = set()
        # Ids scheduled so far in this step. A built-in policy never offers a request twice, so for it the
        # set is only built when a preemption or an admission needs it (``_scheduled_ids``).
        dedupe = type(self.policy) not in (DecodeFirstPolicy, PrefillFirstPolicy)
        scheduled: set[str] = set()
        preempted: list[Request] = []
        admitting = True
        prefill_scheduled = False
        waiting: deque[Request] | list[Request] = self.waiting
        if self.policy.admits_in_queue_order:  # only the head of the queue could be admitted this step
            waiting = list(itertools.islice(self.waiting, max(0, self.max_num_seqs - len(self.running))))

        # Locals and inlined properties: this loop runs for every running request at every step.
        running_status, policy_sizes = RequestStatus.RUNNING, self._policy_sizes
        decode_with_prefill = self.policy.decode_with_prefill
        add_entry, add_decode, add_chunk = entries.append, decode_lens.append, chunks.append
        for req in self.policy.order(self.running, waiting):
            if budget == 0:
                break
            if req.status is running_status:
                if dedupe and req.request_id in scheduled:
                    continue
                start = req.num_computed_tokens
                num_needed = len(req.token_ids) - start  # >= 1 for a running request
                if num_needed == 1 and start >= req.num_prompt_tokens:  # a decode: not req.is_prefill
                    if prefill_scheduled and not decode_with_prefill:
                        continue
                    num_new = 1  # a decode's one token: the policy sizes prompt work only
                    drafts = req.spec_token_ids
                    if drafts:  # speculative decoding: drafts ride along, as far as budget and length allow
                        drafts = drafts[: min(budget - 1, req.max_num_tokens - len(req.token_ids) - 1)]
                        num_new += len(drafts)
                        if start + num_new > len(req.block_table) * block_size and not bm.allocate_slots(
                                req, num_new):
                            drafts, num_new = [], 1  # no free block for a guess: plain decode, no preemption
                    # Most decode steps fit in the last block already: no allocation to ask for.
                    if start + num_new > len(req.block_table) * block_size and not self._allocate_running(
                        req, num_new, entries, scheduled if dedupe else None, preempted
                    ):
                        continue  # it preempted itself
                    add_entry((req, num_new, start, False, True))
                    add_decode(start + num_new)
                    if drafts:
                        spec_tokens[req.request_id] = drafts
                    if dedupe:
                        scheduled.add(req.request_id)
                    budget -= num_new
                    continue
                num_new = num_needed if num_needed <= budget else budget
                if policy_sizes:
                    num_new = self._policy_tokens(req, num_needed, budget)
                    if not num_new:
                        continue
                if start + num_new > len(req.block_table) * block_size and not self._allocate_running(
                    req, num_new, entries, scheduled if dedupe else None, preempted
                ):
                    continue
                add_entry((req, num_new, start, True, num_new == num_needed))
                add_chunk((num_new, start))
                if dedupe:
                    scheduled.add(req.request_id)
                prefill_scheduled = True
                budget -= num_new
                continue
            elif req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                # Includes requests preempted earlier in this loop: nothing is admitted after a preemption.
                if not admitting or preempted or len(self.running) >= self.max_num_seqs:
                    admitting = False
                    continue
                hits, num_cached = bm.get_computed_blocks(req)
                num_computed = max(num_cached, self._num_external_computed.get(req.request_id, 0))
                num_new = req.num_tokens - num_computed
                if num_new > budget and not self.enable_chunked_prefill:
                    admitting = False
                    continue
                if self._policy_sizes:
                    num_new = self._policy_tokens(req, num_new, budget)
                    if not num_new:
                        continue
                num_new = min(num_new, budget)
                # Blocks for the KV that arrives from elsewhere are allocated like new tokens' blocks.
                num_slots = num_computed - num_cached + num_new
                ids = scheduled if dedupe else self._scheduled_ids(entries)
                if not bm.allocate_slots(req, num_slots, hits, reserve=self._reserve(ids, budget - num_new)):
                    admitting = False
                    continue
                self._admit(req, num_computed, num_cached, now)
                if dedupe:
                    scheduled.add(req.request_id)
                start = req.num_computed_tokens
                sample = start + num_new == len(req.token_ids)
                if req.is_prefill:
                    add_entry((req, num_new, start, True, sample))
                    add_chunk((num_new, start))
                    prefill_scheduled = True
                else:
                    add_entry((req, num_new, start, False, sample))
                    add_decode(start + 1)
                budget -= num_new
            # else: finished (aborted) after the policy ordered it

        out.preempted_request_ids = [r.request_id for r in preempted]
        out.num_running, out.num_waiting = len(self.running), len(self.waiting)
        out.kv_blocks_used, out.kv_blocks_total = bm.num_used_blocks, bm.num_blocks
        out.prefix_cache_queries = bm.prefix_cache_queries - queries0
        out.prefix_cache_hits = bm.prefix_cache_hits - hits0
        return out

    def update_from_output(
        self, output: SchedulerOutput, sampled_token_ids: dict[str, int | list[int]],
        now: float | None = None, stop_checker: StopChecker | None = None,
    ) -> list[Request]:
        """After the forward pass: advance computed tokens, cache full blocks, append sampled tokens,
        stop finished requests (EOS, stop token ids, max_tokens, max_model_len, and a stop string when
        ``stop_checker`` finds one) and free their blocks. Returns the requests that finished. A token
        that cannot stop its request is appended in line (``Request.prepare_stops``); others take
        ``Request.append_output_token``.
        """
        now = self.clock() if now is None else now
        finished = []
        running, max_model_len, length = (RequestStatus.RUNNING, self.max_model_len,
                                          RequestStatus.FINISHED_LENGTH)
        bm, bs = self.block_manager, self.block_manager.block_size
        caching = bm.enable_prefix_caching
        get_token = sampled_token_ids.get
        for req, n, start, is_prefill, sample in output.entries:
            if req.status is not running:
                continue  # aborted while the step ran
            token = get_token(req.request_id)
            if type(token) is list:  # a decode that verified drafts: the tokens it kept
                if self._append_verified(req, start, token, output, now, stop_checker):
                    finished.append(req)
                continue
            if n != 1 and not is_prefill:
                raise RuntimeError(
                    f"request {req.request_id!r} verified {n - 1} drafts in this step, but the executor "
                    "returned one token: ModelRunnerOutput.sampled_token_ids needs the list of tokens it kept"
                )
            end = start + n
            req.num_computed_tokens = end  # it was ``start``: only the scheduler moves it
            if caching and end // bs > start // bs:  # a block filled up: cache it
                bm.cache_blocks(req)
            if token is None:
                if sample:
                    raise RuntimeError(
                        f"the executor returned no token for request {req.request_id!r}, which sampled in "
                        "this step: ModelRunnerOutput.sampled_token_ids needs one for every request with "
                        "ScheduledRequest.sample"
                    )
                continue  # a prefill chunk that did not reach the end of the prompt
            if type(token) is int and token not in req.stop_token_set:  # append_output_token, inlined
                token_ids, record = req.token_ids, req.record
                token_ids.append(token)
                record.token_times.append(now)
                num_tokens = len(token_ids)
                record.num_output_tokens = num_tokens - req.num_prompt_tokens
                if num_tokens < req.max_num_tokens and stop_checker is None:
                    continue  # the common case: not finished
                status = length if num_tokens >= req.max_num_tokens else None
            else:
                status = req.append_output_token(token, now, max_model_len)
            if stop_checker is not None:
                stop = stop_checker(req, status is not None)
                if stop is not None:  # a stop string wins over a length stop in the same token (as vLLM)
                    status, req.stop_reason = RequestStatus.FINISHED_STOPPED, stop
            if status is not None:
                self.requests.pop(req.request_id)
                self._finish(req, status, now)
                finished.append(req)
        if finished:  # one pass over the running list, not one remove() per finished request
            self.running = [r for r in self.running if r.status is running]
        if self.drafter is not None:
            self._propose_drafts(output)
        return finished

    # ---- speculative decoding ----
    def _append_verified(self, req: Request, start: int, tokens: list[int], output: SchedulerOutput,
                         now: float, stop_checker: StopChecker | None) -> bool:
        """Apply a verified decode: ``tokens`` are the drafts the target kept, then its own token. Their
        K/V (the decode's token and the kept drafts) is computed; a rejected draft's slot is simply
        written over later, since ``num_computed_tokens`` stops before it. Tokens after a stop are
        dropped (and cut from ``tokens``, which the engine streams). True when the request finished."""
        drafts = output.scheduled_spec_decode_tokens.get(req.request_id, [])
        req.record.num_draft_tokens += len(drafts)
        req.record.num_accepted_tokens += len(tokens) - 1
        output.num_accepted_tokens += len(tokens) - 1
        stats = self.spec_decode_stats
        stats["num_drafts"] += 1
        stats["num_draft_tokens"] += len(drafts)
        stats["num_accepted_tokens"] += len(tokens) - 1
        status = None
        for i, token in enumerate(tokens):
            status = req.append_output_token(token, now, self.max_model_len)
            if stop_checker is not None:
                stop = stop_checker(req, status is not None)
                if stop is not None:
                    status, req.stop_reason = RequestStatus.FINISHED_STOPPED, stop
            if status is not None:
                del tokens[i + 1:]
                break
        req.num_computed_tokens = len(req.token_ids) - 1  # all but the newest token, as after any decode
        if self.block_manager.enable_prefix_caching:
            self.block_manager.cache_blocks(req)
        if status is None:
            return False
        self.requests.pop(req.request_id)
        self._finish(req, status, now)
        return True

    def _propose_drafts(self, output: SchedulerOutput) -> None:
        """New drafts for every request that got tokens in this step and decodes next (n-gram lookup over
        its prompt and output so far)."""
        assert self.drafter is not None
        for req, _, _, _, sample in output.entries:
            if sample and req.status is RequestStatus.RUNNING and not req.is_prefill:
                req.spec_token_ids = self.drafter.propose(req.token_ids)

    # ---- helpers ----
    def _policy_tokens(self, req: Request, num_needed: int, budget: int) -> int:
        """The policy's chunk size for ``req``, checked: an int in [0, min(needed, budget)]."""
        n = self.policy.num_new_tokens(req, num_needed, budget)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= min(num_needed, budget):
            raise PolicyError(
                f"policy {type(self.policy).__name__}.num_new_tokens gave request {req.request_id!r} {n!r} "
                f"tokens; it needs {num_needed} and {budget} are left in this step's budget "
                f"(max_num_batched_tokens {self.max_num_batched_tokens}): return an int from 0 to "
                f"{min(num_needed, budget)}"
            )
        if n < num_needed and req.is_prefill and not self.enable_chunked_prefill:
            raise PolicyError(
                f"policy {type(self.policy).__name__}.num_new_tokens gave request {req.request_id!r} {n} of "
                f"its {num_needed} prompt tokens, but chunked prefill is off: all of them or 0"
            )
        return n

    @staticmethod
    def _scheduled_ids(entries: list[Entry]) -> set[str]:
        """The ids of the requests this step has scheduled so far."""
        return {e[0].request_id for e in entries}

    def _allocate_running(
        self, req: Request, num_new: int, entries: list[Entry], scheduled: set[str] | None,
        preempted: list[Request],
    ) -> bool:
        """Blocks for a running request's next ``num_new`` tokens, preempting the policy's victims (among
        the running requests not scheduled yet in this step) until they fit. False: it preempted itself."""
        ids = scheduled
        while not self.block_manager.allocate_slots(req, num_new):
            if ids is None:
                ids = self._scheduled_ids(entries)
            victim = self.policy.select_victim([r for r in self.running if r.request_id not in ids])
            self._preempt(victim)
            preempted.append(victim)
            if victim is req:
                break
        return req.status is RequestStatus.RUNNING

    def _reserve(self, scheduled: set[str], budget: int) -> int:
        """Blocks that running requests not yet scheduled in this step may still need (for their next
        token or chunk). An admission must leave them free, so admitting never causes a preemption."""
        bm, total = self.block_manager, 0
        for r in self.running:
            if r.request_id not in scheduled:
                n = min(r.num_tokens - r.num_computed_tokens, max(budget, 1))
                total += max(0, bm.blocks_needed(r.num_computed_tokens + n) - len(r.block_table))
        return total

    def _admit(self, req: Request, num_computed: int, num_cached: int, now: float) -> None:
        self.waiting.remove(req)  # usually the head: O(1)
        self.running.append(req)
        self._num_external_computed.pop(req.request_id, None)  # a recompute after preemption starts over
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = num_computed
        if req.record.first_scheduled_time is None:
            req.record.first_scheduled_time = now
            req.record.num_cached_tokens = num_cached

    def _preempt(self, req: Request) -> None:
        """Recompute-style preemption: drop its KV, send it to the front of the waiting queue."""
        self.block_manager.free(req)
        self.running.remove(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.record.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _finish(self, req: Request, status: RequestStatus, now: float) -> None:
        self.block_manager.free(req)
        self._num_external_computed.pop(req.request_id, None)
        self._finished_req_ids.add(req.request_id)
        req.status = status
        req.record.finish_time = now
        req.record.finish_reason = status.finish_reason
