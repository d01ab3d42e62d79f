"""Attention over the paged KV cache, behind one seam (``backends.py``): the reference path in
``reference.py``, the CPU's C++ decode kernel, and the GPU's Triton kernel (``triton_kernels.py``)."""

from typing import Any

import torch

from minengine.models.attention.reference import (
    AttentionMetadata,
    KVCache,
    allocate_kv_cache,
    paged_attention,
)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache | None, meta: Any,
                      scale: float, sliding_window: int | None) -> torch.Tensor:
    """What a layer calls: the backend that built ``meta`` attends (plain ``AttentionMetadata``, which
    a lesson or a test may build by hand, and a compiled step's tensors take the reference path)."""
    backend = getattr(meta, "backend", None)
    if backend is None:
        return paged_attention(q, k, v, kv_cache, meta, scale, sliding_window)
    return backend.forward(q, k, v, kv_cache, meta, scale, sliding_window)


__all__ = ["AttentionMetadata", "KVCache", "allocate_kv_cache", "attention_forward", "paged_attention"]
