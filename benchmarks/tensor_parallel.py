"""Tensor parallelism on a CPU: what splitting a model across two processes costs, and where the time goes.

    .venv/bin/python benchmarks/tensor_parallel.py --rounds 5      # llama-100m fp32, ~3 min on 2 cores
    .venv/bin/python benchmarks/tensor_parallel.py --smoke         # seconds; for the CI test

One engine with ``tensor_parallel_size=1`` (all the machine's threads) and one with 2 (two processes, each
with half the threads, joined by gloo all-reduces) run the same greedy requests, in alternating order
round by round. From the engines' own step records, the medians of:

- a batch-1 decode step and a batch-8 decode step (forward time; of which all-reduce, rank 0's view);
- a 512-token prompt computed in one step (prefill: compute-bound);
- one all-reduce call (a step's all-reduce time over its 2 x layers calls), with the bytes it carries
  (rows x hidden x 4 in fp32).

On one CPU, two ranks share the same memory bandwidth and cores that one rank had, so tensor parallelism
cannot speed a step up here: it shows its cost (two all-reduces per layer, the ranks waiting for each
other) with none of the gain it brings on GPUs, where each rank adds its own HBM and compute. Greedy
tokens must be the same either way.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/tensor_parallel.py
    import common  # type: ignore[no-redef]

SIZES = (1, 2)
TRACE_ENV = "MINENGINE_TP_TRACE"  # minengine.models.tensor_parallel.TRACE_ENV (not imported: no torch yet)


def _all_reduce_rank(rank: int, port: int, sizes: list[int], rounds: int, out: Any) -> None:
    """One of two processes timing gloo's all-reduce alone, at each size (fp32 elements); rank 0 reports."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    medians = {}
    for n in sizes:
        x = torch.ones(n)
        for _ in range(10):
            dist.all_reduce(x)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - start)
        medians[4 * n] = statistics.median(times)
    dist.destroy_process_group()
    if rank == 0:
        out.put(medians)


