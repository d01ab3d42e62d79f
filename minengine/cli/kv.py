"""``minengine kv``: the KV-cache calculator on the command line (its flags and exit codes).

The arithmetic is ``minengine.kvcalc``, the wording ``minengine.kvcalc.report`` (shared with the widget).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys

from minengine.kvcalc import (
    DEFAULT_ACTIVATION_RESERVE_BYTES,
    DEFAULT_BLOCK_SIZE,
    KV_CACHE_DTYPES,
    GiB,
    KVCalcError,
    estimate,
    load_model_spec,
    normalise_dtype,
)
from minengine.kvcalc.report import explain, format_estimate, list_text
from minengine.perf.hardware import ACCELERATORS, UnknownAcceleratorError, get_accelerator

_SUFFIXES = {"": 1, "k": 2**10, "m": 2**20}  # context lengths: 128K = 131,072 tokens, as the seeds count
_PARAM_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}  # parameter counts: decimal


def _parse_scaled(text: str, suffixes: dict[str, int], what: str) -> int:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]?)\s*", text.lower())
    if not match or match.group(2) not in suffixes:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {what} (examples: "
                                         + ("4096, 128K" if "k" in suffixes and "b" not in suffixes
                                            else "7e9, 7B, 70.6B") + ")")
    return int(float(match.group(1)) * suffixes[match.group(2)])


def parse_tokens(text: str) -> int:
    """'4096' -> 4096, '128K' -> 131072, '1M' -> 1048576."""
    return _parse_scaled(text, _SUFFIXES, "token count")


def parse_params(text: str) -> int:
    """'7B' -> 7e9, '8.03e9' -> 8030000000."""
    return _parse_scaled(text, _PARAM_SUFFIXES, "parameter count")


def _dtype(text: str) -> str:
    try:
        return normalise_dtype(text)
    except KVCalcError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _gpu(text: str) -> str:
    try:
        return get_accelerator(text).key
    except UnknownAcceleratorError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in (0, 1]")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags follow vLLM's names where vLLM has one (--tensor-parallel-size, --block-size, ...)."""
    parser.add_argument("--model", "-m", help="preset key, hub id, or path to a config.json (see --list)")
    parser.add_argument("--context", "-c", type=parse_tokens, default=4096,
                        help="tokens per sequence, prompt + output (4096, 128K; default 4096)")
    parser.add_argument("--batch", "-b", type=int, default=1, help="concurrent sequences (default 1)")
    parser.add_argument("--dtype", "--kv-cache-dtype", dest="dtype", type=_dtype, default="auto",
                        help=f"KV cache dtype: {', '.join(KV_CACHE_DTYPES)} (auto = the model's dtype)")
    parser.add_argument("--gpu", type=_gpu, default=None,
                        help=f"accelerator for the capacity plan: {', '.join(ACCELERATORS)}")
    parser.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=1,
                        help="tensor-parallel GPUs sharing the model (default 1)")
    parser.add_argument("--gpu-memory-utilization", type=_fraction, default=0.9,
                        help="fraction of GPU memory the server may use (vLLM's default 0.9)")
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE,
                        help=f"paged-cache block size in tokens (default {DEFAULT_BLOCK_SIZE})")
    parser.add_argument("--weight-dtype", type=_dtype, default="auto",
                        help="dtype the weights are stored in (auto = from config.json)")
    parser.add_argument("--params", type=parse_params, default=None,
                        help="parameter count for weight bytes, e.g. 7B (default: preset or config estimate)")
    parser.add_argument("--activation-reserve-gib", type=float,
                        default=DEFAULT_ACTIVATION_RESERVE_BYTES / GiB,
                        help="memory kept for activations, CUDA graphs and context (default 2 GiB)")
    parser.add_argument("--quant-group-size", type=int, default=None,
                        help="elements per quantisation scale (adds one fp16 scale per group)")
    parser.add_argument("--disable-sliding-window", action="store_true",
                        help="cache every token in every layer, as vLLM's flag of the same name")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    parser.add_argument("--list", action="store_true", help="list model presets and GPUs, then exit")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``minengine kv``; bad input prints one line and returns 2."""
    if args.list:
        print(list_text())
        return 0
    if not args.model:
        print("minengine kv: error: --model is required (try --list, or --model llama-3.1-8b)",
              file=sys.stderr)
        return 2
    try:
        if args.activation_reserve_gib < 0:
            raise KVCalcError("--activation-reserve-gib must be >= 0")
        spec = load_model_spec(args.model, disable_sliding_window=args.disable_sliding_window)
        est = estimate(spec, args.context, args.batch, kv_cache_dtype=args.dtype,
                       tensor_parallel_size=args.tp, block_size=args.block_size, gpu=args.gpu,
                       gpu_memory_utilization=args.gpu_memory_utilization, weight_dtype=args.weight_dtype,
                       num_params=args.params,
                       activation_reserve_bytes=int(args.activation_reserve_gib * GiB),
                       quant_group_size=args.quant_group_size)
    except (KVCalcError, UnknownAcceleratorError) as exc:
        print(f"minengine kv: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(dataclasses.asdict(est), indent=2))
    else:
        print(format_estimate(est))
        print()
        print(explain(est))
    return 0


def add_kv_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "kv", help="KV-cache size and capacity calculator",
        description="How much memory the KV cache takes, and how many sequences fit on a GPU. Example: "
                    "minengine kv --model llama-3.1-8b --context 8192 --batch 16 --gpu h100",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)
