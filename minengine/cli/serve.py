"""``minengine serve``: the OpenAI-compatible server on one model (like ``vllm serve``).

    minengine serve --model tinystories-4m --host 127.0.0.1 --port 8000
    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"prompt": "Once upon a time", "max_tokens": 32, "stream": true}'

Heavy imports (torch, fastapi) happen inside ``run`` so ``minengine --help`` stays instant.
"""

from __future__ import annotations

import argparse
import os
import sys

from minengine.cli.validators import port, positive_int


def add_serve_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server (completions, chat, /metrics)",
        description="Serve a model over the OpenAI API with token streaming (SSE) and Prometheus metrics. "
        "Example: minengine serve --model tinystories-4m --port 8000",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="smollm2-135m, tinystories-4m, an HF folder or hub id (default: smollm2-135m when installed)",
    )
    parser.add_argument("--served-model-name", default=None, help="model id clients use (default: --model)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    parser.add_argument("--port", type=port, default=8000)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("MINENGINE_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1/* (default: $MINENGINE_API_KEY)",
    )
    parser.add_argument(
        "--metrics-prefix",
        choices=["minengine", "vllm"],
        default="minengine",
        help="Prometheus name prefix; 'vllm' makes vLLM dashboards work unchanged",
    )
    parser.add_argument("--max-model-len", type=positive_int, default=None)
    parser.add_argument("--max-num-seqs", type=positive_int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=None)
    parser.add_argument(
        "--num-blocks", type=positive_int, default=None, help="KV-cache blocks (default: sized from memory)"
    )
    parser.add_argument("--block-size", type=positive_int, default=None)
    parser.add_argument("--no-prefix-caching", action="store_true", help="turn the prefix cache off")
    parser.add_argument("--no-chunked-prefill", action="store_true", help="turn chunked prefill off")
    parser.add_argument("--compile-decode", action="store_true",
                        help="CPU: run decode steps as one torch.compile'd graph "
                             "(compiles at start-up, ~1 min)")
    add_backend_flags(parser)
    parser.add_argument("--policy", choices=["decode_first", "prefill_first"], default=None)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: best available)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: by device)")
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch CPU threads (default: torch's choice; 1 is fastest for tiny models on busy CPUs)",
    )
    parser.add_argument(
        "--log-level", choices=["critical", "error", "warning", "info", "debug"], default="info"
    )
    parser.set_defaults(func=run)


def add_backend_flags(parser: argparse.ArgumentParser) -> None:
    """--attention-backend, --enforce-eager and --tensor-parallel-size, shared by serve and generate."""
    from minengine.config import ATTENTION_BACKENDS

    parser.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default=None,
                        help="default: triton on CUDA, cpp on a CPU in fp32 "
                             "(the start-up line says which runs)")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--tensor-parallel-size", "-tp", type=positive_int, default=1, metavar="N",
                        help="split the model across N processes (CPU, gloo): each holds 1/N of the heads "
                             "and of the MLP, and they all-reduce twice per layer")


def backend_options(args: argparse.Namespace) -> dict:
    options: dict = {}
    if getattr(args, "attention_backend", None):
        options["attention_backend"] = args.attention_backend
    if getattr(args, "enforce_eager", False):
        options["enforce_eager"] = True
    if getattr(args, "tensor_parallel_size", 1) != 1:
        options["tensor_parallel_size"] = args.tensor_parallel_size
    return options


def engine_options(args: argparse.Namespace) -> dict:
    """The EngineConfig fields the flags set (unset flags keep the engine's defaults)."""
    options = {
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "num_blocks": args.num_blocks,
        "block_size": args.block_size,
        "policy": args.policy,
        "device": args.device,
        "dtype": args.dtype,
    }
    options = {k: v for k, v in options.items() if v is not None}
    if args.no_prefix_caching:
        options["enable_prefix_caching"] = False
    if args.no_chunked_prefill:
        options["enable_chunked_prefill"] = False
    if args.compile_decode:
        options["compile_decode"] = True
    return options | backend_options(args)


def run(args: argparse.Namespace) -> int:
    import logging

    import torch
    import uvicorn

    from minengine.engine.gc_heap import freeze_gc_heap
    from minengine.models.errors import ModelLoadError
    from minengine.server.app import create_app

    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from minengine.models.loader import cli_default_model

    try:
        app = create_app(
            model=args.model or cli_default_model(),
            served_model_name=args.served_model_name,
            api_key=args.api_key,
            metrics_prefix=args.metrics_prefix,
            **engine_options(args),
        )
    except (ModelLoadError, ValueError, TypeError) as e:
        print(f"minengine serve: error: {e}", file=sys.stderr)
        return 2
    engine = app.state.llm.engine
    # What runs, on every device, in one line (backend, graphs, dtype, KV layout, and why each default)
    print(f"minengine: {engine.runtime.describe()}", file=sys.stderr, flush=True)
    # Built and warmed up: keep the start-up heap out of the collector's walks, as vLLM does.
    frozen = freeze_gc_heap()
    print(
        f"minengine: serving {app.state.model_name!r} on {engine.device} "
        f"(max_model_len {engine.config.max_model_len}, {engine.scheduler.block_manager.num_blocks} KV "
        f"blocks of {engine.config.block_size} tokens) at http://{args.host}:{args.port}/v1  "
        f"(metrics: /metrics, health: /health); {frozen:,} start-up objects frozen out of GC walks",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn shuts down gracefully on Ctrl-C, then re-raises the signal
        pass
    return 0 if server.started else 1


