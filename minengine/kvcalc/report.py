"""An estimate for people: the table and the plain-English story shared by ``minengine kv`` and the
KV-calculator widget, so both always say the same thing."""

from __future__ import annotations

from minengine.kvcalc.calculator import (
    DTYPE_BITS,
    MAX_CONTEXT_SEARCH,
    PRESETS,
    KVEstimate,
    format_bytes,
    load_model_spec,
)
from minengine.perf.hardware import ACCELERATORS


def title(est: KVEstimate) -> str:
    spec, tp = est.spec, est.tensor_parallel_size
    name = spec.name + (f" ({spec.hf_id})" if spec.hf_id and spec.hf_id != spec.name else "")
    where = f" on {tp} x {est.gpu.name}" if est.gpu else ""
    return f"KV cache: {name}{where}" + (f" (tensor parallel {tp}; byte counts are per GPU)" if tp > 1
                                         else "")


def estimate_rows(est: KVEstimate) -> list[tuple[str, str, str]]:
    """(label, value, note) rows shared by the CLI table and the notebook widget."""
    spec, tp = est.spec, est.tensor_parallel_size
    per_gpu = " per GPU" if tp > 1 else ""
    elem_bytes = DTYPE_BITS[est.kv_cache_dtype] / 8
    rows = [
        ("attention", spec.describe(), ""),
        ("KV cache dtype", est.kv_cache_dtype,
         f"({elem_bytes:g} bytes per element, block_size {est.block_size})"),
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
         f"(at batch {est.batch_size:,}" + ("; the model's limit)" if est.max_context_limited_by_model
                                            else ")")),
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
    text = (f"Each token costs {format_bytes(est.bytes_per_token)} of KV cache, so one "
            f"{est.context_len:,}-token sequence holds {format_bytes(est.bytes_per_sequence)} and a batch of "
            f"{est.batch_size:,} holds {format_bytes(est.total_bytes)}.")
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
        lines.append(f"  {acc.key:<18}{acc.name:<28}{acc.bf16_tflops:>7.0f} TFLOP/s {acc.memory_gib:>5.0f} "
                     f"GiB {acc.bandwidth_bytes_per_s / 1e12:>5.2f} TB/s")
    return "\n".join(lines)
