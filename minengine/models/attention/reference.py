"""Paged attention over a packed batch: the readable reference path (gather blocks + SDPA).

A step's batch is *packed*: the new tokens of all sequences are concatenated into one ``[N, ...]`` tensor,
with no padding. ``AttentionMetadata`` says where each sequence's tokens start and how long each
sequence is, and (with a KV cache) where each new token's K/V goes and which blocks hold the context.

KV cache layout (one pair per layer), as in vLLM's reference backends::

    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    slot = block_id * block_size + offset          # flat index into k_cache.view(-1, H_kv, D)

Token ``p`` (absolute position) of a sequence lives in slot
``block_table[p // block_size] * block_size + p % block_size``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from minengine.models.paged_decode import DecodeBatch, DecodeTensors
from minengine.utils import cdiv, cumsum

KVCache = tuple[torch.Tensor, torch.Tensor]

# `enable_gqa` lets SDPA broadcast K/V heads itself (torch >= 2.5); older torch repeats them.
_TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
_SDPA_HAS_GQA = _TORCH_VERSION >= (2, 5)
# CPU decode: context tokens per batched SDPA call (see _decode_groups).
CPU_DECODE_GROUP_TOKENS = 4096


@dataclass
class AttentionMetadata:
    """Where each sequence's tokens are in a packed batch and in the paged KV cache.

    query_start_loc: B+1 offsets; sequence i's new tokens are rows query_start_loc[i]:query_start_loc[i+1].
    seq_lens:        tokens of sequence i after this step (cached context + new tokens), so its new tokens
                     sit at absolute positions seq_lens[i] - n_new .. seq_lens[i] - 1.
    slot_mapping:    [N] int64, the cache slot each new token's K/V is written to (None without a cache).
    block_tables:    each sequence's KV block ids, in order (None without a cache).
    block_size:      tokens per block.

    ``prepare`` builds the gather indices every layer reads (``decode_groups``, ``context_slots``); the
    model calls it once per forward, before its first layer, so no layer builds them again. The list
    fields are read, never copied: they must not change while a forward pass runs.
    """

    query_start_loc: list[int]
    seq_lens: list[int]
    slot_mapping: torch.Tensor | None = None
    block_tables: list[list[int]] | None = None
    block_size: int = 16
    # The fast path's decodes (rows decode_batch.rows), attended in place; None: the reference path.
    decode_batch: DecodeBatch | None = field(default=None, repr=False, compare=False)
    # Sequences whose short chunk the fast path attends too, one decode row per token (no gather).
    fast_chunks: frozenset[int] = field(default=frozenset(), repr=False, compare=False)
    # Filled by prepare(): decode groups per sliding window (None = full attention), and each prefill
    # sequence's context slots (by its index in the batch).
    decode_groups: dict[int | None, list[DecodeGroup]] = field(default_factory=dict, init=False, repr=False,
                                                              compare=False)
    context_slots: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False,
                                                   compare=False)
    _query_lens: list[int] = field(default_factory=list, init=False, repr=False, compare=False)
    _prepared: set[int | None] = field(default_factory=set, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.query_start_loc) != len(self.seq_lens) + 1:
            raise ValueError("query_start_loc must have one more entry than seq_lens")
        loc = self.query_start_loc
        self._query_lens = [b - a for a, b in zip(loc, loc[1:], strict=False)]
        for i, n in enumerate(self._query_lens):
            if n < 1 or n > self.seq_lens[i]:
                raise ValueError(f"sequence {i}: {n} new tokens but seq_len {self.seq_lens[i]}")

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1]

    @property
    def query_lens(self) -> list[int]:
        """New tokens of each sequence in this step (computed once, at construction)."""
        return self._query_lens

    def positions(self, device: torch.device | str | None = None) -> torch.Tensor:
        """[N] int64 absolute position of every new token (what the model's RoPE needs)."""
        pos = [p for s, q in zip(self.seq_lens, self.query_lens, strict=True) for p in range(s - q, s)]
        return torch.tensor(pos, dtype=torch.long, device=device)

    def last_token_indices(self) -> list[int]:
        """Row of each sequence's last new token: the only rows whose logits the engine needs."""
        return [end - 1 for end in self.query_start_loc[1:]]

    def prepare(self, device: torch.device, sliding_windows: Iterable[int | None] = (None,)) -> None:
        """Build the per-step gather indices for these windows (once; a later call adds missing windows).

        Without a KV cache (``block_tables`` None) there is nothing to gather. Every layer calls this too
        (a layer may run without the model around it); after the first call it is a set lookup.
        """
        if self.block_tables is None:
            return
        if not isinstance(sliding_windows, tuple):
            sliding_windows = tuple(sliding_windows)
        if all(w in self._prepared for w in sliding_windows):
            return
        self._prepared.update(sliding_windows)
        query_lens = self._query_lens
        decode_rows = [i for i, n in enumerate(query_lens) if n == 1]
        if self.decode_batch is not None:  # the fast path attends the decodes: no gather indices
            decode_rows = []
        for window in set(sliding_windows):
            if window not in self.decode_groups:
                self.decode_groups[window] = _decode_groups(self, decode_rows, device, window)
        for i, n in enumerate(query_lens):
            if n > 1 and i not in self.context_slots and i not in self.fast_chunks:
                self.context_slots[i] = _gather_slots(self, i, device)

    @classmethod
    def for_prefill(cls, seq_lens: list[int]) -> AttentionMetadata:
        """No-cache batch: every sequence is all new tokens and attends causally to itself only."""
        return cls(query_start_loc=cumsum(seq_lens), seq_lens=list(seq_lens))

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str | None = None,
    ) -> AttentionMetadata:
        """Paged batch: compute query_start_loc and slot_mapping from the block tables."""
        slots: list[int] = []
        for q, s, table in zip(query_lens, seq_lens, block_tables, strict=True):
            if len(table) * block_size < s:
                raise ValueError(f"block table {table} holds {len(table) * block_size} < {s} tokens")
            slots += [table[p // block_size] * block_size + p % block_size for p in range(s - q, s)]
        return cls(
            query_start_loc=cumsum(query_lens),
            seq_lens=list(seq_lens),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            block_tables=block_tables if isinstance(block_tables, list) else list(block_tables),
            block_size=block_size,
        )


def allocate_kv_cache(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> list[KVCache]:
    """One zeroed ``(k_cache, v_cache)`` pair per layer, each [num_blocks, block_size, H_kv, D]."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return [
        (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        for _ in range(num_layers)
    ]


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool = False,
) -> torch.Tensor:
    """SDPA on [B, H, L, D] tensors with grouped K/V heads; ``mask`` is boolean (True = may attend)."""
    if _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
        )
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


def _context_mask(key_pos: torch.Tensor, query_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """[..., L_q, L_k] bool: a query at position p sees keys at positions p-W+1 .. p (W = window)."""
    q, k = query_pos.unsqueeze(-1), key_pos.unsqueeze(-2)
    mask = k <= q
    if sliding_window is not None:
        mask &= k > q - sliding_window
    return mask


class DecodeGroup(NamedTuple):
    """Decodes attended in one SDPA call: their query rows [n], the flat cache slots of their keys
    [n * L] (L = the group's longest context), and a key mask [n, 1, 1, L] (None when none is padded).
    ``rows`` is the same rows as a slice when they are consecutive (batch 1, or a step of equal-length
    decodes): q[slice] is a view and out[slice] a plain copy, where a tensor index gathers and scatters."""

    starts: torch.Tensor
    slots: torch.Tensor
    mask: torch.Tensor | None
    rows: slice | torch.Tensor


def _gather_slots(meta: AttentionMetadata, i: int, device: torch.device) -> torch.Tensor:
    """Flat cache slots of sequence i's first seq_lens[i] tokens."""
    assert meta.block_tables is not None
    pos = torch.arange(meta.seq_lens[i], device=device)
    blocks = torch.tensor(meta.block_tables[i], dtype=torch.long, device=device)
    return blocks[pos // meta.block_size] * meta.block_size + pos % meta.block_size


def _decode_groups(
    meta: AttentionMetadata, rows: list[int], device: torch.device, sliding_window: int | None
) -> list[DecodeGroup]:
    """Split the single-token sequences ``rows`` into ``DecodeGroup``s.

    Shorter keys are padded to L (padding points at slot 0 and is masked out). On a GPU all decodes form
    one group: one SDPA call. On a CPU the rows are sorted by length and cut into groups of about
    ``CPU_DECODE_GROUP_TOKENS`` context tokens, so little is padded and each group's gathered K/V stays
    in the core's cache while SDPA reads it (``benchmarks/attention_decode.py``: about 2x faster decode
    attention at batch 64 than one padded call). Built once per step (``prepare``) for every layer.
    """
    if not rows:
        return []
    assert meta.block_tables is not None
    bs = meta.block_size
    if device.type == "cpu":
        rows = sorted(rows, key=lambda i: meta.seq_lens[i], reverse=True)
    groups: list[list[int]] = []
    for i in rows:  # longest first on CPU: a group's first row sets its padded length
        if groups and (device.type != "cpu" or
                       (len(groups[-1]) + 1) * meta.seq_lens[groups[-1][0]] <= CPU_DECODE_GROUP_TOKENS):
            groups[-1].append(i)
        else:
            groups.append([i])
    out = []
    for group in groups:
        lens = [meta.seq_lens[i] for i in group]
        max_len = max(lens)
        max_blocks = cdiv(max_len, bs)
        padded = [(meta.block_tables[i] + [0] * max_blocks)[:max_blocks] for i in group]
        tables = torch.tensor(padded, dtype=torch.long, device=device)  # [n, max_blocks]
        pos = torch.arange(max_len, device=device)
        slots = (tables[:, pos // bs] * bs + pos % bs).view(-1)  # [n * L], row-major
        rows = [meta.query_start_loc[i] for i in group]
        starts = torch.tensor(rows, device=device)
        consecutive = rows == list(range(rows[0], rows[0] + len(rows)))
        mask = None
        if min(lens) != max_len or (sliding_window is not None and sliding_window < max_len):
            query_pos = torch.tensor(lens, device=device).unsqueeze(-1) - 1  # the new token ends its context
            mask = _context_mask(pos.expand(len(group), -1), query_pos, sliding_window)
            mask = mask.unsqueeze(1)  # [n, 1(head), 1(query), L]
        where = slice(rows[0], rows[0] + len(rows)) if consecutive else starts
        out.append(DecodeGroup(starts, slots, mask, where))
    return out


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: KVCache | None,
    meta: AttentionMetadata | DecodeTensors,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal attention for a packed batch, reading the context from a paged KV cache.

    q: [N, H_q, D]; k, v: [N, H_kv, D] (the new tokens, RoPE already applied); returns [N, H_q, D].
    With ``kv_cache``, k/v are first written at ``meta.slot_mapping``; then each sequence attends to its
    first ``seq_lens[i]`` cached tokens, its queries sitting at the END of that context (a prefill chunk
    or a decode). Without a cache each sequence attends causally within its own new tokens.
    """
    if isinstance(meta, DecodeTensors):  # a compiled decode step: tensors only, one batched call
        assert kv_cache is not None and sliding_window is None
        return meta.attend(q, k, v, kv_cache, scale)
    if kv_cache is None:
        out = torch.empty_like(q)
        for i, n in enumerate(meta.query_lens):
            if meta.seq_lens[i] != n:
                raise ValueError(
                    f"sequence {i} has {meta.seq_lens[i] - n} cached tokens but no kv_cache given"
                )
            a, b = meta.query_start_loc[i], meta.query_start_loc[i + 1]
            out[a:b] = _attend(q[a:b], k[a:b], v[a:b], 0, scale, sliding_window)
        return out

    if meta.slot_mapping is None or meta.block_tables is None:
        raise ValueError("a kv_cache needs attn_metadata.slot_mapping and block_tables")
    k_cache, v_cache = kv_cache
    if k_cache.shape[1] != meta.block_size:
        raise ValueError(
            f"kv cache has block_size {k_cache.shape[1]} but attn_metadata says {meta.block_size}"
        )
    n_kv, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat, v_flat = k_cache.view(-1, n_kv, head_dim), v_cache.view(-1, n_kv, head_dim)
    slot_mapping = meta.slot_mapping
    if slot_mapping.device != k_flat.device:  # the engine builds it on the device
        slot_mapping = slot_mapping.to(k_flat.device)
    # (the dtype checks skip a no-op .to() call each: small ops cost dispatch time, 30 per layer add up)
    k_flat.index_copy_(0, slot_mapping, k if k.dtype == k_flat.dtype else k.to(k_flat.dtype))
    v_flat.index_copy_(0, slot_mapping, v if v.dtype == v_flat.dtype else v.to(v_flat.dtype))

    meta.prepare(q.device, (sliding_window,))  # a no-op when the model prepared it for every layer
    groups = meta.decode_groups[sliding_window]
    if len(groups) == 1 and not meta.context_slots and meta.decode_batch is None:
        rows = groups[0].rows
        if isinstance(rows, slice) and rows.stop - rows.start == q.shape[0]:  # every row, in order
            return _decode(q, k_flat, v_flat, groups[0], scale)  # nothing to scatter
    fast = meta.decode_batch
    if fast is not None and fast.rows is not None and fast.rows.shape[0] == q.shape[0]:  # all decodes
        return fast.attend(q, k_cache, v_cache, scale, sliding_window).to(q.dtype)
    out = torch.empty_like(q)
    if fast is not None and fast.rows is not None:  # the fast path: read the blocks in place
        out[fast.rows] = fast.attend(q[fast.rows], k_cache, v_cache, scale, sliding_window).to(out.dtype)
    # Decodes batched into few SDPA calls (one on a GPU): the common case of a running batch.
    # index_select, not k_flat[slots]: on a CPU it copies whole rows and is 2-4x faster.
    for group in groups:
        out[group.rows] = _decode(q, k_flat, v_flat, group, scale)
    for i, slots in meta.context_slots.items():
        # A prefill (chunk): gather this sequence's whole context, then attend from its last n positions.
        a, b, seq_len = meta.query_start_loc[i], meta.query_start_loc[i + 1], meta.seq_lens[i]
        n = b - a
        k_ctx, v_ctx = k_flat.index_select(0, slots), v_flat.index_select(0, slots)
        out[a:b] = _attend(q[a:b], k_ctx, v_ctx, seq_len - n, scale, sliding_window)
    return out


def _decode(
    q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, group: DecodeGroup, scale: float
) -> torch.Tensor:
    """One decode group: its queries q[group.rows] against the K/V gathered at its slots -> [n, H_q, D]."""
    n, n_kv, head_dim = group.starts.shape[0], k_flat.shape[1], k_flat.shape[2]
    keys = k_flat.index_select(0, group.slots).view(n, -1, n_kv, head_dim).transpose(1, 2)
    values = v_flat.index_select(0, group.slots).view(n, -1, n_kv, head_dim).transpose(1, 2)
    if keys.dtype != q.dtype:
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    queries = q[group.rows].unsqueeze(2)  # [n, H_q, 1, D]
    return _sdpa(queries, keys, values, group.mask, scale).squeeze(2)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context_len: int,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """One sequence: q [n, H_q, D] at positions context_len.., k/v [context_len + n, H_kv, D]."""
    n, total = q.shape[0], k.shape[0]
    qt = q.transpose(0, 1).unsqueeze(0)  # [1, H_q, n, D]
    kt = k.transpose(0, 1).unsqueeze(0).to(q.dtype)  # [1, H_kv, total, D]
    vt = v.transpose(0, 1).unsqueeze(0).to(q.dtype)
    if context_len == 0 and (sliding_window is None or sliding_window >= total):
        out = _sdpa(qt, kt, vt, None, scale, causal=True)  # plain causal: SDPA's fast path
    else:
        query_pos = torch.arange(context_len, context_len + n, device=q.device)
        mask = _context_mask(torch.arange(total, device=q.device), query_pos, sliding_window)
        out = _sdpa(qt, kt, vt, mask, scale)
    return out.squeeze(0).transpose(0, 1)