def gloo_all_reduce(num_bytes: list[int], rounds: int = 200) -> dict[int, float]:
    """Median seconds of one fp32 all-reduce between two fresh processes on 127.0.0.1, per message size:
    gloo's own cost, with no model and no engine around it."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    out = context.Queue()
    sizes = [max(1, b // 4) for b in num_bytes]
    procs = [context.Process(target=_all_reduce_rank, args=(r, port, sizes, rounds, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        return out.get(timeout=300)
    finally:
        for p in procs:
            p.join(timeout=30)


def fit_latency_bandwidth(times: dict[int, float]) -> tuple[float, float]:
    """(latency s, bandwidth B/s) of ``time = latency + bytes / bandwidth``, least squares: the
    alpha-beta model of a message (Hockney, 1994) that cost models price collectives with."""
    xs, ys = list(times), list(times.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    slope = max(slope, 1e-15)
    return my - slope * mx, 1 / slope


def _model_config(shape: str) -> dict[str, Any]:
    return dict(architectures=["LlamaForCausalLM"], tie_word_embeddings=True, **common.SHAPES[shape])


def _phases(records: list[Any], batch: int, prompt_len: int) -> dict[str, list[Any]]:
    """The step records of each phase: decode steps of ``batch`` sequences, and whole-prompt steps."""
    decode = [r for r in records if not r.num_prefill_tokens and r.num_decode_seqs == batch]
    prefill = [r for r in records if r.num_prefill_tokens == prompt_len * r.num_prefill_seqs
               and not r.num_decode_seqs]
    return {"decode": decode, "prefill": prefill}


def trace_table(trace_dir: str, hidden: int) -> dict[str, dict[str, float]]:
    """Split rank 0's time in each all-reduce into waiting for rank 1 to arrive and what follows once both
    have (gloo's work, and waking each rank's threads), from both ranks' entry and exit times (the
    engine's trace: ``MINENGINE_TP_TRACE``). Per message size; medians in microseconds."""
    ranks = [json.loads(Path(trace_dir, f"rank{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]), "the ranks traced different numbers of all-reduces"
    by_size: dict[int, list[tuple[list[float], list[float]]]] = {}
    for zero, one in zip(*ranks, strict=True):
        by_size.setdefault(int(zero[2]), []).append((zero, one))
    out, rows = {}, []
    for elements, calls in sorted(by_size.items()):
        inside = [z[1] - z[0] for z, _ in calls]
        waiting = [max(0.0, o[0] - z[0]) for z, o in calls]  # rank 1 arrived after rank 0 by this much
        after = [z[1] - max(z[0], o[0]) for z, o in calls]
        name = f"{elements // hidden}"
        out[name] = {"calls": len(calls), "bytes": 4 * elements, "inside_us": 1e6 * statistics.median(inside),
                     "inside_mean_us": 1e6 * statistics.fmean(inside),
                     "waiting_us": 1e6 * statistics.fmean(waiting),
                     "after_both_arrived_us": 1e6 * statistics.median(after),
                     "after_both_arrived_mean_us": 1e6 * statistics.fmean(after),
                     "p90_inside_us": 1e6 * sorted(inside)[int(0.9 * len(inside))],
                     "p99_inside_us": 1e6 * sorted(inside)[int(0.99 * len(inside))],
                     # the tail: calls over 2 ms, as a share of the calls and of the time in all-reduces
                     "over_2ms_calls": sum(t > 2e-3 for t in inside) / len(inside),
                     "over_2ms_time": sum(t for t in inside if t > 2e-3) / sum(inside)}
        c = out[name]
        rows.append((name, f"{len(calls):,}", f"{4 * elements / 1024:,.1f} KiB",
                     f"{c['inside_mean_us']:.0f} ({c['inside_us']:.0f}, {c['p90_inside_us']:.0f}, "
                     f"{c['p99_inside_us']:.0f})", f"{c['waiting_us']:.0f}",
                     f"{c['after_both_arrived_mean_us']:.0f} ({c['after_both_arrived_us']:.0f})",
                     f"{100 * c['over_2ms_calls']:.0f} % / {100 * c['over_2ms_time']:.0f} %"))
    print("rank 0's all-reduces, from both ranks' traces: mean us (median, p90, p99); inside = wait + after")
    print(common.md_table(["rows per call", "calls", "bytes", "inside", "waiting for rank 1",
                           "after both arrived", "calls over 2 ms / their time"], rows))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from minengine import LLM, SamplingParams
    from minengine.models.loader import build_random_model

    config = _model_config(args.shape)
    model = build_random_model(config, device="cpu", dtype=torch.float32, seed=0, std=0.1)
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    g = torch.Generator().manual_seed(0)
    vocab = min(config["vocab_size"], 1753)
    prompts = {b: [{"prompt_token_ids": torch.randint(3, vocab, (args.prompt_len,), generator=g).tolist()}
                   for _ in range(b)] for b in args.batches}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    threads, threads_before = args.threads, torch.get_num_threads()
    torch.set_num_threads(threads)
    print(common.machine_line())
    trace_dir = tempfile.mkdtemp(prefix="minengine-tp-trace-") if args.trace else None
    if trace_dir:
        os.environ[TRACE_ENV] = trace_dir  # both ranks inherit it: rank 1 is spawned after this
    engines: dict[int, Any] = {}
    for size in SIZES:
        torch.set_num_threads(threads)
        engines[size] = LLM(model, tensor_parallel_size=size, max_num_batched_tokens=max(
            2048, args.prompt_len * max(args.batches)), enable_prefix_caching=False)
    print(engines[2].llm_engine.runtime.describe())
    steps: dict[tuple[int, int], dict[str, list[Any]]] = {
        (s, b): {"decode": [], "prefill": []} for s in SIZES for b in args.batches}
    walls: dict[tuple[int, int], list[float]] = {(s, b): [] for s in SIZES for b in args.batches}
    tokens: dict[tuple[int, int], list[list[int]]] = {}
    try:
        for r in range(args.rounds):
            for size in SIZES if r % 2 == 0 else SIZES[::-1]:
                llm = engines[size]
                torch.set_num_threads(max(1, threads // size))  # rank 0's share, as the engine set it
                for b in args.batches:
                    first = len(llm.llm_engine.step_records)
                    start = time.perf_counter()
                    outs = llm.generate(prompts[b], params, use_tqdm=False)
                    walls[size, b].append(time.perf_counter() - start)
                    tokens[size, b] = [o.outputs[0].token_ids for o in outs]
                    for phase, recs in _phases(list(llm.llm_engine.step_records)[first:], b,
                                               args.prompt_len).items():
                        steps[size, b][phase] += recs
    finally:
        for llm in engines.values():
            llm.close()
        torch.set_num_threads(threads_before)
        os.environ.pop(TRACE_ENV, None)

    def ms(xs: list[float]) -> float:
        return 1e3 * statistics.median(xs) if xs else float("nan")

    rows, summary = [], {}
    for b in args.batches:
        for phase in ("decode", "prefill"):
            cell = {}
            for size in SIZES:
                recs = steps[size, b][phase]
                cell[size] = {"forward_ms": ms([x.t_forward for x in recs]),
                              "all_reduce_ms": ms([x.t_all_reduce for x in recs]),
                              "per_call_us": 1e3 * ms([x.t_all_reduce / (2 * layers) for x in recs]),
                              "steps": len(recs)}
            rows_in_step = b if phase == "decode" else b * args.prompt_len
            one, two = cell[1], cell[2]
            summary[f"{phase} batch {b}"] = {"tp1": one, "tp2": two, "rows": rows_in_step,
                                             "bytes_per_call": rows_in_step * hidden * 4}
            rows.append((f"{phase}, batch {b}", f"{one['forward_ms']:.2f}", f"{two['forward_ms']:.2f}",
                         f"{two['forward_ms'] / one['forward_ms']:.2f}x",
                         f"{two['all_reduce_ms']:.2f} "
                         f"({100 * two['all_reduce_ms'] / two['forward_ms']:.0f} %)",
                         f"{two['per_call_us']:.0f} us", f"{rows_in_step * hidden * 4 / 1024:,.0f} KiB"))
    print(common.md_table(["step", "TP=1 forward ms", "TP=2 forward ms", "TP=2 / TP=1",
                           "TP=2 all-reduce ms (share)", "per all-reduce", "bytes per all-reduce"], rows))
    same = all(tokens[1, b] == tokens[2, b] for b in args.batches)
    print(f"greedy tokens identical at TP=1 and TP=2: {same}")

    # gloo alone, at the sizes the engine's all-reduces carried, and what an alpha-beta fit of it predicts
    # for each step's 2 x layers calls
    raw = gloo_all_reduce(sorted({cell["bytes_per_call"] for cell in summary.values()}),
                          rounds=50 if args.smoke else 200)
    if len(raw) > 1:
        latency, bandwidth = fit_latency_bandwidth(raw)
    else:
        latency, bandwidth = next(iter(raw.values())), float("inf")
    rows = []
    for name, cell in summary.items():
        predicted = 2 * layers * (latency + cell["bytes_per_call"] / bandwidth)
        cell["gloo_alone_us"] = 1e6 * raw[cell["bytes_per_call"]]
        cell["predicted_all_reduce_ms"] = 1e3 * predicted
        rows.append((name, f"{cell['bytes_per_call'] / 1024:,.1f} KiB", f"{cell['gloo_alone_us']:.0f} us",
                     f"{cell['tp2']['per_call_us']:.0f} us", f"{1e3 * predicted:.2f}",
                     f"{cell['tp2']['all_reduce_ms']:.2f}",
                     f"{cell['tp2']['all_reduce_ms'] / (1e3 * predicted):.2f}x"))
    print(f"gloo all-reduce alone, two processes: latency {1e6 * latency:.0f} us, "
          f"bandwidth {bandwidth / 1e9:.2f} GB/s (fit over {len(raw)} sizes)")
    print(common.md_table(["step", "bytes per call", "gloo alone", "in the engine", "predicted ms per step",
                           "measured ms per step", "measured / predicted"], rows))
    waits = trace_table(trace_dir, hidden) if trace_dir else None
    if trace_dir:
        shutil.rmtree(trace_dir, ignore_errors=True)  # waits holds what the trace was for
    data = {"args": vars(args), "summary": summary, "trace": waits,
            "walls": {f"{s}x{b}": w for (s, b), w in walls.items()},
            "identical": same, "gloo_alone_s": raw, "gloo_fit": {"latency_s": latency,
                                                                "bandwidth_bytes_per_s": bandwidth}}
    common.save_json(args.json, data)
    return data


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-100m", choices=sorted(common.SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--smoke", action="store_true", help="llama-tiny, one round, short prompts")
    parser.add_argument("--trace", action="store_true",
                        help="also split each all-reduce into waiting for the other rank and the rest")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shape, args.rounds, args.prompt_len, args.max_tokens = "llama-tiny", 1, 32, 8
    return run(args)


if __name__ == "__main__":
    main()
