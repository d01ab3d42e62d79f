"""Quiz 3's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` draws a static batch's output lengths (Q1), a request stream for Little's law (Q3) and
a server with a long prompt joining its decodes (Q6, Q7: step-cost fit, token budget, prompt length),
and computes the keys, tolerances and explanations. Strings go into the question text, numbers into
the hidden tests.
"""

from __future__ import annotations

import math
import random


def _static_batch(rng: random.Random) -> dict:
    short = sorted(rng.randrange(20, 160, 5) for _ in range(7))
    longest = rng.randrange(400, 1000, 20)
    lengths = [*short, longest]
    rng.shuffle(lengths)
    useful, slots = sum(lengths), 8 * max(lengths)
    key = round(100 * (1 - useful / slots), 1)
    return {
        "q1_lengths": ", ".join(str(n) for n in lengths),
        "q1_key": key,
        "q1_tol": 1.0,
        "q1_tol_text": "1",
        "q1_why": (f"The batch runs {max(lengths)} decode steps, one per token of its longest answer, with 8 "
                   f"slots each: {slots:,} sequence-steps. Only {useful:,} of them (the sum of the output "
                   f"lengths) produce a token; the rest belong to requests that already finished and wait "
                   f"for the longest one: 1 - {useful:,} / {slots:,} = {key:g}%. Meanwhile requests in the "
                   f"queue wait for the whole batch to end. Iteration-level (continuous) batching hands a "
                   f"finished request's slot to a waiting one at the next step, which is where Orca's and "
                   f"vLLM's large throughput gains come from."),
    }


def _littles_law(rng: random.Random) -> dict:
    rate = rng.choice([4, 6, 8, 12, 20])
    ttft = rng.choice([1.0, 1.2, 1.5, 2.0])
    n_out = rng.choice([80, 120, 160, 200])
    tpot_ms = rng.choice([20, 25, 30])
    e2e = ttft + (n_out - 1) * tpot_ms / 1000
    key = round(rate * e2e, 1)
    tol = round(0.03 * key, 1)
    no_ttft = round(rate * n_out * tpot_ms / 1000, 1)
    return {
        "q3_rate": str(rate),
        "q3_ttft": f"{ttft:g}",
        "q3_out": str(n_out),
        "q3_tpot": str(tpot_ms),
        "q3_key": key,
        "q3_no_ttft": no_ttft,
        "q3_tol": tol,
        "q3_tol_text": f"{tol:g}",
        "q3_why": ("Little's law: the average number of requests inside a system is their arrival rate "
                   "times the average time each spends there, L = lambda x W. A request stays from arrival "
                   f"to its last token: E2E = TTFT + (output tokens - 1) x TPOT = {ttft:g} + {n_out - 1} x "
                   f"{tpot_ms / 1000:g} = {e2e:.3f} s, so L = {rate} x {e2e:.3f} = {key:g} requests. "
                   f"Counting only the decode ({rate} x {n_out} x {tpot_ms / 1000:g} = {no_ttft:g}) leaves "
                   "out the requests waiting or prefilling, which hold the server (and, once admitted, KV "
                   "blocks) too. The law needs no assumption about arrivals or service order, which is why "
                   "it checks an engine's own records, and sizes max_num_seqs and the KV cache for a given "
                   "load."),
    }


def _chunked(rng: random.Random) -> dict:
    streams = rng.choice([24, 32, 40, 48])
    base = rng.choice([16, 18, 20, 22])
    per_tok = rng.choice([0.05, 0.06, 0.08])
    budget = rng.choice([512, 768, 1024, 2048])
    prompt = rng.choice([6000, 8000, 10000, 12000])
    chunk = budget - streams
    n_chunks = math.ceil(prompt / chunk)
    spike = round(base + per_tok * chunk, 1)
    whole = round(base + per_tok * prompt, 1)
    ttft = round(n_chunks * base + per_tok * prompt, 1)
    assert ttft - whole > 0.03 * ttft and whole - spike > 0.05 * spike
    return {
        "q6_setup": (f"{streams} requests are decoding, one token each per step. The step records fit a "
                     f"simple cost: a step takes {base} ms (with those {streams} decodes) plus {per_tok:g} "
                     "ms for each prompt token it prefills. The engine schedules decodes first, then fills "
                     f"the rest of its token budget, `max_num_batched_tokens = {budget}`, with prompt chunks "
                     f"(chunked prefill on). A request R arrives with a {prompt:,}-token prompt"),
        "q6_key": spike,
        "q6_whole": whole,
        "q6_tol": round(0.05 * spike, 1),
        "q6_tol_text": f"{round(0.05 * spike, 1):g}",
        "q6_why": (f"Decodes go first: the {streams} running requests take {streams} tokens of the "
                   f"{budget}-token budget, leaving {chunk} for R's prompt. So R is prefilled in chunks of "
                   f"{chunk} tokens, and each step that carries one takes {base} + {per_tok:g} x {chunk} = "
                   f"{spike:g} ms: that is the longest gap a decoding stream sees. Without chunking, the one "
                   f"step holding all {prompt:,} prompt tokens would take {base} + {per_tok:g} x {prompt:,} "
                   f"= {whole:g} ms, and every stream would get a gap that long. With chunking the worst gap "
                   f"is set by the budget, not by the longest prompt that happens to arrive."),
        "q7_key": ttft,
        "q7_whole": whole,
        "q7_tol": round(0.03 * ttft, 1),
        "q7_tol_text": f"{round(0.03 * ttft, 1):g}",
        "q7_why": (f"R needs ceil({prompt:,} / {chunk}) = {n_chunks} steps (the last chunk is shorter). Each "
                   f"of them costs the {base} ms of the step plus its prompt tokens, and the prompt tokens "
                   f"add up to {prompt:,} whatever the chunking: {n_chunks} x {base} + {per_tok:g} x "
                   f"{prompt:,} = {ttft:g} ms until R's first token, against {whole:g} ms if its whole "
                   "prompt ran in one step. Chunking does not reduce the prefill work; it spreads it over "
                   f"{n_chunks} steps, each of which also pays for the decodes. That is the trade-off of "
                   "max_num_batched_tokens: a smaller budget shortens the other streams' worst gap (Q6) and "
                   f"lengthens the long prompt's TTFT."),
    }


def params(seed: int) -> dict:
    rng = random.Random(f"quiz3_batching/{seed}")
    return {**_static_batch(rng), **_littles_law(rng), **_chunked(rng)}
