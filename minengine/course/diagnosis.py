"""Lesson 09's worked case: a slow engine run with one planted problem, and the diagnosis order that finds it.

The order (from the course's seed notes): one request's trace -> length groups -> quiet vs loaded ->
mixed prefill-decode batches -> cache pressure. Each stage here reads only the engine's own records
(``RequestRecord`` / ``StepRecord``) and returns a ``Finding``: what it shows and whether it points at a
problem. The planted problems are the three the order is built to tell apart:

* ``"queueing"``: more requests than the engine can serve; everything else is healthy;
* ``"interference"``: chunked prefill off, so a long prompt is computed in one step and every decoding
  stream stalls behind it;
* ``"thrashing"``: a KV cache too small for the traffic, so running requests are preempted and recomputed.

Why a module: the notebook shows the stages one by one; the tests (tests/test_capacity_lesson.py) check
that each planted problem is flagged by its stage, and not by the stages meant for the others.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from minengine.core.records import RequestRecord, StepRecord
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
    stage: str
    flagged: bool
    text: str

    def __str__(self) -> str:
        return f"[{'!' if self.flagged else ' '}] {self.stage}: {self.text}"


def _ms(x: float) -> str:
    return f"{1e3 * x:,.1f} ms"


def worst_trace(requests: Sequence[RequestRecord]) -> tuple[RequestRecord, Finding]:
    """Stage 1: the slowest request (by E2E) taken apart: queue, prefill, decode, its longest gap."""
    done = [r for r in requests if r.token_times]
    r = max(done, key=lambda x: x.e2e or 0.0)
    queue, prefill = r.queue_time or 0.0, r.first_token_time - (r.first_scheduled_time or r.arrival_time)
    decode = r.token_times[-1] - r.token_times[0]
    gap = max(r.itls, default=0.0)
    parts = {"queue": queue, "prefill": prefill, "decode": decode}
    top = max(parts, key=lambda k: parts[k])
    text = (f"request {r.request_id} ({r.num_prompt_tokens} prompt tokens): queue {_ms(queue)}, prefill "
            f"{_ms(prefill)}, decode {_ms(decode)} for {r.num_output_tokens} tokens (longest gap {_ms(gap)}, "
            f"{r.num_preemptions} preemptions); most of its time: {top}")
    return r, Finding("1 trace", False, text)


def length_groups(requests: Sequence[RequestRecord], edge: int = LONG_PROMPT // 2) -> Finding:
    """Stage 2: TTFT and ITL per prompt-length group (an average would hide the long ones)."""
    lines, done = [], [r for r in requests if r.token_times]
    for name, sel in (("short", lambda r: r.num_prompt_tokens < edge),
                      ("long", lambda r: r.num_prompt_tokens >= edge)):
        g = [r for r in done if sel(r)]
        if not g:
            continue
        ttft = np.array([r.ttft for r in g])
        itl = np.array([x for r in g for x in r.itls] or [np.nan])
        lines.append(f"{name} prompts ({len(g)}): TTFT p50 {_ms(np.median(ttft))}, p99 "
                     f"{_ms(np.percentile(ttft, 99))}; ITL p99 {_ms(np.nanpercentile(itl, 99))}")
    return Finding("2 length groups", False, "; ".join(lines))


@dataclass(frozen=True)
class LoadComparison:
    ttft_ratio: float  # loaded p50 TTFT / quiet p50 TTFT
    queue_share: float  # of loaded TTFT, summed over requests
    itl_ratio: float  # loaded p99 ITL / quiet p50 ITL


def quiet_vs_loaded(quiet: Sequence[RequestRecord],
                    loaded: Sequence[RequestRecord]) -> tuple[LoadComparison, Finding]:
    """Stage 3: the same kind of requests alone and under load. TTFT that grows under load while the
    requests spend it waiting is queueing or admission, not slow kernels."""
    q = [r for r in quiet if r.token_times]
    ld = [r for r in loaded if r.token_times]
    ttft_ratio = float(np.median([r.ttft for r in ld]) / np.median([r.ttft for r in q]))
    queue_share = float(sum(r.queue_time or 0.0 for r in ld) / sum(r.ttft for r in ld))
    itl_ratio = float(np.percentile([x for r in ld for x in r.itls], 99)
                      / np.median([x for r in q for x in r.itls]))
    c = LoadComparison(ttft_ratio, queue_share, itl_ratio)
    flagged = ttft_ratio > 3 and queue_share > 0.5
    text = (f"p50 TTFT {ttft_ratio:.1f}x the quiet run's, {100 * queue_share:.0f} % of it spent waiting in "
            f"the queue; p99 ITL {itl_ratio:.1f}x the quiet p50 ITL")
    return c, Finding("3 quiet vs loaded", flagged, text)


def mixed_batches(steps: Sequence[StepRecord]) -> Finding:
    """Stage 4: steps that carry prompt tokens next to decodes, against pure decode steps. A few huge
    prefill steps stall every decoding stream: that is what the chunked-prefill budget is for."""
    mixed = np.array([s.duration for s in steps if s.num_prefill_tokens and s.num_decode_seqs])
    pure = np.array([s.duration for s in steps if not s.num_prefill_tokens and s.num_decode_seqs])
    biggest = max((s.num_prefill_tokens for s in steps), default=0)
    if not len(mixed) or not len(pure):
        return Finding("4 mixed batches", False, "no mixed steps to compare")
    ratio = float(mixed.max() / np.median(pure))
    flagged = ratio > 15
    text = (f"{len(mixed)} mixed steps, the longest {_ms(mixed.max())} = {ratio:.0f}x a median pure decode "
            f"step ({_ms(np.median(pure))}); up to {biggest} prompt tokens in one step")
    return Finding("4 mixed batches", flagged, text)


def cache_pressure(steps: Sequence[StepRecord], requests: Sequence[RequestRecord]) -> Finding:
    """Stage 5: KV usage and preemptions. A cache that keeps filling evicts running requests, which then
    recompute their whole context: check this before tuning any kernel."""
    kv = np.array([s.kv_usage for s in steps])
    pre = sum(s.num_preempted for s in steps)
    hit = sum(r.num_preemptions > 0 for r in requests)
    full = float(np.mean(kv >= 0.9))
    flagged = pre > 0
    text = (f"KV usage max {100 * kv.max():.0f} %, >= 90 % in {100 * full:.0f} % of steps; {pre} preemptions "
            f"({hit} requests had to recompute)")
    return Finding("5 cache pressure", flagged, text)


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
