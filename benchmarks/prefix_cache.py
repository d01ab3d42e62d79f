"""Prefix caching: TTFT of requests that share a 1k-token system prompt, with the cache on and off.

    .venv/bin/python benchmarks/prefix_cache.py                    # llama-12m, 1024-token shared prefix
    .venv/bin/python benchmarks/prefix_cache.py --prefix-len 1536 --num-requests 24
    .venv/bin/python benchmarks/prefix_cache.py --smoke

Why: chat and agent traffic repeats the same system prompt in every request. With prefix caching the
engine finds that prompt's KV blocks by hash and computes only the new suffix, so TTFT drops from "prefill
prefix + suffix" to "prefill suffix". Two patterns, each with the cache on and off (two engines, same
weights, run alternately so load drift hits both alike):

- sequential: requests arrive one at a time (each ``generate`` call has one prompt): TTFT is pure
  prefill time. The first request with the cache on is a miss (it fills the cache): reported apart.
- burst: all requests at once: TTFT also includes queueing behind the other prefills.

Each prompt = the shared prefix + a unique suffix of ``--suffix-len`` tokens; ``--output-len`` tokens out.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from tqdm.auto import tqdm

import minengine
from minengine.utils import cdiv

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/prefix_cache.py
    import common  # type: ignore[no-redef]


def _ttfts(llm: minengine.LLM) -> list[float]:
    return [r.ttft for r in llm.request_records if r.ttft is not None]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-12m", choices=sorted(common.SHAPES))
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--suffix-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny model, short prefix, 3 requests")
    args = ap.parse_args(argv)
    if args.smoke:
        args.shape, args.prefix_len, args.suffix_len, args.output_len, args.num_requests = \
            "llama-tiny", 64, 8, 2, 3
    common.set_threads(args.threads)
    print(common.machine_line())
    path = str(common.model_dir(args.shape))
    rng = random.Random(0)
    prefix = [rng.randrange(3, 1700) for _ in range(args.prefix_len)]
    def new_prompt() -> list[int]:
        return prefix + [rng.randrange(3, 1700) for _ in range(args.suffix_len)]

    prompts = [new_prompt() for _ in range(args.num_requests)]
    params = minengine.SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    kv_blocks = args.num_requests * cdiv(args.prefix_len + args.suffix_len + args.output_len, 16) + 16
    engines = {on: minengine.LLM(path, enable_prefix_caching=on, num_blocks=kv_blocks)
               for on in (True, False)}
    warm = [[rng.randrange(3, 1700) for _ in range(32)]]
    for llm in engines.values():
        llm.generate(warm, params, use_tqdm=False)

    seq: dict[bool, list[float]] = {True: [], False: []}
    burst: dict[bool, dict[str, Any]] = {}
    loads: list[float] = []
    with tqdm(total=2 * args.num_requests + 2, desc="requests", dynamic_ncols=True) as bar:
        for i, prompt in enumerate(prompts):  # sequential, alternating which engine goes first
            for on in ((True, False) if i % 2 == 0 else (False, True)):
                engines[on].generate([prompt], params, use_tqdm=False)
                seq[on] += _ttfts(engines[on])
                bar.update(1)
            loads.append(common.loadavg()[0])
        for on in (False, True):  # burst: new suffixes, same prefix (already cached on the "on" engine)
            llm = engines[on]
            fresh = [new_prompt() for _ in prompts]
            start = time.perf_counter()
            llm.generate(fresh, params, use_tqdm=False)
            wall = time.perf_counter() - start
            t = _ttfts(llm)
            burst[on] = {"ttft_p50": common.median(t), "ttft_p99": common.percentile(t, 99), "wall_s": wall}
            bar.update(1)
            loads.append(common.loadavg()[0])

    cold, warm_on = seq[True][0], seq[True][1:]
    result = {
        "cold_ttft": cold, "seq_on_p50": common.median(warm_on), "seq_on_p99": common.percentile(warm_on, 99),
        "seq_off_p50": common.median(seq[False]), "seq_off_p99": common.percentile(seq[False], 99),
        "burst": {str(k): v for k, v in burst.items()}, "loads": loads,
    }
    stats = engines[True].llm_engine.prefix_cache_stats
    hit = stats["hits"] / stats["queries"] if stats["queries"] else 0.0
    print(f"\ncommand: {common.command_line()}")
    print(common.machine_line())
    print(f"{args.shape} fp32, shared prefix {args.prefix_len} + unique suffix {args.suffix_len} tokens, "
          f"{args.output_len} output tokens, {args.num_requests} requests per pattern; engine defaults "
          f"otherwise (decode-first, chunked prefill, budget 2048); prefix-cache hit rate over the whole "
          f"run {100 * hit:.0f} % of prompt tokens; load avg {min(loads):.2f}-{max(loads):.2f}\n")
    speed = result["seq_off_p50"] / result["seq_on_p50"]
    rows = [
        ["sequential", f"{1e3 * result['seq_off_p50']:.1f}", f"{1e3 * result['seq_off_p99']:.1f}",
         f"{1e3 * result['seq_on_p50']:.1f}", f"{1e3 * result['seq_on_p99']:.1f}", f"**{speed:.1f}x**"],
        ["burst (all at once)", f"{1e3 * burst[False]['ttft_p50']:.1f}",
         f"{1e3 * burst[False]['ttft_p99']:.1f}",
         f"{1e3 * burst[True]['ttft_p50']:.1f}", f"{1e3 * burst[True]['ttft_p99']:.1f}",
         f"**{burst[False]['ttft_p50'] / burst[True]['ttft_p50']:.1f}x**"],
    ]
    print(common.md_table(["arrivals", "TTFT p50 ms, cache off", "p99 off", "TTFT p50 ms, cache on", "p99 on",
                           "p50 speed-up"], rows))
    print(f"\nFirst request with the cache on (a miss that fills it): TTFT {1e3 * cold:.1f} ms. Burst wall "
          f"time: {burst[False]['wall_s']:.2f} s off, {burst[True]['wall_s']:.2f} s on.")
    common.save_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
