"""Quiz 1's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` picks a GPU and a model for the decode-floor question (Q5) and a load test for the
"what does total time / total tokens hide" question (Q10), and computes their keys and tolerances.
For the multiple-choice questions it picks a scenario (Q1 a new GPU's FLOP/s and bandwidth; Q2 a longer
prompt, a longer answer or a bigger model; Q3 a batch and its contexts; Q4 what the records show; Q6
which latency is asked for; Q7 a prompt in one step or in chunks; Q8 a tail or a slow steady stream; Q9
which percentile the stalls reach) and marks the option that scenario makes right
(``* [@@q1_itl@@]``): which option is right follows from the rule applied to the course's own numbers,
so another course's answer sheet is no key. The strings go into the question text (``@@q5_setup@@``
...), the numbers into the hidden tests.

Hardware figures are NVIDIA's datasheet numbers (dense BF16, HBM bandwidth), as in the course's
reference table: A100 80GB SXM 312 TFLOP/s, 2.04 TB/s; H100 SXM ~989 TFLOP/s, 3.35 TB/s; H100 PCIe
~756 TFLOP/s, 2.0 TB/s; H200 SXM ~989 TFLOP/s, 4.8 TB/s.
"""

from __future__ import annotations

import random

from minengine.course.templating import option_marks as _marks

# name, dense BF16 TFLOP/s, HBM bandwidth TB/s, memory GB
GPUS = [
    ("A100 80GB SXM", 312, 2.04, 80),
    ("H100 SXM", 989, 3.35, 80),
    ("H100 PCIe", 756, 2.0, 80),
    ("H200 SXM", 989, 4.8, 141),
]
# billions of parameters, weight dtype, bytes per parameter
MODELS = [
    (7, "bf16", 2), (8, "bf16", 2), (13, "bf16", 2), (14, "bf16", 2), (32, "bf16", 2),
    (8, "fp8", 1), (32, "fp8", 1), (70, "fp8", 1),
]


H100_TFLOPS, H100_TBPS = 989, 3.35


def _gpu_swap(rng: random.Random) -> dict:
    """Q1: which latency a new GPU improves at light load follows from its FLOP/s and its bandwidth."""
    kind = rng.choice(["itl", "ttft", "both", "neither"])
    tflops, tbps, mem = H100_TFLOPS, H100_TBPS, 80
    if kind in ("ttft", "both"):
        tflops = rng.choice([1483, 1979, 2250])
    if kind in ("itl", "both"):
        tbps = rng.choice([4.8, 6.7, 8.0])
    mem = rng.choice([141, 160]) if kind == "neither" else rng.choice([80, 141, 192])
    if (tflops, tbps, mem) == (989, 4.8, 141):
        gpu = "an H200 SXM: about 989 TFLOP/s of dense BF16, HBM read at 4.8 TB/s, 141 GB of it"
    else:
        gpu = (f"a newer GPU with about {tflops:,} TFLOP/s of dense BF16 and {mem} GB of HBM read at "
               f"{tbps:g} TB/s")
    ttft_x, itl_x = H100_TFLOPS / tflops, H100_TBPS / tbps
    common = ("At light load TTFT is the prefill of the 8,000-token prompt, which reuses every weight it "
              "reads for all 8,000 tokens: thousands of FLOPs per byte, far above the ridge, so it is bound "
              "by arithmetic and scales with 1 / (FLOP/s). A decode step at batch 1 streams all 16 GB of "
              "weights to make one token, about 1 FLOP per byte, so ITL scales with 1 / bandwidth. ")
    flops_text = (f"the FLOP/s go from 989 to {tflops:,} (TTFT x {ttft_x:.2f})" if tflops != H100_TFLOPS
                  else "the FLOP/s stay at 989")
    bw_text = (f"the bandwidth goes from 3.35 to {tbps:g} TB/s (ITL x {itl_x:.2f})" if tbps != H100_TBPS
               else "the bandwidth stays at 3.35 TB/s")
    change = f"Here {flops_text}, and {bw_text}. "
    end = {
        "itl": "Only the bandwidth changed, so only ITL falls; TTFT stays about the same.",
        "ttft": "Only the arithmetic changed, so only TTFT falls; each decode step still waits for the "
                "same weight read, and ITL stays about the same.",
        "both": "Both changed, so both fall, each by its own ratio.",
        "neither": "Neither changed: more HBM capacity lets a server hold more sequences' KV caches (a "
                   "bigger batch, more throughput under load), but one request at a time runs no faster.",
    }[kind]
    return {"q1_gpu": gpu, **_marks("q1", ("itl", "ttft", "both", "neither"), kind),
            "q1_why": repr(common + change + end)}


