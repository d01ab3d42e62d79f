"""The GPU fast path: decode steps replayed from CUDA graphs, decodes attended in place in the paged cache.

Why: on a GPU a decode step of a small model is a few hundred tiny kernels, and launching them from
Python costs more than running them. A CUDA graph records the kernels of one forward once and replays
them with one launch. A graph has fixed shapes and fixed addresses, so (as in vLLM and nano-vllm):

1. graphs are captured for a few batch sizes (``capture_sizes``: powers of two, then ``max_num_seqs``;
   nano-vllm and vLLM capture more sizes, but each size here is also one compile of the flex kernel);
2. a step of n decodes runs the graph of the next size up (``bucket_for``), the extra rows padded with
   a dummy token that writes to and reads from a scratch KV block the scheduler never hands out;
3. inputs are copied into *static* buffers before each replay, and the output is read from the
   static tensor the capture produced.

Steps with a prefill, or more decodes than the largest size, run eagerly; their decodes can still use
the in-place attention (``attention_backend="flex"``). ``EngineConfig.enforce_eager`` turns graphs off.

The graph mechanics sit behind ``GraphBackend``: ``CudaGraphBackend`` on a GPU, ``EagerReplayBackend``
(which "replays" by calling the function again on the same static buffers) so the bookkeeping (bucket
choice, padding, buffer filling, output slicing) is tested on a CPU with the same code.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from minengine.config import EngineConfig
from minengine.engine.kv_cache import PagedKVCache
from minengine.engine.sampler import Sampler
from minengine.models.attention import AttentionMetadata, KVCache
from minengine.models.paged_decode import DecodeBatch

if TYPE_CHECKING:
    from minengine.engine.compiled_decode import CompiledDecode
    from minengine.engine.model_runner import ModelRunner

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

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        stream = torch.cuda.Stream(self.device)
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
        return graph.replay, out


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
        backend: str,
        graph_backend: GraphBackend,
        device: torch.device,
    ) -> None:
        k0 = kv_caches[0][0]
        self.block_size, self.num_cache_blocks = int(k0.shape[1]), int(k0.shape[0])
        if not 0 <= pad_block < self.num_cache_blocks:
            raise ValueError(f"pad_block {pad_block} is not a block of the cache ({self.num_cache_blocks})")
        self.model, self.kv_caches, self.device = model, kv_caches, device
        self.sizes, self.pad_block, self.backend = sorted(sizes), pad_block, backend
        self.width = max_blocks_per_seq
        top = self.sizes[-1]
        # One int64 block holds the per-row inputs (ids, positions, slots, blocks used, lengths), so a
        # step is two host-to-device copies (this block and the used columns of the tables), pinned.
        pin = device.type == "cuda"
        self._ints_host = torch.zeros((5, top), dtype=torch.long, pin_memory=pin)
        # the step's tables, packed [b, kmax] (kmax = most blocks any row uses), then spread on the device
        self._tables_host = torch.full((top * self.width,), pad_block, dtype=torch.int32, pin_memory=pin)
        self._tables_dev = torch.empty(top * self.width, dtype=torch.int32, device=device)
        self._ints_np, self._tables_np = self._ints_host.numpy(), self._tables_host.numpy()
        self._ints = torch.zeros((5, top), dtype=torch.long, device=device)
        self.input_ids, self.positions, self.slot_mapping, self._used, self.seq_lens = self._ints.unbind(0)
        self.block_tables = torch.full((top, self.width), pad_block, dtype=torch.int32, device=device)
        self.num_blocks = torch.ones(top, dtype=torch.int32, device=device)  # from _used, inside the graph
        self.p2l = (torch.full((top, self.num_cache_blocks), -1, dtype=torch.int32, device=device)
                    if backend == "flex" else None)
        self._copied = torch.cuda.Event() if pin else None  # the host buffers may be reused after it
        self.graphs: dict[int, tuple[Callable[[], None], torch.Tensor]] = {}
        self.replays: dict[int, int] = {n: 0 for n in self.sizes}
        self._fill_padding(0, top)
        self._ints.copy_(self._ints_host)
        for size in reversed(self.sizes):  # largest first, so smaller graphs fit in its memory pool
            self.graphs[size] = graph_backend.capture(self._forward_fn(size))

    def _forward_fn(self, b: int) -> Callable[[], torch.Tensor]:
        batch = DecodeBatch(
            self.block_tables[:b], self.num_blocks[:b], self.seq_lens[:b], self.block_size,
            self.num_cache_blocks, self.backend, rows=torch.arange(b, device=self.device),
            physical_to_logical=None if self.p2l is None else self.p2l[:b],
        )
        meta = AttentionMetadata(
            query_start_loc=list(range(b + 1)), seq_lens=[1] * b, slot_mapping=self.slot_mapping[:b],
            block_tables=[[self.pad_block]] * b, block_size=self.block_size, decode_batch=batch,
        )

        @torch.inference_mode()
        def fn() -> torch.Tensor:
            self.num_blocks[:b].copy_(self._used[:b])  # int64 -> int32, inside the graph
            batch.refresh()  # physical_to_logical from the tables, inside the graph
            return self.model(self.input_ids[:b], self.positions[:b], meta, self.kv_caches)

        return fn

    def _fill_padding(self, start: int, stop: int) -> None:
        """Host rows start..stop become padding: token 0 at position 0, one block (the scratch block)."""
        ints = self._ints_np
        ints[0, start:stop] = 0
        ints[1, start:stop] = 0
        ints[2, start:stop] = self.pad_block * self.block_size
        ints[3, start:stop] = 1
        ints[4, start:stop] = 1

    def can_run(self, num_decodes: int) -> bool:
        return bucket_for(num_decodes, self.sizes) is not None

    def load(self, inputs: DecodeInputs) -> int:
        """Copy a step into the static buffers (rows past n become padding); returns the bucket size.

        Table columns past the step's longest row are left as they are: flex never visits them, and the
        static gather masks them out (they always hold some valid block id)."""
        n = len(inputs.input_ids)
        b = bucket_for(n, self.sizes)
        if b is None:
            raise ValueError(f"{n} decodes: more than the largest captured size {self.sizes[-1]}")
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copies have left the host buffers
        ints = self._ints_np
        used = [-(-s // self.block_size) for s in inputs.seq_lens]
        kmax = max(used)
        for i, (table, k) in enumerate(zip(inputs.block_tables, used, strict=True)):
            if k > self.width or k > len(table):
                raise ValueError(f"row {i}: {inputs.seq_lens[i]} tokens need {k} blocks; table has "
                                 f"{len(table)}, {self.width} captured")
        tables = self._tables_np[: b * kmax].reshape(b, kmax)
        tables.fill(self.pad_block)  # padding rows and the unused tail of short rows: the scratch block
        for i, (table, k) in enumerate(zip(inputs.block_tables, used, strict=True)):
            tables[i, :k] = table[:k]
        ints[3, :n] = used
        ints[0, :n] = inputs.input_ids
        ints[1, :n] = inputs.positions
        ints[2, :n] = inputs.slots
        ints[4, :n] = inputs.seq_lens
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


# ---- choosing and building the fast path (LLMEngine calls these) ----
@dataclass
class FastPathPlan:
    """What the engine runs: ``attention_backend`` for decodes and whether decode steps use graphs."""

    attention_backend: str
    cuda_graphs: bool

    @property
    def enabled(self) -> bool:
        return self.attention_backend != "gather" or self.cuda_graphs

    @property
    def extra_blocks(self) -> int:
        """KV blocks allocated beyond the scheduler's: the scratch block padding rows write to (the C++
        kernel pads nothing)."""
        return 1 if self.enabled and self.attention_backend != "cpp" else 0


def plan_fast_path(config: EngineConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> FastPathPlan:
    """None fields by device: CUDA gets flex attention and graphs; a CPU with fp32 weights the C++ decode
    kernel when it builds (``models/cpu_kernels.py``), else the reference path. Graphs are on by
    default only with flex: the static gather reads every row's longest allowed context."""
    cuda = device.type == "cuda"
    backend = config.attention_backend
    if backend is None:
        graphs_asked = config.enforce_eager is False  # on a CPU: the eager-replay test of the graph path
        backend = "flex" if cuda else ("cpp" if not graphs_asked and _cpp_kernel_usable(device, dtype) else "gather")
    elif backend == "cpp":
        if device.type != "cpu" or dtype != torch.float32:
            raise ValueError(f"attention_backend='cpp' is the CPU's fp32 kernel; this engine runs {dtype} on "
                             f"{device.type} (use 'flex' or 'gather', or None to pick by device)")
        if not _cpp_kernel_usable(device, dtype):
            from minengine.models import cpu_kernels

            raise ValueError(f"attention_backend='cpp': the CPU kernels are not in use ({cpu_kernels.build_error()})")
    eager = config.enforce_eager if config.enforce_eager is not None else not (cuda and backend == "flex")
    if backend == "cpp" and not eager:
        raise ValueError("attention_backend='cpp' runs without graphs: leave enforce_eager unset or True")
    return FastPathPlan(backend, not eager)


