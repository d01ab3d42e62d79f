"""CUDA graphs for decode steps: a step's kernels recorded once per batch size, then replayed.

Why: on a GPU a decode step of a small model is a few hundred tiny kernels, and launching them from
Python costs more than running them. A CUDA graph records the kernels of one forward once and replays
them with one launch. A graph has fixed shapes and fixed addresses, so (as in vLLM and nano-vllm):

1. graphs are captured for a few batch sizes (``capture_sizes``: powers of two, then ``max_num_seqs``);
2. a step of n decodes runs the graph of the next size up (``bucket_for``), the extra rows padded with
   a dummy token that writes to and reads from a scratch KV block the scheduler never hands out;
3. inputs are copied into *static* buffers before each replay, and the output is read from the
   static tensor the capture produced.

The attention inside the graph is the Triton backend's kernel (``models/attention/triton_kernels.py``):
its launch depends only on the batch size, and it reads every row's own blocks up to its own length.
Steps with a prompt chunk, or more decodes than the largest size, run eagerly through the same backend.
``EngineConfig.enforce_eager`` turns graphs off.

The graph mechanics sit behind ``GraphBackend``: ``CudaGraphBackend`` on a GPU, ``EagerReplayBackend``
(which "replays" by calling the function again on the same static buffers) so the bookkeeping (bucket
choice, padding, buffer filling, output slicing) is tested on a CPU with the same code, the Triton
kernel running under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from minengine.models.attention import KVCache
from minengine.models.attention.backends import TritonAttentionMetadata, TritonBackend
from minengine.utils import cdiv

MAX_CAPTURE_SIZE = 512  # nano-vllm's cap; bigger decode batches are compute-bound enough to run eagerly


def capture_sizes(max_num_seqs: int, sizes: list[int] | None = None) -> list[int]:
    """Batch sizes to capture, ascending: ``sizes`` if given (those <= max_num_seqs), else 1, 2, 4, 8, ...
    and ``min(max_num_seqs, MAX_CAPTURE_SIZE)`` itself. A padded step wastes at most half its rows."""
    if sizes is not None:
        return sorted({n for n in sizes if n <= max_num_seqs}) or [min(sizes)]
    top = min(max_num_seqs, MAX_CAPTURE_SIZE)
    base = [2**i for i in range(top.bit_length()) if 2**i <= top]
    if base[-1] != top:
        base.append(top)
    return base


def bucket_for(n: int, sizes: list[int]) -> int | None:
    """The smallest captured size >= n (None: too many for any graph; run eagerly)."""
    for size in sizes:
        if size >= n:
            return size
    return None


class GraphBackend(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        """Record ``fn``; returns (replay, the static output tensor each replay refreshes)."""
        ...


class EagerReplayBackend:
    """No graph: replay calls ``fn`` again and copies into the output it first returned (CPU tests)."""

    def __init__(self) -> None:
        self.num_captures = 0
        self.num_replays = 0

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        self.num_captures += 1
        out = fn()

        def replay() -> None:
            self.num_replays += 1
            with torch.inference_mode():  # fn's output is an inference tensor
                out.copy_(fn())

        return replay, out


class CudaGraphBackend:
    """``torch.cuda.CUDAGraph`` with one memory pool shared by all sizes (largest captured first)."""

    def __init__(self, device: torch.device, warmup: int = 2) -> None:
        self.device = device
        self.warmup = warmup
        self.pool = None
        self.num_captures = 0
        self.graphs: list[torch.cuda.CUDAGraph] = []
        # One side stream for every capture: cuBLAS keeps a workspace per stream it has run on, for the
        # life of the process, so a stream per size cost 64 MiB each on an H200 (gpu_check, 2026-12-04).
        self.stream = torch.cuda.Stream(device)

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        stream = self.stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):  # warm-up on a side stream: lazy inits, autotuning, compilation
            for _ in range(self.warmup):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        if self.pool is None:
            self.pool = graph.pool()
        self.num_captures += 1
        self.graphs.append(graph)
        return graph.replay, out

    def release(self) -> None:
        """Free every captured graph and the pool they share (the graphs' outputs live in it)."""
        for graph in self.graphs:
            graph.reset()
        self.graphs.clear()
        self.pool = None


@dataclass
class DecodeInputs:
    """One decode step, host side: a token, its position, its slot, the block table and length per row."""

    input_ids: list[int]
    positions: list[int]
    slots: list[int]
    block_tables: list[list[int]]
    seq_lens: list[int]


class DecodeGraphRunner:
    """Captured decode forwards, one per batch size, over static buffers (see the module doc)."""

    def __init__(
        self,
        model: torch.nn.Module,
        kv_caches: list[KVCache],
        *,
        sizes: list[int],
        max_blocks_per_seq: int,
        pad_block: int,
        attn_backend: TritonBackend,
        graph_backend: GraphBackend,
        device: torch.device,
    ) -> None:
        k0 = kv_caches[0][0]
        self.block_size, self.num_cache_blocks = int(k0.shape[1]), int(k0.shape[0])
        if not 0 <= pad_block < self.num_cache_blocks:
            raise ValueError(f"pad_block {pad_block} is not a block of the cache ({self.num_cache_blocks})")
        self.model, self.kv_caches, self.device = model, kv_caches, device
        self.sizes, self.pad_block, self.attn_backend = sorted(sizes), pad_block, attn_backend
        self.graph_backend = graph_backend
        self.width = max_blocks_per_seq
        top = self.sizes[-1]
        # One int64 block holds the per-row inputs (ids, positions, slots, lengths), so a step is two
        # host-to-device copies (this block and the used columns of the tables), from pinned memory.
        pin = device.type == "cuda"
        self._ints_host = torch.zeros((4, top), dtype=torch.long, pin_memory=pin)
        # the step's tables, packed [b, kmax] (kmax = most blocks any row uses), then spread on the device
        self._tables_host = torch.full((top * self.width,), pad_block, dtype=torch.int32, pin_memory=pin)
        self._tables_dev = torch.empty(top * self.width, dtype=torch.int32, device=device)
        self._ints_np, self._tables_np = self._ints_host.numpy(), self._tables_host.numpy()
        self._ints = torch.zeros((4, top), dtype=torch.long, device=device)
        self.input_ids, self.positions, self.slot_mapping, self._lens = self._ints.unbind(0)
        self.seq_lens = torch.ones(top, dtype=torch.int32, device=device)  # from _lens, inside the graph
        self.query_start_loc = torch.arange(top + 1, dtype=torch.int32, device=device)  # one token a row
        self.block_tables = torch.full((top, self.width), pad_block, dtype=torch.int32, device=device)
        self._copied = torch.cuda.Event() if pin else None  # the host buffers may be reused after it
        self.graphs: dict[int, tuple[Callable[[], None], torch.Tensor]] = {}
        self.replays: dict[int, int] = {n: 0 for n in self.sizes}
        self._fill_padding(0, top)
        self._ints.copy_(self._ints_host)
        for size in reversed(self.sizes):  # largest first, so smaller graphs fit in its memory pool
            self.graphs[size] = graph_backend.capture(self._forward_fn(size))

    def _forward_fn(self, b: int) -> Callable[[], torch.Tensor]:
        meta = TritonAttentionMetadata(
            query_start_loc=self.query_start_loc[: b + 1], seq_lens=self.seq_lens[:b],
            block_tables=self.block_tables[:b], slot_mapping=self.slot_mapping[:b], max_query_len=1,
            backend=self.attn_backend,
        )

        # The closure holds the tensors, not ``self``: the graphs it ends up in belong to ``self``, and a
        # reference cycle would keep the whole engine alive until the cycle collector ran.
        model, kv_caches = self.model, self.kv_caches
        seq_lens, lens = self.seq_lens[:b], self._lens[:b]
        input_ids, positions = self.input_ids[:b], self.positions[:b]

        @torch.inference_mode()
        def fn() -> torch.Tensor:
            seq_lens.copy_(lens)  # int64 -> int32, inside the graph
            return model(input_ids, positions, meta, kv_caches)

        return fn

    def _fill_padding(self, start: int, stop: int) -> None:
        """Host rows start..stop become padding: token 0 at position 0, length 1, in the scratch block."""
        ints = self._ints_np
        ints[0, start:stop] = 0
        ints[1, start:stop] = 0
        ints[2, start:stop] = self.pad_block * self.block_size
        ints[3, start:stop] = 1

    def can_run(self, num_decodes: int) -> bool:
        return bucket_for(num_decodes, self.sizes) is not None

    def load(self, inputs: DecodeInputs) -> int:
        """Copy a step into the static buffers (rows past n become padding); returns the bucket size.

        Table columns past the step's longest row keep what they held: the kernel reads a row's blocks
        only up to its own length."""
        n = len(inputs.input_ids)
        b = bucket_for(n, self.sizes)
        if b is None:
            raise ValueError(f"{n} decodes: more than the largest captured size {self.sizes[-1]}")
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copies have left the host buffers
        ints = self._ints_np
        used = [cdiv(s, self.block_size) for s in inputs.seq_lens]
        kmax = max(used)
        for i, (table, k) in enumerate(zip(inputs.block_tables, used, strict=True)):
            if k > self.width or k > len(table):
                raise ValueError(f"row {i}: {inputs.seq_lens[i]} tokens need {k} blocks; table has "
                                 f"{len(table)}, {self.width} captured")
        tables = self._tables_np[: b * kmax].reshape(b, kmax)
        tables.fill(self.pad_block)  # padding rows and the unused tail of short rows: the scratch block
        for i, (table, k) in enumerate(zip(inputs.block_tables, used, strict=True)):
            tables[i, :k] = table[:k]
        ints[0, :n] = inputs.input_ids
        ints[1, :n] = inputs.positions
        ints[2, :n] = inputs.slots
        ints[3, :n] = inputs.seq_lens
        self._fill_padding(n, b)
        self._ints.copy_(self._ints_host, non_blocking=True)  # contiguous, pinned: asynchronous
        staged = self._tables_dev[: b * kmax]
        staged.copy_(self._tables_host[: b * kmax], non_blocking=True)
        self.block_tables[:b, :kmax].copy_(staged.view(b, kmax))
        if self._copied is not None:
            self._copied.record()
        return b

    def replay(self, b: int, n: int) -> torch.Tensor:
        """Replay the graph of size b; the hidden states [n, hidden] of the real rows."""
        replay, out = self.graphs[b]
        replay()
        self.replays[b] += 1
        return out[:n]

    def run(self, inputs: DecodeInputs) -> torch.Tensor:
        """``load`` then ``replay``: hidden states [n, hidden] of one decode step."""
        return self.replay(self.load(inputs), len(inputs.input_ids))

    def close(self) -> None:
        """Drop the graphs, their memory pool and the pinned buffers (the engine's ``close``)."""
        self.graphs.clear()
        release = getattr(self.graph_backend, "release", None)
        if release is not None:
            release()
        self.model = None  # type: ignore[assignment]
        self.kv_caches = []
        self._ints_host = self._tables_host = torch.empty(0)
        self._ints_np = self._tables_np = None  # type: ignore[assignment]
