"""Decode attention on a CPU: one padded SDPA call, length-sorted groups, and the C++ paged kernel.

    .venv/bin/python benchmarks/attention_decode.py                # batch 64, contexts in [16, 768]
    .venv/bin/python benchmarks/attention_decode.py --batch 8 --contexts 16,2048
    .venv/bin/python benchmarks/attention_decode.py --shape llama-100m --contexts 280,700 --kernel-only \
        --block-layout consecutive          # where the kernel's blocks lie (shuffled, consecutive, cached)
    .venv/bin/python benchmarks/attention_decode.py --smoke

Why this exists: profiling the throughput benchmark (``throughput.py``) showed a batch-64 decode step
spending ~80 % of its time in attention, mostly in ``k_flat[slots]`` (advanced indexing gathers each
token's K/V row element by element) and in one SDPA call whose keys are padded to the longest context.
``minengine.models.attention`` now gathers with ``index_select`` (whole rows, memcpy-like) and, on a CPU,
cuts the decodes into length-sorted groups of ~4k context tokens, so little is padded and each group's
gathered K/V is still in the core's cache when SDPA reads it. Three variants, one engine step each (all
layers, metadata built once per step as in the engine), interleaved round by round:

- ``before``: the previous code path (one padded call, ``k_flat[slots]``), reproduced here;
- ``index_select, one call``: the new gather, grouping switched off;
- ``length-sorted groups``: the reference path (``attention_backend="gather"``);
- ``C++ paged kernel``: what the engine runs on a CPU in fp32 (``models/csrc/paged_attention.cpp``):
  every K/V row read once, in place, through the block tables.

"ideal" is the time to read the batch's K/V context once at the bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from minengine.models import cpu_kernels
from minengine.models.attention import reference as attn
from minengine.models.paged_decode import build_decode_batch
from minengine.perf.measure import measure_read_bandwidth
from minengine.utils import cdiv

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/attention_decode.py
    import common  # type: ignore[no-redef]


_OLD_INDICES: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per metadata object, built once


def before(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: attn.KVCache,
           meta: attn.AttentionMetadata, scale: float) -> torch.Tensor:
    """The decode path as it was: every decode in one SDPA call, keys padded, gathered by k_flat[slots]."""
    k_cache, v_cache = cache
    n_kv, d = k_cache.shape[2], k_cache.shape[3]
    k_flat, v_flat = k_cache.view(-1, n_kv, d), v_cache.view(-1, n_kv, d)
    k_flat.index_copy_(0, meta.slot_mapping, k)
    v_flat.index_copy_(0, meta.slot_mapping, v)
    if id(meta) not in _OLD_INDICES:
        assert meta.block_tables is not None
        lens = torch.tensor(meta.seq_lens)
        max_len, bs = int(lens.max()), meta.block_size
        max_blocks = cdiv(max_len, bs)
        tables = torch.tensor([(t + [0] * max_blocks)[:max_blocks] for t in meta.block_tables])
        pos = torch.arange(max_len)
        slots = tables[:, pos // bs] * bs + pos % bs
        _OLD_INDICES[id(meta)] = (slots, (pos[None, :] < lens[:, None])[:, None, None, :])
    slots, mask = _OLD_INDICES[id(meta)]
    keys, values = k_flat[slots].transpose(1, 2), v_flat[slots].transpose(1, 2)
    return attn._sdpa(q.unsqueeze(2), keys, values, mask, scale).squeeze(2)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-12m", choices=sorted(common.SHAPES))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--contexts", default="16,768", help="context lengths uniform in [lo, hi]")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    ap.add_argument("--block-layout", default="shuffled", choices=["shuffled", "consecutive", "cached"],
                    help="where each sequence's blocks lie: scattered over the pool (as after a while of "
                         "serving), one after another, or all on the same 4 blocks (the K/V read from the "
                         "caches: the kernel's arithmetic alone)")
    ap.add_argument("--kernel-only", action="store_true", help="time the C++ kernel alone (the reference "
                    "path still runs once, untimed, to check its output)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="batch 4, 2 rounds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.batch, args.rounds, args.contexts = 4, 2, "8,64"
    common.set_threads(args.threads)
    print(common.machine_line())
    shape = common.SHAPES[args.shape]
    layers, n_q, n_kv = shape["num_hidden_layers"], shape["num_attention_heads"], shape["num_key_value_heads"]
    d, bs = shape["hidden_size"] // n_q, args.block_size
    rng = random.Random(0)
    lo, hi = (int(x) for x in args.contexts.split(","))
    lens = [rng.randint(lo, hi) for _ in range(args.batch)]
    num_blocks = sum(cdiv(n, bs) for n in lens) + 1
    ids = list(range(1, num_blocks))
    if args.block_layout == "shuffled":
        rng.shuffle(ids)  # blocks scattered over the pool, as after a while of serving
    tables, used = [], 0
    for n in lens:
        count = cdiv(n, bs)
        tables.append(ids[used:used + count] if args.block_layout != "cached"
                      else [1 + j % 4 for j in range(count)])
        used += count
    caches = [(torch.randn(num_blocks, bs, n_kv, d), torch.randn(num_blocks, bs, n_kv, d))
              for _ in range(layers)]
    q, k, v = (torch.randn(args.batch, h, d) for h in (n_q, n_kv, n_kv))
    scale = d**-0.5

    outputs: dict[Any, torch.Tensor] = {}

    def step(fn: Any, group_tokens: int) -> float:
        attn.CPU_DECODE_GROUP_TOKENS = group_tokens
        start = time.perf_counter()
        meta = attn.AttentionMetadata.build([1] * len(lens), lens, tables, bs)
        for cache in caches:
            out = fn(q, k, v, cache, meta, scale)
        elapsed = time.perf_counter() - start
        outputs[fn, group_tokens] = out
        return elapsed

    def kernel_step() -> float:  # the engine's CPU default: the decodes' block tables, read in place
        start = time.perf_counter()
        meta = attn.AttentionMetadata.build([1] * len(lens), lens, tables, bs)
        meta.decode_batch = build_decode_batch(tables, lens, bs, num_blocks, backend="cpp")
        meta.decode_batch.rows = torch.arange(len(lens))
        for cache in caches:
            out = attn.paged_attention(q, k, v, cache, meta, scale)
        elapsed = time.perf_counter() - start
        outputs["cpp", 0] = out
        return elapsed

    default_group = attn.CPU_DECODE_GROUP_TOKENS
    variants = {
        "before (one padded call, k_flat[slots])": lambda: step(before, default_group),
        "index_select, one call": lambda: step(attn.paged_attention, 10**9),
        f"length-sorted groups of ~{default_group} tokens (gather)": lambda: step(attn.paged_attention,
                                                                                  default_group),
    }
    if cpu_kernels.load():
        variants["C++ paged kernel (in place)"] = kernel_step
        if args.kernel_only:
            with torch.inference_mode():
                step(attn.paged_attention, default_group)  # the reference output, untimed
            variants = {"C++ paged kernel (in place)": kernel_step}
    try:
        with torch.inference_mode(), tqdm(total=args.rounds * len(variants), desc="steps") as bar:
            for run in variants.values():
                run()  # warm-up
            timed = common.interleave(variants, args.rounds, bar)
    finally:
        attn.CPU_DECODE_GROUP_TOKENS = default_group
    for out in outputs.values():  # same attention output (last layer) from every variant
        torch.testing.assert_close(out, outputs[attn.paged_attention, default_group], rtol=1e-5, atol=1e-5)
    kv_bytes = 2 * sum(lens) * n_kv * d * 4 * layers
    bw = measure_read_bandwidth("cpu", num_bytes=max(2**28, kv_bytes))
    ideal = kv_bytes / bw
    print(f"\ncommand: {common.command_line()}")
    print(common.machine_line())
    print(f"{args.shape} attention ({layers} layers, {n_q} query / {n_kv} KV heads, head_dim {d}), fp32, "
          f"{args.batch} decodes, contexts uniform in [{lo}, {hi}] ({sum(lens):,} tokens, blocks of {bs} "
          f"tokens, {args.block_layout}, "
          f"{kv_bytes / 1e6:.0f} MB of K/V per step); read bandwidth {bw / 1e9:.1f} GB/s -> ideal "
          f"{1e3 * ideal:.2f} ms; medians of {args.rounds} interleaved rounds\n")
    first = next(iter(timed.values())).median
    rows = [[name, f"{1e3 * t.median:.2f}", f"{first / t.median:.2f}x", f"{t.median / ideal:.2f}x"]
            for name, t in timed.items()]
    print(common.md_table(["decode attention, one step", "ms", "speed-up vs the first row", "vs ideal"],
                          rows))
    result = {"ideal": ideal, "bandwidth": bw, "ms": {name: 1e3 * t.median for name, t in timed.items()}}
    common.save_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
