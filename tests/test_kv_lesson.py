"""minengine.course.kv_lesson: generating without a KV cache gives the engine's tokens, only slower."""

from __future__ import annotations

import random

from minengine.course import lessons as lu
from minengine.course.kv_lesson import recompute_vs_cache
from minengine.engine.threads import torch_threads


def test_recomputing_everything_gives_the_same_tokens_and_costs_more() -> None:
    with torch_threads(1):
        llm = lu.shipped_llm()
        lu.warm_up(llm)
        prompt = lu.random_prompt(150, random.Random(0))
        timing = recompute_vs_cache(llm, prompt, 24, progress=False)
    assert timing.same_tokens, "the no-cache loop must compute the same greedy tokens as the engine"
    assert len(timing.no_cache_s) == len(timing.cached_s) == len(timing.context) == 24
    assert timing.context[0] == 150 and timing.context[-1] == 173
    # Every decode step after the first: one token with the cache against ~160 without it.
    assert sum(timing.no_cache_s[1:]) > 2 * sum(timing.cached_s[1:])
    assert timing.speedup > 1.5
