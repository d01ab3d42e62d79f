"""Quiz 2's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` draws a GPU and a weight format for the critical-batch question (Q2), a benchmark's
largest TTFTs for the p99 question (Q4), a model config for the KV-bytes question (Q8) and a cache and a
request length for the capacity question (Q9), a GPU and its other tenants for the
gpu_memory_utilization question (Q11), and computes their keys, tolerances and explanations.
The strings go into the question text (``@@q2_setup@@`` ...), the numbers into the hidden tests.

Hardware figures are datasheet numbers (dense BF16, HBM bandwidth), as in the course's reference table,
plus AMD's MI300X (1,307 TFLOP/s, 5.3 TB/s) and NVIDIA's L40S (362 TFLOP/s, 0.864 TB/s). Model shapes
are those of the models' published config.json files.
"""

from __future__ import annotations

import random

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
    return {**_critical_batch(rng), **_p99(rng), **_kv_per_token(rng), **_capacity(rng), **_utilization(rng)}
