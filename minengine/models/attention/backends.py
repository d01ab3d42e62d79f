"""The attention seam: every way the engine attends is a backend with the same two methods.

    meta = backend.build_metadata(query_lens, seq_lens, block_tables, block_size, device)   # once a step
    out  = backend.forward(q, k, v, kv_cache, meta, scale, sliding_window)                # every layer

``build_metadata`` turns the scheduler's step (how many new tokens each request has, how long its context
is, which KV blocks hold it) into whatever the backend's kernels read; ``forward`` writes the new tokens'
K/V into the paged cache and attends, prefill chunks (with or without cached context), decodes and mixed
steps alike. The model never knows which backend runs: each layer calls ``meta.backend.forward``.

Backends (``EngineConfig.attention_backend``; the engine reports which one it runs and why):

- ``"gather"``: the readable reference in PyTorch (``reference.py``): each context is gathered out of
  its blocks, then SDPA. Runs everywhere; every other backend is tested against it.
- ``"cpp"``: a CPU's default in fp32: decodes read the cache in place in a C++ kernel
  (``models/csrc/paged_attention.cpp``), and so do chunks of at most ``SHORT_CHUNK_TOKENS`` (a
  speculative verify), one kernel row per token; longer prompt chunks take the reference path.
- ``"triton"``: a GPU's default: one Triton kernel per layer for the whole step, reading the pages in
  place (``triton_kernels.py``). CI runs it on a CPU under ``TRITON_INTERPRET=1``.

vLLM has the same seam (``AttentionBackend``, its metadata builder and ``AttentionImpl.forward``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from minengine.config import ATTENTION_BACKENDS
from minengine.models.attention.reference import AttentionMetadata, KVCache, paged_attention
from minengine.utils import cdiv


class AttentionBackend:
    """The seam: metadata once a step, then ``forward`` in every layer (see the module doc)."""

    name: ClassVar[str]

    def build_metadata(self, query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]],
                       block_size: int, device: torch.device) -> Any:
        raise NotImplementedError

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache | None,
                meta: Any, scale: float, sliding_window: int | None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class ReferenceBackend(AttentionBackend):
    """Gather each context out of its blocks, then SDPA: slow, short, and the yardstick of the others."""

    name = "gather"

    def build_metadata(self, query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]],
                       block_size: int, device: torch.device) -> AttentionMetadata:
        return AttentionMetadata.build(query_lens, seq_lens, block_tables, block_size, device=device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache | None,
                meta: Any, scale: float, sliding_window: int | None) -> torch.Tensor:
        return paged_attention(q, k, v, kv_cache, meta, scale, sliding_window)


# A chunk of at most this many tokens is attended by the decode kernel, one row per token, each row
# seeing the context up to its own position (causal by seq_len). A speculative verify (1 + k tokens) is
# such a chunk: through the reference path it gathered its whole context and ran a masked SDPA, which
# made a verify step of SmolLM2-135M cost ~1.4x a decode step. The price: each row re-reads the context,
# k + 1 reads instead of one, small next to the weights at these lengths.
SHORT_CHUNK_TOKENS = 8


class CppBackend(ReferenceBackend):
    """The reference path, with the step's decodes and short chunks attended in place by the CPU's C++
    kernel (fp32)."""

    name = "cpp"

    def build_metadata(self, query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]],
                       block_size: int, device: torch.device) -> AttentionMetadata:
        from minengine.models.paged_decode import build_decode_batch

        meta = AttentionMetadata.build(query_lens, seq_lens, block_tables, block_size, device=device)
        rows, tables, lens = [], [], []
        for i, (n, s) in enumerate(zip(query_lens, seq_lens, strict=True)):
            if n <= SHORT_CHUNK_TOKENS:  # token j of the chunk sees the context up to itself
                start = meta.query_start_loc[i]
                rows += range(start, start + n)
                tables += [block_tables[i]] * n
                lens += range(s - n + 1, s + 1)
        if rows:
            batch = build_decode_batch(tables, lens, block_size, 0, backend="cpp", device=device)
            # the rows of the packed batch these are: a sequence's index is its row only while no prompt
            # chunk comes before it in the step (a running request's next chunk can)
            batch.rows = torch.tensor(rows, device=device)
            meta.decode_batch = batch
            meta.fast_chunks = frozenset(i for i, n in enumerate(query_lens) if 1 < n <= SHORT_CHUNK_TOKENS)
        return meta


@dataclass
class TritonAttentionMetadata:
    """The step as the Triton kernel reads it: device tensors only, so a CUDA graph can replay it.

    query_start_loc [B+1] int32, seq_lens [B] int32, block_tables [B, W] int32 (W: the most blocks any
    row uses), slot_mapping [N] int64 (where each new token's K/V goes), max_query_len (picks the tile
    shape: 1 in a decode-only step).
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    max_query_len: int
    backend: TritonBackend

    def prepare(self, device: torch.device, sliding_windows: Any = ()) -> None:
        """Nothing to build per layer: the tensors are the metadata (the model calls this on any kind)."""


