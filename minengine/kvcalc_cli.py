"""``minengine kv``: the KV-cache calculator on the command line (arguments, table, plain-English story).

Kept apart from ``minengine.cli`` so the CLI entry point stays a thin list of subcommands, and apart from
``minengine.kvcalc`` so the library holds no printing.
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
    DTYPE_BITS,
    KV_CACHE_DTYPES,
    MAX_CONTEXT_SEARCH,
    PRESETS,
    GiB,
    KVCalcError,
    KVEstimate,
    estimate,
    format_bytes,
    load_model_spec,
    normalise_dtype,
)
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
    parser.add_argument("--activation-reserve-gib", type=float, default=DEFAULT_ACTIVATION_RESERVE_BYTES / GiB,
                        help="memory kept for activations, CUDA graphs and context (default 2 GiB)")
    parser.add_argument("--quant-group-size", type=int, default=None,
                        help="elements per quantisation scale (adds one fp16 scale per group)")
    parser.add_argument("--disable-sliding-window", action="store_true",
                        help="cache every token in every layer, as vLLM's flag of the same name")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    parser.add_argument("--list", action="store_true", help="list model presets and GPUs, then exit")


def title(est: KVEstimate) -> str:
    spec, tp = est.spec, est.tensor_parallel_size
    name = spec.name + (f" ({spec.hf_id})" if spec.hf_id and spec.hf_id != spec.name else "")
    where = f" on {tp} x {est.gpu.name}" if est.gpu else ""
    return f"KV cache: {name}{where}" + (f" (tensor parallel {tp}; byte counts are per GPU)" if tp > 1 else "")


def estimate_rows(est: KVEstimate) -> list[tuple[str, str, str]]:
    """(label, value, note) rows shared by the CLI table and the notebook widget."""
    spec, tp = est.spec, est.tensor_parallel_size
    per_gpu = " per GPU" if tp > 1 else ""
    elem_bytes = DTYPE_BITS[est.kv_cache_dtype] / 8
    rows = [
        ("attention", spec.describe(), ""),
        ("KV cache dtype", est.kv_cache_dtype, f"({elem_bytes:g} bytes per element, block_size {est.block_size})"),
        ("per token", format_bytes(est.bytes_per_token), f"({est.bytes_per_token:,} B{per_gpu})"),
        ("per sequence", format_bytes(est.bytes_per_sequence), f"({est.context_len:,} tokens)"),
        ("total", format_bytes(est.total_bytes), f"(batch {est.batch_size:,}"
         + (f"; {format_bytes(est.total_bytes_all_gpus)} over {tp} GPUs)" if tp > 1 else ")")),
    ]
    if est.gpu is None or est.weight_bytes is None or est.kv_budget_bytes is None:
        return rows
    params = spec.num_params or 0
    used = f"({est.total_bytes / est.kv_budget_bytes:.1%} of the KV budget)" if est.kv_budget_bytes else ""
    return rows + [
        ("weights", format_bytes(est.weight_bytes), f"({params / 1e9:.2f} B params in {est.weight_dtype} = "
         f"{est.weight_bytes * tp / 1e9:.1f} GB" + (f", over {tp} GPUs)" if tp > 1 else ")")),
        ("KV budget", format_bytes(est.kv_budget_bytes),
         f"({est.gpu_memory_utilization:.2f} x {format_bytes(est.gpu.memory_bytes)} - weights - "
         f"{format_bytes(est.activation_reserve_bytes)} reserve)"),
        ("fits", "yes" if est.fits else "NO", used or "(no room left for the KV cache)"),
        ("GPU KV cache size", f"{est.kv_cache_tokens:,} tokens", f"({est.num_gpu_blocks:,} blocks)"),
        ("max concurrency", f"{est.max_num_seqs:,} sequences",
         f"({est.max_concurrency:.2f}x for {est.context_len:,} tokens per request)"),
        ("max context", _max_context(est),
         f"(at batch {est.batch_size:,}" + ("; the model's limit)" if est.max_context_limited_by_model else ")")),
    ]


def _max_context(est: KVEstimate) -> str:
    if (est.max_context_len or 0) >= MAX_CONTEXT_SEARCH:
        return "no memory limit"  # every layer slides: the cache stops growing at the window
    return f"{est.max_context_len:,} tokens"


def format_estimate(est: KVEstimate) -> str:
    """The table ``minengine kv`` prints: sizes first, then the capacity plan when a GPU is given."""
    lines = [title(est)]
    lines += [f"  {label:<20}{value:<20}{note}".rstrip() for label, value, note in estimate_rows(est)]
    if est.gpu is None:
        lines.append("  (pass --gpu for the capacity plan: weights, KV budget, max concurrency)")
    lines += [f"  note: {w}" for w in est.warnings]
    return "\n".join(lines)


def explain(est: KVEstimate) -> str:
    """The capacity story in sentences (the seeds' "128K context on a 7B model" told for any input)."""
    text = (f"Each token costs {format_bytes(est.bytes_per_token)} of KV cache, so one {est.context_len:,}-token "
            f"sequence holds {format_bytes(est.bytes_per_sequence)} and a batch of {est.batch_size:,} holds "
            f"{format_bytes(est.total_bytes)}.")
    if est.gpu is None or est.kv_budget_bytes is None or est.weight_bytes is None:
        return text
    text += (f" On {est.gpu.name} the weights take {format_bytes(est.weight_bytes)}, leaving "
             f"{format_bytes(est.kv_budget_bytes)} for the cache, so the batch "
             + ("fits." if est.fits else "does not fit."))
    seqs = est.max_num_seqs or 0
    text += (f" Not one {est.context_len:,}-token sequence fits" if seqs == 0 else
             f" Up to {seqs:,} sequences of {est.context_len:,} tokens fit at once")
    if (est.max_context_len or 0) >= MAX_CONTEXT_SEARCH:
        return text + "; every layer slides over a window, so longer contexts need no more memory."
    text += (f"; at batch {est.batch_size:,} the longest context that fits is {est.max_context_len:,} tokens"
             + (" (the model's own limit)." if est.max_context_limited_by_model else "."))
    return text


def list_text() -> str:
    lines = ["Model presets (offline; values from each model's config.json):"]
    for key in PRESETS:
        spec = load_model_spec(key)
        lines.append(f"  {key:<18}{spec.hf_id or '':<36}{spec.describe()}")
    lines.append("GPUs (dense BF16 TFLOP/s, memory, bandwidth):")
    for acc in ACCELERATORS.values():
        lines.append(f"  {acc.key:<18}{acc.name:<28}{acc.bf16_tflops:>7.0f} TFLOP/s {acc.memory_gib:>5.0f} GiB "
                     f"{acc.bandwidth_bytes_per_s / 1e12:>5.2f} TB/s")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``minengine kv``; bad input prints one line and returns 2."""
    if args.list:
        print(list_text())
        return 0
    if not args.model:
        print("minengine kv: error: --model is required (try --list, or --model llama-3.1-8b)", file=sys.stderr)
        return 2
    try:
        if args.activation_reserve_gib < 0:
            raise KVCalcError("--activation-reserve-gib must be >= 0")
        spec = load_model_spec(args.model, disable_sliding_window=args.disable_sliding_window)
        est = estimate(spec, args.context, args.batch, kv_cache_dtype=args.dtype, tensor_parallel_size=args.tp,
                       block_size=args.block_size, gpu=args.gpu,
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
