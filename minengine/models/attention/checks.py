"""How the attention kernels are checked: random paged batches and a dense, obviously-right answer.

``random_batch`` lays a step out the way the engine does (sequences with cached context and new tokens,
their blocks scattered at random through the cache), and ``dense_attention`` answers it the slow way:
each sequence's keys gathered in order, every score computed, a mask, a softmax. The kernel tests
(``tests/test_triton_attention.py``, under ``TRITON_INTERPRET=1`` on a CPU) and the GPU check
(``benchmarks/gpu_check.py``, compiled) both compare the Triton kernels with it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from minengine.utils import cdiv


@dataclass
class PagedBatch:
    q: torch.Tensor  # [N, H_q, D]
    k_new: torch.Tensor  # [N, H_kv, D]
    v_new: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, H_kv, D], the context already written
    v_cache: torch.Tensor
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    slot_mapping: torch.Tensor  # [N] int64

    @property
    def query_start_loc(self) -> list[int]:
        loc = [0]
        for n in self.query_lens:
            loc.append(loc[-1] + n)
        return loc


def random_batch(query_lens: list[int], context_lens: list[int], num_heads: int, num_kv_heads: int,
                 head_dim: int, block_size: int, dtype: torch.dtype = torch.float32, seed: int = 0,
                 device: str | torch.device = "cpu", spare_blocks: int = 3) -> PagedBatch:
    """A step of ``len(query_lens)`` sequences: sequence i has ``context_lens[i]`` cached tokens and
    ``query_lens[i]`` new ones, its blocks drawn at random from a cache with ``spare_blocks`` extra."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(context_lens, query_lens, strict=True)]
    num_blocks = sum(cdiv(s, block_size) for s in seq_lens) + spare_blocks
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)
    tables, taken = [], iter(order)
    for s in seq_lens:
        tables.append([next(taken) for _ in range(cdiv(s, block_size))])

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    n = sum(query_lens)
    slots = [tables[i][p // block_size] * block_size + p % block_size
             for i, (c, q) in enumerate(zip(context_lens, query_lens, strict=True)) for p in range(c, c + q)]
    return PagedBatch(
        q=rand(n, num_heads, head_dim),
        k_new=rand(n, num_kv_heads, head_dim), v_new=rand(n, num_kv_heads, head_dim),
        k_cache=rand(num_blocks, block_size, num_kv_heads, head_dim),
        v_cache=rand(num_blocks, block_size, num_kv_heads, head_dim),
        query_lens=list(query_lens), seq_lens=seq_lens, block_tables=tables,
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
    )


def dense_attention(batch: PagedBatch, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float,
                    sliding_window: int | None = None) -> torch.Tensor:
    """The answer, computed in fp32 one sequence at a time from caches that hold every token's K/V."""
    out = torch.empty(batch.q.shape, dtype=torch.float32, device=batch.q.device)
    bs = k_cache.shape[1]
    loc = batch.query_start_loc
    for i, (n, length) in enumerate(zip(batch.query_lens, batch.seq_lens, strict=True)):
        pos = torch.arange(length, device=k_cache.device)
        blocks = torch.tensor(batch.block_tables[i], device=k_cache.device)[pos // bs]
        keys, values = k_cache[blocks, pos % bs].float(), v_cache[blocks, pos % bs].float()  # [L, H_kv, D]
        group = batch.q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        queries = batch.q[loc[i]: loc[i + 1]].float()
        scores = torch.einsum("nhd,lhd->hnl", queries, keys) * scale
        q_pos, k_pos = torch.arange(length - n, length, device=k_cache.device)[:, None], pos[None, :]
        visible = k_pos <= q_pos
        if sliding_window is not None:
            visible &= k_pos > q_pos - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[loc[i]: loc[i + 1]] = torch.einsum("hnl,lhd->nhd", scores.softmax(-1), values)
    return out


# The tolerance of a kernel's output against ``dense_attention``, by dtype: fp32 sums in another order;
# bf16/fp16 round the probabilities before the second matmul (as every flash kernel does).
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
