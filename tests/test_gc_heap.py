"""gc_heap: what exists before a measured run stays out of the collector's walks, and only for the run."""

from __future__ import annotations

import gc
import random
import weakref

import pytest

from minengine import SamplingParams
from minengine.course import lessons as lu
from minengine.engine.gc_heap import freeze_gc_heap, gc_heap_frozen


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cycle collector can free it


@pytest.fixture(autouse=True)
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_garbage_from_before_the_block_waits_for_its_end() -> None:
    node = Node()
    alive = weakref.ref(node)
    with gc_heap_frozen():
        assert gc.get_freeze_count() > 0
        del node  # the cycle is garbage now, but it sits in the frozen heap
        gc.collect()
        assert alive() is not None
        fresh = Node()  # made inside the block: collected as usual
        fresh_alive = weakref.ref(fresh)
        del fresh
        gc.collect()
        assert fresh_alive() is None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert alive() is None


def test_an_error_inside_still_unfreezes() -> None:
    with pytest.raises(RuntimeError), gc_heap_frozen():
        raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_before_stays_frozen() -> None:
    # Judged by what the collector does, not by counts: other threads (a server's, a compiler's) may free
    # frozen objects at any time, and each one freed leaves the frozen count.
    node = Node()
    alive = weakref.ref(node)
    assert freeze_gc_heap() > 0
    with gc_heap_frozen():
        pass
    assert gc.get_freeze_count() > 0
    del node  # garbage now, but frozen before the block: the block's end must not have thawed it
    gc.collect()
    assert alive() is not None
    gc.unfreeze()
    gc.collect()
    assert alive() is None


def test_freeze_gc_heap_collects_garbage_first() -> None:
    node = Node()
    alive = weakref.ref(node)
    del node
    freeze_gc_heap()
    assert alive() is None  # collected, not frozen for ever


def test_run_requests_measures_with_the_heap_frozen() -> None:
    llm = lu.shipped_llm()
    seen: list[int] = []
    params = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0)
    work = [lu.WorkRequest(0.0, lu.random_prompt(8, random.Random(0), lu.SHIPPED_VOCAB), params)]
    run = lu.run_requests(llm, work, on_step=lambda record: seen.append(gc.get_freeze_count()))
    assert run.requests[0].num_output_tokens == 3
    assert seen and min(seen) > 0
    assert gc.get_freeze_count() == 0


def test_llm_generate_runs_its_steps_with_the_callers_heap_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = lu.shipped_llm()
    engine, seen = llm.llm_engine, []
    step = engine.step

    def watched_step():
        seen.append(gc.get_freeze_count())
        return step()

    monkeypatch.setattr(engine, "step", watched_step)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True, temperature=0),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    assert seen and min(seen) > 0 and gc.get_freeze_count() == 0
