"""What reading a speculative verify's chunk in place saves: paired runs with and without it, one process.

    .venv/bin/python benchmarks/verify_step.py --rounds 8      # SmolLM2-135M fp32, batch 1, ~2 min
    .venv/bin/python benchmarks/verify_step.py --smoke         # seconds; for the CI test

A verify step computes 1 + k tokens of one sequence after its cached context. On a CPU the ``cpp``
attention backend attends chunks of at most ``SHORT_CHUNK_TOKENS`` tokens with the C++ decode kernel, one
row per token (``minengine/models/attention/backends.py``); with the constant at 1 only decodes go there
and a verify chunk takes the reference path (its context gathered, then a masked SDPA), as before the
change. The same engine runs the repeat-a-paragraph prompts of ``speculative.py`` (all four, batch 1, one
after the other) with the constant at 8 and at 1, in alternating order round by round, and reports the
median forward time of verify steps and of plain decode steps (from the engine's step records) and each
round's wall time. Greedy tokens must be the same either way.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

try:
    from benchmarks import common
    from benchmarks.speculative import workload_prompts
except ImportError:  # run as a script: python benchmarks/verify_step.py
    import common  # type: ignore[no-redef]
    from speculative import workload_prompts  # type: ignore[no-redef]

VARIANTS = {"in place": 8, "gathered": 1}  # SHORT_CHUNK_TOKENS for each


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--smoke", action="store_true", help="one round, one prompt, 24 tokens")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.max_tokens = 1, 24
    common.set_threads(args.threads)

    from minengine import LLM, SamplingParams, load_model, load_tokenizer
    from minengine.models.attention import backends

    model, tokenizer = load_model("smollm2-135m", device="cpu", dtype="fp32"), load_tokenizer("smollm2-135m")
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    llm = LLM(model, tokenizer=tokenizer, speculative_config=spec)
    backend = llm.llm_engine.model_runner.attention_backend
    if backend != "cpp":
        raise SystemExit(f"this benchmark compares two paths of the cpp attention backend; the engine runs "
                         f"{backend!r} here (are the C++ kernels built?)")
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    prompts = workload_prompts(tokenizer, "repeat")[: 1 if args.smoke else None]
    print(common.machine_line())
    verify: dict[str, list[float]] = {name: [] for name in VARIANTS}
    decode: dict[str, list[float]] = {name: [] for name in VARIANTS}
    walls: dict[str, list[float]] = {name: [] for name in VARIANTS}
    tokens: dict[str, list[list[int]]] = {}
    before = backends.SHORT_CHUNK_TOKENS
    try:
        for r in range(args.rounds):
            for name in list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]:
                backends.SHORT_CHUNK_TOKENS = VARIANTS[name]
                first = len(llm.llm_engine.step_records)
                start = time.perf_counter()
                outs = [llm.generate([{"prompt_token_ids": p}], params, use_tqdm=False)[0] for p in prompts]
                walls[name].append(time.perf_counter() - start)
                tokens[name] = [o.outputs[0].token_ids for o in outs]
                for s in list(llm.llm_engine.step_records)[first:]:
                    if not s.num_prefill_tokens:
                        (verify if s.num_draft_tokens else decode)[name].append(s.t_forward)
    finally:
        backends.SHORT_CHUNK_TOKENS = before
    summary = {name: {"verify_ms": 1e3 * statistics.median(verify[name]) if verify[name] else float("nan"),
                      "decode_ms": 1e3 * statistics.median(decode[name]) if decode[name] else float("nan"),
                      "verify_steps": len(verify[name]), "wall_s": statistics.median(walls[name])}
               for name in VARIANTS}
    paired = [a / b for a, b in zip(walls["in place"], walls["gathered"], strict=True)]
    rows = [(name, f"{s['verify_ms']:.2f}", s["verify_steps"], f"{s['decode_ms']:.2f}",
             f"{s['verify_ms'] / s['decode_ms']:.2f}x", f"{s['wall_s']:.2f}") for name, s in summary.items()]
    print(common.md_table(["verify chunk", "verify forward ms", "verify steps", "decode forward ms",
                           "verify / decode", "round wall s"], rows))
    same = tokens["in place"] == tokens["gathered"]
    print(f"round wall, in place / gathered (paired): median {statistics.median(paired):.3f} "
          f"({', '.join(f'{x:.3f}' for x in paired)}); same tokens: {same}")
    data = {"args": vars(args), "summary": summary, "paired_wall_ratios": paired, "identical": same}
    common.save_json(args.json, data)
    return data


if __name__ == "__main__":
    main()
