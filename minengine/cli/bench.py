"""``minengine bench``: load-test an OpenAI-compatible server and print vLLM's summary table.

    minengine serve --model tinystories-4m --port 8000 &
    minengine bench --base-url http://127.0.0.1:8000 --num-prompts 200 --request-rate 4 \\
        --input-len 128 --output-len 64 --ignore-eos --slo ttft:200,tpot:50 --save-result run.json

The flags mirror ``vllm bench serve`` (--request-rate, --burstiness, --max-concurrency, --ignore-eos,
--save-result; --input-len etc. are its --random-input-len ...), so a command carries over.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from minengine.cli.validators import non_negative_int, positive_int


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="load-test an OpenAI-compatible server (TTFT, TPOT, ITL, E2E, goodput)",
        description="Send a workload to an OpenAI-compatible server (minengine serve, vLLM, SGLang) on an "
        "open-loop schedule and report latency percentiles, throughput and goodput.",
    )
    parser.add_argument(
        "--base-url", default="http://127.0.0.1:8000", help="server URL (with or without /v1)"
    )
    parser.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    parser.add_argument("--model", default=None, help="model id to request (default: first id in /v1/models)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer for building prompts (default: --model)")
    parser.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY"), help="default: $OPENAI_API_KEY"
    )
    parser.add_argument("--dataset", choices=["random", "jsonl"], default="random")
    parser.add_argument("--dataset-path", default=None, help='JSONL file: {"prompt": ..., "output_len": ...}')
    parser.add_argument(
        "--num-prompts",
        type=positive_int,
        default=None,
        help="requests to send (default 100; jsonl: every line)",
    )
    parser.add_argument("--input-len", "--random-input-len", type=positive_int, default=128)
    parser.add_argument("--output-len", "--random-output-len", type=positive_int, default=64)
    parser.add_argument(
        "--range-ratio",
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="lengths uniform in [len*(1-r), len*(1+r)], 0 <= r < 1",
    )
    parser.add_argument(
        "--prefix-len",
        "--random-prefix-len",
        type=non_negative_int,
        default=0,
        help="tokens of shared prefix before every prompt",
    )
    parser.add_argument(
        "--request-rate", type=float, default=math.inf, help="requests/s (default inf: all at once)"
    )
    parser.add_argument("--burstiness", type=float, default=1.0, help="Gamma shape: 1 Poisson, <1 burstier")
    parser.add_argument(
        "--max-concurrency", type=positive_int, default=None, help="cap on requests in flight"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--slo", "--goodput", default=None, help="SLOs in ms for goodput, e.g. ttft:200,tpot:50"
    )
    parser.add_argument(
        "--ignore-eos", action="store_true", help="send ignore_eos (vLLM extension): exact lengths"
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="default 0 (greedy), like vLLM's client"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--save-result", default=None, metavar="PATH", help="write the result JSON here")
    parser.add_argument("--disable-tqdm", action="store_true")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from minengine.bench.client import run_benchmark, save_result
    from minengine.bench.datasets import jsonl_requests
    from minengine.metrics.stats import parse_slo

    try:
        slo = parse_slo(args.slo) if args.slo else None
        if not 0 <= args.range_ratio < 1:
            raise ValueError(f"--range-ratio must be in [0, 1), got {args.range_ratio}")
        requests = None
        if args.dataset == "jsonl":
            if not args.dataset_path:
                raise ValueError("--dataset jsonl needs --dataset-path")
            requests = jsonl_requests(args.dataset_path, args.num_prompts, default_output_len=args.output_len)
        elif args.dataset_path:
            raise ValueError("--dataset-path is for --dataset jsonl")
        summary = asyncio.run(
            run_benchmark(
                args.base_url,
                endpoint=args.endpoint,
                model=args.model,
                requests=requests,
                num_prompts=args.num_prompts or 100,
                input_len=args.input_len,
                output_len=args.output_len,
                range_ratio=args.range_ratio,
                prefix_len=args.prefix_len,
                tokenizer=args.tokenizer,
                request_rate=args.request_rate,
                burstiness=args.burstiness,
                max_concurrency=args.max_concurrency,
                seed=args.seed,
                slo=slo,
                ignore_eos=args.ignore_eos,
                temperature=args.temperature,
                api_key=args.api_key,
                timeout=args.timeout,
                disable_tqdm=args.disable_tqdm,
            )
        )
    except (ValueError, RuntimeError, OSError) as e:
        print(f"minengine bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("minengine bench: interrupted", file=sys.stderr)
        return 130
    print(summary.format_table())
    for note in summary.notes:
        print(f"note: {note}", file=sys.stderr)
    if summary.errors:
        print(f"{len(summary.errors)} requests failed; first error: {summary.errors[0]}", file=sys.stderr)
    if args.save_result:
        save_result(summary, args.save_result)
        print(f"result saved to {args.save_result}", file=sys.stderr)
    return 0 if not summary.errors else 1


