"""The CPU's small-op kernels against the PyTorch ops they replace, one call each, at a step's row counts.

    .venv/bin/python benchmarks/small_ops.py                 # llama-100m's widths, 1 / 64 / 512 rows, ~20 s
    .venv/bin/python benchmarks/small_ops.py --shape llama-12m --rows 1,8
    .venv/bin/python benchmarks/small_ops.py --smoke         # seconds (CI)

Why: each of these kernels saves a few microseconds of dispatch and a pass or two over memory per call,
well under a percent of a whole step, which the shared machine's noise buries in whole-step timings
(``decode_floor.py --breakdown`` puts each one back in turn; its differences are mostly that noise). Timed
alone, one call at a time, the saving is plain. Compared, in fp32 (what the engine runs them for):

- RMSNorm: ``csrc/rms_norm.cpp`` vs ``F.rms_norm`` (about seven ATen ops on a CPU);
- SwiGLU's activation: ``csrc/activation.cpp`` (``silu_and_mul``) vs ``F.silu(gate) * up``;
- RoPE: ``csrc/rotary.cpp`` (``rotary_embedding_``, in place) vs the four ops of ``RotaryEmbedding``.

Each pair runs in interleaved rounds (a loop of calls per round); a variant's time is its fastest round,
since load from elsewhere only ever adds time. Same inputs for both sides of a pair.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/small_ops.py
    import common  # type: ignore[no-redef]


def fastest(calls: dict[str, Callable[[], Any]], rounds: int, loops: int) -> dict[str, float]:
    """Seconds per call of each: its fastest round of ``loops`` calls, rounds interleaved (``common``)."""
    def per_call(fn: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            for _ in range(loops):
                fn()
            return (time.perf_counter() - start) / loops
        return run

    for fn in calls.values():  # warm-up
        fn()
    timed = common.interleave({name: per_call(fn) for name, fn in calls.items()}, rounds)
    return {name: min(t.seconds) for name, t in timed.items()}


def pairs(shape: dict[str, int], rows: int) -> dict[str, dict[str, Callable[[], Any]]]:
    """{op: {"PyTorch ops": call, "C++ kernel": call}} on inputs of ``rows`` tokens of this model shape."""
    from minengine.models.config import ModelConfig
    from minengine.models.llama import RotaryEmbedding

    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = hidden // heads
    ops = torch.ops.minengine
    x, weight = torch.randn(rows, hidden), torch.randn(hidden)
    gate_up = torch.randn(rows, 2 * inter)
    config = ModelConfig(architecture="LlamaForCausalLM", hidden_size=hidden, intermediate_size=inter,
                         num_hidden_layers=1, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         vocab_size=8, head_dim=head_dim,
                         max_position_embeddings=shape["max_position_embeddings"])
    rope = RotaryEmbedding(config)
    tables = rope.tables(torch.arange(rows) % config.max_position_embeddings, torch.float32)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim)  # the fused projection's output
    qk = qkv[:, :(heads + kv_heads) * head_dim].view(rows, heads + kv_heads, head_dim)

    def rope_ops() -> Any:  # what RotaryEmbedding.forward runs without the kernel
        cos, sin = tables
        x1, x2 = qk.chunk(2, -1)
        return (qk * cos + torch.cat((x2, x1), -1) * sin).split((heads, kv_heads), 1)

    return {
        "RMSNorm": {"PyTorch ops": lambda: F.rms_norm(x, (hidden,), weight, 1e-6),
                    "C++ kernel": lambda: ops.rms_norm(x, weight, 1e-6)},
        "SwiGLU activation": {"PyTorch ops": lambda: F.silu(gate_up[:, :inter]) * gate_up[:, inter:],
                              "C++ kernel": lambda: ops.silu_and_mul(gate_up)},
        "RoPE (q and k)": {"PyTorch ops": rope_ops,  # the kernel rotates qk over and over: timing only
                           "C++ kernel": lambda: (ops.rotary_embedding_(qk, *tables),
                                                  qk.split((heads, kv_heads), 1))},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-100m", choices=sorted(common.SHAPES))
    ap.add_argument("--rows", default="1,64,512",
                    help="tokens per call: batch-1 decode, batched decode, a chunk")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (0 = torch's default)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny shape, 2 row counts, 3 rounds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.shape, args.rows, args.rounds = "llama-tiny", "1,8", 3
    from minengine.models import cpu_kernels

    if not cpu_kernels.load():
        raise SystemExit(f"the C++ kernels are not built here: {cpu_kernels.build_error()}")
    common.set_threads(args.threads)
    print(f"command: {common.command_line()}")
    print(common.machine_line())
    results: dict[str, dict[str, dict[str, float]]] = {}
    table = []
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            for op, calls in pairs(common.SHAPES[args.shape], rows).items():
                t = fastest(calls, args.rounds, loops=200 if rows <= 64 else 20)
                results.setdefault(op, {})[str(rows)] = t
                ops, kernel = t["PyTorch ops"], t["C++ kernel"]
                table.append([op, rows, f"{ops * 1e6:.1f}", f"{kernel * 1e6:.1f}", f"**{ops / kernel:.1f}x**",
                              f"{(ops - kernel) * 1e6:.1f}"])
    print(f"\n{args.shape} widths, fp32, {args.threads} threads; fastest of {args.rounds} interleaved "
          "rounds\n")
    print(common.md_table(["op", "rows", "PyTorch ops us", "C++ kernel us", "kernel faster",
                           "saved us per call"], table))
    common.save_json(args.json, {"results": results, "args": vars(args)})
    return results


if __name__ == "__main__":
    main()