def _cpp_kernel_usable(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cpu" or dtype != torch.float32:
        return False
    from minengine.models import cpu_kernels

    return cpu_kernels.load()


def make_model_runner(
    model: torch.nn.Module,
    kv_cache: PagedKVCache,
    device: torch.device,
    sampler: Sampler,
    config: EngineConfig,
    plan: FastPathPlan,
    graph_backend: GraphBackend | None = None,
) -> ModelRunner:
    """The engine's ``ModelRunner`` for ``plan`` (``kv_cache`` holds ``plan.extra_blocks`` more blocks
    than the scheduler's ``kv_cache.num_blocks``; the last one is the scratch block)."""
    runner = _make_runner(model, kv_cache, device, sampler, config, plan, graph_backend)
    if config.compile_decode:
        runner.compiled_decode = _compiled_decode(model, kv_cache, device)
    return runner


def _compiled_decode(model: torch.nn.Module, kv_cache: PagedKVCache, device: torch.device) -> CompiledDecode:
    """The CPU's compiled decode steps, compiled now (on block 0: nothing is allocated yet); batch-1 steps
    only when the Linear layers run on prepacked weights (``CompiledDecode.max_batch``)."""
    from minengine.engine.compiled_decode import CompiledDecode

    if device.type != "cpu":
        raise ValueError(f"compile_decode is a CPU fast path; on {device.type} leave it off "
                         "(on CUDA the engine replays CUDA graphs instead: enforce_eager=False)")
    prepacked = any(getattr(m, "packed", None) is not None for m in model.modules())
    compiled = CompiledDecode(model, kv_cache.kv_caches, kv_cache.block_size, max_batch=1 if prepacked else None)
    compiled.warmup(free_block=0)
    return compiled


def _make_runner(
    model: torch.nn.Module, kv_cache: PagedKVCache, device: torch.device, sampler: Sampler,
    config: EngineConfig, plan: FastPathPlan, graph_backend: GraphBackend | None,
) -> ModelRunner:
    from minengine.engine.model_runner import ModelRunner

    if not plan.enabled:
        return ModelRunner(model, kv_cache, device, sampler)
    assert config.max_model_len is not None, "resolve the EngineConfig first"
    pad_block = int(kv_cache.kv_caches[0][0].shape[0]) - 1
    width = -(-config.max_model_len // kv_cache.block_size)
    graphs = None
    if plan.attention_backend == "cpp":  # no padding rows, no graphs: only the kernel's block tables
        return ModelRunner(model, kv_cache, device, sampler, attention_backend="cpp")
    if plan.cuda_graphs:
        if graph_backend is None:
            graph_backend = CudaGraphBackend(device) if device.type == "cuda" else EagerReplayBackend()
        try:
            graphs = DecodeGraphRunner(
                model, kv_cache.kv_caches, sizes=capture_sizes(config.max_num_seqs, config.cudagraph_capture_sizes),
                max_blocks_per_seq=width, pad_block=pad_block, backend=plan.attention_backend,
                graph_backend=graph_backend, device=device,
            )
        except Exception as e:  # an untested GPU/torch combination: run, slower, rather than fail
            if device.type != "cuda":
                raise
            warnings.warn(f"CUDA graph capture failed ({type(e).__name__}: {e}); running the reference "
                          "path (set enforce_eager=True, attention_backend='gather' to skip the attempt)",
                          RuntimeWarning, stacklevel=2)
            return ModelRunner(model, kv_cache, device, sampler)
    return ModelRunner(model, kv_cache, device, sampler, attention_backend=plan.attention_backend,
                       graph_runner=graphs, pad_block=pad_block, max_blocks_per_seq=width)
