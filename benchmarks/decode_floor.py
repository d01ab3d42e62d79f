"""Batch-1 decode step time against the memory-bandwidth floor, minengine and HF ``generate()`` side by side.

    .venv/bin/python benchmarks/decode_floor.py                       # llama-100m, fp32 and bf16
    .venv/bin/python benchmarks/decode_floor.py --dtypes float32 --rounds 3
    .venv/bin/python benchmarks/decode_floor.py --dtypes float32 --breakdown   # + where the time goes
    .venv/bin/python benchmarks/decode_floor.py --smoke               # seconds; for the CI test

Why a floor: at batch 1 every decode step must read every weight once (and the KV cache), and a CPU can
read memory only so fast. ``floor = bytes read per step / read bandwidth``, with the bandwidth measured in
the same run, just before each round, on a buffer as large as the weights (a ``sum``, like
``minengine.perf.measure``). No engine can beat it; the ratio step / floor says how much time goes to
everything else (Python, small ops, attention, sampling).

Step time: the gap between consecutive output tokens of one request (its ITL), for minengine from the
engine's own token stamps and for HF from a ``StoppingCriteria`` that HF calls once per generated token.
The prefill (first token) is left out. Engines run interleaved, round by round, so load drift hits both.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from tqdm.auto import tqdm

import minengine
from minengine import kvcalc
from minengine.perf.measure import measure_read_bandwidth

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/decode_floor.py
    import common  # type: ignore[no-redef]


class _TokenClock:
    """A StoppingCriteria that never stops, only stamps the time HF finishes each token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def run_dtype(shape: str, dtype: str, args: argparse.Namespace, bar: Any) -> dict[str, Any]:
    from transformers import StoppingCriteriaList

    path = common.model_dir(shape, dtype)
    llm = minengine.LLM(str(path), dtype=dtype, enable_prefix_caching=False, max_num_seqs=4,
                        num_blocks=(args.prompt_len + args.new_tokens) // 16 + 8)
    hf = common.load_hf(path, dtype)
    weights = common.weight_bytes(llm.llm_engine.model)
    kv_tok = kvcalc.kv_bytes_per_token(hf.config, kv_cache_dtype=dtype)  # GQA aware (REFERENCE.md)
    mean_ctx = args.prompt_len + args.new_tokens / 2
    bytes_per_step = weights + kv_tok * (mean_ctx + 1)  # weights + read the context + write one token
    bw_bytes = max(2**28, weights)
    prompt = [(37 * j) % 1000 + 3 for j in range(args.prompt_len)]
    params = minengine.SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    ids = torch.tensor([prompt])

    def mine() -> list[float]:
        llm.generate([prompt], params, use_tqdm=False)
        return _gaps(llm.request_records[0].token_times)

    linears = [m for m in llm.llm_engine.model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {n: torch.randn(1, n, dtype=getattr(torch, dtype)) for n in {m.in_features for m in linears}}

    def matmuls_only() -> float:
        """The step's weight matmuls back to back, nothing else: what the kernels alone reach."""
        times = []
        with torch.inference_mode():
            for _ in range(3):
                start = time.perf_counter()
                for m in linears:
                    m(inputs[m.in_features])
                times.append(time.perf_counter() - start)
        return common.median(times)

    def theirs() -> list[float]:
        clock = _TokenClock()
        with torch.inference_mode():
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                        min_new_tokens=args.new_tokens, do_sample=False,
                        stopping_criteria=StoppingCriteriaList([clock]), pad_token_id=0)
        return _gaps(clock.times)

    mine(), theirs()  # warm-up: first calls allocate and pick kernels
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        bw = measure_read_bandwidth("cpu", num_bytes=bw_bytes, repeats=5)
        floor = bytes_per_step / bw
        row: dict[str, Any] = {"bandwidth": bw, "floor": floor, "load": common.loadavg()[0],
                               "matmuls": matmuls_only()}
        pair = [("minengine", mine), ("hf", theirs)]
        for name, fn in pair if r % 2 == 0 else pair[::-1]:
            gaps = fn()
            row[name] = common.median(gaps)
            row[name + "_gaps"] = gaps
            bar.update(1)
        rounds.append(row)

    def med(key: str) -> float:
        return common.median([r[key] for r in rounds])

    parts = breakdown(mine, args.rounds) if args.breakdown else None
    return {
        "breakdown": parts,
        "shape": shape, "dtype": dtype, "params": common.num_params(hf), "weight_bytes": weights,
        "bytes_per_step": bytes_per_step, "bandwidth": med("bandwidth"), "floor": med("floor"),
        "matmuls": med("matmuls"),
        "minengine": med("minengine"), "hf": med("hf"),
        "minengine_ratio": common.median([r["minengine"] / r["floor"] for r in rounds]),
        "hf_ratio": common.median([r["hf"] / r["floor"] for r in rounds]),
        "loads": [r["load"] for r in rounds],
        "rounds": [{k: v for k, v in r.items() if not k.endswith("_gaps")} for r in rounds],
    }


def breakdown(mine: Any, rounds: int) -> dict[str, float]:
    """Median ITL with one part of every layer removed (or fused): where the time beyond the matmuls goes.

    Patches ``minengine.models.llama`` for the duration (restored after). The "skipped" variants compute
    wrong tokens; their saving is an upper bound on what a faster version of that part could save.
    """
    from minengine.models import llama

    shipped = (llama.paged_attention, llama.RMSNorm.forward, llama.RotaryEmbedding.forward)

    def fused_rms(self: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.variance_epsilon)

    variants = {
        "as shipped": shipped,
        "attention skipped": (lambda q, *a, **k: q, shipped[1], shipped[2]),
        "RoPE skipped": (shipped[0], shipped[1], lambda self, positions, q, k: (q, k)),
        "RMSNorm as one F.rms_norm": (shipped[0], fused_rms, shipped[2]),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for _ in range(rounds):
            for name, (attn, rms, rope) in variants.items():
                llama.paged_attention, llama.RMSNorm.forward, llama.RotaryEmbedding.forward = attn, rms, rope
                times[name].append(common.median(mine()))
    finally:
        llama.paged_attention, llama.RMSNorm.forward, llama.RotaryEmbedding.forward = shipped
    return {name: common.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-100m", choices=sorted(common.SHAPES))
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64, help="generated tokens per request")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per dtype")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time minengine with attention / RoPE removed and RMSNorm fused")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--smoke", action="store_true", help="tiny model, 1 round (for the CI test)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.shape, args.dtypes, args.new_tokens, args.rounds = "llama-tiny", "float32", 8, 1
    common.set_threads(args.threads)
    dtypes = args.dtypes.split(",")
    print(common.machine_line())
    results = []
    with tqdm(total=2 * args.rounds * len(dtypes), desc="decode rounds", dynamic_ncols=True) as bar:
        for dtype in dtypes:
            results.append(run_dtype(args.shape, dtype, args, bar))
    print(f"\ncommand: {common.command_line()}")
    print(common.machine_line())
    print(f"batch 1, prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, {args.rounds} rounds; "
          "times are medians of per-round medians\n")
    rows = []
    for r in results:
        rows.append([
            f"{r['shape']} {r['dtype']}", f"{r['params'] / 1e6:.1f}M", f"{r['bytes_per_step'] / 1e6:.0f} MB",
            f"{r['bandwidth'] / 1e9:.1f} GB/s", f"{1e3 * r['floor']:.2f}", f"{1e3 * r['matmuls']:.2f}",
            f"{1e3 * r['minengine']:.2f}", f"**{r['minengine_ratio']:.2f}x**",
            f"{1e3 * r['hf']:.2f}", f"{r['hf_ratio']:.2f}x", f"{r['hf'] / r['minengine']:.2f}x",
            " ".join(f"{x:.2f}" for x in r["loads"]),
        ])
    print(common.md_table(
        ["model", "params", "bytes/step", "read BW", "floor ms", "matmuls alone ms", "minengine ms",
         "minengine / floor", "HF generate ms", "HF / floor", "HF / minengine", "load avg per round"], rows))
    for r in results:
        if r["breakdown"]:
            base = r["breakdown"]["as shipped"]
            print(f"\nWhere minengine's {r['dtype']} step goes beyond the matmuls ({1e3 * r['matmuls']:.2f} "
                  "ms alone); skipped parts compute wrong tokens, so their saving is an upper bound:\n")
            print(common.md_table(["variant", "minengine ms", "saved ms"], [
                [name, f"{1e3 * t:.2f}", f"{1e3 * (base - t):.2f}"] for name, t in r["breakdown"].items()]))
    common.save_json(args.json, {"results": results})
    return results


if __name__ == "__main__":
    main()
