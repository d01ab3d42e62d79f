"""Where the mixed workload's time goes inside minengine: every Linear call, attention call and the rest.

    .venv/bin/python benchmarks/throughput_breakdown.py --shape llama-100m      # ~1 min on 2 cores
    .venv/bin/python benchmarks/throughput_breakdown.py --smoke

Why this exists: ``throughput.py`` says how far a run is from its compute floor, not why. This runs the
same workload once more through ``minengine-decode-first`` (after a warm-up run) with a clock around each
call of the parts that should dominate, and charges each call its work:

- **Linear layers** (``KernelLinear.run``: every projection, MLP and the LM head), by rows in the call,
  2 x rows x out x in FLOPs each: 1 row is a batch-1 decode, 2-64 rows batched decodes, more rows
  prompt chunks (with the step's decodes);
- **decode attention** (the C++ paged kernel: every decode, and every prompt chunk of at most
  ``SHORT_CHUNK_TOKENS``, one kernel row per token), charged the K/V bytes it must read: every context
  token's K and V row, once per row;
- **SDPA** (longer prompt chunks, and decodes where the kernel is not built), charged 4 x head_dim FLOPs per
  (query, key) pair it needs (causal: the masked-out pairs are not work);
- **the rest**: the run's wall time minus the above (element-wise ops, norms, RoPE, K/V writes, sampling,
  the scheduler and Python).

Each part's rate is set against the fp32 matmul peak and the read bandwidth measured just before the run
(``minengine.perf.measure``), which is what the floors in ``throughput.py`` use. The wrappers cost about a
microsecond a call, which lands in "the rest".
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from minengine.models import cpu_kernels, linear_kernels
from minengine.perf.measure import measure_matmul_flops, measure_read_bandwidth

try:
    from benchmarks import common, mixed_workload, throughput
except ImportError:  # run as a script: python benchmarks/throughput_breakdown.py
    import common  # type: ignore[no-redef]
    import mixed_workload  # type: ignore[no-redef]
    import throughput  # type: ignore[no-redef]

# Linear calls by rows: (most rows, label), in order
ROW_BUCKETS = ((1, "linear, 1 row"), (8, "linear, 2-8 rows"), (32, "linear, 9-32 rows"),
               (64, "linear, 33-64 rows"), (float("inf"), "linear, 65+ rows"))


class Tally:
    """Seconds and work (FLOPs or bytes) per part, filled by the wrappers of ``clocked``."""

    def __init__(self) -> None:
        self.parts: dict[str, list[float]] = {}  # name: [calls, seconds, work]

    def add(self, part: str, seconds: float, work: float) -> None:
        entry = self.parts.setdefault(part, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += seconds
        entry[2] += work


def _row_bucket(rows: int) -> str:
    return next(label for most, label in ROW_BUCKETS if rows <= most)


def _sdpa_pairs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> int:
    """(query, key) pairs an SDPA call must compute, over batch and query heads."""
    batch, heads, lq, lk = q.shape[0], q.shape[1], q.shape[-2], k.shape[-2]
    if mask is not None:
        return (int(mask.expand(batch, heads, lq, lk).sum()) if mask.dtype == torch.bool
                else batch * heads * lq * lk)
    return batch * heads * (lq * (lq + 1) // 2 if causal and lq == lk else lq * lk)


@contextmanager
def clocked(tally: Tally) -> Iterator[None]:
    """Wrap the Linear layers' ``run``, the decode-attention kernel and SDPA with clocks while inside."""
    saved_run, saved_kernel, saved_sdpa = (linear_kernels.KernelLinear.run,
                                           cpu_kernels.paged_decode_attention, F.scaled_dot_product_attention)

    def run(self: linear_kernels.KernelLinear, x: torch.Tensor, weight: torch.Tensor,
            bias: torch.Tensor | None) -> torch.Tensor:
        start = time.perf_counter()
        out = saved_run(self, x, weight, bias)
        rows = x.numel() // x.shape[-1]
        tally.add(_row_bucket(rows), time.perf_counter() - start,
                  2.0 * rows * weight.shape[0] * weight.shape[1])
        return out

    def kernel(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
               seq_lens: torch.Tensor, scale: float, sliding_window: int | None = None) -> torch.Tensor:
        start = time.perf_counter()
        out = saved_kernel(q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window)
        seconds = time.perf_counter() - start
        row_bytes = k_cache.shape[2] * k_cache.shape[3] * k_cache.element_size()
        tally.add("decode attention (C++ kernel)", seconds, 2.0 * row_bytes * float(seq_lens.sum()))
        return out

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
             dropout_p: float = 0.0, is_causal: bool = False, **kwargs: Any) -> torch.Tensor:
        start = time.perf_counter()
        out = saved_sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)
        seconds = time.perf_counter() - start
        tally.add("SDPA (prompt chunks)", seconds,
                  4.0 * q.shape[-1] * _sdpa_pairs(q, k, attn_mask, is_causal))
        return out

    linear_kernels.KernelLinear.run = run  # type: ignore[method-assign]
    cpu_kernels.paged_decode_attention = kernel  # type: ignore[assignment]
    F.scaled_dot_product_attention = sdpa  # type: ignore[assignment]
    try:
        yield
    finally:
        linear_kernels.KernelLinear.run = saved_run  # type: ignore[method-assign]
        cpu_kernels.paged_decode_attention = saved_kernel  # type: ignore[assignment]
        F.scaled_dot_product_attention = saved_sdpa  # type: ignore[assignment]


