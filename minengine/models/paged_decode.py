"""Decode attention that reads the paged KV cache where it lies: the fast path's attention.

The reference path (``attention.paged_attention``) gathers every decode's context into a fresh tensor,
with shapes that change each step. Here a decode batch is described by fixed-shape tensors only
(``DecodeBatch``), so the same call can be recorded once in a CUDA graph and replayed with new contents:

    block_tables [B, W] int32   each row's physical block ids (W = blocks of the longest allowed sequence)
    num_blocks   [B]    int32   blocks in use per row
    seq_lens     [B]    int64   tokens per row including the new one (the query sits at seq_lens - 1)

Two ways to attend (``backend``):

- ``"gather"``: the static-shape form: gather all W blocks of each row and mask what is past its
  length. It reads W blocks per row whatever the true length: a yardstick for the kernels.
- ``"cpp"``: the CPU's C++ kernel (``cpu_kernels.py``, ``csrc/paged_attention.cpp``): each row's
  blocks read once, in place, up to its own length. No padding, no graph: the CPU's default for fp32.

A GPU attends with the Triton backend instead (``models/attention/triton_kernels.py``), which serves
prompt chunks and decodes in one kernel.

Padding rows (a batch padded up to a CUDA-graph size) point at a scratch block the scheduler never
hands out, with length 1, so they write and read only that block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from minengine.utils import cdiv

DECODE_BACKENDS = ("gather", "cpp")


@dataclass
class DecodeBatch:
    """Fixed-shape description of B single-token sequences in the paged cache (see the module doc)."""

    block_tables: torch.Tensor  # [B, W] int32
    num_blocks: torch.Tensor  # [B] int32
    seq_lens: torch.Tensor  # [B] int64
    block_size: int
    num_cache_blocks: int  # blocks in the cache tensors (the scratch block included)
    backend: str = "cpp"
    rows: torch.Tensor | None = None  # [n <= B] query rows of the packed batch that are these decodes

    def __post_init__(self) -> None:
        if self.backend not in DECODE_BACKENDS:
            raise ValueError(f"unknown decode backend {self.backend!r}: use one of "
                             f"{', '.join(DECODE_BACKENDS)}")

    @property
    def batch_size(self) -> int:
        return int(self.block_tables.shape[0])

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """q [n, H_q, D] (n <= B; missing rows are padding) -> [n, H_q, D]."""
        n = q.shape[0]
        if n < self.batch_size:
            q = torch.cat([q, q.new_zeros((self.batch_size - n, *q.shape[1:]))])
        fn = {"gather": gather_decode, "cpp": cpp_decode}[self.backend]
        return fn(q, k_cache, v_cache, self, scale, sliding_window)[:n]


def build_decode_batch(
    block_tables: list[list[int]],
    seq_lens: list[int],
    block_size: int,
    num_cache_blocks: int,
    *,
    backend: str = "cpp",
    width: int | None = None,
    pad_to: int | None = None,
    pad_block: int | None = None,
    device: torch.device | str = "cpu",
) -> DecodeBatch:
    """A ``DecodeBatch`` for these rows, padded to ``pad_to`` rows (needs ``pad_block``) and W = ``width``."""
    n = len(seq_lens)
    b = pad_to or n
    w = width or max(len(t) for t in block_tables)
    if b > n and pad_block is None:
        raise ValueError("padding rows need a scratch pad_block")
    fill = pad_block if pad_block is not None else 0
    rows: list[list[int]] = []
    used_blocks: list[int] = []
    for i, (table, s) in enumerate(zip(block_tables, seq_lens, strict=True)):
        used = cdiv(s, block_size)
        if used > w or used > len(table):
            raise ValueError(f"row {i}: {s} tokens need {used} blocks; table has {len(table)}, width {w}")
        rows.append(table[:used] + [fill] * (w - used))
        used_blocks.append(used)
    # one tensor per field from plain lists (a tensor per row costs microseconds each, every step)
    tables = torch.tensor(rows + [[fill] * w] * (b - n), dtype=torch.int32)
    num_blocks = torch.tensor(used_blocks + [1] * (b - n), dtype=torch.int32)
    lens = torch.tensor(list(seq_lens) + [1] * (b - n), dtype=torch.long)
    dev = torch.device(device)
    return DecodeBatch(tables.to(dev), num_blocks.to(dev), lens.to(dev), block_size, num_cache_blocks,
                       backend)


def gather_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: DecodeBatch, scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """The static-shape fallback: all W blocks of each row, masked past its length."""
    bsz, w = batch.block_tables.shape
    bs, h_kv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    tables = batch.block_tables.long()
    keys = k_cache[tables].view(bsz, w * bs, h_kv, d).transpose(1, 2).to(q.dtype)
    values = v_cache[tables].view(bsz, w * bs, h_kv, d).transpose(1, 2).to(q.dtype)
    pos = torch.arange(w * bs, device=q.device)
    lens = batch.seq_lens.unsqueeze(1)
    mask = pos < lens
    if sliding_window is not None:
        mask = mask & (pos > lens - 1 - sliding_window)
    mask = mask[:, None, None, :]  # [B, 1, 1, W * bs]
    queries = q.unsqueeze(2)
    gqa = keys.shape[1] != q.shape[1]
    if not gqa:
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
    else:
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale,
                                             enable_gqa=True)
    return out.squeeze(2)


def cpp_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: DecodeBatch, scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """The C++ kernel: each row's own blocks, read in place up to its length (CPU, fp32)."""
    from minengine.models.cpu_kernels import paged_decode_attention

    return paged_decode_attention(q, k_cache, v_cache, batch.block_tables, batch.seq_lens, scale,
                                  sliding_window)


