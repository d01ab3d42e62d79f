"""Lesson 09's worked case: a slow engine run with one planted problem, and the diagnosis order that finds it.

The order: one request's trace -> length groups -> quiet vs loaded -> mixed prefill-decode batches ->
cache pressure. The stages themselves are in the notebook, each next to its explanation: each reads only
the engine's own records (``RequestRecord`` / ``StepRecord``) and returns a ``Finding``. This module holds
what the notebook should not have to: the planted runs' settings, their traffic, and the verdict. The
planted problems are the three the order is built to tell apart:

* ``"queueing"``: more requests than the engine can serve; everything else is healthy;
* ``"interference"``: chunked prefill off, so a long prompt is computed in one step and every decoding
  stream stalls behind it;
* ``"thrashing"``: a KV cache too small for the traffic, so running requests are preempted and recomputed.

The tests (tests/test_capacity_lesson.py) run the notebook's stages and check that each planted problem
is flagged by its stage, and not by the stages meant for the others.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from minengine.core.sampling_params import SamplingParams
from minengine.course.lessons import SHIPPED_VOCAB, WorkRequest, random_prompt

PROBLEMS = ("queueing", "interference", "thrashing")
LONG_PROMPT = 700  # tokens: the "documents" of the traffic (shipped model context: 2048)


def engine_options(problem: str) -> dict:
    """Engine settings of a planted run (the shipped model, as ``lessons.shipped_llm`` builds it)."""
    if problem not in PROBLEMS:
        raise ValueError(f"unknown problem {problem!r}; pick one of {', '.join(PROBLEMS)}")
    if problem == "interference":  # no chunking: a long prompt takes a whole step
        return {"enable_chunked_prefill": False, "max_num_batched_tokens": 2048}
    if problem == "thrashing":  # room for only a few long requests' KV at once
        return {"max_num_batched_tokens": 256, "num_blocks": 96, "kv_cache_memory_bytes": None}
    return {"max_num_batched_tokens": 256}


def traffic(num_requests: int, rate: float, seed: int = 0, long_fraction: float = 0.15,
            vocab: int = SHIPPED_VOCAB) -> list[WorkRequest]:
    """Chat turns (16-96 tokens) with a share of long documents, 24-64 output tokens, Poisson arrivals."""
    rng = random.Random(seed)
    work, t = [], 0.0
    for _ in range(num_requests):
        n = (rng.randint(LONG_PROMPT, LONG_PROMPT + 300) if rng.random() < long_fraction
             else rng.randint(16, 96))
        params = SamplingParams(max_tokens=rng.randint(24, 64), ignore_eos=True, temperature=0)
        work.append(WorkRequest(t, random_prompt(n, rng, vocab), params))
        t += rng.expovariate(rate)
    return work


def quiet_traffic(work: Sequence[WorkRequest], n: int = 8, gap: float = 0.4) -> list[WorkRequest]:
    """The first ``n`` requests of a workload one after another (``gap`` s apart): the engine idle."""
    return [WorkRequest(i * gap, w.prompt, w.params) for i, w in enumerate(work[:n])]


# ------------------------------------------------------------------------------------------ findings
@dataclass(frozen=True)
class Finding:
    """What one stage of the diagnosis shows, and whether it points at a problem."""

    stage: str
    flagged: bool
    text: str

    def __str__(self) -> str:
        return f"[{'!' if self.flagged else ' '}] {self.stage}: {self.text}"


def verdict(findings: Sequence[Finding]) -> str:
    """The planted problem the findings point to: the most specific stage that flagged (a full cache and
    huge prefill steps both also make requests queue)."""
    flags = {f.stage[0]: f.flagged for f in findings}
    if flags.get("5"):
        return "thrashing"
    if flags.get("4"):
        return "interference"
    if flags.get("3"):
        return "queueing"
    return "none found"
