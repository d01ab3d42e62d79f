"""Keep Python's garbage-collection pauses out of serving and out of latency measurements.

CPython frees most objects by reference counting, but objects in reference cycles wait for the cycle
collector, and its occasional full pass walks *every* container object the process holds: the pause
grows with the live heap, not with the garbage. A server's heap is mostly objects made at start-up
(modules, the model, the tokenizer) that live until it exits, so walking them only adds a pause in the
middle of a step. vLLM moves its start-up heap into CPython's permanent generation after warm-up
(``freeze_gc_heap`` in ``vllm/utils/gc_utils.py``); ``minengine serve`` does the same.

The lessons run the client and the engine in one process, so the notebook's own records (thousands of
requests from earlier experiments) would lengthen the engine's pauses beyond a real server's: in lesson
03 on a 2-core Xeon, a full pass over the notebook's heap (460-580k objects) took 146-165 ms, as long as
seven whole chat requests. ``gc_heap_frozen`` keeps that heap out of the walks for one run: the
lessons' load generator (``lu.run_requests``) and ``LLM.generate`` run their steps inside it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


def freeze_gc_heap() -> int:
    """Collect once, then move every live object into the permanent generation; returns how many.

    For a process's start-up (after the engine is built and warmed up, before traffic): the collect
    first matters, because garbage frozen now would never be reclaimed. Objects made later are
    collected as usual.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextmanager
def gc_heap_frozen() -> Iterator[None]:
    """Collections inside the block skip every object that existed when it began.

    No collect first: that would itself be the pause being avoided, and garbage already in the heap
    only waits until the block ends, when the heap is unfrozen (and collected in the normal course).
    A heap frozen before the block (``freeze_gc_heap``) stays frozen, with the block's start-up
    objects added to it.
    """
    owner = gc.get_freeze_count() == 0
    gc.freeze()
    try:
        yield
    finally:
        if owner:
            gc.unfreeze()
