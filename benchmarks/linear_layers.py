"""A step's Linear layers on a CPU in fp32: F.linear, oneDNN on the ordinary weight, oneDNN prepacked.

    .venv/bin/python benchmarks/linear_layers.py                       # llama-100m, 1 to 512 rows
    .venv/bin/python benchmarks/linear_layers.py --rows 8,64 --rounds 5
    .venv/bin/python benchmarks/linear_layers.py --smoke

Why this exists: the mixed-workload benchmark (``throughput.py``) spends most of its time in Linear layers
at 8-64 rows (batched decode steps) and ~512 (prompt chunks). Given an ordinary [out, in] weight, oneDNN
first copies it into its blocked layout on every call; at a few dozen rows that copy costs about as much
as the multiply. ``linear_kernels.pack_weight`` keeps that layout once (``EngineConfig.prepack_weights``).

One "step" here is every matrix a token meets in ``--shape`` (per layer: q/k/v fused, o, gate/up fused,
down; then the LM head), each its own fresh tensor, so together they are far larger than the CPU's caches
and stream from memory as in the engine. Variants, interleaved round by round:

- ``F.linear``: torch's default (MKL on x86);
- ``oneDNN``: ``torch.ops.mkldnn._linear_pointwise`` on the ordinary weight (the engine before packing);
- ``oneDNN packed``: the same op on weights packed once for ``PACK_ROWS`` rows (what the engine runs);
- ``packed for n``: packed for exactly this row count (does one packing serve every batch?);
- ``GEMV`` (1 row only): ``csrc/gemv.cpp``, which the engine runs for batch-1 decode steps.

Printed per row count: milliseconds per step (median), GFLOP/s, and each variant's speed-up over oneDNN
on the ordinary weight; with the fp32 matmul peak and the read bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from minengine.models import cpu_kernels, linear_kernels
from minengine.perf.measure import measure_matmul_flops, measure_read_bandwidth

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/linear_layers.py
    import common  # type: ignore[no-redef]


def step_shapes(shape: dict[str, Any]) -> list[tuple[int, int]]:
    """[out, in] of every matrix one token goes through, in order (Llama; q/k/v and gate/up fused)."""
    h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    head_dim = h // shape["num_attention_heads"]
    qkv = (shape["num_attention_heads"] + 2 * shape["num_key_value_heads"]) * head_dim
    per_layer = [(qkv, h), (h, shape["num_attention_heads"] * head_dim), (2 * inter, h), (h, inter)]
    return per_layer * layers + [(shape["vocab_size"], h)]


def _step(kernel: Callable[[torch.Tensor, torch.Tensor], Any], weights: list[torch.Tensor],
          inputs: list[torch.Tensor]) -> Callable[[], None]:
    """One step: ``kernel(x, w)`` for every matrix, each with an input of its width."""

    def run() -> None:
        for x, w in zip(inputs, weights, strict=True):
            kernel(x, w)

    return run


def _timed(fn: Callable[[], None]) -> Callable[[], float]:
    """``fn`` as a run for ``common.interleave``: returns its seconds."""

    def run() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-100m", choices=sorted(common.SHAPES))
    ap.add_argument("--rows", default="1,8,16,32,64,128,512",
                    help="comma-separated row counts (batch tokens)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (0 = torch's default)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny shape, 2 row counts, 2 rounds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.shape, args.rows, args.rounds = "llama-tiny", "1,8", 2
    if not linear_kernels.onednn_available():
        raise SystemExit("this torch has no oneDNN: nothing to compare")
    common.set_threads(args.threads)
    shape = common.SHAPES[args.shape]
    print(common.machine_line((shape["vocab_size"], shape["hidden_size"])))
    rows_list = [int(r) for r in args.rows.split(",")]
    shapes = step_shapes(shape)
    flops_per_row = sum(2 * n * k for n, k in shapes)
    weights = [torch.randn(s) for s in shapes]
    packed = [linear_kernels.pack_weight(w) for w in weights]
    onednn = lambda x, w: linear_kernels.onednn_linear(x, w, None)  # noqa: E731
    have_gemv = cpu_kernels.load()
    results: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        peak = measure_matmul_flops("cpu")
        bandwidth = measure_read_bandwidth("cpu")
        bar = tqdm(total=len(rows_list) * args.rounds, desc="row counts x rounds", leave=False)
        for rows in rows_list:
            by_width = {k: torch.randn(rows, k) for k in {k for _, k in shapes}}
            inputs = [by_width[k] for _, k in shapes]
            runs = {"F.linear": _step(F.linear, weights, inputs), "oneDNN": _step(onednn, weights, inputs),
                    "oneDNN packed": _step(onednn, packed, inputs)}
            if rows != linear_kernels.PACK_ROWS:
                exact = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in weights]
                runs[f"packed for {rows}"] = _step(onednn, exact, inputs)
            if rows == 1 and have_gemv:
                runs["GEMV"] = _step(lambda x, w: torch.ops.minengine.gemv(x, w, None), weights, inputs)
            for fn in runs.values():
                fn()  # warm: first calls allocate
            timed = common.interleave({k: _timed(v) for k, v in runs.items()}, args.rounds, bar)
            results[str(rows)] = {k: t.median for k, t in timed.items()}
        bar.close()
    weight_mb = sum(n * k for n, k in shapes) * 4 / 1e6
    print(f"\n{args.shape}: {len(shapes)} matrices, {weight_mb:.0f} MB of fp32 weights, "
          f"{flops_per_row / 1e9:.2f} GFLOP per row; matmul peak {peak / 1e9:.0f} GFLOP/s, read "
          f"{bandwidth / 1e9:.1f} GB/s (reading the weights once: {weight_mb / (bandwidth / 1e9):.1f} ms); "
          f"median of {args.rounds} rounds\n")
    rows_out = []
    for rows, times in results.items():
        base = times["oneDNN"]
        for name, t in times.items():
            gflops = flops_per_row * int(rows) / t / 1e9
            rows_out.append([rows, name, f"{t * 1e3:.1f}", f"{gflops:.0f}",
                             f"{100 * gflops * 1e9 / peak:.0f} %", f"{base / t:.2f}x"])
    print(common.md_table(["rows", "kernel", "ms per step", "GFLOP/s", "of peak", "vs oneDNN"], rows_out))
    out = {"results": results, "peak_flops": peak, "read_bytes_per_s": bandwidth, "args": vars(args),
           "weight_bytes": weight_mb * 1e6}
    common.save_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
