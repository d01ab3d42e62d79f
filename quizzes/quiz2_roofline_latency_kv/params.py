"""Quiz 2's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` draws a GPU and a weight format for the critical-batch question (Q2), a benchmark's
largest TTFTs for the p99 question (Q4), a model config for the KV-bytes question (Q8) and a cache and a
request length for the capacity question (Q9), a GPU and its other tenants for the
gpu_memory_utilization question (Q11), and computes their keys, tolerances and explanations. For the
multiple-choice questions it draws a scenario (Q1 how a new GPU's two roofs move, Q3 a batch below or past
the ridge, Q5 which of TPOT and ITL is the larger, Q6 how the benchmark sends and times, Q7 a rate near or
far below capacity, Q10 an fp8 KV cache or fp8 weights) and marks the option it makes right
(``* [@@q1_falls@@]``), so another course's answer sheet is no key.
The strings go into the question text (``@@q2_setup@@`` ...), the numbers into the hidden tests.

Hardware figures are datasheet numbers (dense BF16, HBM bandwidth), as in the course's reference table,
plus AMD's MI300X (1,307 TFLOP/s, 5.3 TB/s) and NVIDIA's L40S (362 TFLOP/s, 0.864 TB/s). Model shapes
are those of the models' published config.json files.
"""

from __future__ import annotations

import random

from minengine.course.templating import option_marks as _marks

# name, dense BF16 TFLOP/s, bandwidth TB/s
GPUS = [
    ("A100 80GB SXM", 312, 2.04),
    ("H100 SXM", 989, 3.35),
    ("H100 PCIe", 756, 2.0),
    ("H200 SXM", 989, 4.8),
    ("MI300X", 1307, 5.3),
    ("L40S", 362, 0.864),
]
# what the question says, bytes per parameter
WEIGHT_FORMATS = [
    ("bf16 (2 bytes per parameter)", 2.0),
    ("int8 with weight-only quantisation (1 byte per parameter, turned back into bf16 inside the "
     "matmul kernel, so the bf16 peak is the one that applies)", 1.0),
    ("int4 with weight-only quantisation (half a byte per parameter, turned back into bf16 inside the "
     "matmul kernel, so the bf16 peak is the one that applies)", 0.5),
]
# name, layers, hidden_size, query heads, KV heads, head_dim (from each model's config.json)
MODELS = [
    ("Llama-3.1-8B", 32, 4096, 32, 8, 128),
    ("Llama-3.1-70B", 80, 8192, 64, 8, 128),
    ("Mistral-7B-v0.3", 32, 4096, 32, 8, 128),
    ("Qwen2.5-7B", 28, 3584, 28, 4, 128),
    ("Qwen2.5-14B", 48, 5120, 40, 8, 128),
    ("Qwen2.5-32B", 64, 5120, 40, 8, 128),
    ("Llama-3.2-3B", 28, 3072, 24, 8, 128),
]
KV_DTYPES = [("bf16", 2), ("fp8", 1)]


def _ridge_move(rng: random.Random) -> dict:
    """Q1: the ridge is the ratio of the two roofs, so a faster chip can move it either way, or not at all."""
    kind = rng.choice(["falls", "rises", "stays"])
    tflops, tbps, gpu = {
        "falls": (989, 4.8, "H200 SXMs: the same tensor cores (989 TFLOP/s), with memory that reads at "
                            "4.8 TB/s"),
        "rises": (1979, 3.35, "a newer GPU with twice the tensor-core throughput (about 1,979 TFLOP/s of "
                              "dense BF16) and the same 3.35 TB/s of memory bandwidth"),
        "stays": (1483, 5.0, "a newer GPU with about 1,483 TFLOP/s of dense BF16 (1.5x) and memory that "
                             "reads at 5.0 TB/s (1.5x)"),
    }[kind]
    ridge = tflops / tbps
    why = (f"The ridge point is peak FLOP/s divided by bandwidth: 989 / 3.35 = 295 FLOP/byte on the H100, "
           f"{tflops:,} / {tbps:g} = {ridge:.0f} on the new GPU. " + {
               "falls": ("More bandwidth with the same arithmetic moves the ridge down, not up: a decode "
                         "step that streams the weights gets 4.8 / 3.35 = 1.43x shorter, and a decode "
                         "batch of about 206 instead of 295 already fills the tensor cores. "),
               "rises": ("More arithmetic with the same bandwidth moves the ridge up: a memory-bound "
                         "decode step reads the same bytes at the same rate and keeps its length, prefill "
                         "gets up to twice as fast, and decode stays memory-bound up to batches of about "
                         "590. "),
               "stays": ("Both roofs moved by 1.5x, so their ratio, the ridge, stays near 295: decode steps "
                         "(memory-bound) and prefill (compute-bound) both get about 1.5x faster. "),
           }[kind] + "'The faster chip has the higher ridge' mixes up speed with the ratio of the two "
                     "speeds; and batch-1 decode, about 1 FLOP/byte in bf16, stays far below any of these "
                     "ridges.")
    return {"q1_gpu": gpu, **_marks("q1", ("falls", "rises", "stays"), kind), "q1_why": repr(why)}


