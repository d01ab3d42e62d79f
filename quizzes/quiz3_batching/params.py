"""Quiz 3's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` draws a static batch's output lengths (Q1), a request stream for Little's law (Q3) and
a server with a long prompt joining its decodes (Q6, Q7: step-cost fit, token budget, prompt length),
and computes the keys, tolerances and explanations. For the multiple-choice questions it draws a
scenario (Q2 the ITL target, Q4 recompute or swap, Q5 the sweep's SLO shares, Q8 which run is
decode-first, Q9 a tiny or an ample token budget) and marks the option it makes right
(``* [@@q2_b128@@]``), so another course's answer sheet is no key. Strings go into the question text,
numbers into the hidden tests.
"""

from __future__ import annotations

import math
import random

from minengine.course.templating import option_marks as _marks

# Q2's step records: (batch, step ms) of an 8B model in bf16 on a simulated H100, short contexts
Q2_STEPS = [(1, 6.2), (32, 6.6), (64, 7.1), (128, 8.3), (256, 13.9), (512, 26.5)]


def _pick_batch(rng: random.Random) -> dict:
    """Q2: the largest batch whose step meets the ITL target; which one follows from the target."""
    target, pick = rng.choice([(8, 64), (10, 128), (15, 256)])
    rates = {b: b / ms * 1000 for b, ms in Q2_STEPS}
    step = dict(Q2_STEPS)
    nxt = {64: 128, 128: 256, 256: 512}[pick]
    why = ("Throughput is batch / step time: "
           f"{', '.join(f'{rates[b]:,.0f} tokens/s at {b}' for b in (32, 64, 128, 256, 512))}. Each stream "
           f"gets one token per step, so its ITL is the step time: {step[pick]} ms at {pick} meets the "
           f"{target} ms target, while {step[nxt]} ms at {nxt} does not. " +
           "Up to about 128 the step is mostly the weight read and barely grows, so batching is nearly "
           "free; past the ridge the step grows about in proportion to the batch, and throughput stops "
           "rising while every stream slows down. A smaller batch than the largest that meets the target "
           "leaves throughput on the table, and a larger one breaks the ITL the users were promised.")
    return {"q2_target": str(target), **_marks("q2", ("b64", "b128", "b256"), f"b{pick}"),
            "q2_why": repr(why)}


def _preemption_mode(rng: random.Random) -> dict:
    """Q4: what happens to a preempted request depends on the mode: recompute (vLLM V1) or swap (V0)."""
    kind = rng.choice(["recompute", "swap"])
    engine = {"recompute": "The engine, like vLLM V1, preempts the request admitted last, by recompute",
              "swap": ("The engine, like vLLM V0 started with `preemption_mode=\"swap\"` and CPU swap space, "
                       "preempts the request admitted last by swapping it out")}[kind]
    why = {
        "recompute": ("Recompute preemption frees all the request's KV blocks at once, so the others can "
                      "keep decoding, and puts the request back at the front of the waiting queue. Its "
                      "generated tokens are kept: when it is readmitted, its prompt plus those tokens are "
                      "prefilled again (a compute-bound pass, cheap next to generating them one step at a "
                      "time), and decoding continues from there, so the user's stream is unchanged, only "
                      "paused. "),
        "swap": ("Swap preemption copies the request's KV blocks to CPU memory over PCIe and frees them on "
                 "the GPU; once room frees up they are copied back and decoding resumes where it stopped, "
                 "with nothing computed again (the price is the copies, and the CPU memory). vLLM V0 "
                 "offered it; V1 only recomputes. "),
    }[kind] + ("Neither mode cancels the request or regenerates tokens the user has seen. The pause is "
               "counted by vllm:num_preemptions: a cache that keeps filling up is a capacity problem (fewer "
               "sequences, shorter outputs, a smaller KV dtype), not something to leave running.")
    return {"q4_engine": engine, **_marks("q4", ("recompute", "swap"), kind), "q4_why": repr(why)}


# Q5's sweeps: the share of requests meeting both SLOs at 4, 6, 8, 10 and 12 requests/s
Q5_SWEEPS = {6: (100, 98, 70, 40, 15), 8: (100, 99, 93, 61, 22), 10: (100, 100, 98, 90, 40)}
Q5_RATES = (4, 6, 8, 10, 12)
Q5_THROUGHPUT = (4.0, 6.0, 8.0, 9.8, 10.1)


