"""Lab 2's hidden workloads and scores for one course seed (instructor-only: params.py never reaches the
release).

``params(seed)`` draws the four workload families the quality cells grade on (bursty arrivals, bimodal
prompts, KV pressure that forces preemption, long outputs), the engine settings of the correctness cell and
the seeds of the property tests, and simulates on each family the two baselines (FCFS/prefill-first and
decode-first) and the REFERENCE: the source notebook's own solution cell (``answer_policy``), read from the
notebook next to this file. So the reference lives only in the source; the package holds none. A family is
redrawn until it separates the policies (prefill-first < decode-first, reference >= 1.15 x decode-first),
so that every tier of the score means something for every course.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path("labs/lab2_batching_scheduler")
NOTEBOOK = "lab2_batching_scheduler.ipynb"
SLO = {"ttft": 500.0, "tpot": 30.0}  # ms; stated in the notebook
ENGINE = {"max_model_len": 8192, "max_num_batched_tokens": 512, "max_num_seqs": 64}
SEPARATION = 1.15  # the reference beats decode-first by at least this factor on every family


def reference_policy() -> type:
    """The solution cell of the source notebook, executed: the reference policy (never in the package)."""
    nb = json.loads((HERE / NOTEBOOK).read_text())
    (cell,) = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "answer_policy"]
    code = re.sub(r"^\s*### (BEGIN|END) SOLUTION\s*$", "", "".join(cell["source"]), flags=re.M)
    namespace: dict[str, Any] = {"__name__": "lab2_reference"}
    exec(compile(code, "lab2 reference (answer_policy)", "exec"), namespace)
    return namespace["MyPolicy"]


def _family(rng: random.Random, kind: str) -> dict[str, Any]:
    fam: dict[str, Any] = {"name": kind, "model": "llama-3.1-8b", "gpu": "h100", "engine": dict(ENGINE),
                           "slo": dict(SLO), "seed": rng.randrange(2**31), "burstiness": 1.0}
    if kind == "bursty":
        fam.update(num_requests=250, rate=round(rng.uniform(22, 28), 1),
                   burstiness=round(rng.uniform(0.08, 0.15), 3),
                   prompt=["lognormal", rng.randrange(600, 1000), 1.0, 6000], max_tokens=[128, 512, 1024],
                   output_fraction=[0.05, 1.0])
    elif kind == "bimodal":
        fam.update(num_requests=250, rate=round(rng.uniform(22, 28), 1),
                   prompt=["bimodal", [50, 400], [3000, 7000], round(rng.uniform(0.12, 0.2), 2)],
                   max_tokens=[128, 256, 512], output_fraction=[0.05, 1.0])
    elif kind == "kv_pressure":
        fam["engine"]["num_blocks"] = rng.randrange(2500, 3500)
        fam.update(num_requests=200, rate=round(rng.uniform(7, 10), 1), prompt=["lognormal", 500, 0.8, 3000],
                   max_tokens=[512, 1024, 2048], output_fraction=[0.3, 1.0])
    else:
        fam.update(num_requests=160, rate=round(rng.uniform(9, 12), 1), burstiness=0.5,
                   prompt=["lognormal", 300, 0.8, 2000], max_tokens=[1024, 2048, 4096],
                   output_fraction=[0.1, 1.0])
    return fam


def _scored_family(rng: random.Random, kind: str, reference: type) -> dict[str, Any]:
    from minengine.course.policy_scoring import simulate

    for attempt in range(8):
        if attempt % 3 == 0:
            fam = _family(rng, kind)
        scores = {name: simulate(p, fam)["goodput"] for name, p in
                  (("prefill_first", "prefill_first"), ("decode_first", "decode_first"),
                   ("reference", reference))}
        if (scores["decode_first"] >= 1.02 * scores["prefill_first"]
                and scores["reference"] >= SEPARATION * scores["decode_first"]):
            return {"family": fam, "goodput": scores}
        fam["rate"] = round(fam["rate"] * 1.2, 1)  # not loaded enough to tell the policies apart: push harder
    raise RuntimeError(f"lab 2: no {kind} workload separates the policies (is the reference the solution?)")


def _engine_case(rng: random.Random) -> dict[str, Any]:
    n = rng.randint(5, 7)
    return {"prompt_lens": [rng.randint(4, 40) for _ in range(n)],
            "max_tokens": [rng.randint(6, 16) for _ in range(n)], "num_blocks": rng.randint(14, 18),
            "block_size": 4, "max_num_batched_tokens": rng.choice([16, 24, 32]),
            "max_num_seqs": rng.choice([3, 4]), "seed": rng.randrange(10_000)}


def params(seed: int) -> dict[str, Any]:
    # Simulating takes seconds; a process that renders the same seed again (tests, release) reuses it.
    key = hashlib.sha256((f"{seed}/{(HERE / NOTEBOOK).read_text()}/"
                          f"{Path(__file__).read_text()}").encode()).hexdigest()
    cache = sys.modules.setdefault("_lab2_params_cache", types.ModuleType("_lab2_params_cache")).__dict__
    if key not in cache:
        cache[key] = _params(seed)
    return json.loads(json.dumps(cache[key]))


def _params(seed: int) -> dict[str, Any]:
    rng = random.Random(f"lab2_batching_scheduler/{seed}")
    reference = reference_policy()
    out: dict[str, Any] = {}
    for kind in ("bursty", "bimodal", "kv_pressure", "long_outputs"):
        out[f"hidden_{kind}"] = _scored_family(rng, kind, reference)
    out["hidden_engine"] = _engine_case(rng)
    out["hidden_property_seed"] = rng.randrange(2**31)
    return out