def _roofline_parts(rng: random.Random) -> dict:
    """Q3: the weight matmuls ride the batch up to and past the ridge; attention stays at the GQA group."""
    kind = rng.choice(["past", "below"])
    batch = rng.choice([384, 512, 768]) if kind == "past" else rng.choice([32, 64, 128])
    why = (f"The weight matmuls multiply each weight (2 bytes) by {batch} vectors, 2 FLOPs each: about "
           f"{batch} FLOP/byte, " + ("past the ridge of about 295. " if kind == "past" else
                             "still short of the ridge of about 295. ") +
           "Attention is different: each sequence reads its own keys and values, so a bigger batch brings "
           "more bytes along with the FLOPs and the ratio does not move. Per KV element read (2 bytes), the "
           "8 query heads of its group each do a multiply-add for the score and one for the output: about 2 "
           "x 8 x 2 / 2 = 8 FLOP/byte, the GQA group size, whatever the batch and the context. So "
           "'memory-bound until the batch reaches the ridge' holds for the weight matmuls only. Attention's "
           "n^2 term is prefill's; in decode each step costs a multiple of the context, not its square.")
    return {"q3_batch": f"{batch:,}", **_marks("q3", ("past", "below"), kind), "q3_why": repr(why)}


def _tpot_itl(rng: random.Random) -> dict:
    """Q5: which of TPOT and ITL comes out larger says whether short or long answers met the stalls."""
    kind = rng.choice(["short_stalled", "long_stalled"])
    tpot, itl = (48, 14) if kind == "short_stalled" else (14, 48)
    common = ("Both average the gaps between output tokens, weighted differently. TPOT is one value per "
              "request, (E2E - TTFT) / (output tokens - 1), then averaged over requests: every user counts "
              "once. ITL pools every gap of every request: a 500-token answer adds 499 gaps, a 3-token "
              "answer 2. ")
    end = {
        "short_stalled": ("Here TPOT is the larger: the short answers met a stall (say a long prefill "
                          "sharing their step) in their few gaps, which lifts their TPOT and so the mean "
                          "TPOT, while the pooled ITL is carried by the long answers' many quick gaps. "),
        "long_stalled": ("Here ITL is the larger: the long answers met the stalls across their many gaps, "
                         "and those gaps dominate the pooled ITL, while the mean TPOT is carried by the "
                         "many short answers that streamed fast, each counting once. "),
    }[kind]
    why = common + end + ("vLLM's TPOT leaves the first token out (some tools put it in: always say which "
                          "definition you use), and both come from the same records, so the network is not "
                          "what separates them.")
    return {"q5_tpot": str(tpot), "q5_itl": str(itl), **_marks("q5", ("short_stalled", "long_stalled"), kind),
            "q5_why": repr(why)}


def _benchmark_gap(rng: random.Random) -> dict:
    """Q6: a closed loop never sends what users send into a pause; a clock started at scheduling never
    sees the queue. Which one hides the waits follows from how the script works."""
    kind = rng.choice(["closed_loop", "clock"])
    script = {
        "closed_loop": ("runs 8 workers; each sends a request, waits for its answer, then sends the next, "
                        "and times TTFT from the moment it sends"),
        "clock": ("sends requests on a schedule (Poisson arrivals at the production rate, whatever the "
                  "server is doing) and takes each TTFT from the server's records, whose clock starts when "
                  "the engine schedules the request"),
    }[kind]
    why = {
        "closed_loop": ("A closed-loop client sends its next request only when an answer came back, so its "
                        "sending rate follows the server: while the server pauses, 8 requests wait (8 "
                        "samples out of 5,000, too few to reach the p99) and no new ones arrive. Real "
                        "users keep arriving during the pause, pile up, and wait for the queue to drain "
                        "afterwards; none of those requests exists in the benchmark. This is coordinated "
                        "omission. An open-loop generator (arrivals on a schedule, like vllm bench serve "
                        "--request-rate) sees them. "),
        "clock": ("The script's arrivals are open-loop, so the requests sent into a pause do exist in its "
                  "samples, and they do wait. But a clock that starts when the engine schedules a request "
                  "leaves out the time it spent in the queue, the very wait the users feel after a pause: "
                  "each of those requests looks as fast as any other. Time TTFT from arrival (the client's "
                  "send time), as vllm bench serve does. "),
    }[kind] + ("5,000 samples are plenty for a p99, and the network adds milliseconds, not the seconds the "
               "users report.")
    return {"q6_script": script, **_marks("q6", ("closed_loop", "clock"), kind), "q6_why": repr(why)}


