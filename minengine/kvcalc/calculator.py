"""KV-cache calculator: how many bytes the cache takes, and how many requests fit on a GPU.

The general per-token size is ``2 (K and V) x layers x num_key_value_heads x head_dim x bytes``. The
course's seed text writes it with the hidden size, ``2 x layers x hidden x bytes``: that is the MHA
special case (kv_heads x head_dim == hidden); GQA/MQA shrink it by sharing KV heads, MLA (DeepSeek-V2/V3)
caches one compressed latent per layer, and sliding-window layers stop growing at the window.

Capacity follows vLLM's startup line: KV budget = GPU memory x gpu_memory_utilization - weights -
activation reserve; "GPU KV cache size: N tokens"; "Maximum concurrency for L tokens per request: Xx".
All numbers are per GPU unless a name says otherwise. This module must not import torch (``minengine kv``
should answer instantly).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from minengine.perf.hardware import Accelerator, get_accelerator
from minengine.perf.model_input import load_model_spec
from minengine.perf.model_presets import PRESETS
from minengine.perf.model_spec import (
    DTYPE_BITS,
    KV_CACHE_DTYPES,
    KVCalcError,
    KVSpec,
    dtype_bits,
    estimate_num_params,
    from_hf_config,
    from_hub,
    list_presets,
    model_dtype_of,
    normalise_dtype,
    weight_dtype_of,
)
from minengine.utils import cdiv

GiB = 2**30

DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size
# Round allowance for activations at the profiling batch, CUDA graphs and the CUDA context (vLLM measures
# this at startup; 1-3 GiB is typical for 7-8B models). Override it when you know better.
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * GiB
MAX_CONTEXT_SEARCH = 2**24  # the "max context" search stops here (reached only when every layer slides)


__all__ = [
    "GiB", "DEFAULT_ACTIVATION_RESERVE_BYTES", "DEFAULT_BLOCK_SIZE", "MAX_CONTEXT_SEARCH", "DTYPE_BITS",
    "KV_CACHE_DTYPES", "PRESETS", "KVCalcError", "KVEstimate", "KVSpec", "dtype_bytes", "estimate",
    "estimate_num_params", "format_bytes", "from_hf_config", "from_hub", "kv_bytes_mha", "kv_bytes_per_batch",
    "kv_bytes_per_sequence", "kv_bytes_per_token", "kv_bytes_per_token_per_layer", "kv_cache_budget",
    "kv_heads_per_rank", "list_presets", "load_model_spec", "max_context_for_batch", "normalise_dtype",
    "tokens_held", "model_dtype_of", "weight_bytes", "weight_dtype_of",
]


# ------------------------------------------------------------------------------------------ byte counts
# Every function below that takes ``spec`` accepts whatever ``load_model_spec`` does: a KVSpec, an HF config
# dict, a config.json path or folder, a preset name, a hub id or a ModelConfig (ModelSpec below).
ModelSpec = KVSpec | dict[str, Any] | str | Path | Any


def dtype_bytes(dtype: str) -> float:
    return dtype_bits(dtype) / 8


def kv_heads_per_rank(spec: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """KV heads one GPU holds. Heads split across ranks; with more ranks than heads they are replicated."""
    spec = load_model_spec(spec)
    tp = tensor_parallel_size
    if tp < 1:
        raise KVCalcError("tensor_parallel_size must be >= 1")
    if spec.num_attention_heads % tp:
        raise KVCalcError(f"{spec.num_attention_heads} attention heads do not split over TP={tp}")
    if spec.is_mla:  # vLLM keeps the whole latent on every rank: nothing to split
        return 1
    if tp <= spec.num_kv_heads:
        if spec.num_kv_heads % tp:
            raise KVCalcError(f"{spec.num_kv_heads} KV heads do not split evenly over TP={tp}")
        return spec.num_kv_heads // tp
    if tp % spec.num_kv_heads:
        raise KVCalcError(f"TP={tp} is not a multiple of the {spec.num_kv_heads} KV heads to replicate")
    return 1


def kv_bytes_per_token_per_layer(spec: ModelSpec, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1,
                                 quant_group_size: int | None = None, scale_bytes: int = 2) -> int:
    """Bytes one token adds to one layer on one GPU.

    Quantised caches may store one scale (``scale_bytes``, fp16 by default) per ``quant_group_size``
    elements; that overhead is what makes int4 cost a little more than half a byte per element.
    """
    spec = load_model_spec(spec)
    dtype = normalise_dtype(kv_cache_dtype)
    dtype = spec.dtype if dtype == "auto" else dtype
    elements = spec.kv_elements_per_token_per_layer(kv_heads_per_rank(spec, tensor_parallel_size))
    size = math.ceil(elements * DTYPE_BITS[dtype] / 8)
    if quant_group_size:
        if quant_group_size < 1:
            raise KVCalcError("quant_group_size must be >= 1")
        size += math.ceil(elements / quant_group_size) * scale_bytes
    return size


def kv_bytes_per_token(spec: ModelSpec, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1,
                       quant_group_size: int | None = None, scale_bytes: int = 2) -> int:
    """Bytes one token adds across all layers on one GPU (before any sliding window caps it).

    The one per-token count: for a dense model 2 x layers x kv_heads x head_dim x bytes per element (the
    engine sizes its cache with it too, through its ModelConfig).
    """
    spec = load_model_spec(spec)
    return spec.num_layers * kv_bytes_per_token_per_layer(spec, kv_cache_dtype, tensor_parallel_size,
                                                          quant_group_size, scale_bytes)


def tokens_held(num_tokens: int, window: int | None, block_size: int | None = None) -> int:
    """Token slots a layer keeps for a sequence: capped at the window, rounded up to whole blocks.

    A window that does not start on a block boundary straddles one extra block, so a paged sliding layer
    keeps up to ``cdiv(window - 1, block_size) + 1`` blocks (vLLM reserves the same).
    """
    bs = block_size or 1
    blocks = cdiv(num_tokens, bs)
    if window is not None and num_tokens > window:
        blocks = min(blocks, cdiv(window - 1, bs) + 1)
    return blocks * bs


def kv_bytes_per_sequence(spec: ModelSpec, num_tokens: int, kv_cache_dtype: str = "auto",
                          tensor_parallel_size: int = 1, block_size: int | None = None,
                          quant_group_size: int | None = None, scale_bytes: int = 2) -> int:
    """Bytes one sequence of ``num_tokens`` tokens holds on one GPU (windows and paging applied)."""
    spec = load_model_spec(spec)
    if num_tokens < 0:
        raise KVCalcError("the number of tokens must be >= 0")
    per_layer = kv_bytes_per_token_per_layer(spec, kv_cache_dtype, tensor_parallel_size, quant_group_size,
                                             scale_bytes)
    return per_layer * sum(tokens_held(num_tokens, w, block_size) for w in spec.layer_windows)


def kv_bytes_per_batch(spec: ModelSpec, num_tokens: int, batch_size: int, **kwargs: Any) -> int:
    """Bytes for ``batch_size`` sequences of ``num_tokens`` each, on one GPU."""
    return batch_size * kv_bytes_per_sequence(spec, num_tokens, **kwargs)


def kv_bytes_mha(num_layers: int, hidden_size: int, seq_len: int, batch_size: int, bytes_per_element: float
                 ) -> float:
    """The seed text's formula, 2 x layers x hidden x seq_len x batch x bytes: exact only for MHA."""
    return 2 * num_layers * hidden_size * seq_len * batch_size * bytes_per_element


