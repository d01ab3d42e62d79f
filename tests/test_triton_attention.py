"""The Triton paged-attention kernels against a dense answer, run by Triton's interpreter on a CPU.

``conftest.py`` sets ``TRITON_INTERPRET=1`` on a machine without CUDA before anything imports triton, so
the very kernels a GPU compiles run here on real tensors, every commit. Shapes cover what the engine
sends in one launch: prompts from scratch (varlen), chunks after cached context, decodes, a mixed step,
long contexts, GQA groups 1-8 (6 included: not a power of two), head dims 64 and 128 (and 80, padded),
fp32/bf16/fp16, sliding windows and block sizes 8/16/32.
"""

from __future__ import annotations

import pytest
import torch

from minengine.models.attention import triton_kernels as tk
from minengine.models.attention.checks import TOLERANCE, dense_attention, random_batch

pytestmark = pytest.mark.skipif(tk.triton_available() is not None, reason=str(tk.triton_available()))

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {  # name: (query_lens, context_lens, heads, kv_heads, head_dim, block_size, dtype, window)
    "varlen-prefill": ([7, 20, 1, 33], [0, 0, 0, 0], 8, 2, 64, 16, torch.float32, None),
    "chunks-with-context": ([16, 5], [40, 3], 8, 8, 64, 16, torch.float32, None),
    "decode": ([1, 1, 1, 1, 1], [5, 40, 17, 0, 63], 8, 2, 64, 16, torch.float32, None),
    "mixed": ([1, 12, 1, 30], [50, 20, 7, 0], 12, 2, 128, 16, torch.float32, None),
    "long-context-decode": ([1, 1], [700, 1200], 4, 1, 64, 32, torch.float32, None),
    "long-context-chunk": ([64], [900], 4, 4, 64, 16, torch.float32, None),
    "gqa-1": ([3, 1], [10, 20], 4, 4, 64, 16, torch.float32, None),
    "gqa-2": ([3, 1], [10, 20], 4, 2, 64, 16, torch.float32, None),
    "gqa-4": ([3, 1], [10, 20], 8, 2, 64, 16, torch.float32, None),
    "gqa-6": ([5, 1, 3], [3, 50, 0], 12, 2, 128, 16, torch.float32, None),
    "gqa-8": ([9, 1], [8, 30], 16, 2, 64, 16, torch.float32, None),
    "head-dim-80": ([4, 1], [10, 25], 4, 2, 80, 16, torch.float32, None),
    "window": ([9, 1, 20], [30, 70, 5], 8, 1, 64, 8, torch.float32, 16),
    "window-wider-than-context": ([6, 1], [3, 9], 4, 2, 64, 16, torch.float32, 64),
    "block-size-32": ([17, 1], [40, 90], 4, 2, 64, 32, torch.float32, None),
    "bf16": ([33, 1, 5], [0, 47, 12], 8, 2, 128, 16, torch.bfloat16, None),
    "fp16": ([9, 1], [21, 44], 8, 4, 64, 16, torch.float16, None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_dense_attention(name: str) -> None:
    qlens, ctx, heads, kv_heads, d, bs, dtype, window = CASES[name]
    batch = random_batch(qlens, ctx, heads, kv_heads, d, bs, dtype=dtype, seed=len(name), device=DEVICE)
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    tk.store_kv(batch.k_new, batch.v_new, k_cache, v_cache, batch.slot_mapping)
    # the writer put every new token's K/V at its slot, and touched nothing else
    flat_k, flat_v = k_cache.view(-1, kv_heads, d), v_cache.view(-1, kv_heads, d)
    assert torch.equal(flat_k[batch.slot_mapping], batch.k_new)
    assert torch.equal(flat_v[batch.slot_mapping], batch.v_new)
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool, device=DEVICE)
    untouched[batch.slot_mapping] = False
    assert torch.equal(flat_k[untouched], batch.k_cache.view(-1, kv_heads, d)[untouched])

    dev = torch.device(DEVICE)
    i32 = dict(dtype=torch.int32, device=dev)
    width = max(len(t) for t in batch.block_tables)
    tables = torch.tensor([t + [0] * (width - len(t)) for t in batch.block_tables], **i32)
    out = tk.paged_attention(batch.q, k_cache, v_cache, tables, torch.tensor(batch.seq_lens, **i32),
                             torch.tensor(batch.query_start_loc, **i32), max(qlens), d**-0.5, window)
    want = dense_attention(batch, k_cache, v_cache, d**-0.5, window)
    assert out.dtype == dtype and out.shape == batch.q.shape
    torch.testing.assert_close(out.float(), want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_padding_slots_are_skipped_by_the_writer() -> None:
    """A slot of -1 (a padding row with nowhere to go) writes nothing."""
    batch = random_batch([3], [0], 4, 2, 64, 16, device=DEVICE)
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    slots = batch.slot_mapping.clone()
    slots[1] = -1
    tk.store_kv(batch.k_new, batch.v_new, k_cache, v_cache, slots)
    flat = k_cache.view(-1, 2, 64)
    assert torch.equal(flat[slots[[0, 2]]], batch.k_new[[0, 2]])
    assert torch.equal(flat[batch.slot_mapping[1]], batch.k_cache.view(-1, 2, 64)[batch.slot_mapping[1]])


def test_a_group_that_does_not_divide_is_refused() -> None:
    batch = random_batch([1], [4], 6, 4, 64, 16, device=DEVICE)  # 6 query heads over 4 KV heads
    one = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="groups"):
        tk.paged_attention(batch.q, batch.k_cache, batch.v_cache, torch.zeros(1, 1, dtype=torch.int32),
                           one * 5, torch.tensor([0, 1], dtype=torch.int32), 1, 0.125)


def test_launch_grid_depends_only_on_the_batch_size() -> None:
    """A decode step's launch (what a CUDA graph records) is the same whatever the contexts are."""
    assert tk.launch_config(4, 1) == tk.launch_config(4, 1)
    block_m, block_q, _ = tk.launch_config(6, 1)
    assert block_m >= 16 and block_q == block_m // 6 and block_q >= 1
    block_m, block_q, _ = tk.launch_config(16, 300)  # a tall tile for prompt chunks
    assert block_m == 64 and block_q == 4
