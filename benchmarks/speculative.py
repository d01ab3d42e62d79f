"""Speculative decoding on this CPU: output tokens/s with and without n-gram drafts, on text that repeats
its prompt and on chat that does not, at batch 1 and up to where it stops paying.

    .venv/bin/python benchmarks/speculative.py                              # SmolLM2-135M fp32, 3 rounds
    .venv/bin/python benchmarks/speculative.py --batches 1,2,4,8,16 --rounds 3 --json out.json
    .venv/bin/python benchmarks/speculative.py --smoke                      # seconds; for the CI test

Workloads (the model's chat template, greedy):
* ``repeat``: the user gives a paragraph and asks for it back word for word. The answer quotes the
  prompt, so prompt lookup finds most of it: the case speculation is for (summaries, code edits).
* ``chat``: open questions under a shared system prompt. The answers reuse few n-grams of their prompts.

Both engines share one loaded model; the rounds interleave them, so load drift hits both. A run is a
``generate()`` of ``batch`` requests, once per group when there are more prompts than the batch (so every
batch size runs all four); its figure is output tokens / wall time (prefill included, which is
small next to 96 decode steps). Greedy tokens are checked identical with and without drafts. At batch 1 a
decode step reads all the weights for one token, so a kept draft is nearly free; as the batch grows, the
verify step's extra rows cost real compute, and the speedup falls.

The simulator's prediction: its cost model is calibrated on this machine from the plain engine's own
steps (``sim.calibrate.fit_cost_model``), then prices every step both engines recorded, a verify as a
chunk of 1 + drafts (as ``sim.executor`` does); the predicted speedup is the plain steps' priced seconds
over the speculative ones'. It predicts from the drafts that were made and kept, so it checks the
pricing of verify steps against the engine, not the acceptance.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from tqdm.auto import tqdm

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/speculative.py
    import common  # type: ignore[no-redef]

PARAGRAPHS = [
    "The library opens at nine in the morning and closes at six in the evening. Children can borrow up to "
    "five books at a time, and adults up to ten. Books are due back after three weeks.",
    "To make the bread, mix the flour with warm water and a spoon of yeast, knead it for ten minutes, and "
    "let it rise in a warm place for an hour before you bake it.",
    "The train to the coast leaves from platform four every hour. The journey takes ninety minutes, and "
    "the last train back leaves the coast at ten past eleven at night.",
    "Our team meets every Monday to plan the week. Each person says what they finished, what they will do "
    "next, and what is blocking them, and the meeting ends after fifteen minutes.",
]
QUESTIONS = [
    "Why is the sky blue?",
    "Give me three tips for learning to play the piano.",
    "How do vaccines train the immune system?",
    "Describe how a bicycle stays upright when it moves.",
]
SYSTEM = "You are a helpful assistant. Answer in plain English."


def workload_prompts(tokenizer: Any, kind: str) -> list[list[int]]:
    if kind == "repeat":
        asks = [f"Repeat this text exactly, word for word:\n\n{p}" for p in PARAGRAPHS]
    else:
        asks = QUESTIONS
    out = []
    for ask in asks:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(text)["input_ids"])
    return out


def _runner(llm: Any, name: str, groups: list[list[list[int]]], params: Any, outputs: dict[str, Any],
            kept: dict[str, int]) -> Any:
    """One timed run: a generate() of each group of prompts (each group is one batch), one after the
    other; returns output tokens per second, keeps the tokens (to compare) and adds the drafts it verified
    and kept to ``kept``."""

    def run() -> float:
        before = llm.llm_engine.spec_decode_stats
        start = time.perf_counter()
        outputs[name] = [o.outputs[0].token_ids for group in groups
                         for o in llm.generate([{"prompt_token_ids": p} for p in group], params,
                                               use_tqdm=False)]
        wall = time.perf_counter() - start
        after = llm.llm_engine.spec_decode_stats
        if after is not None and before is not None:
            kept["drafts"] += after["num_draft_tokens"] - before["num_draft_tokens"]
            kept["accepted"] += after["num_accepted_tokens"] - before["num_accepted_tokens"]
        return sum(len(t) for t in outputs[name]) / wall

    return run


def verify_cost(plain: Any, ngram: Any) -> dict[str, float]:
    """Median forward time of the speculative engine's batch-1 verify steps against the plain engine's
    batch-1 decode steps, from the steps each engine has recorded so far (what a kept draft must beat)."""
    def forward_times(llm: Any, verify: bool) -> list[float]:
        return [s.t_forward for s in llm.llm_engine.step_records
                if s.num_decode_seqs == 1 and not s.num_prefill_tokens and bool(s.num_draft_tokens) == verify]

    verify_times, decode_times = forward_times(ngram, True), forward_times(plain, False)
    if not verify_times or not decode_times:
        return dict.fromkeys(("verify_ms", "decode_ms", "ratio"), float("nan")) | {"verify_steps": 0}
    v, d = statistics.median(verify_times), statistics.median(decode_times)
    return {"verify_ms": v, "decode_ms": d, "ratio": v / d, "verify_steps": len(verify_times)}


def priced_seconds(cost_model: Any, step: Any) -> float:
    """A recorded step as the simulator prices it: its prompt chunks, and each decode as a chunk of one
    token plus its drafts after its context, sampling one LM-head row per decode token. A step records its
    drafts in total, so they are spread evenly over its decodes (exact at batch 1)."""
    lens, drafts = step.decode_context_lens, step.num_draft_tokens
    per_seq = [drafts // len(lens) + (i < drafts % len(lens)) for i in range(len(lens))]
    decodes = [(1 + d, n - 1) for n, d in zip(lens, per_seq, strict=True)]
    rows = len(step.prefill_chunks) + sum(c for c, _ in decodes)
    return cost_model.step_cost(list(step.prefill_chunks) + decodes, rows).time


def simulate(model: Any, results: list[dict[str, Any]], cell_steps: list[dict[str, list[Any]]]) -> Any:
    """The simulator's cost model calibrated on this machine (``sim.calibrate.fit_cost_model``, fitted on
    the plain engine's steps only), then every cell's recorded steps priced by it: the predicted speedup
    is the plain run's priced seconds over the speculative run's (the same tokens). Adds
    ``simulated_speedup`` to each result; returns the fit."""
    from minengine.perf.measure import measure_this_machine
    from minengine.perf.roofline import CostModel, ModelShape
    from minengine.sim.calibrate import fit_cost_model

    base = CostModel(measure_this_machine("cpu"), ModelShape.from_model(model, dtype="fp32"), overhead_s=0.0)
    fit = fit_cost_model([s for cell in cell_steps for s in cell["plain"]], base)
    for result, cell in zip(results, cell_steps, strict=True):
        priced = {name: sum(priced_seconds(fit.cost_model, s) for s in steps) for name, steps in cell.items()}
        result["simulated_speedup"] = priced["plain"] / priced["ngram"]
    return fit


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--lookup-min", type=int, default=2, help="prompt_lookup_min")
    parser.add_argument("--lookup-max", type=int, default=4, help="prompt_lookup_max")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--smoke", action="store_true", help="the tiny model, batch 1 and 2, one round")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.batches, args.rounds, args.max_tokens = "tinystories-4m", "1,2", 1, 8
    batches = [int(b) for b in args.batches.split(",")]
    common.set_threads(args.threads)

    from minengine import LLM, SamplingParams, load_model, load_tokenizer

    model, tokenizer = load_model(args.model, device="cpu", dtype="fp32"), load_tokenizer(args.model)
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": args.lookup_min,
            "prompt_lookup_max": args.lookup_max}
    engines = {"plain": LLM(model, tokenizer=tokenizer),
               "ngram": LLM(model, tokenizer=tokenizer, speculative_config=spec)}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    kinds = ["repeat"] if args.smoke else ["repeat", "chat"]
    print(common.machine_line())
    rows, results, cell_steps = [], [], []
    bar = tqdm(total=len(kinds) * len(batches) * args.rounds * len(engines), desc="speculative")
    for kind in kinds:
        prompts = workload_prompts(tokenizer, kind)
        for batch in batches:
            # Every batch size runs every prompt: below the number of prompts, in turn, `batch` at a time
            # (batch 1 once ran the first paragraph only, whose drafts were kept 39 % of the time where
            # the four together kept 65 %); above it, the prompts repeat to fill the batch.
            if batch < len(prompts):
                groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
            else:
                groups = [[prompts[i % len(prompts)] for i in range(batch)]]
            outputs: dict[str, list[list[int]]] = {}
            kept = {"drafts": 0, "accepted": 0}
            runs = {name: _runner(llm, name, groups, params, outputs, kept)
                    for name, llm in engines.items()}
            first = {name: len(llm.llm_engine.step_records) for name, llm in engines.items()}
            timed = common.interleave(runs, args.rounds, bar)
            cell_steps.append({name: list(llm.llm_engine.step_records)[first[name]:]
                               for name, llm in engines.items()})
            same = outputs["plain"] == outputs["ngram"]
            ratios = [s / p for s, p in zip(timed["ngram"].seconds, timed["plain"].seconds, strict=True)]
            rate = kept["accepted"] / kept["drafts"] if kept["drafts"] else 0.0
            result = dict(workload=kind, batch=batch, requests=sum(len(g) for g in groups),
                          plain_tok_s=timed["plain"].median,
                          ngram_tok_s=timed["ngram"].median, speedup=statistics.median(ratios),
                          speedups=ratios, acceptance=rate, identical=same,
                          loads=timed["plain"].loads + timed["ngram"].loads)
            if batch == 1 and kind == kinds[0]:  # the engines' records hold batch-1 runs only so far
                result["verify_cost"] = verify_cost(engines["plain"], engines["ngram"])
                forward = result["verify_cost"]
                print(f"{kind}, batch 1: a verify step's forward {1e3 * forward['verify_ms']:.1f} ms "
                      f"({forward['verify_steps']} steps) against a decode step's "
                      f"{1e3 * forward['decode_ms']:.1f} ms: {forward['ratio']:.2f}x (medians)")
            results.append(result)
    bar.close()
    fit = simulate(model, results, cell_steps)
    for r in results:
        rows.append((r["workload"], r["batch"], f"{r['plain_tok_s']:.1f}", f"{r['ngram_tok_s']:.1f}",
                     f"{r['speedup']:.2f}x", f"{r['simulated_speedup']:.2f}x",
                     f"{100 * (r['simulated_speedup'] / r['speedup'] - 1):+.0f} %",
                     f"{100 * r['acceptance']:.0f} %", "yes" if r["identical"] else "NO"))
    print(common.md_table(["workload", "batch", "plain tok/s", "ngram tok/s", "speedup (median of rounds)",
                           "simulated", "error", "drafts kept", "same tokens"], rows))
    print(f"simulated: the cost model calibrated on the plain engine's {len(fit.measured)} steps (median "
          f"|error| {100 * fit.mape:.1f} %, {100 * fit.holdout_mape:.1f} % held out), pricing each run's "
          "recorded steps, a verify as a chunk of 1 + drafts")
    data = {"args": vars(args), "results": results,
            "calibration": {"steps": len(fit.measured), "mape": fit.mape, "holdout_mape": fit.holdout_mape}}
    common.save_json(args.json, data)
    return data


if __name__ == "__main__":
    main()
