"""The scheduler driven by EngineCore with a NullExecutor (no torch, no model): limits, policies,
preemption, freeing, the KV-connector admission."""

from __future__ import annotations

import random
import subprocess
import sys

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from minengine.config import EngineConfig
from minengine.core.engine_core import EngineCore, NullExecutor
from minengine.core.policies import DecodeFirstPolicy, PrefillFirstPolicy, SchedulingPolicy
from minengine.core.request import Request, RequestStatus
from minengine.core.sampling_params import SamplingParams
from minengine.core.sched_output import SchedulerOutput
from minengine.core.scheduler import Scheduler

EOS = 0


def make_scheduler(num_blocks: int = 64, max_model_len: int = 64, **kw) -> Scheduler:
    config = EngineConfig(**kw).resolved(max_model_len)
    clock = iter(range(10**9)).__next__  # a fake clock: every call is one tick later
    return Scheduler(config, num_blocks, clock=lambda: float(clock()))


def make_request(rid: str, prompt_len: int, max_tokens: int = 8, first: int = 1, **params) -> Request:
    ids = [first + (i % 3) for i in range(prompt_len)]
    return Request(rid, ids, SamplingParams(max_tokens=max_tokens, **params), eos_token_ids=[EOS])


def core_for(sched: Scheduler, rng: random.Random | None = None) -> EngineCore:
    """The engine's own step loop around ``sched``; sampled tokens are 5, or random in 0..3 with ``rng``."""
    return EngineCore(sched, NullExecutor(token=(lambda r: rng.randrange(4)) if rng else 5))


def fake_step(sched: Scheduler, rng: random.Random | None = None) -> SchedulerOutput:
    """One EngineCore step with no model; returns what was scheduled (an empty output when idle)."""
    step = core_for(sched, rng).step()
    return step.scheduler_output if step is not None else SchedulerOutput()


