"""Lesson 07's helpers: the hit rule written by hand agrees with the engine; the runs count what they say."""

from __future__ import annotations

import random

import pytest

import minengine
from minengine.course import lessons as lu
from minengine.course import prefix_lesson as pl


@pytest.fixture(scope="module")
def shipped(torch_one_thread):
    return minengine.load_model(), minengine.load_tokenizer()


def test_first_difference_and_the_rule_by_hand():
    assert pl.first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert pl.first_difference([1, 2], [1, 2, 3]) == 2
    assert pl.first_difference([], [5]) == 0
    base = list(range(100))
    assert pl.expected_hit_tokens(base, base, 16) == 96  # never the last token: (100 - 1) // 16 blocks
    assert pl.expected_hit_tokens(base, base[:64], 16) == 48  # 64 tokens: the 4th block holds the last one
    changed = base[:40] + [999] + base[41:]
    assert pl.expected_hit_tokens(base, changed, 16) == 32
    assert pl.expected_hit_tokens(base, changed, 8) == 40


def test_system_prompt_is_long_enough_and_documents_differ(shipped):
    _, tok = shipped
    text = pl.system_prompt(tok, 300)
    assert len(tok.encode(text)) >= 300
    assert len(tok.encode(text.rsplit("Rule", 1)[0])) < 300  # the shortest such text
    docs = pl.documents(10)
    assert len(set(docs)) == 10
    prompt = pl.rag_prompt("S\n", docs[:2], "Q?")
    assert prompt.startswith("S\n" + docs[0] + docs[1]) and prompt.endswith("Child: Q?\nPip:")


def test_shared_prefix_hits_match_the_rule_and_save_prefill(shipped):
    model, tok = shipped
    llm = minengine.LLM(model, tokenizer=tok, num_blocks=128)
    rng = random.Random(0)
    shared = lu.random_prompt(100, rng)
    prompts = [shared + lu.random_prompt(10, rng) for _ in range(3)]
    params = minengine.SamplingParams(max_tokens=3, ignore_eos=True, temperature=0)
    run = pl.run_one_by_one(llm, prompts, params)
    assert run.cached_tokens == [0, 96, 96]
    assert run.cached_tokens[1] == pl.expected_hit_tokens(prompts[0], prompts[1], 16)
    assert run.queries == 330 and run.hits == 192
    assert run.hit_rate == pytest.approx(192 / 330)
    assert run.prefill_tokens == run.prompt_tokens - run.hits
    assert len(run.ttfts) == 3 and len(run.itls) == 6 and run.peak_kv_blocks >= 7
    again = pl.run_one_by_one(llm, prompts[:1], params)  # reset: the cache was emptied first
    assert again.hits == 0
    kept = pl.run_one_by_one(llm, prompts[:1], params, reset=False)
    assert kept.hits == 96


def test_eviction_forgets_the_tail_first(shipped):
    """The engine behaviour lesson 07's eviction loop shows: the free pool hands out the least recently
    freed blocks first, so a finished prompt loses its last block first."""
    model, tok = shipped
    llm = minengine.LLM(model, tokenizer=tok, num_blocks=24)
    pool = llm.llm_engine.scheduler.block_manager
    rng = random.Random(1)
    prompt = lu.random_prompt(160, rng)  # 10 full blocks
    params = minengine.SamplingParams(max_tokens=1, ignore_eos=True, temperature=0)

    def hits_after(others: list[list[int]]) -> int:
        pool.reset_prefix_cache()
        for ids in [prompt, *others]:
            llm.generate([ids], params, use_tqdm=False)
        (again,) = llm.generate([prompt], params, use_tqdm=False)
        return again.num_cached_tokens

    assert hits_after([]) == 144
    # 14 untouched blocks, then the prompt's blocks: a 15-block request must evict exactly one, its last
    # (the 10th, never looked up: it holds the prompt's last token), so the hits stay
    assert pool.blocks_needed(239 + 1) == 15 and hits_after([lu.random_prompt(239, rng)]) == 144
    assert pool.blocks_needed(16 * 18) == 18 and hits_after([lu.random_prompt(16 * 18 - 1, rng)]) == 16 * 6