def _longer_request(rng: random.Random) -> dict:
    """Q2: a longer prompt, a longer answer or a bigger model: what each does to TTFT and ITL."""
    kind = rng.choice(["prompt", "answer", "model"])
    change = {
        "prompt": "A user now sends a 6,000-token prompt and asks for an answer of the same length",
        "answer": "A user now sends a 3,000-token prompt and asks for an answer of 600 tokens",
        "model": ("You now serve a model twice the size (16 billion parameters, bf16) on the same GPU, and "
                  "a user sends a 3,000-token prompt for a 300-token answer"),
    }[kind]
    why = {
        "prompt": ("Prefill's matrix multiplications cost about 2 x parameters FLOPs per prompt token, so "
                   "twice the prompt is about twice the work; attention's n^2 term adds a little on top, a "
                   "small share for a model this size at 6,000 tokens, so TTFT about doubles, not "
                   "quadruples. After the first token, decode reads the KV cache the prefill left behind: "
                   "each step still reads the 16 GB of weights plus a cache now twice as long but small "
                   "next to them (under 1 GB at 6,000 tokens for Llama-3.1-8B), so ITL rises by a few "
                   "percent."),
        "answer": ("The prompt is the same, so the prefill and TTFT are the same. Each decode step reads "
                   "the same 16 GB of weights and a KV cache that grows by a token a step, small next to "
                   "them, so ITL stays about the same; twice the tokens at the same pace just stream for "
                   "twice as long (the end-to-end latency doubles, not the gap between tokens)."),
        "model": ("Twice the parameters is twice the FLOPs per prompt token, and prefill is bound by "
                  "arithmetic, so TTFT about doubles. Each decode step streams all the weights, now 32 GB "
                  "instead of 16, and decode at batch 1 is bound by that read, so ITL about doubles too."),
    }[kind]
    return {"q2_change": change, **_marks("q2", ("prompt", "answer", "model"), kind), "q2_why": repr(why)}


KV_BYTES_PER_TOKEN = 131072  # Llama-3.1-8B in bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes


def _batch_step(rng: random.Random) -> dict:
    """Q3: a decode step at a bigger batch stays at the weight read, turns compute-bound past the ridge,
    or is taken over by the KV reads of long contexts: which one follows from the batch and the context."""
    kind = rng.choice(["flat", "compute", "kv"])
    batch, context = {"flat": (rng.choice([16, 32, 64]), 100), "compute": (rng.choice([2048, 3072]), 100),
                      "kv": (32, rng.choice([6000, 8000]))}[kind]
    kv_gb = batch * context * KV_BYTES_PER_TOKEN / 1e9
    read_ms = (16 + kv_gb) / H100_TBPS
    compute_ms = 2 * 8e9 * batch / (H100_TFLOPS * 1e12) * 1e3
    numbers = (f"A batch of {batch:,} at about {context:,} tokens of context each reads 16 GB of weights "
               f"plus {batch:,} x {context:,} x 128 KiB = {kv_gb:.1f} GB of KV cache: {read_ms:.1f} ms at "
               f"3.35 TB/s; its arithmetic, 2 x 8 billion x {batch:,} FLOPs, takes {compute_ms:.1f} ms at "
               "989 TFLOP/s. The step takes about the longer of the two. ")
    end = {
        "flat": ("The weight read still dominates and the batch shares it, so the step stays near the "
                 "batch-1 value, and the server makes a token per sequence per step: throughput grows almost "
                 "in proportion to the batch while each ITL barely moves."),
        "compute": ("Past the ridge (about 295 FLOP/byte in bf16, so a batch of about 300) the arithmetic "
                    "outgrows the read: the step is a few times the batch-1 step, set by the tensor cores."),
        "kv": ("The weights are shared, but every sequence reads its own long KV cache, and together those "
               "reads now outweigh the weights: the step is a few times the batch-1 step, still bound by "
               "memory, not by arithmetic."),
    }[kind]
    shrink = (" A step never shrinks below one weight read: sharing the read makes the batch cheap, not the "
              "step faster.")
    return {"q3_batch": f"a batch of {batch:,} sequences whose contexts are about {context:,} tokens each",
            **_marks("q3", ("flat", "compute", "kv"), kind), "q3_why": repr(numbers + end + shrink)}