def weight_bytes(spec: ModelSpec, weight_dtype: str | None = None, tensor_parallel_size: int = 1
                 ) -> int | None:
    """Parameters x bytes per parameter, split evenly over TP ranks (embeddings' extra copies ignored)."""
    spec = load_model_spec(spec)
    if spec.num_params is None:
        return None
    dtype = normalise_dtype(weight_dtype or spec.weight_dtype)
    dtype = spec.weight_dtype if dtype == "auto" else dtype
    return math.ceil(spec.num_params * DTYPE_BITS[dtype] / 8 / tensor_parallel_size)


# ------------------------------------------------------------------------------------------------ capacity
@dataclass(frozen=True)
class KVEstimate:
    """Everything the CLI table and the widget show. Byte counts are per GPU."""

    spec: KVSpec
    context_len: int
    batch_size: int
    kv_cache_dtype: str
    tensor_parallel_size: int
    block_size: int
    bytes_per_token: int
    bytes_per_sequence: int
    total_bytes: int
    gpu: Accelerator | None = None
    gpu_memory_utilization: float = 0.9
    weight_dtype: str | None = None
    weight_bytes: int | None = None
    activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES
    kv_budget_bytes: int | None = None
    num_gpu_blocks: int | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_context_len: int | None = None
    max_context_limited_by_model: bool = False
    fits: bool | None = None
    warnings: tuple[str, ...] = ()

    @property
    def total_bytes_all_gpus(self) -> int:
        return self.total_bytes * self.tensor_parallel_size

    @property
    def max_num_seqs(self) -> int | None:
        return None if self.max_concurrency is None else int(self.max_concurrency)


def kv_cache_budget(memory_bytes: int, gpu_memory_utilization: float, weight_bytes: int,
                    activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES) -> int:
    """Bytes left for the KV cache on one GPU (may be negative: then nothing fits)."""
    return int(memory_bytes * gpu_memory_utilization) - weight_bytes - activation_reserve_bytes