def _goodput(rng: random.Random) -> dict:
    """Q5: goodput peaks where the share meeting the SLOs starts to fall fast; the sweep decides where."""
    best = rng.choice(sorted(Q5_SWEEPS))
    shares = Q5_SWEEPS[best]
    good = [t * s / 100 for t, s in zip(Q5_THROUGHPUT, shares, strict=True)]
    assert max(range(5), key=lambda i: good[i]) == Q5_RATES.index(best)
    why = ("Goodput counts only the requests that met every SLO: "
           f"{', '.join(f'{g:.1f}' for g in good)} requests/s for the five rates (throughput times the share "
           f"that met both), highest at {best} requests/s. Past it the server still finishes more requests, "
           "but more and more of them too late, so useful work falls while throughput keeps rising: "
           "throughput alone would send you to the rate where most requests miss. A lower rate is safer, but "
           "gives up goodput for a margin the SLO did not ask for.")
    row = " | ".join(f"{s} %" for s in shares)
    return {"q5_met": row, **_marks("q5", ("r6", "r8", "r10"), f"r{best}"), "q5_why": repr(why)}


def _policy_runs(rng: random.Random) -> dict:
    """Q8: the decode-first run has the smooth streams and the slower first tokens; which run it is, the
    seed decides."""
    decode_first = rng.choice(["X", "Y"])
    rows = {"prefill": "0.25 s | 0.9 s | 160 ms", "decode": "0.6 s | 2.1 s | 35 ms"}
    x, y = (rows["decode"], rows["prefill"]) if decode_first == "X" else (rows["prefill"], rows["decode"])
    other = "Y" if decode_first == "X" else "X"
    why = (f"With a fixed budget, the policy decides who gets it first. Decode-first (vLLM V1's order) gives "
           f"every running sequence its token before any prompt chunk, so a step never holds more prompt "
           f"tokens than the budget leaves over, and the streams' gaps stay short: {decode_first}'s low p99 "
           f"ITL. New prompts get what is left, so they take longer to reach their first token: "
           f"{decode_first}'s higher TTFT. Prefill-first hands the budget to waiting prompts, so they start "
           f"sooner ({other}'s TTFT), and decodes stall behind big prompt steps ({other}'s ITL tail). The "
           "number of tokens per step is not the whole story: which tokens they are decides who waits.")
    return {"q8_x": x, "q8_y": y, **_marks("q8", ("x_first", "y_first"), f"{decode_first.lower()}_first"),
            "q8_why": repr(why)}


def _tiny_budget(rng: random.Random) -> dict:
    """Q9: a budget of a few dozen tokens turns a prefill memory-bound; one of a couple of thousand keeps it
    compute-bound. Which one the team set, the seed decides."""
    kind = rng.choice(["tiny", "ample"])
    budget = 64 if kind == "tiny" else 2048
    chunk = budget - 16
    steps = math.ceil(8000 / chunk)
    why = {
        "tiny": ("Prefill is cheap per token only because one pass over the weights serves many tokens. "
                 f"With {budget} tokens per step and 16 taken by decodes, each step prefills {chunk} "
                 f"prompt tokens: 8,000 / {chunk} = about {steps} steps. Every step reads the 16 GB of "
                 "weights (16 GB / 3.35 TB/s = 4.8 ms) to do a few dozen tokens of work, an intensity "
                 "near 64 FLOP/byte, far below the ridge: the prompt's prefill has turned memory-bound, "
                 f"and its TTFT is at least {steps} x 4.8 ms = {steps * 4.8 / 1000:.1f} s, four times what "
                 "it needs. "),
        "ample": (f"With {budget} tokens per step and 16 taken by decodes, each step prefills {chunk:,} "
                  f"prompt tokens: {steps} steps. Each one does about 2 x 8 billion x {chunk:,} = "
                  f"{2 * 8 * chunk / 1000:.0f} TFLOP, {2 * 8e9 * chunk / 989e12 * 1e3:.0f} ms at 989 "
                  "TFLOP/s, far more than the 4.8 ms weight read: the prefill stays compute-bound, and "
                  f"its TTFT stays close to the 0.2 s it takes in one piece, spread over {steps} steps. "),
    }[kind] + ("Under decode-first scheduling every decoding stream gets its one token in every step "
               "whatever the budget; what the budget sets is how much prompt rides along, so how long each "
               "of those steps is.")
    return {"q9_budget": f"{budget:,}", **_marks("q9", ("tiny", "ample"), kind), "q9_why": repr(why)}


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
    return {**_static_batch(rng), **_littles_law(rng), **_chunked(rng), **_pick_batch(rng),
            **_preemption_mode(rng), **_goodput(rng), **_policy_runs(rng), **_tiny_budget(rng)}
