"""Quiz 6's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` draws the acceptance rates, draft lengths and verify-step costs of the three numeric
questions and computes their keys, tolerances and explanations. The formula is lesson 10's: with k drafts
each kept with chance a (until the first rejection), a verify step yields on average
T = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens (Leviathan et al., 2023), and speculation speeds
decoding up by T / r when a verify step costs r plain decode steps. The verify costs are of the sizes the
lesson measures and simulates: slightly above 1 at batch 1 on a GPU (the drafts' rows ride along with the
weight reads), about 2.2-2.6 for k = 3 at batch 256 on a simulated H100 (the step is compute-bound).
"""

from __future__ import annotations

import random


def tokens_per_step(a: float, k: int) -> float:
    """Mean tokens a verify step yields: the kept drafts plus the model's own token."""
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def _tokens(rng: random.Random) -> dict:
    a = rng.choice([0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9])
    k = rng.choice([2, 3, 4, 5, 6])
    key = round(tokens_per_step(a, k), 3)
    tol = round(0.01 * key, 3)
    terms = " + ".join(["1"] + [f"{a:g}" if i == 1 else f"{a:g}^{i}" for i in range(1, k + 1)])
    return {
        "q2_a": f"{a:g}", "q2_k": str(k), "q2_key": key, "q2_tol": tol, "q2_tol_text": f"{tol:g}",
        "q2_linear": round(1 + k * a, 3),
        "q2_why": (f"A draft counts only if every draft before it was kept, so draft i survives with chance "
                   f"{a:g}^i, and the step always adds the model's own token: T = {terms} = (1 - {a:g}^"
                   f"{k + 1}) / (1 - {a:g}) = {key:g} tokens. Counting {k} x {a:g} = {k * a:g} kept drafts "
                   "treats each draft as if it were checked on its own; the first rejection ends the step, "
                   "so later drafts are worth less and less."),
    }


def _speedup_small_batch(rng: random.Random) -> dict:
    a = rng.choice([0.6, 0.7, 0.8])
    k = rng.choice([3, 4, 5])
    r = rng.choice([1.05, 1.1, 1.15, 1.2, 1.3])
    t = tokens_per_step(a, k)
    key = round(t / r, 3)
    tol = round(0.02 * key, 3)
    return {
        "q3_a": f"{a:g}", "q3_k": str(k), "q3_r": f"{r:g}", "q3_key": key, "q3_tol": tol,
        "q3_tol_text": f"{tol:g}", "q3_no_cost": round(t, 3),
        "q3_why": (f"Each verify step yields T = (1 - {a:g}^{k + 1}) / (1 - {a:g}) = {t:.3f} tokens and "
                   f"costs {r:g} plain decode steps, each of which yields 1 token: the speedup is "
                   f"{t:.3f} / {r:g} = {key:g}x. The step costs only a little more than a plain one "
                   "because at batch 1 it is bound by reading the weights, which it does once for all "
                   f"{k + 1} positions. Leaving the cost out ({t:.3f}x) is the speedup of a free verify "
                   "step, which no machine has; the drafter's own time (a draft model's) would lower it "
                   "further."),
    }


def _speedup_large_batch(rng: random.Random) -> dict:
    while True:  # a case that is clearly above or clearly below 1
        a = rng.choice([0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
        r = rng.choice([2.2, 2.4, 2.6])
        t = tokens_per_step(a, 3)
        key = round(t / r, 3)
        if abs(key - 1) > 0.08:
            break
    tol = round(0.02 * key, 3)
    verdict = (f"below 1: the decode phase is {100 * (1 - key):.0f}% slower with drafts than without"
               if key < 1 else f"above 1, but far below the batch-1 gain: {100 * (key - 1):.0f}% faster")
    return {
        "q4_a": f"{a:g}", "q4_r": f"{r:g}", "q4_key": key, "q4_tol": tol, "q4_tol_text": f"{tol:g}",
        "q4_no_cost": round(t, 3),
        "q4_why": (f"With k = 3 a verify step yields T = 1 + {a:g} + {a:g}^2 + {a:g}^3 = {t:.3f} tokens "
                   f"but now costs {r:g} decode steps: at batch 256 a plain decode step already computes "
                   "256 rows, near the H100's ridge, so the 4 x 256 rows of a verify step cost about their "
                   f"arithmetic. Speedup = {t:.3f} / {r:g} = {key:g}, {verdict}. At high load the batch "
                   "already spends the arithmetic that speculation would have used."),
    }


def params(seed: int) -> dict:
    rng = random.Random(f"quiz6_speculative_decoding/{seed}")
    return {**_tokens(rng), **_speedup_small_batch(rng), **_speedup_large_batch(rng)}
