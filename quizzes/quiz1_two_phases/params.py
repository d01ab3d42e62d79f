"""Quiz 1's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` picks a GPU and a model for the decode-floor question (Q5) and a load test for the
"what does total time / total tokens hide" question (Q10), and computes their keys and tolerances.
The strings go into the question text (``@@q5_setup@@`` ...), the numbers into the hidden tests.

Hardware figures are NVIDIA's datasheet numbers (dense BF16, HBM bandwidth), as in the course's
reference table: A100 80GB SXM 312 TFLOP/s, 2.04 TB/s; H100 SXM ~989 TFLOP/s, 3.35 TB/s; H100 PCIe
~756 TFLOP/s, 2.0 TB/s; H200 SXM ~989 TFLOP/s, 4.8 TB/s.
"""

from __future__ import annotations

import random

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
    return {**_decode_floor(rng), **_load_test(rng)}
