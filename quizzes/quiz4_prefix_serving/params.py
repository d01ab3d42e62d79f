"""Quiz 4's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` draws a prompt template for the prefix-cache question (Q1: system prompt length,
a per-request line, the question) and a retrieval setup for the top-k question (Q5: prefill speed,
documents, question), and computes their keys, tolerances and explanations. Strings go into the
question text, numbers into the hidden tests.
"""

from __future__ import annotations

import random

BLOCK = 16


def _prefix_hit(rng: random.Random) -> dict:
    system = BLOCK * rng.randrange(60, 190) + rng.randrange(8, 16)  # ends 8-15 tokens into a block
    stamp = rng.choice([10, 12, 14, 18])
    question = rng.randrange(24, 90)
    total = system + stamp + question
    cached = system // BLOCK * BLOCK
    key = total - cached
    return {
        "q1_system": f"{system:,}",
        "q1_stamp": str(stamp),
        "q1_question": str(question),
        "q1_key": key,
        "q1_total": total,
        "q1_unblocked": stamp + question,
        "q1_tol": 2,
        "q1_tol_text": "2",
        "q1_why": (f"In the new layout every request starts with the same {system:,} system-prompt tokens, "
                   f"so the second request finds the first one's blocks in the cache, but only whole blocks: "
                   f"{system:,} // {BLOCK} = {system // BLOCK} full blocks, {cached:,} tokens. The last "
                   f"{system - cached} system-prompt tokens share a block with the time line, which differs, "
                   f"so that block misses. It prefills {total:,} - {cached:,} = {key} tokens: "
                   f"{system - cached} of the system prompt, {stamp} of the time line and {question} of the "
                   f"question. With the time line in front, the very first block already differed, and since "
                   f"each block's hash includes the one before it, nothing matched: all {total:,} tokens. "
                   f"Counting only the time line and the question ({stamp + question}) forgets that the "
                   f"cache works in blocks."),
    }


def _top_k(rng: random.Random) -> dict:
    speed = rng.choice([6000, 8000, 10000, 12000, 16000])  # prefill tokens per second
    system_blocks = rng.randrange(40, 120)
    system = system_blocks * BLOCK
    docs_all = rng.choice([15, 20, 25])
    k = rng.choice([3, 4, 5])
    doc = rng.choice([300, 350, 400, 500, 600])
    question = rng.randrange(30, 80)
    tokens = k * doc + question
    key = round(1000 * tokens / speed, 1)
    with_system = round(1000 * (system + tokens) / speed, 1)
    all_docs = round(1000 * (docs_all * doc + question) / speed, 1)
    tol = round(0.03 * key, 1)
    return {
        "q5_speed": f"{speed:,}",
        "q5_system": f"{system:,}",
        "q5_blocks": str(system_blocks),
        "q5_all": str(docs_all),
        "q5_k": str(k),
        "q5_doc": str(doc),
        "q5_question": str(question),
        "q5_key": key,
        "q5_with_system": with_system,
        "q5_all_docs": all_docs,
        "q5_tol": tol,
        "q5_tol_text": f"{tol:g}",
        "q5_why": (f"The system prompt fills exactly {system_blocks} blocks and is the same for everyone, so "
                   f"it comes from the prefix cache. The documents differ from question to question, so "
                   f"everything from the first document on is computed: {k} x {doc} + {question} = "
                   f"{tokens:,} tokens at {speed:,} tokens/s, {key:g} ms. With all {docs_all} documents the "
                   f"same request would prefill {docs_all * doc + question:,} tokens ({all_docs:g} ms) and "
                   f"hold their KV cache for as long as it runs, which lowers how many requests fit at once. "
                   f"Counting the system prompt too ({with_system:g} ms) forgets the cache, which is why the "
                   f"stable part goes first and the documents after it."),
    }


def params(seed: int) -> dict:
    rng = random.Random(f"quiz4_prefix_serving/{seed}")
    return {**_prefix_hit(rng), **_top_k(rng)}
