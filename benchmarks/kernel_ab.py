"""Paired A/B of the batch-1 GEMV kernel: ``gemv.cpp`` at another git revision against the build in use,
in one process, on whole decode steps.

    .venv/bin/python benchmarks/kernel_ab.py --rev HEAD~1 --rounds 40
    .venv/bin/python benchmarks/kernel_ab.py --source /tmp/my_gemv.cpp      # a file instead of a revision

Why not two processes (``with_tree.py``): on this shared VM the measured read bandwidth swung between 41
and 69 GB/s across runs a minute apart (2026-12-02), which buries a 10 % kernel change. Here the other
source is compiled as the op ``minengine_ab::gemv`` with the kernels' own flags, and one engine's decode
steps alternate between the two ops round by round (order swapped every round), checked to give the same
greedy tokens; the ratio is taken per pair of rounds, so a swing hits both halves of a pair alike.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import minengine
from minengine.models import cpu_kernels, linear_kernels

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/kernel_ab.py
    import common  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
GEMV_SOURCE = "minengine/models/csrc/gemv.cpp"
BUILD_ROOT = ROOT / "benchmarks" / "out" / "kernel_ab"


def other_source(rev: str | None, source: str | None, path: str = GEMV_SOURCE) -> tuple[str, str]:
    """(label, C++ text) of the kernel to compare: a file, or ``path`` as it was at ``rev``."""
    if source:
        return source, Path(source).read_text()
    text = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if text.returncode != 0:
        raise SystemExit(f"git show {rev}:{path} failed: {text.stderr.strip()}")
    return f"{path} at {rev}", text.stdout


def build_other(text: str, op: str = "gemv") -> Any:
    """Compile ``text`` as ``torch.ops.minengine_ab.<op>`` (its own namespace: both ops live in one
    process)."""
    from torch.utils.cpp_extension import load

    renamed = text
    for macro in ("TORCH_LIBRARY(minengine,", "TORCH_LIBRARY_FRAGMENT(minengine,"):  # the def: a fragment,
        # so several ops can share it
        renamed = renamed.replace(macro, "TORCH_LIBRARY_FRAGMENT(minengine_ab,")
    renamed = renamed.replace("TORCH_LIBRARY_IMPL(minengine,", "TORCH_LIBRARY_IMPL(minengine_ab,")
    if renamed.count("minengine_ab,") != 2:
        raise SystemExit("the other source does not register its op the way the kernels do "
                         "(TORCH_LIBRARY*(minengine, ...))")
    cflags, ldflags = cpu_kernels._flags()
    tag = hashlib.sha1((renamed + " ".join(cflags + ldflags) + sys.prefix).encode()).hexdigest()[:12]
    folder = BUILD_ROOT / tag
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{op}_ab.cpp").write_text(renamed)
    load(name=f"minengine_{op}_ab_{tag}", sources=[str(folder / f"{op}_ab.cpp")], extra_cflags=cflags,
         extra_ldflags=ldflags, build_directory=str(folder), is_python_module=False)
    return getattr(torch.ops.minengine_ab, op)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="HEAD", help="the git revision whose gemv.cpp is the other half")
    ap.add_argument("--source", default=None, help="a gemv.cpp-like file instead of --rev")
    ap.add_argument("--shape", default="llama-100m", choices=sorted(common.SHAPES))
    ap.add_argument("--rounds", type=int, default=40, help="pairs of rounds")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny model, 2 pairs (for the CI test)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.shape, args.rounds, args.new_tokens = "llama-tiny", 2, 8
    common.set_threads(args.threads)
    if not cpu_kernels.load():
        raise SystemExit(f"the CPU kernels are not built: {cpu_kernels.build_error()}")
    label, text = other_source(args.rev, args.source)
    other, current = build_other(text), torch.ops.minengine.gemv
    path = common.model_dir(args.shape, "float32")
    llm = minengine.LLM(str(path), dtype="float32", enable_prefix_caching=False, max_num_seqs=4,
                        num_blocks=(32 + args.new_tokens) // 16 + 8)
    prompt = [(37 * j) % 1000 + 3 for j in range(32)]
    params = minengine.SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    reference: list[int] = []  # the first run's tokens: every later run must give them again
    real_gemv = linear_kernels._gemv

    def step_ms(op: Any) -> float:
        linear_kernels._gemv = lambda x, w, b: op(x, w, b)
        try:
            tokens = list(llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids)
        finally:
            linear_kernels._gemv = real_gemv
        if not reference:
            reference.extend(tokens)
        if tokens != reference:
            raise SystemExit("the two kernels gave different greedy tokens")
        times = llm.request_records[0].token_times
        return 1e3 * statistics.median(b - a for a, b in zip(times, times[1:], strict=False))

    step_ms(current), step_ms(other)  # warm-up: page faults, first calls
    mine, theirs = [], []
    for i in range(args.rounds):
        order = [(mine, current), (theirs, other)]
        for out, op in (order if i % 2 == 0 else order[::-1]):
            out.append(step_ms(op))
    ratios = [t / m for t, m in zip(theirs, mine, strict=True)]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    result = dict(other=label, shape=args.shape, current_ms=statistics.median(mine),
                  other_ms=statistics.median(theirs), ratio=statistics.median(ratios),
                  ratio_quartiles=[quartiles[0], quartiles[2]], rounds=args.rounds)
    print(f"command: {common.command_line()}\n{common.machine_line()}")
    print(f"eager batch-1 decode step, {args.shape} fp32, {args.new_tokens} new tokens, {args.rounds} pairs "
          "of rounds; same greedy tokens from both kernels\n")
    print(common.md_table(["GEMV kernel", "median step ms", "other / current (paired)"], [
        ["current build (gemv.cpp as built by make)", f"{result['current_ms']:.2f}", "-"],
        [label, f"{result['other_ms']:.2f}",
         f"**{result['ratio']:.3f}** (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f})"],
    ]))
    common.save_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
