"""Paged attention in Triton: one launch per layer for every prefill chunk and every decode of a step.

Read this file top to bottom: the KV writer first, then the attention kernel, then the two Python
functions that launch them. The kernel is the idea of vLLM's "unified" Triton attention
(``vllm/attention/ops/triton_unified_attention.py``) and of FlashAttention, written out small:

**The batch.** A step's new tokens are packed ``[num_tokens, heads, head_dim]``, sequence after sequence
(``query_start_loc`` says where each begins). A sequence's new tokens sit at the END of its context:
a prefill chunk of ``q_len`` tokens after ``context_len`` cached ones, a decode is ``q_len == 1``.
``seq_lens[i] = context_len + q_len``. Keys and values live in the paged cache; sequence ``i``'s token
at position ``p`` is in physical block ``block_tables[i, p // BLOCK_SIZE]``, row ``p % BLOCK_SIZE``.

**Who computes what.** A program takes one *tile* of queries of one sequence and one KV head: up to
``BLOCK_Q`` consecutive new tokens times the ``NUM_QUERIES_PER_KV`` query heads that share that KV head
(grouped-query attention), ``BLOCK_M`` rows in all. Every query head of a group reads the same keys, so
the group is loaded once and multiplied as one matrix: that is what makes GQA cheap. The grid is
``(tiles, kv_heads)``. To find its sequence without a table built on the host, a program uses vLLM's
trick: sequence ``i``'s tiles are numbered from ``query_start_loc[i] // BLOCK_Q + i``, so a binary
search over ``query_start_loc`` finds it, and the grid size ``num_tokens // BLOCK_Q + num_seqs`` depends
only on the batch's size (a decode batch replayed from a CUDA graph keeps its launch).

**Online softmax.** The program walks the keys it may see, ``TILE_N`` at a time, looking each one's
block up in the block table (the pages are read where they lie: nothing is gathered or copied). For
each tile of keys it computes the scores ``S = Q K^T * scale``, masks what the query may not see
(causality: a key after the query; a sliding window: a key too far before it), and folds the tile into a
running maximum ``m``, a running sum ``l`` and an accumulator ``acc = sum(exp(S - m) V)``, rescaling the
old ones by ``exp(m_old - m_new)`` (Milakov & Gimelshein 2018; FlashAttention). After the last tile the
output is ``acc / l``. Only one tile of scores exists at a time, so the memory the kernel needs does not
grow with the context.

Written for Triton 3.6 (what PyTorch 2.11's CUDA wheels bring) and later. CI runs both kernels on a CPU
with ``TRITON_INTERPRET=1`` (``tests/test_triton_attention.py``), against the readable reference path.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # torch without triton (a CPU wheel without the dev extra): the backend says so
    triton = None
    tl = None

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)): exp2 is the GPU's native instruction


def _interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, read at import)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available() -> str | None:
    """None when the kernels can run here, else the reason they cannot (for the engine's error)."""
    if triton is None:
        return "the triton package is not installed (it comes with CUDA builds of torch; pip install triton)"
    if _interpreted() and tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 7):
        return (f"Triton {triton.__version__}'s interpreter cannot run loops with run-time bounds; "
                "pip install 'triton>=3.7' to run these kernels on a CPU")
    if not _interpreted() and not torch.cuda.is_available():
        return "no CUDA device (on a CPU the Triton kernels run only under TRITON_INTERPRET=1, for tests)"
    return None