def _slow_first_token(rng: random.Random) -> dict:
    """Q4: a long TTFT at the peak is a queue, or prompts prefilled many to a step: the records say which."""
    kind = rng.choice(["queue", "shared"])
    records = {
        "queue": "about 1.7 s between each request's arrival and the first step that schedules it",
        "shared": ("each request scheduled within 20 ms of its arrival, into a step that computes about "
                   "fifteen such prompts together and lasts about 1.8 s"),
    }[kind]
    why = {
        "queue": ("TTFT runs from a request's arrival to its first token, so it holds everything in "
                  "between: time in the queue, then the prefill. The records split the 1.9 s: about 1.7 s "
                  "from arrival to the first step that takes the request, leaving about 0.2 s for the "
                  "prefill itself, close to the 120 ms measured alone (a little more because it shares its "
                  "steps with decodes). The fix is admission and capacity (fewer requests per server, more "
                  "servers), not the prefill kernels. "),
        "shared": ("The records put each request into a step at once, so there is no queue to speak of. "
                   "But that step computes about fifteen prompts of 2,000 tokens, 30,000 tokens of "
                   "prefill, and prefill is bound by arithmetic: about 15 x 120 ms = 1.8 s, and no request "
                   "in the step gets its first token before the step ends. The fix is to cap the prompt "
                   "tokens one step may take (chunked prefill, lesson 06) or to add capacity, not faster "
                   "kernels. "),
    }[kind] + ("TTFT stops at the first token, so it contains no decoding of the answer (that would be the "
               "end-to-end latency). And decode is bound by memory reads, not by the tensor cores: it cannot "
               "crowd out a prefill's arithmetic, and the median ITL moved from 21 to 24 ms only.")
    return {"q4_records": records, **_marks("q4", ("queue", "shared"), kind), "q4_why": repr(why)}


def _latency_record(rng: random.Random) -> dict:
    """Q6: the same record asked for the user's TTFT or for the part after scheduling: which line is which."""
    kind = rng.choice(["arrival", "scheduled"])
    what = {
        "arrival": ("its TTFT and its inter-token gaps (ITL) the way the course, and `vllm bench serve`, "
                    "define them"),
        "scheduled": ("the time from the moment the engine scheduled it to its first token (the part its "
                      "prefill controls), and its inter-token gaps (ITL)"),
    }[kind]
    first = {
        "arrival": ("TTFT runs from arrival (10.000) to the first output token (10.620): 620 ms, of which "
                    "350 ms waiting in the queue and 270 ms from being scheduled to the first token. "
                    "Starting the clock when the request is scheduled leaves the queue out, but the user "
                    "waited through it. "),
        "scheduled": ("From being scheduled (10.350) to the first token (10.620) is 270 ms: the part the "
                      "engine's prefill controls. The user's TTFT, 620 ms from arrival, also holds the 350 "
                      "ms the request waited in the queue before that. "),
    }[kind]
    why = first + ("ITL is the gap between consecutive output tokens, so five tokens give four gaps: 25, "
                   "25, 520 and 25 ms; the wait before the first token is not an ITL gap. The 243 ms "
                   "average (1.215 s / 5 tokens) blends the pause before the first token with the stream "
                   "and hides the one 520 ms stall, most likely a step that also ran another request's long "
                   "prompt.")
    return {"q6_what": what, **_marks("q6", ("arrival", "scheduled"), kind), "q6_why": repr(why)}


Q7_WHOLE = """the engine puts R's whole prompt into step 203, next to the forty decodes.

| step | prompt tokens in the step | sequences decoding | step time |
|---|---|---|---|
| 201 | 0 | 40 | 22 ms |
| 202 | 0 | 40 | 22 ms |
| 203 | 6,000 (R's prompt) | 40 | 410 ms |
| 204 | 0 | 41 | 23 ms |"""
Q7_CHUNKED = """the engine splits R's prompt into chunks of at most 512 tokens, one chunk a step from step
203, next to the forty decodes.

| step | prompt tokens in the step | sequences decoding | step time |
|---|---|---|---|
| 201 | 0 | 40 | 22 ms |
| 202 | 0 | 40 | 22 ms |
| 203 to 213 | 512 each (R's prompt) | 40 | about 55 ms each |
| 214 | 368 (the rest of R's prompt) | 40 | 45 ms |
| 215 | 0 | 41 | 23 ms |"""


