"""Paired A/B of the C++ decode-attention kernel: ``paged_attention.cpp`` at another git revision against
the build in use, on the calls the engine made during the mixed workload of ``throughput.py``.

    .venv/bin/python benchmarks/attention_ab.py --rev HEAD~1 --rounds 9
    .venv/bin/python benchmarks/attention_ab.py --source /tmp/my_attention.cpp

Why replay rather than time two engines: a change of a few percent in one kernel that takes ~15 % of the
run is far below this VM's run-to-run swing. The workload runs once through ``minengine-decode-first``,
every ``--every``-th kernel call is kept (its query, block table and lengths, on the engine's own KV
caches, so the blocks lie where the engine put them), and then both kernels run that list in interleaved
rounds (``common.interleave``, order rotated every round); the ratio is taken per round. The other source is
compiled as ``minengine_ab::paged_decode_attention`` by ``kernel_ab.build_other``; both must give the same
outputs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from minengine.models import cpu_kernels

try:
    from benchmarks import common, kernel_ab, mixed_workload, throughput
except ImportError:  # run as a script: python benchmarks/attention_ab.py
    import common  # type: ignore[no-redef]
    import kernel_ab  # type: ignore[no-redef]
    import mixed_workload  # type: ignore[no-redef]
    import throughput  # type: ignore[no-redef]

SOURCE = "minengine/models/csrc/paged_attention.cpp"


def capture_calls(args: argparse.Namespace) -> list[tuple[Any, ...]]:
    """Every ``args.every``-th decode-attention call of one workload run: the kernel's arguments."""
    shape = common.SHAPES[args.shape]
    run = throughput.run_minengine(str(common.model_dir(args.shape)),
                                   *throughput.MINENGINE["minengine-decode-first"], args)
    real, calls = cpu_kernels.paged_decode_attention, []

    def keep(q: Any, k_cache: Any, v_cache: Any, tables: Any, lens: Any, scale: float,
             window: int | None = None) -> Any:
        calls.append((q.clone(), k_cache, v_cache, tables.clone(), lens.clone(), scale, window or 0))
        return real(q, k_cache, v_cache, tables, lens, scale, window)

    cpu_kernels.paged_decode_attention = keep
    try:
        with torch.inference_mode():
            run(mixed_workload.from_args(args, shape["vocab_size"]))
    finally:
        cpu_kernels.paged_decode_attention = real
    if not calls:
        raise SystemExit("the engine made no C++ decode-attention call: are the CPU kernels built?")
    return calls[:: args.every]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="HEAD", help=f"the git revision whose {SOURCE} is the other half")
    ap.add_argument("--source", default=None, help="a paged_attention.cpp-like file instead of --rev")
    ap.add_argument("--shape", default="llama-100m", choices=sorted(common.SHAPES))
    mixed_workload.add_args(ap)
    ap.add_argument("--every", type=int, default=4, help="keep every n-th call of the run")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        mixed_workload.apply_smoke(args)
        args.rounds, args.every = 2, 1
    common.set_threads(args.threads)
    if not cpu_kernels.load():
        raise SystemExit(f"the CPU kernels are not built: {cpu_kernels.build_error()}")
    label, text = kernel_ab.other_source(args.rev, args.source, SOURCE)
    other, current = (kernel_ab.build_other(text, "paged_decode_attention"),
                      torch.ops.minengine.paged_decode_attention)
    calls = capture_calls(args)
    for call in calls[:50]:
        torch.testing.assert_close(other(*call), current(*call), rtol=1e-5, atol=1e-5)

    def seconds(op: Any) -> float:
        start = time.perf_counter()
        for call in calls:
            op(*call)
        return time.perf_counter() - start

    timed = common.interleave({"current": lambda: seconds(current), "other": lambda: seconds(other)},
                              args.rounds)
    mine, theirs = timed["current"].seconds, timed["other"].seconds
    ratios = [t / m for t, m in zip(theirs, mine, strict=True)]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    result = dict(other=label, shape=args.shape, calls=len(calls), current_s=statistics.median(mine),
                  other_s=statistics.median(theirs), ratio=statistics.median(ratios),
                  ratio_quartiles=[quartiles[0], quartiles[2]], rounds=args.rounds)
    print(f"command: {common.command_line()}\n{common.machine_line()}")
    print(f"{len(calls)} decode-attention calls of the {args.shape} mixed workload (one in {args.every}), "
          f"{args.rounds} interleaved rounds; outputs checked equal\n")
    print(common.md_table(["decode-attention kernel", "median s per round", "other / current (paired)"], [
        ["current build (paged_attention.cpp as built by make)", f"{result['current_s']:.3f}", "-"],
        [label, f"{result['other_s']:.3f}",
         f"**{result['ratio']:.3f}** (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f})"],
    ]))
    common.save_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
