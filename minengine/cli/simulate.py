"""``minengine simulate``: serve a synthetic workload or a trace on a simulated GPU, print vLLM's table.

Examples::

    minengine simulate --model llama-2-7b --gpu h100 --rate 4 --num-requests 500 --input-len 512
    minengine simulate --no-chunked-prefill --policy prefill_first ...   # the classic V0 scheduler
    minengine simulate --disagg 1:1 --link-gb-per-s 50 ...                    # DistServe-style pools
    minengine simulate --sweep 1,2,4,8 --slo ttft:500,tpot:50 ...         # goodput over request rates
    minengine simulate --model llama-2-70b -tp 4 -pp 2 ...               # one instance on 8 GPUs

Only argparse is imported at module level: the simulator loads when the command runs.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from minengine.cli.validators import non_negative_int, positive_float, positive_int


def _rates(text: str) -> list[float]:
    rates = [positive_float(t) for t in text.split(",") if t.strip()]
    if not rates:
        raise argparse.ArgumentTypeError(f"{text!r}: give request rates like 1,2,4,8")
    return rates


def _disagg(text: str) -> tuple[int, int]:
    parts = text.split(":")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{text!r}: use P:D, e.g. 1:1 or 2:1 (prefill:decode instances)")
    return positive_int(parts[0]), positive_int(parts[1])


def _slo(text: str) -> dict[str, float]:
    from minengine.metrics.stats import parse_slo

    try:
        return parse_slo(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    w = p.add_argument_group("model and hardware")
    w.add_argument("--model", default="llama-2-7b", help="kv preset (llama-2-7b, llama-3.1-8b, ...) or a "
                   "config.json path (default: llama-2-7b)")
    w.add_argument("--gpu", default="h100", help="accelerator key (h100, a100, h200, l4, ...) or "
                   "'this-machine' to measure this one (default: h100)")
    w.add_argument("--dtype", default=None, help="weight dtype (default: the model's, e.g. fp16)")
    w.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=1,
                   help="GPUs per instance, the model split across them (each instance: this many GPUs)")
    w.add_argument("--pipeline-parallel-size", "-pp", type=positive_int, default=1,
                   help="pipeline stages per instance, the layers split between them (GPUs per instance: "
                        "tp x pp); each stage keeps its own batch in flight")
    w.add_argument("--num-blocks", type=positive_int, default=None,
                   help="KV blocks per instance (default: what fits in GPU memory, like vLLM)")
    g = p.add_argument_group("workload")
    g.add_argument("--rate", type=positive_float, default=math.inf,
                   help="requests per second (default: inf, everything at t=0)")
    g.add_argument("--num-requests", type=positive_int, default=200)
    g.add_argument("--input-len", type=positive_int, default=512, help="prompt tokens (default 512)")
    g.add_argument("--output-len", type=positive_int, default=128, help="output tokens (default 128)")
    g.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len x (1 - r), len x (1 + r)], like vLLM's random dataset")
    g.add_argument("--burstiness", type=positive_float, default=1.0,
                   help="Gamma shape of the arrival gaps: 1 = Poisson, < 1 burstier (default 1)")
    g.add_argument("--prefix-len", type=non_negative_int, default=0,
                   help="tokens of shared prefix at the start of every prompt (counted in --input-len)")
    g.add_argument("--num-prefixes", type=positive_int, default=1, help="distinct shared prefixes")
    g.add_argument("--trace", default=None, help="CSV or JSONL trace (arrival_time, prompt_len, output_len) "
                   "instead of a synthetic workload")
    g.add_argument("--seed", type=int, default=0)
    e = p.add_argument_group("engine (EngineConfig)")
    e.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="split long prompts into chunks that fit the token budget (default: on)")
    e.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV blocks of shared prefixes (default: on)")
    e.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="token budget per step (default 2048; max_model_len without chunking)")
    e.add_argument("--max-num-seqs", type=positive_int, default=256)
    e.add_argument("--policy", choices=("decode_first", "prefill_first"), default="decode_first")
    c = p.add_argument_group("cluster")
    c.add_argument("--replicas", type=positive_int, default=1, help="colocated engine replicas (default 1)")
    c.add_argument("--router", choices=("round_robin", "least_loaded"), default="round_robin")
    c.add_argument("--disagg", type=_disagg, default=None, metavar="P:D",
                   help="disaggregate: P prefill and D decode instances")
    c.add_argument("--link-gb-per-s", type=positive_float, default=50.0,
                   help="KV-transfer link bandwidth in GB/s, gigaBYTES (default 50, a 400 Gb/s NIC)")
    c.add_argument("--link-latency-ms", type=float, default=0.1, help="per-transfer latency (default 0.1)")
    s = p.add_argument_group("sweep and SLOs")
    s.add_argument("--sweep", type=_rates, default=None, metavar="R1,R2,...",
                   help="simulate each request rate and report DistServe's goodput")
    s.add_argument("--slo", type=_slo, default=None, metavar="ttft:MS,tpot:MS",
                   help="SLOs in ms (ttft, tpot, e2e): goodput and attainment")
    s.add_argument("--price-per-gpu-hour", type=positive_float, default=None, metavar="USD",
                   help="what one GPU-hour costs, for the cost per million tokens (default: the first "
                        "on-demand list price for the GPU in minengine.perf.prices, where it has one)")


def add_simulate_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate", help="simulate serving on a GPU with the engine's own scheduler",
        description="Discrete-event simulation of minengine's scheduler and KV block manager, with step "
                    "times from a roofline model of the GPU. Example: minengine simulate --model llama-2-7b "
                    "--gpu h100 --rate 4 --num-requests 500 --input-len 512 --output-len 128",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def _workload(args: argparse.Namespace) -> list[Any]:
    from minengine.sim.workload import Fixed, Uniform, load_trace, synthetic_workload

    if args.trace:
        return load_trace(args.trace)
    r = args.range_ratio
    if not 0 <= r < 1:
        raise ValueError(f"--range-ratio must be in [0, 1), got {r}")
    if args.prefix_len and args.prefix_len >= args.input_len:
        raise ValueError(f"--prefix-len ({args.prefix_len}) must be shorter than --input-len "
                         f"({args.input_len})")

    def dist(n: int) -> Any:
        return Fixed(n) if r == 0 else Uniform(max(1, round(n * (1 - r))), max(1, round(n * (1 + r))))

    return synthetic_workload(args.num_requests, args.rate, dist(args.input_len), dist(args.output_len),
                              burstiness=args.burstiness, prefix_len=args.prefix_len,
                              num_prefixes=args.num_prefixes, seed=args.seed)


def _build(args: argparse.Namespace) -> Any:
    from minengine.perf.roofline import CostModel

    gpu: Any = args.gpu
    if gpu.lower().replace("_", "-") in ("this-machine", "this", "local"):
        from minengine.perf.measure import measure_this_machine

        gpu = measure_this_machine(persist=True)
    cost_model = CostModel.create(args.model, gpu, dtype=args.dtype,
                                  tensor_parallel_size=args.tensor_parallel_size,
                                  pipeline_parallel_size=args.pipeline_parallel_size)
    engine = dict(enable_chunked_prefill=args.chunked_prefill, enable_prefix_caching=args.prefix_caching,
                  max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                  policy=args.policy, num_blocks=args.num_blocks, seed=args.seed)
    if args.disagg:
        from minengine.sim.cluster import DisaggregatedCluster

        if args.replicas != 1:
            raise ValueError("--replicas is for colocated serving; with --disagg give P:D instead")
        return DisaggregatedCluster(cost_model=cost_model, num_prefill=args.disagg[0],
                                    num_decode=args.disagg[1], link_bandwidth=args.link_gb_per_s * 1e9,
                                    link_latency_s=args.link_latency_ms / 1e3, router=args.router, **engine)
    from minengine.sim.simulator import Simulator

    return Simulator(cost_model=cost_model, num_replicas=args.replicas, router=args.router, **engine)


def _price(args: argparse.Namespace) -> tuple[float, str] | None:
    """(USD per GPU-hour, where it came from), or None where the table has no price for the GPU."""
    if args.price_per_gpu_hour is not None:
        return args.price_per_gpu_hour, f"${args.price_per_gpu_hour:.2f}/GPU-h (as given)"
    from minengine.perf.hardware import get_accelerator
    from minengine.perf.prices import gpu_price

    try:
        accelerator = get_accelerator(args.gpu)
    except ValueError:
        return None  # 'this-machine' and the like: no list price
    try:
        row = gpu_price(accelerator.key)
    except ValueError:
        print(f"(no list price for {accelerator.name} in minengine.perf.prices: give "
              "--price-per-gpu-hour for the cost per token)")
        return None
    return row.usd_per_gpu_hour, row.describe() + "; --price-per-gpu-hour to change"


def _print_cost(sim: Any, result: Any, price: tuple[float, str], rate: float | None, label: str) -> None:
    from minengine.sim.token_cost import serving_cost

    instances = getattr(sim, "num_replicas", None) or sim.num_prefill + sim.num_decode  # colocated or pools
    try:
        costs = serving_cost(result, sim.cost_model, price[0], instances, rate)
    except ValueError as exc:
        print(f"Cost per token: not priced ({exc})")
        return
    gpus = instances * sim.cost_model.num_gpus
    print(f"Cost {label} on {gpus} GPU{'s' if gpus > 1 else ''} at {price[1]}:\n  {costs.describe()}")


def run(args: argparse.Namespace) -> int:
    from minengine.sim.simulator import sweep
    from minengine.sim.workload import describe

    try:
        sim = _build(args)
        workload = _workload(args)
        start = time.perf_counter()
        if args.sweep:
            result = sweep(sim.run, workload, args.sweep, burstiness=args.burstiness, seed=args.seed,
                           slo=args.slo, progress=sys.stderr.isatty())
        else:
            single = sim.run(workload)
    except Exception as exc:  # bad model, GPU, trace, or a request that can never run: one line, exit 2
        if not isinstance(exc, (ValueError, KeyError, OSError)):
            raise
        message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"minengine simulate: error: {message}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - start
    try:
        price = _price(args)
    except ValueError as exc:
        print(f"minengine simulate: error: {exc}", file=sys.stderr)
        return 2
    print(f"Simulated {sim.describe()}")
    print(f"Workload: {describe(workload)}")
    if args.sweep:
        print(result.table())
        slo = args.slo or {}
        if "ttft" in slo and "tpot" in slo:
            best = result.goodput()
            print(f"DistServe goodput (>= 90% of requests meet TTFT <= {slo['ttft']:g} ms and TPOT <= "
                  f"{slo['tpot']:g} ms): "
                  + ("below the lowest rate" if best is None else f"{best:.2f} req/s"))
            if best is not None and price is not None:
                # the GPU-time split of the busiest swept run within the SLO, sold at the goodput
                run_ok = max((r for rate, r, s in zip(result.rates, result.results, result.summaries,
                                                      strict=True)
                              if rate <= best and (s.slo_attainment or 0.0) >= 0.9),
                             key=lambda r: r.summary().request_throughput, default=result.results[0])
                _print_cost(sim, run_ok, price, best, f"at the goodput, {best:.2f} req/s")
    else:
        print(single.summary(args.slo).format_table("Simulated Serving Benchmark Result"))
        if price is not None:
            rate = args.rate if math.isfinite(args.rate) and not args.trace else None
            label = (f"at {rate:g} req/s" if rate else
                     "flat out (no SLO: the cheapest figure, and no service anyone can sell)")
            _print_cost(sim, single, price, rate, label)
        for i, busy in enumerate(single.stage_utilization):
            print(f"Pipeline stages busy (replica {i}): " + ", ".join(f"{100 * b:.0f}%" for b in busy)
                  + " of the run (the rest is the bubble)")
    print(f"(simulated in {wall:.2f} s of wall time)")
    return 0