def _step_trace(rng: random.Random) -> dict:
    """Q7: a long prompt in one step gives every stream one long gap; in chunks, many shorter ones."""
    kind = rng.choice(["whole", "chunked"])
    why = {
        "whole": ("Every sequence in a step advances together, and none gets its token before the step "
                  "ends: the forty decoding requests wait the whole 410 ms of step 203 for their next "
                  "token, so each one gets one 410 ms ITL gap (this is where ITL tails come from), and no "
                  "run of 55 ms gaps. R's prefill ends by sampling its first token at the end of step 203, "
                  "so those 410 ms (plus any time R queued before) are its TTFT. "),
        "chunked": ("Every sequence in a step advances together, and none gets its token before the step "
                    "ends: while R's prompt is computed in twelve chunks, each of the forty decoding "
                    "requests gets a gap of about 55 ms per step (45 ms in the last), twelve times, and "
                    "never one long gap. R's first token comes out at the end of step 214, the last of its "
                    "prompt's steps, so all twelve (about 0.65 s, plus any time R queued before) are its "
                    "TTFT. "),
    }[kind] + ("ITL only counts gaps between output tokens: R's first gap runs from its first to its second "
               "token (about 23 ms, the step after its prompt), and its prompt belongs to TTFT.")
    return {"q7_how": Q7_WHOLE if kind == "whole" else Q7_CHUNKED,
            "q7_one_gap": "x" if kind == "whole" else " ", "q7_many_gaps": "x" if kind == "chunked" else " ",
            "q7_why": repr(why)}


def _itl_fix(rng: random.Random) -> dict:
    """Q8: a tail from long prompts wants a per-step prompt cap; a slow steady stream wants bandwidth."""
    kind = rng.choice(["chunk", "bandwidth"])
    symptom = {
        "chunk": ("Prompts of about 6,000 tokens arrive a few times a minute, and the streams' p99 ITL "
                  "sits far above their median"),
        "bandwidth": ("No long prompts arrive, and the streams' ITL is a steady 22 ms, median and p99 alike; "
                      "the product needs 15 ms"),
    }[kind]
    why = {
        "chunk": ("The tail comes from the steps that also carry a whole long prompt: the decodes in them "
                  "wait for 6,000 tokens of compute-bound prefill. Capping the prompt tokens per step "
                  "splits such a prefill into about a dozen pieces of 512 tokens, each adding tens of ms "
                  "to a step instead of hundreds, so no stream's gap is far above the usual one; the price "
                  "is a somewhat longer TTFT for the long prompt. (This is chunked prefill, measured in "
                  "lesson 06.) More bandwidth shortens the ordinary decode steps but barely the "
                  "compute-bound prefill inside the long step. "),
        "bandwidth": ("With no long prompts there is no stall to remove: every step is a decode step, "
                      "bound by reading the weights (and the KV caches), since forty sequences are far "
                      "below the ridge. Only a faster read shortens it: about 1.4x the bandwidth takes 22 "
                      "ms to about 15 ms. Capping the prompt tokens per step changes nothing when no step "
                      "holds a long prompt. "),
    }[kind] + ("A bigger batch raises the server's throughput, not the speed of any one stream. And how "
               "many tokens a request still has to generate does not change the work of one decode step: "
               "one token per sequence, whatever max_tokens says.")
    return {"q8_symptom": symptom, **_marks("q8", ("chunk", "bandwidth"), kind), "q8_why": repr(why)}


def _percentiles(rng: random.Random) -> dict:
    """Q9: which share of the gaps are stalls follows from which percentile the stall reaches."""
    kind = rng.choice(["one_in_100", "one_in_10"])
    stats = {"one_in_100": "mean 29 ms, p50 22 ms, p95 24 ms, p99 410 ms",
             "one_in_10": "mean 70 ms, p50 22 ms, p85 24 ms, p90 410 ms, p99 450 ms"}[kind]
    why = {
        "one_in_100": ("The p99 is the value 99% of the gaps stay under, so 1% of them, about 500 here, "
                       "last 410 ms or longer, while 95% take at most 24 ms: most gaps are fast and a few "
                       "are very slow. A 300-token answer then meets about three such freezes, which users "
                       "do notice. The mean (29 ms) "),
        "one_in_10": ("The p90 is the value 90% of the gaps stay under, so 10% of them, about 5,000 here, "
                      "last 410 ms or longer, while 85% take at most 24 ms. A 300-token answer then meets "
                      "about thirty such freezes: one every ten tokens or so. The mean (70 ms) "),
    }[kind] + ("blends the many fast gaps with the stalls and describes neither, and the median says nothing "
               "about the tail. Stalls of 0.4 s on a server whose decode steps take about 22 ms usually mean "
               "steps that also ran a long prompt's prefill (as in Q7): look for them in the step trace.")
    return {"q9_stats": stats, **_marks("q9", ("one_in_100", "one_in_10"), kind), "q9_why": repr(why)}