def _near_capacity(rng: random.Random) -> dict:
    """Q7: the wait grows steeply near capacity, the tail first, and hardly at all well below it."""
    kind = rng.choice(["near", "far_below"])
    plan = {"near": "wants to run at 9.5 requests/s, \"still under capacity\"",
            "far_below": ("moves half the traffic to a second server, so this one will run at 2.5 "
                          "requests/s")}[kind]
    why = ("A queue's waiting time is not proportional to the load: it grows like rho / (1 - rho) in the "
           "textbook single-server queue, 1/3 at a quarter load, 1 at half load and 19 at 95%. " + {
               "near": ("Near capacity, bursts of arrivals leave queues that take long to drain, and the "
                        "requests behind a burst make the tail, so p99 grows first and most, while p50 "
                        "moves less. At 9.5 requests/s the p99 will be several times its value at 5; a "
                        "sweep of rates (lesson 03) shows where the wall starts, and the highest rate that "
                        "still meets the SLO is the one to plan for."),
               "far_below": ("At 2.5 requests/s, a quarter of the capacity, a request rarely finds another "
                             "ahead of it: the waits, already small at half load, shrink further, and TTFT "
                             "stays close to the prefill itself, p50 and p99 alike (the p99 may fall a "
                             "little). Halving the rate does not halve the latency: most of it is the "
                             "work, not the queue."),
           }[kind])
    return {"q7_plan": plan, **_marks("q7", ("near", "far_below"), kind), "q7_why": repr(why)}


def _eight_bits(rng: random.Random) -> dict:
    """Q10: an fp8 KV cache doubles the cache's tokens; fp8 weights halve the weight reads. What each buys."""
    kind = rng.choice(["kv", "weights"])
    proposal = {
        "kv": ("`--kv-cache-dtype fp8`: keys and values stored in 8 bits instead of bf16, the weights "
               "unchanged"),
        "weights": ("an fp8 checkpoint of the model: weights stored in 8 bits and turned back into bf16 "
                    "inside the matmuls, the KV cache left in bf16"),
    }[kind]
    why = {
        "kv": ("The KV formula's last factor is bytes per element: 1 instead of 2 halves the bytes per "
               "token, so the same cache memory holds twice the tokens (keys and values both shrink, which "
               "is how the total halves, not quarters). The weights are untouched, so a batch-1 decode "
               "step, mostly the weight read, barely changes. "),
        "weights": ("The weights go from 16 GB to about 8 GB, so a decode step at small batch, mostly the "
                    "weight read, reads about half the bytes and gets nearly twice as fast; the 8 GB freed "
                    "also hold more KV cache (here about a seventh more, not twice), so the preemptions "
                    "ease somewhat. "),
    }[kind] + ("Rounding perturbs every product it enters, and no normalisation undoes that: the effect "
               "depends on the model, the scaling scheme and the task, so measure it on your own evaluation "
               "before trading it for speed or capacity.")
    return {"q10_proposal": proposal, **_marks("q10", ("kv", "weights"), kind), "q10_why": repr(why)}