if triton is not None:

    @triton.jit
    def store_kv_kernel(
        key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
        key_stride_token, key_stride_head, value_stride_token, value_stride_head,
        cache_stride_block, cache_stride_slot, cache_stride_head,
        NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    ):
        """Program t writes new token t's K and V (all its KV heads) into its cache slot."""
        token = tl.program_id(0)
        slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
        if slot < 0:  # a padding row with nowhere to go
            return
        block, row = slot // BLOCK_SIZE, slot % BLOCK_SIZE
        heads = tl.arange(0, HEADS_PAD)[:, None]
        dims = tl.arange(0, HEAD_DIM_PAD)[None, :]
        ok = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
        dst = block * cache_stride_block + row * cache_stride_slot + heads * cache_stride_head + dims
        k = tl.load(key_ptr + token * key_stride_token + heads * key_stride_head + dims, mask=ok)
        v = tl.load(value_ptr + token * value_stride_token + heads * value_stride_head + dims, mask=ok)
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=ok)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def find_sequence(query_start_loc_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
        """The sequence whose tiles include ``tile``: the last i with query_start_loc[i] // BLOCK_Q + i
        <= tile (binary search; sequence i's first tile is numbered query_start_loc[i] // BLOCK_Q + i)."""
        lo = 0
        hi = num_seqs
        while lo < hi:
            mid = (lo + hi) // 2
            first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
            if first_tile <= tile:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    # Triton compiles a variant per "is it 1 / a multiple of 16" of each int argument; these change from
    # step to step, and a compile in the middle of serving costs hundreds of milliseconds.
    @triton.jit(do_not_specialize=["num_seqs", "block_tables_stride"])
    def paged_attention_kernel(
        out_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
        block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
        scale, num_seqs,
        q_stride_token, q_stride_head, out_stride_token, out_stride_head,
        cache_stride_block, cache_stride_slot, cache_stride_head, block_tables_stride,
        NUM_QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, TILE_N: tl.constexpr,
        SLIDING_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
    ):
        tile = tl.program_id(0)
        kv_head = tl.program_id(1)

        # 1. Which sequence, which of its query tiles, and where its new tokens sit.
        seq = find_sequence(query_start_loc_ptr, tile, num_seqs, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        q_tile = tile - (q_start // BLOCK_Q + seq)
        if q_tile * BLOCK_Q >= q_len:  # the grid has a few spare tiles; this is one
            return
        seq_len = tl.load(seq_lens_ptr + seq)
        context_len = seq_len - q_len

        # 2. The tile's rows: BLOCK_Q tokens x NUM_QUERIES_PER_KV heads of this KV head's group.
        rows = tl.arange(0, BLOCK_M)
        token = q_tile * BLOCK_Q + rows // NUM_QUERIES_PER_KV  # which new token of the sequence
        head = kv_head * NUM_QUERIES_PER_KV + rows % NUM_QUERIES_PER_KV
        row_ok = (rows < BLOCK_Q * NUM_QUERIES_PER_KV) & (token < q_len)
        dims = tl.arange(0, HEAD_DIM_PAD)
        dim_ok = dims < HEAD_DIM
        q_offsets = (q_start + token).to(tl.int64)[:, None] * q_stride_token + head[:, None] * q_stride_head
        q = tl.load(q_ptr + q_offsets + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        if DOT_FP32:  # the interpreter's bf16 matmul is wrong (numpy has no bf16): multiply in fp32 there
            q = q.to(tl.float32)
        q_pos = context_len + token  # each row's absolute position: it sees keys 0..q_pos

        # 3. The keys any row of the tile may see: [first, last).
        last = tl.minimum(context_len + (q_tile + 1) * BLOCK_Q, seq_len)
        first = 0
        if SLIDING_WINDOW > 0:
            first = tl.maximum(context_len + q_tile * BLOCK_Q - SLIDING_WINDOW + 1, 0)

        # 4. Online softmax over the keys, TILE_N at a time, read in place through the block table.
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
        qk_scale = scale * 1.4426950408889634  # scores in log2 units, for exp2
        keys = tl.arange(0, TILE_N)
        table = block_tables_ptr + seq.to(tl.int64) * block_tables_stride
        for start in range((first // TILE_N) * TILE_N, last, TILE_N):
            k_pos = start + keys
            k_ok = k_pos < last
            block = tl.load(table + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
            kv_offsets = (block * cache_stride_block + (k_pos % BLOCK_SIZE) * cache_stride_slot
                          + kv_head * cache_stride_head)
            k = tl.load(k_cache_ptr + kv_offsets[None, :] + dims[:, None],  # [HEAD_DIM_PAD, TILE_N]
                        mask=k_ok[None, :] & dim_ok[:, None], other=0.0)
            s = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, TILE_N]
            visible = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
            if SLIDING_WINDOW > 0:
                visible = visible & (k_pos[None, :] > q_pos[:, None] - SLIDING_WINDOW)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
            p = tl.math.exp2(s - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_cache_ptr + kv_offsets[:, None] + dims[None, :],  # [TILE_N, HEAD_DIM_PAD]
                        mask=k_ok[:, None] & dim_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
            m_i = m_new

        # 5. Normalise and write the rows that are real.
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        out_offsets = ((q_start + token).to(tl.int64)[:, None] * out_stride_token
                       + head[:, None] * out_stride_head)
        tl.store(out_ptr + out_offsets + dims[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & dim_ok[None, :])


def _pad(n: int) -> int:
    """Next power of two, at least 16 (tl.dot's smallest side on a GPU)."""
    return max(16, 1 << (n - 1).bit_length())


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write the new tokens' K/V ([N, H_kv, D]) into the paged cache at ``slot_mapping`` ([N]; -1 skips)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert k_cache.stride() == v_cache.stride() and key.stride(2) == 1 and value.stride(2) == 1
    store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEADS_PAD=1 << (num_kv_heads - 1).bit_length(),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=1 << (head_dim - 1).bit_length(), BLOCK_SIZE=k_cache.shape[1],
    )


def launch_config(num_queries_per_kv: int, max_query_len: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_Q, TILE_N) for a step: decodes get the smallest row tile (one token per program),
    steps with a prompt chunk a taller one, so each key tile loaded serves more queries."""
    block_m = 16 if max_query_len == 1 else 64
    block_m = max(block_m, 1 << (num_queries_per_kv - 1).bit_length())
    return block_m, block_m // num_queries_per_kv, 64 if max_query_len == 1 else 32


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, max_query_len: int, scale: float,
    sliding_window: int | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of packed queries ``q`` [N, H_q, D] over the paged cache (the new K/V already written).

    ``block_tables`` [B, W] int32, ``seq_lens`` [B] int32 (context + new tokens), ``query_start_loc``
    [B+1] int32, ``max_query_len`` the longest q_len (a Python int: it picks the tile shape, not the
    work). Returns [N, H_q, D] in q's dtype.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = seq_lens.shape[0]
    num_kv_heads = k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not split into groups over {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads
    out = torch.empty_like(q) if out is None else out
    if num_tokens == 0:
        return out
    assert k_cache.stride() == v_cache.stride() and q.stride(2) == 1 and out.stride(2) == 1
    block_m, block_q, tile_n = launch_config(group, max_query_len)
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    paged_attention_kernel[grid](
        out, q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
        scale, num_seqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        NUM_QUERIES_PER_KV=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=_pad(head_dim),
        BLOCK_SIZE=k_cache.shape[1], BLOCK_Q=block_q, BLOCK_M=block_m, TILE_N=tile_n,
        SLIDING_WINDOW=sliding_window or 0,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,  # fp32: no TF32 rounding
        DOT_FP32=q.dtype == torch.bfloat16 and _interpreted(),
        num_warps=4,
    )
    return out