def run_to_end(
    sched: Scheduler, rng: random.Random | None = None, max_steps: int = 10_000
) -> list[SchedulerOutput]:
    outs = []
    while sched.has_unfinished_requests():
        outs.append(fake_step(sched, rng))
        assert outs[-1].scheduled, "no progress"
        assert len(outs) < max_steps
    return outs


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    chunked = draw(st.booleans())
    config = dict(
        block_size=block_size,
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(64 if not chunked else 1, 96)),
        enable_chunked_prefill=chunked,
        enable_prefix_caching=draw(st.booleans()),
        policy=draw(
            st.sampled_from(["decode_first", "prefill_first", PrefillFirstPolicy(decode_with_prefill=True)])
        ),
    )
    num_blocks = draw(st.integers(-(-64 // block_size), -(-160 // block_size)))
    requests = draw(
        st.lists(
            st.tuples(
                st.integers(1, 40), st.integers(1, 20), st.integers(0, 15), st.booleans(), st.booleans()
            ),
            min_size=1,
            max_size=16,
        )
    )  # (prompt length, max_tokens, arrival step, ignore_eos, abort later)
    return config, num_blocks, requests, draw(st.integers(0, 2**16))


@given(workloads())
@settings(max_examples=300, deadline=None)
def test_random_workloads_respect_every_limit(workload):
    config, num_blocks, specs, seed = workload
    rng = random.Random(seed)
    sched = make_scheduler(num_blocks, **config)
    core = core_for(sched, rng)
    budget, max_seqs = sched.max_num_batched_tokens, sched.max_num_seqs
    pending = sorted(enumerate(specs), key=lambda x: x[1][2])
    all_reqs: list[Request] = []
    step = 0
    while pending or sched.has_unfinished_requests():
        while pending and pending[0][1][2] <= step:
            i, (plen, max_tokens, _, ignore_eos, abort) = pending.pop(0)
            req = make_request(f"r{i}", plen, max_tokens, first=1 + i % 2, ignore_eos=ignore_eos)
            req.abort_at = step + rng.randrange(1, 10) if abort else None
            sched.add_request(req)
            all_reqs.append(req)
        for req in all_reqs:
            if req.abort_at == step and not req.is_finished:
                sched.abort_request(req.request_id)
                assert req.block_table == [] and req.status == RequestStatus.FINISHED_ABORTED
        step += 1
        running_decodes = [r for r in sched.running if not r.is_prefill]
        waiting_before = set(id(r) for r in sched.waiting)
        inflight = core.start_step()
        if inflight is None:
            assert not sched.has_unfinished_requests()
            continue
        out = inflight.scheduler_output
        ids = out.num_scheduled_tokens
        assert 0 < out.total_num_scheduled_tokens <= budget
        assert len(out.scheduled) <= max_seqs and sched.num_running <= max_seqs
        assert len(ids) == len(out.scheduled), "a request scheduled twice"
        for s in out.scheduled:
            req = s.request
            assert req.status == RequestStatus.RUNNING and 1 <= s.num_tokens <= req.num_tokens - s.start
            assert len(req.block_table) * sched.block_manager.block_size >= s.start + s.num_tokens
            if not config["enable_chunked_prefill"]:
                assert s.start + s.num_tokens == req.num_tokens, "a prompt was chunked with chunking off"
        if out.preempted_request_ids:
            assert not any(id(s.request) in waiting_before for s in out.scheduled), (
                "admitted while preempting"
            )
        if isinstance(sched.policy, DecodeFirstPolicy) and len(running_decodes) <= budget:
            for r in running_decodes:  # the budget allows every decode: none may be skipped
                assert r.request_id in ids or r.request_id in out.preempted_request_ids, "decode skipped"
        sched.block_manager.check_invariants(sched.running)
        core.finish_step(inflight)
        assert step < 5000
    assert sched.block_manager.num_used_blocks == 0 and sched.block_manager.usage == 0
    for req in all_reqs:
        assert req.is_finished and req.block_table == []
        if req.status == RequestStatus.FINISHED_LENGTH:
            assert req.num_output_tokens == req.sampling_params.max_tokens
        elif req.status == RequestStatus.FINISHED_STOPPED:
            assert req.token_ids[-1] == EOS and not req.sampling_params.ignore_eos


def test_preemption_recomputes_latest_admitted_from_the_front_of_the_queue():
    sched = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64)
    a, b, c = make_request("a", 4, 12), make_request("b", 4, 12), make_request("c", 4, 12)
    for r in (a, b, c):
        sched.add_request(r)
    fake_step(sched)  # a, b, c prefilled: 3 blocks, 1 free
    steps = [fake_step(sched) for _ in range(4)]
    preempting = next(o for o in steps if o.preempted_request_ids)
    assert preempting.preempted_request_ids == ["c"], "the most recently admitted request goes first"
    assert c.status == RequestStatus.PREEMPTED and c.block_table == [] and c.num_computed_tokens == 0
    assert sched.waiting[0] is c and c.num_preemptions == 1 and c.record.num_preemptions == 1
    run_to_end(sched)
    assert all(r.num_output_tokens == 12 for r in (a, b, c))
    assert sched.block_manager.num_used_blocks == 0


def test_recompute_after_preemption_counts_outputs_as_prefill():
    sched = make_scheduler(num_blocks=3, block_size=4, max_num_batched_tokens=64, enable_prefix_caching=False)
    a, b = make_request("a", 4, 8), make_request("b", 4, 8)
    sched.add_request(a)
    sched.add_request(b)
    outs = run_to_end(sched)
    readmit = next(
        o for o in outs if "b" in o.prefill_request_ids and o.scheduled[0].start == 0 and o is not outs[0]
    )
    assert readmit.num_scheduled_tokens["b"] > 4  # prompt + the outputs it had already generated


def test_no_admission_in_a_step_that_preempted():
    sched = make_scheduler(num_blocks=3, block_size=2, max_num_batched_tokens=64)
    a, b = make_request("a", 2, 3), make_request("b", 3, 3)
    sched.add_request(a)
    sched.add_request(b)
    fake_step(sched)  # a: 1 block, b: 2 blocks, cache full
    sched.add_request(make_request("c", 1, 1))
    out = fake_step(sched)  # a needs a block -> b is preempted; c must not be admitted
    assert out.preempted_request_ids == ["b"] and out.num_scheduled_tokens == {"a": 1}
    assert [r.request_id for r in sched.waiting] == ["b", "c"]


def test_prefill_first_runs_prefill_steps_and_decode_steps():
    sched = make_scheduler(max_num_batched_tokens=64, policy="prefill_first")
    sched.add_request(make_request("a", 5, 10))
    fake_step(sched)
    sched.add_request(make_request("b", 7, 10))
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"b": 7}, "no decode in a step with prefill work"
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}