def measure(run: Callable[[mixed_workload.Workload], Any], work: mixed_workload.Workload) -> dict[str, Any]:
    """One clocked run of ``work``: its wall time, the machine's peak and bandwidth just before, the parts."""
    peak, bandwidth = measure_matmul_flops("cpu"), measure_read_bandwidth("cpu")
    tally = Tally()
    with torch.inference_mode(), clocked(tally):
        start = time.perf_counter()
        run(work)
        wall = time.perf_counter() - start
    return {"wall_s": wall, "peak_flops": peak, "read_bytes_per_s": bandwidth,
            "parts": {k: {"calls": int(v[0]), "seconds": v[1], "work": v[2]} for k, v in tally.parts.items()},
            "prefill_chunks": list(getattr(run, "prefill_chunks", []))}  # (tokens, context before) each


def table(result: dict[str, Any]) -> str:
    peak, bandwidth, wall = result["peak_flops"], result["read_bytes_per_s"], result["wall_s"]
    order = [label for _, label in ROW_BUCKETS] + ["decode attention (C++ kernel)", "SDPA (prompt chunks)"]
    rows, counted = [], 0.0
    for name in order:
        part = result["parts"].get(name)
        if part is None:
            continue
        seconds, work = part["seconds"], part["work"]
        counted += seconds
        if name.startswith("decode attention"):
            rate = f"{work / seconds / 1e9:.1f} GB/s ({100 * work / seconds / bandwidth:.0f} % of the read)"
            amount = f"{work / 1e9:,.1f} GB"
        else:
            rate = f"{work / seconds / 1e9:.0f} GFLOP/s ({100 * work / seconds / peak:.0f} % of the peak)"
            amount = f"{work / 1e9:,.1f} GFLOP"
        rows.append([name, f"{part['calls']:,}", f"{seconds:.2f}", f"{100 * seconds / wall:.0f} %", amount,
                     rate])
    rows.append(["the rest (element-wise, norms, K/V writes, sampling, scheduler, Python)", "-",
                 f"{wall - counted:.2f}", f"{100 * (wall - counted) / wall:.0f} %", "-", "-"])
    return common.md_table(["part", "calls", "seconds", "of the run", "work", "rate"], rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-100m", choices=sorted(common.SHAPES))
    mixed_workload.add_args(ap)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (0 = torch's default)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        mixed_workload.apply_smoke(args)
    common.set_threads(args.threads)
    shape = common.SHAPES[args.shape]
    print(common.machine_line((shape["vocab_size"], shape["hidden_size"])))
    path = common.model_dir(args.shape)
    work = mixed_workload.from_args(args, shape["vocab_size"])
    run = throughput.run_minengine(str(path), *throughput.MINENGINE["minengine-decode-first"], args)
    with torch.inference_mode():
        run(mixed_workload.make_workload(2, (8, 32), (4, 8), shape["vocab_size"], args.seed + 1))  # warm-up
    result = measure(run, work)
    print(f"\n{args.shape}, minengine-decode-first, {args.num_requests} requests: wall "
          f"{result['wall_s']:.1f} s; matmul peak {result['peak_flops'] / 1e9:.0f} GFLOP/s, read "
          f"{result['read_bytes_per_s'] / 1e9:.1f} GB/s (measured just before)\n")
    print(table(result))
    common.save_json(args.json, {"result": result, "args": vars(args)})
    return {**result, "work": work}


if __name__ == "__main__":
    main()
