"""The fast scheduler makes the same decisions as the plain one it replaced.

``Scheduler.schedule`` / ``update_from_output`` and the block manager were rewritten for speed (the
simulator runs them once per request per step): tuples instead of ``ScheduledRequest`` objects, a
decode path without the prefill arithmetic, sampled tokens appended in line, no per-block calls.
``ReferenceScheduler`` below is the code as it was before (2026-12-01, commit a2702a4), kept as the
oracle: every step of random workloads (shared prefixes, preemptions, EOS and stop tokens, aborts,
every built-in policy, custom policies that size chunks or offer a request twice) must schedule the
same tokens, preempt the same requests, hold the same KV blocks and finish the same way. And a
simulated run gives the same step records and token times with either.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import minengine.sim.instance as sim_instance
from minengine.config import EngineConfig
from minengine.core.block_manager import BlockManager
from minengine.core.engine_core import EngineCore, NullExecutor
from minengine.core.policies import DecodeFirstPolicy, PrefillFirstPolicy, SchedulingPolicy, split_by_phase
from minengine.core.request import Request, RequestStatus
from minengine.core.sampling_params import SamplingParams
from minengine.core.sched_output import ScheduledRequest, SchedulerOutput
from minengine.core.scheduler import Scheduler
from minengine.sim import Simulator, Uniform, synthetic_workload
from minengine.sim.workload import RequestSpec


# ------------------------------------------------------------------ the oracle: the code before the rewrite
class ReferenceBlockManager(BlockManager):
    def cache_blocks(self, request: Request) -> None:
        if not self.enable_prefix_caching:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_table))
        start = self._num_hashed.get(request.request_id, 0)
        if num_full <= start:
            return
        bs = self.block_size
        hashes = self.block_hashes(request, num_full)
        for i in range(start, num_full):
            block = self.blocks[request.block_table[i]]
            if block.block_hash is not None or hashes[i] in self.cached_blocks:
                continue
            block.block_hash = hashes[i]
            block.token_ids = tuple(request.token_ids[i * bs : (i + 1) * bs])
            self.cached_blocks[hashes[i]] = block.block_id
        self._num_hashed[request.request_id] = num_full

    def allocate_slots(self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[int] = (),
                       reserve: int = 0) -> bool:
        bs = self.block_size
        total = request.num_computed_tokens + len(new_computed_blocks) * bs + num_new_tokens
        num_new_blocks = self.blocks_needed(total) - len(request.block_table) - len(new_computed_blocks)
        num_revived = sum(1 for b in new_computed_blocks if self.blocks[b].ref_cnt == 0)
        if num_new_blocks + num_revived + reserve > self.num_free_blocks:
            return False
        if self.enable_prefix_caching and not request.block_table and request.num_computed_tokens == 0:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += len(new_computed_blocks) * bs
            self._num_hashed[request.request_id] = len(new_computed_blocks)
        for block_id in new_computed_blocks:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                del self.free_queue[block_id]
            block.ref_cnt += 1
            request.block_table.append(block_id)
        for _ in range(max(0, num_new_blocks)):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                if self.cached_blocks.get(block.block_hash) == block_id:
                    del self.cached_blocks[block.block_hash]
                block.block_hash, block.token_ids = None, ()
            assert block.ref_cnt == 0
            block.ref_cnt = 1
            request.block_table.append(block_id)
        return True

    def free(self, request: Request) -> None:
        for block_id in reversed(request.block_table):
            block = self.blocks[block_id]
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0
            if block.ref_cnt == 0:
                self.free_queue[block_id] = None
                if block.block_hash is None:
                    self.free_queue.move_to_end(block_id, last=False)
        request.block_table = []
        self._num_hashed.pop(request.request_id, None)


class ReferenceScheduler(Scheduler):
    """``schedule`` and ``update_from_output`` as they were: one object per scheduled request, the phase
    computed for every request, a set of scheduled ids, the full stop checks for every token."""

    def __init__(self, config: EngineConfig, num_blocks: int, clock=None, drafter=None) -> None:
        super().__init__(config, num_blocks, **({} if clock is None else {"clock": clock}), drafter=drafter)
        bm = self.block_manager
        self.block_manager = ReferenceBlockManager(bm.num_blocks, bm.block_size, bm.enable_prefix_caching)

    def schedule(self) -> SchedulerOutput:
        bm, now = self.block_manager, self.clock()
        queries0, hits0 = bm.prefix_cache_queries, bm.prefix_cache_hits
        budget = self.max_num_batched_tokens
        out = SchedulerOutput(finished_req_ids=self._finished_req_ids)
        self._finished_req_ids = set()
        batch: list[ScheduledRequest] = []
        scheduled: set[str] = set()
        preempted: list[Request] = []
        admitting, prefill_scheduled = True, False
        waiting = list(self.waiting)
        if self.policy.admits_in_queue_order:
            waiting = waiting[: max(0, self.max_num_seqs - len(self.running))]
        for req in self.policy.order(self.running, waiting):
            if budget == 0:
                break
            if req.status == RequestStatus.RUNNING:
                if req.request_id in scheduled:
                    continue
                is_prefill = req.is_prefill
                if not is_prefill and prefill_scheduled and not self.policy.decode_with_prefill:
                    continue
                num_new = min(req.num_tokens - req.num_computed_tokens, budget)
                if self._policy_sizes:
                    num_new = self._policy_tokens(req, req.num_tokens - req.num_computed_tokens, budget)
                    if not num_new:
                        continue
                while not bm.allocate_slots(req, num_new):
                    victim = self.policy.select_victim([r for r in self.running
                                                        if r.request_id not in scheduled])
                    self._preempt(victim)
                    preempted.append(victim)
                    if victim is req:
                        break
                if req.status != RequestStatus.RUNNING:
                    continue
            elif req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
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
                num_slots = num_computed - num_cached + num_new
                if not bm.allocate_slots(req, num_slots, hits,
                                         reserve=self._reserve(scheduled, budget - num_new)):
                    admitting = False
                    continue
                self._admit(req, num_computed, num_cached, now)
                is_prefill = req.is_prefill
            else:
                continue
            start = req.num_computed_tokens
            batch.append(ScheduledRequest(req, num_new, start, is_prefill, start + num_new == req.num_tokens))
            scheduled.add(req.request_id)
            budget -= num_new
            prefill_scheduled |= is_prefill
        out.scheduled = batch
        out.preempted_request_ids = [r.request_id for r in preempted]
        out.num_running, out.num_waiting = len(self.running), len(self.waiting)
        out.kv_blocks_used, out.kv_blocks_total = bm.num_used_blocks, bm.num_blocks
        out.prefix_cache_queries = bm.prefix_cache_queries - queries0
        out.prefix_cache_hits = bm.prefix_cache_hits - hits0
        return out

    def update_from_output(self, output, sampled_token_ids, now=None, stop_checker=None) -> list[Request]:
        now = self.clock() if now is None else now
        finished = []
        bs = self.block_manager.block_size
        for s in output.scheduled:
            req = s.request
            if req.status != RequestStatus.RUNNING:
                continue
            req.num_computed_tokens += s.num_tokens
            if (s.start + s.num_tokens) // bs > s.start // bs:
                self.block_manager.cache_blocks(req)
            token = sampled_token_ids.get(req.request_id)
            if token is None:
                continue
            status = req.append_output_token(token, now, self.max_model_len)
            if stop_checker is not None:
                stop = stop_checker(req, status is not None)
                if stop is not None:
                    status, req.stop_reason = RequestStatus.FINISHED_STOPPED, stop
            if status is not None:
                self.requests.pop(req.request_id)
                self._finish(req, status, now)
                finished.append(req)
        self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]
        return finished


# ------------------------------------------------------------------ custom policies (the generic paths)
class ChunkCap(DecodeFirstPolicy):
    """Sizes chunks itself (the scheduler's ``num_new_tokens`` path) and is not a built-in type; with
    chunked prefill off a prompt must get all its tokens, so only chunks of a chunked run are capped."""

    def num_new_tokens(self, request: Request, num_needed: int, budget: int) -> int:
        return min(num_needed, budget, 7 if self.chunked else num_needed)


class OffersTwice(SchedulingPolicy):
    """Offers every request twice and picks the oldest victim: the scheduler must skip the repeats."""

    def order(self, running, waiting):
        decodes, prefills = split_by_phase(running)
        return prefills + decodes + prefills + list(waiting) + decodes

    def select_victim(self, candidates):
        return candidates[0]


POLICIES = ["decode_first", "prefill_first", PrefillFirstPolicy(decode_with_prefill=True), ChunkCap(),
            OffersTwice()]
ChunkCap.chunked = True
EOS = 0


def token_for(req: Request) -> int:
    """The same 'sampled' token in both runs: a function of the request and how far it got."""
    return (sum(map(ord, req.request_id)) * 7 + 2 * req.num_output_tokens) % 9


def step_view(out: SchedulerOutput, sched: Scheduler) -> tuple:
    batch = [(s.request_id, s.num_tokens, s.start, s.is_prefill, s.sample) for s in out.scheduled]
    record = out.to_step_record(0, 0.0, 0.0)
    tables = sorted((r.request_id, tuple(r.block_table)) for r in sched.running)
    return (batch, out.preempted_request_ids, out.num_running, out.num_waiting, out.kv_blocks_used,
            out.prefix_cache_queries, out.prefix_cache_hits, record.decode_context_lens,
            record.prefill_chunks, record.num_prefill_tokens, record.num_decode_tokens, tables,
            sorted(sched.block_manager.cached_blocks))


def run(cls: type[Scheduler], config: EngineConfig, num_blocks: int, specs: list[tuple]) -> tuple[list, list]:
    clock = iter(range(10**9)).__next__
    sched = cls(config, num_blocks, clock=lambda: float(clock()))
    core = EngineCore(sched, NullExecutor(token=token_for))
    pending, reqs, steps, step = sorted(specs, key=lambda s: s[0]), [], [], 0
    while pending or sched.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            arrival, rid, ids, params, abort_at = pending.pop(0)
            req = Request(rid, ids, params, eos_token_ids=[EOS])
            req.abort_at = abort_at
            sched.add_request(req)
            reqs.append(req)
        for req in reqs:
            if req.abort_at == step and not req.is_finished:
                sched.abort_request(req.request_id)
        step += 1
        inflight = core.start_step()
        if inflight is None:
            continue
        view = step_view(inflight.scheduler_output, sched)
        finished = core.finish_step(inflight).finished
        steps.append((view, [r.request_id for r in finished]))
        assert step < 3000
    ends = [(r.request_id, r.token_ids, r.status, r.stop_reason, r.record.token_times, r.num_preemptions)
            for r in reqs]
    return steps, ends


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    chunked = draw(st.booleans())
    config = EngineConfig(
        block_size=block_size, max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(64 if not chunked else 1, 96)),
        enable_chunked_prefill=chunked, enable_prefix_caching=draw(st.booleans()),
        policy=draw(st.sampled_from(POLICIES)),
    ).resolved(64)
    if isinstance(config.policy, ChunkCap):
        config.policy.chunked = chunked
    num_blocks = draw(st.integers(-(-64 // block_size), -(-160 // block_size)))
    prefix = [5 + i % 4 for i in range(draw(st.integers(0, 24)))]
    specs = []
    for i, (plen, max_tokens, arrival, kind, abort) in enumerate(draw(st.lists(st.tuples(
            st.integers(1, 30), st.integers(1, 20), st.integers(0, 15),
            st.sampled_from("eos ignore stop".split()), st.booleans()), min_size=1, max_size=14))):
        ids = (prefix if i % 2 else [])[: 63 - plen] + [10 + (i + j) % 5 for j in range(plen)]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=kind != "eos",
                                stop_token_ids=[4] if kind == "stop" else None)
        specs.append((arrival, f"r{i}", ids, params, arrival + 1 + (i * 7) % 9 if abort else None))
    return config, num_blocks, specs


@given(workloads())
@settings(max_examples=300, deadline=None)
def test_every_step_matches_the_reference_scheduler(workload) -> None:
    config, num_blocks, specs = workload
    fast = run(Scheduler, config, num_blocks, specs)
    reference = run(ReferenceScheduler, config, num_blocks, specs)
    assert len(fast[0]) == len(reference[0])
    for i, (a, b) in enumerate(zip(fast[0], reference[0], strict=True)):
        assert a == b, f"step {i + 1} differs"
    assert fast[1] == reference[1]


def test_the_workloads_reach_every_path() -> None:
    """The random workloads above are worth something only if they preempt, hit the prefix cache,
    stop on EOS and stop tokens and abort; one fixed draw of the same kind shows each happens."""
    config = EngineConfig(block_size=4, max_num_seqs=4, max_num_batched_tokens=20,
                          policy="decode_first").resolved(64)
    rng = random.Random(0)
    prefix = [5, 6, 7, 8] * 4
    specs = [(rng.randrange(6), f"r{i}", (prefix if i % 2 else []) + [10 + i] * rng.randrange(2, 20),
              SamplingParams(max_tokens=rng.randrange(8, 30), ignore_eos=i % 3 == 1,
                             stop_token_ids=[4] if i % 3 == 2 else None), 4 if i in (5, 6) else None)
             for i in range(12)]
    steps, ends = run(Scheduler, config, 24, specs)
    assert steps == run(ReferenceScheduler, config, 24, specs)[0]
    assert sum(len(view[1]) for view, _ in steps) > 0, "no preemption"
    assert sum(view[6] for view, _ in steps) > 0, "no prefix-cache hit"
    statuses = {status for *_, status, _reason, _times, _n in ends}
    assert {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
            RequestStatus.FINISHED_ABORTED} <= statuses
    assert any(reason == 4 for *_, reason, _t, _n in ends), "no stop token"


@pytest.mark.parametrize("engine", [{}, {"num_blocks": 900, "max_num_seqs": 64}, {"policy": "prefill_first"}])
def test_a_simulated_run_is_the_same_with_the_reference_scheduler(monkeypatch, engine) -> None:
    """The simulator at a size where batches are full and the KV cache runs out (preemptions)."""
    lengths = Uniform(20, 400)
    work = synthetic_workload(300, 40.0, lengths, lengths, seed=1)
    work += [RequestSpec(w.arrival_time, w.prompt_len, 30, prefix_id=0, prefix_len=min(64, w.prompt_len - 1),
                         max_tokens=60) for w in work[:40]]  # shared prefixes; true lengths hidden (an EOS)
    fast = Simulator("llama-3.1-8b", "h100", **engine).run(work)
    monkeypatch.setattr(sim_instance, "Scheduler", ReferenceScheduler)
    reference = Simulator("llama-3.1-8b", "h100", **engine).run(work)
    assert [s.to_dict() for s in fast.steps] == [s.to_dict() for s in reference.steps]
    assert [r.to_dict() for r in fast.requests] == [r.to_dict() for r in reference.requests]
    if "num_blocks" in engine:
        assert fast.num_preemptions > 0
    assert sum(s.prefix_cache_hits for s in fast.steps) > 0