class DecodeTensors(NamedTuple):
    """B decodes described by tensors only, for a *compiled* decode step (``engine/compiled_decode.py``).

    ``AttentionMetadata`` carries Python lists, which ``torch.compile`` would treat as constants (one
    recompile per step); this carries the same facts as tensors whose sizes may vary (B rows, L keys):

        slot_mapping   [B]     int64  where each row's new K/V goes (flat cache slot)
        context_slots  [B, L]  int64  each row's context slots, the new token's included, padded with slot 0
        mask           [B, L]  bool   True where a key is real; None when no row is padded (B == 1)
        query_buffer   [B, H_q, D]    scratch the rotated queries are written to once (optional)
        block_tables   [B, W]  int32  with seq_lens [B] int64: the C++ kernel's inputs; when given, the
                                      graph calls that kernel instead (context_slots and mask unused)

    Full attention only (no sliding window): the compiled path is not offered to windowed models.
    """

    slot_mapping: torch.Tensor
    context_slots: torch.Tensor | None
    mask: torch.Tensor | None
    query_buffer: torch.Tensor | None = None  # [B, H_q, D] scratch: see attend
    block_tables: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None

    def prepare(self, device: torch.device, sliding_windows: Any = ()) -> None:
        """Nothing to build: the runner made the tensors (the model calls this on any metadata)."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               kv_cache: tuple[torch.Tensor, torch.Tensor],
               scale: float) -> torch.Tensor:
        """Write the new K/V, then attend over each row's context where it lies: q [B, H_q, D] -> [B, H_q, D].

        Written as products and sums rather than a gather and SDPA on purpose. Compiled, inductor fuses
        the cache lookups into the loops that use them, so each K and V row is read once, from the cache
        (a gather would copy the context out and SDPA read the copy: three passes over the KV bytes).
        Padding points at slot 0, so its reads hit the same cache line. Run eagerly, this form would
        materialize [B, L, H_q, D] products: it is for the compiled graph only.
        """
        k_cache, v_cache = kv_cache
        n_kv, d = k_cache.shape[2], k_cache.shape[3]
        k_flat, v_flat = k_cache.view(-1, n_kv, d), v_cache.view(-1, n_kv, d)
        k_flat.index_copy_(0, self.slot_mapping, k.to(k_flat.dtype))
        v_flat.index_copy_(0, self.slot_mapping, v.to(v_flat.dtype))
        if self.block_tables is not None:  # the C++ kernel, an opaque call inside the graph
            assert self.seq_lens is not None
            return torch.ops.minengine.paged_decode_attention(q, k_cache, v_cache, self.block_tables,
                                                              self.seq_lens, scale, 0)
        assert self.context_slots is not None
        b, length = self.context_slots.shape
        group = q.shape[1] // n_kv  # query heads per KV head (GQA)
        if self.query_buffer is not None:  # written out once, else inductor recomputes RoPE for every key
            self.query_buffer.copy_(q)
            q = self.query_buffer
        queries = q.view(b, 1, n_kv, group, d)
        keys = k_flat[self.context_slots].unsqueeze(3)  # [B, L, H_kv, 1, D]
        scores = (queries * keys).sum(-1) * scale  # [B, L, H_kv, group]
        if self.mask is not None:
            scores = scores.masked_fill(~self.mask.view(b, length, 1, 1), float("-inf"))
        # softmax along the innermost axis: inductor then parallelizes over rows, not within one row
        probs = torch.softmax(scores.permute(0, 2, 3, 1).contiguous(), dim=-1).permute(0, 3, 1, 2)
        values = v_flat[self.context_slots].unsqueeze(3)  # [B, L, H_kv, 1, D]
        out = (probs.unsqueeze(-1) * values).sum(1)  # [B, H_kv, group, D]
        return out.reshape(b, n_kv * group, d).to(q.dtype)