def test_prefill_first_can_mix_decodes_after_prefills():
    sched = make_scheduler(max_num_batched_tokens=8, policy=PrefillFirstPolicy(decode_with_prefill=True))
    sched.add_request(make_request("a", 5, 10))
    fake_step(sched)
    sched.add_request(make_request("b", 5, 10))
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"b": 5, "a": 1}
    assert [s.request_id for s in out.scheduled] == ["b", "a"]


def test_decode_first_puts_decodes_before_a_long_prefill():
    sched = make_scheduler(max_num_batched_tokens=16)
    sched.add_request(make_request("a", 5, 10))
    fake_step(sched)
    sched.add_request(make_request("b", 40, 10))
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 15}
    assert out.decode_request_ids == ["a"] and out.prefill_request_ids == ["b"]
    record = out.to_step_record(1, 0.0, 1.0)
    assert (record.num_prefill_tokens, record.num_decode_tokens, record.num_decode_seqs) == (15, 1, 1)
    assert record.prefill_chunks == [(15, 0)] and record.decode_context_lens == [6]


def test_chunked_prefill_off_waits_for_room_without_overtaking():
    sched = make_scheduler(max_num_batched_tokens=64, enable_chunked_prefill=False)
    for first, (rid, n) in enumerate((("a", 40), ("b", 30), ("c", 5))):
        sched.add_request(make_request(rid, n, 4, first=10 * first))  # no shared prefixes
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"a": 40}, "b does not fit the rest of the budget; c may not overtake"
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 30, "c": 5}


def test_max_num_seqs_limits_running_requests():
    sched = make_scheduler(max_num_seqs=2)
    for i in range(5):
        sched.add_request(make_request(f"r{i}", 3, 4))
    for out in run_to_end(sched):
        assert len(out.scheduled) <= 2 and out.num_running <= 2


def test_abort_and_finish_free_all_blocks():
    sched = make_scheduler(num_blocks=16, block_size=4)
    reqs = [make_request(f"r{i}", 9, 6) for i in range(4)]
    for r in reqs:
        sched.add_request(r)
    fake_step(sched)
    assert sched.block_manager.num_used_blocks > 0
    sched.abort_request("r1")
    sched.abort_request("r3")
    assert reqs[1].finish_reason == "abort" and reqs[1].record.finish_reason == "abort"
    run_to_end(sched)
    assert sched.block_manager.num_used_blocks == 0 and not sched.running and not sched.waiting
    assert [r.finish_reason for r in reqs] == ["length", "abort", "length", "abort"]
    assert sched.abort_request("r0") is None  # already finished: a no-op


def test_stop_conditions():
    sched = make_scheduler(max_model_len=12)
    eos = make_request("eos", 3, 8)
    stop_id = make_request("stop_id", 3, 8, stop_token_ids=[5])
    capped = make_request("capped", 3, None, ignore_eos=True)  # runs until max_model_len
    for r in (eos, stop_id, capped):
        sched.add_request(r)
    first = {"eos": EOS, "stop_id": 5, "capped": EOS}
    EngineCore(sched, NullExecutor(token=lambda r: first[r.request_id])).step()
    assert eos.finish_reason == "stop" and eos.stop_reason is None
    assert stop_id.finish_reason == "stop" and stop_id.stop_reason == 5
    run_to_end(sched)
    assert capped.finish_reason == "length" and capped.num_tokens == 12