def max_context_for_batch(seq_bytes_at: Callable[[int], int], batch_size: int, budget: int,
                          ceiling: int) -> int:
    """Largest context whose batch fits the budget (binary search; bytes grow with context)."""
    if batch_size * seq_bytes_at(ceiling) <= budget:
        return ceiling
    lo, hi = 0, ceiling  # invariant: lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if batch_size * seq_bytes_at(mid) <= budget else (lo, mid)
    return lo


def estimate(model: ModelSpec, context_len: int, batch_size: int = 1, *,
             kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1,
             block_size: int = DEFAULT_BLOCK_SIZE, gpu: str | Accelerator | None = None,
             gpu_memory_utilization: float = 0.9, weight_dtype: str | None = None,
             num_params: int | None = None,
             activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
             quant_group_size: int | None = None, scale_bytes: int = 2) -> KVEstimate:
    """KV size for a batch and, given a GPU, the capacity plan vLLM would print at startup."""
    spec = load_model_spec(model)
    if num_params is not None:
        spec = replace(spec, num_params=int(num_params))
    if context_len < 1 or batch_size < 1 or block_size < 1:
        raise KVCalcError("context, batch size and block size must all be >= 1")
    if not 0 < gpu_memory_utilization <= 1:
        raise KVCalcError("gpu_memory_utilization must be in (0, 1]")
    if activation_reserve_bytes < 0:
        raise KVCalcError("the activation reserve must be >= 0")
    dtype = normalise_dtype(kv_cache_dtype)
    dtype = spec.dtype if dtype == "auto" else dtype
    kw = dict(kv_cache_dtype=dtype, tensor_parallel_size=tensor_parallel_size,
              quant_group_size=quant_group_size, scale_bytes=scale_bytes)
    per_token = kv_bytes_per_token(spec, **kw)

    def seq_bytes_at(n: int) -> int:
        return kv_bytes_per_sequence(spec, n, block_size=block_size, **kw)

    per_seq = seq_bytes_at(context_len)
    warnings = []
    if spec.max_position_embeddings and context_len > spec.max_position_embeddings:
        warnings.append(f"context {context_len:,} exceeds the model's max_position_embeddings "
                        f"({spec.max_position_embeddings:,})")
    result = dict(spec=spec, context_len=context_len, batch_size=batch_size, kv_cache_dtype=dtype,
                  tensor_parallel_size=tensor_parallel_size, block_size=block_size,
                  bytes_per_token=per_token, bytes_per_sequence=per_seq, total_bytes=batch_size * per_seq,
                  gpu_memory_utilization=gpu_memory_utilization,
                  activation_reserve_bytes=activation_reserve_bytes)
    if gpu is None:
        return KVEstimate(**result, warnings=tuple(warnings))
    acc = get_accelerator(gpu)
    wdtype = normalise_dtype(weight_dtype or "auto")
    wdtype = spec.weight_dtype if wdtype == "auto" else wdtype
    weights = weight_bytes(spec, wdtype, tensor_parallel_size)
    result.update(gpu=acc, weight_dtype=wdtype, weight_bytes=weights)
    if weights is None:
        warnings.append("parameter count unknown, so no capacity plan: pass num_params (--params)")
        return KVEstimate(**result, warnings=tuple(warnings))
    budget = kv_cache_budget(acc.memory_bytes, gpu_memory_utilization, weights, activation_reserve_bytes)
    if budget <= 0:
        warnings.append(f"weights ({weights / GiB:.1f} GiB per GPU) leave no room for the KV cache on "
                        f"{acc.name}: add GPUs (tensor parallel) or quantise the weights")
    budget = max(budget, 0)
    num_blocks = budget // (block_size * per_token)
    # Search up to the model's limit; past it (a what-if beyond max_position_embeddings) memory alone decides.
    model_max = spec.max_position_embeddings
    ceiling = model_max if model_max and context_len <= model_max else MAX_CONTEXT_SEARCH
    max_ctx = max_context_for_batch(seq_bytes_at, batch_size, budget, ceiling)
    result.update(kv_budget_bytes=budget, num_gpu_blocks=num_blocks, kv_cache_tokens=num_blocks * block_size,
                  max_concurrency=budget / per_seq, max_context_len=max_ctx,
                  max_context_limited_by_model=max_ctx == ceiling == model_max,
                  fits=batch_size * per_seq <= budget)
    return KVEstimate(**result, warnings=tuple(warnings))


def format_bytes(n: float) -> str:
    """Binary units, as memory is sized: 131072 -> '128.0 KiB'."""
    for unit, size in (("TiB", 2**40), ("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}" if unit in ("GiB", "TiB") else f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"