class TritonBackend(AttentionBackend):
    """One Triton kernel per layer for the whole step, over the block table (``triton_kernels.py``)."""

    name = "triton"

    def __init__(self) -> None:
        from minengine.models.attention.triton_kernels import triton_available

        reason = triton_available()
        if reason is not None:
            raise RuntimeError(f"attention_backend='triton' cannot run here: {reason}. "
                               "Use attention_backend='gather' (the reference path) instead")

    def build_metadata(self, query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]],
                       block_size: int, device: torch.device) -> TritonAttentionMetadata:
        loc, slots = [0], []
        for q, s, table in zip(query_lens, seq_lens, block_tables, strict=True):
            if len(table) * block_size < s:
                raise ValueError(f"block table {table} holds {len(table) * block_size} < {s} tokens")
            loc.append(loc[-1] + q)
            slots += [table[p // block_size] * block_size + p % block_size for p in range(s - q, s)]
        width = max(cdiv(s, block_size) for s in seq_lens)
        tables = [t[:width] + [0] * (width - min(len(t), width)) for t in block_tables]
        # One host-to-device copy for both int vectors; seq_lens starts 16-byte aligned, since Triton
        # compiles a kernel variant per pointer alignment (an unaligned one compiled mid-run on an H200)
        n, start = len(seq_lens), cdiv(len(seq_lens) + 1, 4) * 4
        ints = torch.tensor(loc + [0] * (start - n - 1) + list(seq_lens), dtype=torch.int32)
        ints = _to_device(ints, device)
        return TritonAttentionMetadata(
            query_start_loc=ints[: n + 1], seq_lens=ints[start:],
            block_tables=_to_device(torch.tensor(tables, dtype=torch.int32), device),
            slot_mapping=_to_device(torch.tensor(slots, dtype=torch.long), device),
            max_query_len=max(query_lens), backend=self,
        )

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache | None,
                meta: Any, scale: float, sliding_window: int | None) -> torch.Tensor:
        from minengine.models.attention import triton_kernels

        if kv_cache is None:
            raise ValueError("the triton backend attends over the paged KV cache: pass kv_cache")
        k_cache, v_cache = kv_cache
        triton_kernels.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        return triton_kernels.paged_attention(
            q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, meta.max_query_len,
            scale, sliding_window,
        )


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def get_attention_backend(name: str) -> AttentionBackend:
    """The backend called ``name`` (raises with the reason when it cannot run on this machine)."""
    backends = {cls.name: cls for cls in (ReferenceBackend, CppBackend, TritonBackend)}
    assert tuple(backends) == ATTENTION_BACKENDS, "config.ATTENTION_BACKENDS names every backend, in order"
    if name not in backends:
        raise ValueError(f"unknown attention backend {name!r}: use one of {', '.join(ATTENTION_BACKENDS)}")
    return backends[name]()
