"""Per-step host cost against output length, for each ``RequestOutputKind``.

    .venv/bin/python benchmarks/output_kinds.py                  # 16 requests x 4,096 output tokens
    .venv/bin/python benchmarks/output_kinds.py --smoke

Why: an engine that hands back every request's whole output every step copies O(L) per request per
step, O(L^2) over a request's life; at 4K-token outputs that copying outgrows the rest of the host work.
``LLM.generate`` asks for FINAL_ONLY and streams for DELTA, so neither copies. The model here is a tiny
random one (8K positions) so that the forward pass stays small and the host work shows; the figure
is the step's wall time minus its forward pass and its input preparation (shown apart: block tables
and slot indices also grow with the context), early in the outputs and late (medians).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from tqdm.auto import tqdm

from minengine.core.sampling_params import RequestOutputKind, SamplingParams
from minengine.engine.llm_engine import LLMEngine
from minengine.models.loader import build_random_model

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/output_kinds.py
    import common  # type: ignore[no-redef]

TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=8192,
            tie_word_embeddings=True)


def run(kind: RequestOutputKind, batch: int, output_len: int, model: Any, bar: Any) -> dict[str, float]:
    engine = LLMEngine(model=model, max_num_seqs=batch, block_size=16, enable_prefix_caching=False,
                       num_blocks=batch * (-(-(output_len + 16) // 16)))
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True, output_kind=kind)
    for i in range(batch):
        engine.add_request(str(i), [10 + i] * 8, params)
    host: list[float] = []
    prepare: list[float] = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - t0
        record = engine.last_step_record
        assert record is not None
        host.append(wall - record.t_forward - record.t_prepare)
        prepare.append(record.t_prepare)
        bar.update(1)
    w = max(1, len(host) // 8)

    def ms(xs: list[float]) -> float:
        return 1e3 * statistics.median(xs)

    return {"early_ms": ms(host[w : 2 * w]), "late_ms": ms(host[-w:]), "prepare_early_ms": ms(prepare[w : 2 * w]),
            "prepare_late_ms": ms(prepare[-w:]), "steps": len(host)}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="2 requests x 64 tokens")
    args = ap.parse_args(argv)
    if args.smoke:
        args.batch, args.output_len = 2, 64
    common.set_threads(args.threads)
    print(common.machine_line())
    model = build_random_model(TINY)
    results = {}
    with tqdm(total=len(RequestOutputKind) * (args.output_len + 1), desc="steps", dynamic_ncols=True) as bar:
        for kind in RequestOutputKind:
            results[kind.name] = run(kind, args.batch, args.output_len, model, bar)
    print(f"\ncommand: {common.command_line()}")
    print(f"{args.batch} requests x {args.output_len} output tokens; host ms per step = wall - forward - input "
          f"preparation; medians over the first and last eighth of the steps\n")
    rows = [[k, f"{r['early_ms']:.3f}", f"{r['late_ms']:.3f}", f"**{r['late_ms'] / r['early_ms']:.2f}x**",
             f"{r['prepare_early_ms']:.3f} -> {r['prepare_late_ms']:.3f}"] for k, r in results.items()]
    print(common.md_table(["output kind", "host ms/step, early", "host ms/step, late", "late / early",
                           "input preparation ms, early -> late"], rows))
    common.save_json(args.json, {"results": results})
    return results


if __name__ == "__main__":
    main()