def _critical_batch(rng: random.Random) -> dict:
    gpu, tflops, tbps = rng.choice(GPUS)
    fmt, bpp = rng.choice(WEIGHT_FORMATS)
    model = rng.choice(["an 8B", "a 14B", "a 32B", "a 70B"])
    ridge = tflops / tbps  # TFLOP/s / (TB/s) = FLOP/byte
    key = round(ridge * bpp / 2, 1)
    tol = round(0.05 * key, 1)
    coef = "" if bpp == 2 else f"{2 / bpp:g}"
    return {
        "q2_setup": f"{model} model with its weights in {fmt}, on one {gpu} ({tflops:,} TFLOP/s of dense "
                    f"BF16, {tbps:g} TB/s of memory bandwidth)",
        "q2_key": key,
        "q2_tol": tol,
        "q2_tol_text": f"{tol:g}",
        "q2_ridge": round(ridge, 1),
        "q2_why": (f"The ridge point is peak arithmetic over bandwidth: {tflops:,} TFLOP/s / {tbps:g} TB/s = "
                   f"{ridge:.0f} FLOP/byte. A decode step at batch B does about 2 x B FLOPs (a multiply and "
                   f"an add per sequence) for each weight it reads, and each weight costs {bpp:g} byte"
                   f"{'s' if bpp != 1 else ''}, so the weight matmuls run at 2B / {bpp:g} = {coef}B "
                   f"FLOP/byte. They meet the ridge at B = {ridge:.1f} x {bpp:g} / 2 = {key:g}. The model's "
                   "size does not enter: a bigger model reads more bytes and does proportionally more "
                   "FLOPs. "
                   + ("In bf16 the critical batch is the ridge itself. " if bpp == 2 else
                      f"Smaller weights mean fewer bytes for the same FLOPs, so the critical batch is "
                      f"{2 / bpp:g}x below the ridge of {ridge:.0f}: taking the ridge as the batch forgets "
                      f"the bytes per parameter. ")
                   + "Reading the KV cache as well lowers the intensity of the whole step, so in practice "
                     "the step turns compute-bound at an even larger batch than this."),
    }


def _p99(rng: random.Random) -> dict:
    n = rng.choice([20, 24, 30, 40])
    second = rng.randrange(700, 1500, 10)
    top = sorted([second - rng.randrange(30, 120, 5) - d for d in (0, 60, 140)])
    largest = second + rng.randrange(1500, 4000, 50)
    values = [*top, second, largest]
    pos = 0.99 * (n - 1)  # numpy's linear interpolation: position in the sorted samples (0-based)
    frac = pos - (n - 2)  # 0 <= frac < 1 for n <= 100: between the two largest values
    key = round(second + frac * (largest - second), 1)
    tol = round(max(5.0, 0.01 * key), 1)
    return {
        "q4_n": str(n),
        "q4_top": ", ".join(f"{v:,}" for v in values),
        "q4_largest": largest,
        "q4_key": key,
        "q4_tol": tol,
        "q4_tol_text": f"{tol:g}",
        "q4_why": (f"With n = {n} sorted samples, numpy puts the 99th percentile at position 0.99 x (n - 1) "
                   f"= {pos:.2f} counting from 0, that is between the second largest value (position "
                   f"{n - 2}, {second:,} ms) and the largest (position {n - 1}, {largest:,} ms), {frac:.0%} "
                   f"of the way: {second:,} + {frac:.2f} x {largest - second:,} = {key:,.1f} ms. With so few "
                   "requests the p99 is the maximum, slightly shaded: one unlucky request sets it, and the "
                   "next run will print a different number (below 100 requests it always lies between the "
                   "two slowest). The other three values do not enter at all. For a p99 you can trust, send "
                   f"enough requests that a few dozen lie beyond it (thousands), and say how many you sent."),
    }


def _kv_per_token(rng: random.Random) -> dict:
    pairs = [(m, d) for m in MODELS for d in KV_DTYPES if (m[0], d[0]) != ("Llama-3.1-8B", "bf16")]
    (name, layers, hidden, q_heads, kv_heads, head_dim), (dtype, nbytes) = rng.choice(pairs)
    per_token = 2 * layers * kv_heads * head_dim * nbytes
    key = per_token / 1024
    mha = 2 * layers * hidden * nbytes / 1024
    tol = round(0.02 * key, 2)
    return {
        "q8_setup": (f"{name}, whose config.json says `num_hidden_layers: {layers}`, `hidden_size: "
                     f"{hidden}`, `num_attention_heads: {q_heads}`, `num_key_value_heads: {kv_heads}`, "
                     f"`head_dim: {head_dim}`"),
        "q8_dtype": dtype,
        "q8_key": key,
        "q8_mha": mha,
        "q8_tol": tol,
        "q8_tol_text": f"{tol:g}",
        "q8_why": (f"Each layer keeps one key and one value vector per KV head: 2 x {layers} layers x "
                   f"{kv_heads} KV heads x {head_dim} x {nbytes} byte{'s' if nbytes > 1 else ''} ({dtype}) = "
                   f"{per_token:,} bytes = {key:g} KiB per token. The {q_heads} query heads share those "
                   f"{kv_heads} KV heads (grouped-query attention, {q_heads // kv_heads} query heads per KV "
                   f"head), so the formula with the hidden size, 2 x layers x {hidden} x {nbytes} = {mha:g} "
                   f"KiB, describes the multi-head case and overstates this cache {q_heads // kv_heads}x. "
                   "The number of query heads does not enter."),
    }