def _decode_floor(rng: random.Random) -> dict:
    # Only pairs whose weights leave at least a fifth of the GPU's memory for the KV cache.
    pairs = [(g, m) for g in GPUS for m in MODELS if m[0] * m[2] <= 0.8 * g[3]]
    (gpu, tflops, tbps, mem_gb), (billions, dtype, nbytes) = rng.choice(pairs)
    weight_gb = billions * nbytes
    key = round(weight_gb / tbps, 3)  # GB / (TB/s) = ms
    tol = round(0.05 * key, 2)
    return {
        "q5_setup": (f"{'an' if billions in (8, 18, 80) else 'a'} {billions}-billion-parameter model whose "
                     f"weights are stored in {dtype} ({nbytes} byte{'s' if nbytes > 1 else ''} per "
                     f"parameter) on one {gpu} ({mem_gb} GB of HBM read at {tbps:g} TB/s; about {tflops} "
                     f"TFLOP/s of dense BF16 arithmetic)"),
        "q5_key": key,
        "q5_tol": tol,
        "q5_tol_text": f"{tol:g}",
        "q5_why": (f"At batch 1 every decode step streams all {weight_gb} GB of weights "
                   f"({billions} billion parameters x {nbytes} byte{'s' if nbytes > 1 else ''}) from memory, "
                   f"and nothing can make a step shorter than {weight_gb} GB / {tbps:g} TB/s = {key:.2f} ms. "
                   f"The FLOP/s figure does not enter: one token needs about 2 x {billions} = {2 * billions} "
                   f"GFLOP, {2 * billions / tflops:.3f} ms of arithmetic at that rate, far less than the "
                   f"read. Common slips: forgetting the bytes per parameter, mixing up bits and bytes, or "
                   f"dividing by the FLOP/s instead of the bandwidth."),
    }


def _load_test(rng: random.Random) -> dict:
    streams = rng.choice([16, 24, 32, 48, 64])
    step_ms = rng.choice([18, 20, 22, 25, 28, 30, 35, 40])
    wall_s = rng.choice([120, 300, 600])
    tokens = int(round(streams * wall_s * 1000 / step_ms, -3))
    key = round(streams * wall_s * 1000 / tokens, 2)
    naive = round(wall_s * 1000 / tokens, 3)
    tol = max(1.0, round(0.05 * key, 1))
    return {
        "q10_streams": str(streams),
        "q10_wall": str(wall_s),
        "q10_tokens": f"{tokens:,}",
        "q10_naive_text": f"{naive:.3f}",
        "q10_naive": naive,
        "q10_key": key,
        "q10_tol": tol,
        "q10_tol_text": f"{tol:g}",
        "q10_why": (f"{tokens:,} tokens shared by {streams} streams that always decode together means "
                    f"{tokens:,} / {streams} = {tokens / streams:,.0f} engine steps in {wall_s} s, one token "
                    f"per stream per step: {wall_s} s / {tokens / streams:,.0f} = {key:.1f} ms per step, and "
                    f"that is the gap each user sees between two tokens. The report's {naive:.3f} ms "
                    f"divides the wall time by the tokens of all {streams} streams at once: it is the "
                    f"server's throughput ({tokens / wall_s:,.0f} tokens/s) turned upside down, and "
                    f"describes no one's stream (nor the wait before the first token, nor the tail)."),
    }


def params(seed: int) -> dict:
    rng = random.Random(f"quiz1_two_phases/{seed}")
    return {**_decode_floor(rng), **_load_test(rng), **_gpu_swap(rng), **_longer_request(rng),
            **_batch_step(rng), **_slow_first_token(rng), **_latency_record(rng), **_step_trace(rng),
            **_itl_fix(rng), **_percentiles(rng)}
