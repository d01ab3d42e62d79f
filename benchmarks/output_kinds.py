"""Per-step host cost against output length, for each ``RequestOutputKind``.

    .venv/bin/python benchmarks/output_kinds.py                  # 16 requests x 4,096 output tokens
    .venv/bin/python benchmarks/output_kinds.py --smoke

Why: an engine that hands back every request's whole output every step copies O(L) per request per
step, O(L^2) over a request's life; at 4K-token outputs that copying outgrows the rest of the host work.
``LLM.generate`` asks for FINAL_ONLY and streams for DELTA, so neither should copy. The model is a tiny
random one (8K positions) with the shipped tokenizer and a stop string, so detokenization and the
stop-string search run as in a real stream. The figure is the step's wall time minus its forward
pass and its input preparation (shown apart), early in the outputs and late (medians).

Two forwards, because the real one hides the answer: its K/V gather reads the whole context every step
(O(L) by nature: that is decode attention), and at 4K tokens x 16 requests that is ~32 MB per step,
which evicts the host code's data from the CPU caches, so the host work after it runs slower late in
the outputs even when it does the same work. ``stand-in`` replaces the forward by one that returns
logits without touching the KV cache: what is left is the host work alone, and it is what must be flat.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from minengine.core.sampling_params import RequestOutputKind, SamplingParams
from minengine.engine.llm_engine import LLMEngine
from minengine.models.loader import build_random_model, load_tokenizer
from minengine.utils import cdiv

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/output_kinds.py
    import common  # type: ignore[no-redef]

TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=1753, max_position_embeddings=8192,
            tie_word_embeddings=True)  # the shipped tokenizer's vocabulary
STOP = ["<never in the output>"]  # searched for after every token, never found
FORWARDS = ("model", "stand-in")


def _stand_in_forward(vocab: int) -> Any:
    """A ModelRunner.forward that returns logits naming varied tokens, without the model or the KV cache."""
    step = [0]

    def forward(inputs: Any) -> torch.Tensor:
        m = len(inputs.sampled)
        step[0] += 1
        logits = torch.zeros(m, vocab)
        logits[torch.arange(m), (torch.arange(m) * 31 + step[0] * 7) % (vocab - 3) + 3] = 1.0
        return logits

    return forward


def run(kind: RequestOutputKind, batch: int, output_len: int, model: Any, tokenizer: Any, forward: str,
        bar: Any) -> dict[str, float]:
    engine = LLMEngine(model=model, tokenizer=tokenizer, max_num_seqs=batch, block_size=16,
                       enable_prefix_caching=False, num_blocks=batch * cdiv(output_len + 16, 16))
    if forward == "stand-in":
        engine.model_runner.forward = _stand_in_forward(model.config.vocab_size)  # type: ignore[method-assign]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True, output_kind=kind,
                            stop=STOP)
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

    return {"early_ms": ms(host[w : 2 * w]), "late_ms": ms(host[-w:]),
            "prepare_early_ms": ms(prepare[w : 2 * w]), "prepare_late_ms": ms(prepare[-w:]),
            "steps": len(host)}


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--forwards", default=",".join(FORWARDS),
                    help="which forwards to run: model (the tiny model's), stand-in (no model, no KV cache)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="2 requests x 64 tokens")
    args = ap.parse_args(argv)
    if args.smoke:
        args.batch, args.output_len = 2, 64
    common.set_threads(args.threads)
    print(common.machine_line())
    model = build_random_model(TINY)
    tokenizer = load_tokenizer("tinystories-4m")
    results: dict[str, dict[str, Any]] = {}
    forwards = [f for f in FORWARDS if f in args.forwards.split(",")]
    if not forwards:
        ap.error(f"--forwards: pick from {', '.join(FORWARDS)}")
    total = len(forwards) * len(RequestOutputKind) * (args.output_len + 1)
    with tqdm(total=total, desc="steps", dynamic_ncols=True) as bar:
        for forward in forwards:  # results[kind] = the model's rows, results[kind]["stand-in"] the other's
            for kind in RequestOutputKind:
                row = run(kind, args.batch, args.output_len, model, tokenizer, forward, bar)
                if forward == "model":
                    results.setdefault(kind.name, {}).update(row)
                else:
                    results.setdefault(kind.name, {})[forward] = row
    print(f"\ncommand: {common.command_line()}")
    print(common.machine_line())
    print(f"{args.batch} requests x {args.output_len} output tokens, detokenized, one stop string; host ms "
          "per step = wall - forward - input preparation; medians over the first and last eighth of the "
          "steps\n")
    rows = []
    for forward in forwards:
        for k, res in results.items():
            r = res if forward == "model" else res[forward]
            rows.append([forward, k, f"{r['early_ms']:.3f}", f"{r['late_ms']:.3f}",
                         f"**{r['late_ms'] / r['early_ms']:.2f}x**",
                         f"{r['prepare_early_ms']:.3f} -> {r['prepare_late_ms']:.3f}"])
    print(common.md_table(["forward", "output kind", "host ms/step, early", "host ms/step, late",
                           "late / early", "input preparation ms, early -> late"], rows))
    common.save_json(args.json, {"results": results})
    return results


if __name__ == "__main__":
    main()