def _capacity(rng: random.Random) -> dict:
    block = rng.choice([16, 32])
    kv_kib = rng.choice([64, 96, 128, 160, 320])
    gib = rng.choice([20, 30, 40, 50, 60, 100])
    blocks_per_req = rng.randrange(12, 40) if block == 16 else rng.randrange(6, 20)
    length = (blocks_per_req - 1) * block + rng.randrange(1, 4)  # just over a block boundary
    num_blocks = gib * 1024 * 1024 // (block * kv_kib)
    key = num_blocks // blocks_per_req
    naive = int(gib * 1024 * 1024 / kv_kib // length)
    tol = max(1, round(0.01 * key))
    assert naive - key > tol, (naive, key)
    return {
        "q9_gib": str(gib),
        "q9_kv": str(kv_kib),
        "q9_block": str(block),
        "q9_len": f"{length:,}",
        "q9_key": key,
        "q9_naive": naive,
        "q9_tol": tol,
        "q9_tol_text": f"{tol:g}",
        "q9_why": (f"The cache is cut into blocks of {block} tokens: {gib} GiB / ({block} x {kv_kib} KiB) = "
                   f"{num_blocks:,} blocks. A request of {length:,} tokens holds ceil({length:,} / {block}) "
                   f"= {blocks_per_req} blocks ({blocks_per_req * block:,} token slots: its last block is "
                   f"almost empty), so {num_blocks:,} // {blocks_per_req} = {key:,} requests fit. Dividing "
                   f"the tokens ({gib * 1024 * 1024 // kv_kib:,}) by {length:,} gives {naive:,}: it forgets "
                   "that a block is taken whole, which costs most when a request ends just past a block "
                   "boundary, as here. This is the maximum concurrency vLLM logs at start-up; the cache may "
                   f"allow it while max_num_seqs or the compute per step does not."),
    }


def _utilization(rng: random.Random) -> dict:
    gpu_gib = rng.choice([40, 48, 80, 94, 141])
    weights = rng.choice([15, 16, 28]) if gpu_gib > 40 else rng.choice([15, 16])
    other = rng.choice([2, 3, 4, 6])
    context = 0.5  # the CUDA context and libraries' workspaces, outside the engine's accounting
    margin = rng.choice([1, 2])
    key = round(1 - (other + context + margin) / gpu_gib, 3)
    minus_weights = round(1 - (other + context + margin + weights) / gpu_gib, 3)
    tol = 0.005
    return {
        "q11_gpu": str(gpu_gib),
        "q11_weights": str(weights),
        "q11_other": str(other),
        "q11_margin": str(margin),
        "q11_key": key,
        "q11_minus_weights": minus_weights,
        "q11_tol": tol,
        "q11_tol_text": f"{tol:g}",
        "q11_why": (f"The fraction is the engine's share of the whole GPU, and its own weights, "
                    "activations and KV cache all live inside it. What must fit outside is what the "
                    f"engine does not count: the embedding server at its busiest ({other} GiB), the CUDA "
                    f"context ({context:g} GiB) and your margin ({margin} GiB), {other + context + margin:g} "
                    f"GiB of {gpu_gib}: 1 - {other + context + margin:g} / {gpu_gib} = {key:.3f}. "
                    f"Subtracting the {weights} GiB of weights as well ({minus_weights:.3f}) counts them "
                    "twice and gives the cache that much less for nothing. Then check the other side at "
                    "the peak: no preemptions, or the cache is too small for the traffic at any safe "
                    "setting."),
    }


def params(seed: int) -> dict:
    rng = random.Random(f"quiz2_roofline_latency_kv/{seed}")
    return {**_critical_batch(rng), **_p99(rng), **_kv_per_token(rng), **_capacity(rng), **_utilization(rng),
            **_ridge_move(rng), **_roofline_parts(rng), **_tpot_itl(rng), **_benchmark_gap(rng),
            **_near_capacity(rng), **_eight_bits(rng)}