def test_requests_that_can_never_run_are_rejected_up_front():
    sched = make_scheduler(num_blocks=4, block_size=4, max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add_request(make_request("long", 64, 1))
    with pytest.raises(ValueError, match="KV cache holds 16 tokens"):
        sched.add_request(make_request("big", 10, 8))  # 17 tokens of K/V
    sched.add_request(make_request("ok", 10, 6))
    with pytest.raises(ValueError, match="already in use"):
        sched.add_request(make_request("ok", 2, 2))


def test_config_validation():
    with pytest.raises(ValueError, match="chunked prefill off"):
        EngineConfig(enable_chunked_prefill=False, max_num_batched_tokens=16).resolved(64)
    assert EngineConfig(enable_chunked_prefill=False).resolved(4096).max_num_batched_tokens == 4096
    with pytest.raises(ValueError, match="either num_blocks or kv_cache_memory_bytes"):
        EngineConfig(num_blocks=4, kv_cache_memory_bytes=1000)
    with pytest.raises(ValueError, match="unknown policy"):
        EngineConfig(policy="fastest")
    with pytest.raises(ValueError, match="positive int"):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match="longer than the model's context"):
        EngineConfig(max_model_len=100).resolved(64)
    with pytest.raises(TypeError, match="valid:"):
        EngineConfig.from_kwargs(max_seqs=3)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    assert SamplingParams(stop="x").stop == ["x"] and SamplingParams(top_k=-1).top_k == 0


class ShortestPromptFirst(SchedulingPolicy):
    """What a learner might write in lab 2: admit short prompts first."""

    def order(self, running, waiting):
        return list(running) + sorted(waiting, key=lambda r: r.num_prompt_tokens)


def test_a_custom_policy_plugs_in():
    sched = make_scheduler(max_num_seqs=1, policy=ShortestPromptFirst())
    for rid, n in (("long", 30), ("short", 3)):
        sched.add_request(make_request(rid, n, 2))
    out = fake_step(sched)
    assert out.num_scheduled_tokens == {"short": 3}
    run_to_end(sched)


def test_core_does_not_import_torch():
    code = (
        "import sys; import minengine.core, minengine.config; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_kv_computed_elsewhere_is_admitted_through_add_request():
    """The disaggregated-decode seam: a request whose prompt KV arrived over a link computes only the rest."""
    sched = make_scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=64)
    req = make_request("moved", 10, 5)
    req.append_output_token(7, now=0.0)  # its first token came from the prefill instance
    with pytest.raises(ValueError, match="num_computed_tokens must be in"):
        sched.add_request(make_request("bad", 10, 5), num_computed_tokens=10)  # nothing left to compute
    sched.add_request(req, num_computed_tokens=10)
    out = fake_step(sched)
    (s,) = out.scheduled
    assert (s.num_tokens, s.start, s.is_prefill, s.sample) == (1, 10, False, True)
    assert len(req.block_table) == 3 and req.num_cached_tokens == 0  # blocks for all 11 tokens; no cache hit
    run_to_end(sched)
    assert req.num_output_tokens == 5 and req.finish_reason == "length"


def test_a_preempted_transferred_request_recomputes_everything():
    sched = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64, enable_prefix_caching=False)
    moved = make_request("moved", 8, 8)
    moved.append_output_token(7, now=0.0)
    sched.add_request(make_request("first", 4, 12))
    fake_step(sched)
    sched.add_request(moved, num_computed_tokens=8)
    outs = run_to_end(sched)
    assert moved.num_preemptions >= 1
    recompute = next(s for o in outs for s in o.scheduled if s.request is moved and s.start == 0)
    assert recompute.is_prefill  # after losing its KV it computes its prompt here, from token 0
    assert moved.num_output_tokens == 8


def test_drafts_never_preempt_another_request():
    # Two 7-token prompts fill all four 4-token blocks. A decode with 3 drafts needs a fifth block: drafts
    # are guesses, so the step drops them and decodes plainly rather than evict the other request.
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    sched = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64, speculative_config=spec)
    a, b = make_request("a", 7, 8), make_request("b", 7, 8)
    for r in (a, b):
        sched.add_request(r)
    fake_step(sched)  # both prefilled and sampled one token; no free block left
    assert sched.block_manager.num_free_blocks == 0
    a.spec_token_ids = [5, 5, 5]
    out = fake_step(sched)
    assert out.preempted_request_ids == [] and b.status == RequestStatus.RUNNING
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert not out.scheduled_spec_decode_tokens.get("a")
