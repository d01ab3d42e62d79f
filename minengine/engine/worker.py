"""``Worker``: the one owner of the engine's device side: what runs, the memory it holds, and its end.

Everything that depends on the device is decided and built here, once, in this order:

1. the kernels: which library each Linear layer calls (a CPU in fp32) and the small C++ ops;
2. the attention backend (``models/attention/backends.py``) and whether decode steps replay CUDA graphs,
   each either asked for or chosen, with the reason recorded (``plan_execution``);
3. the KV cache: its size (vLLM's rule on a GPU, a fixed budget on a CPU), checked against what the
   kernels can index, then allocated per layer;
4. the ``ModelRunner`` (the executor) and its graphs or compiled steps.

``worker.runtime`` says what was built, in one place: ``minengine serve`` and ``minengine generate`` print
it, and run summaries carry it. Nothing falls back silently: a path that was asked for (or is the
device's default) and cannot be built raises with the reason and the option that runs without it, as
vLLM does. ``close()`` releases all of it: the KV cache, the graphs and their memory pool, compiled
steps and pinned buffers. Nothing here holds a reference back to the engine, so ``del`` frees it too.
"""

from __future__ import annotations

import dataclasses
import multiprocessing.connection
import os
import traceback
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from minengine.config import EngineConfig
from minengine.engine.kv_cache import PagedKVCache, check_kv_index_space, determine_num_blocks
from minengine.engine.model_runner import ModelRunner
from minengine.engine.sampler import Sampler
from minengine.engine.tensor_parallel import TensorParallelRanks
from minengine.models import linear_kernels, triton_ops
from minengine.models.attention.backends import get_attention_backend
from minengine.models.tensor_parallel import TensorParallelGroup, build_shard
from minengine.utils import cdiv


@dataclass
class ExecutionPlan:
    """What the engine runs: the attention backend, whether decode steps replay CUDA graphs, and why
    (``reasons``: one line for each choice the user did not make)."""

    attention_backend: str
    cuda_graphs: bool
    reasons: dict[str, str] = field(default_factory=dict)

    @property
    def extra_blocks(self) -> int:
        """KV blocks allocated beyond the scheduler's: the scratch block that graph padding rows use."""
        return 1 if self.cuda_graphs else 0


def plan_execution(config: EngineConfig, device: torch.device,
                   dtype: torch.dtype = torch.float32) -> ExecutionPlan:
    """The attention backend and graphs for this device: as asked, else the device's default, with the
    reason. CUDA: the Triton kernel with graphs. A CPU in fp32: the C++ decode kernel when it is built,
    else the reference path. A CPU that asks for graphs (``enforce_eager=False``): the Triton backend under
    the interpreter, replayed eagerly: the test of the GPU path that CI can run."""
    cuda = device.type == "cuda"
    reasons: dict[str, str] = {}
    backend = config.attention_backend
    if backend is None:
        if cuda:
            backend = "triton"
            reasons["attention_backend"] = "the CUDA default: one Triton kernel per layer for every step"
        elif config.enforce_eager is False:
            backend = "triton"
            reasons["attention_backend"] = "graphs asked for on a CPU: the Triton kernel, interpreted"
        elif dtype != torch.float32:
            backend = "gather"
            reasons["attention_backend"] = f"the C++ decode kernel is fp32 only; this engine runs {dtype}"
        elif not _cpp_kernel_usable(device, dtype):
            from minengine.models import cpu_kernels

            backend = "gather"
            reasons["attention_backend"] = f"the C++ kernels are not built ({cpu_kernels.build_error()})"
        else:
            backend = "cpp"
            reasons["attention_backend"] = "the CPU default in fp32: decodes in the C++ kernel"
    elif backend == "cpp":
        if device.type != "cpu" or dtype != torch.float32:
            raise ValueError(f"attention_backend='cpp' is the CPU's fp32 kernel; this engine runs {dtype} on "
                             f"{device.type} (use 'triton' or 'gather', or None to pick by device)")
        if not _cpp_kernel_usable(device, dtype):
            from minengine.models import cpu_kernels

            raise ValueError("attention_backend='cpp': the CPU kernels are not in use "
                             f"({cpu_kernels.build_error()})")
    if config.enforce_eager is None:
        graphs = cuda and backend == "triton"
        reasons["cuda_graphs"] = ("the CUDA default with the triton backend" if graphs
                                  else "off: graphs replay the triton backend on CUDA only")
    else:
        graphs = not config.enforce_eager
    if graphs and backend != "triton":
        raise ValueError(f"CUDA graphs replay the triton backend's decode steps, not {backend!r}: set "
                         "attention_backend='triton' (or None), or enforce_eager=True")
    return ExecutionPlan(backend, graphs, reasons)


def _cpp_kernel_usable(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cpu" or dtype != torch.float32:
        return False
    from minengine.models import cpu_kernels

    return cpu_kernels.load()


@dataclass
class RuntimeInfo:
    """What the engine actually runs, for the start-up line, the run summaries and the lessons."""

    device: str
    dtype: str
    attention_backend: str
    cuda_graphs: bool
    capture_sizes: list[int]
    kv_cache: str  # the tensors' layout
    kv_cache_bytes: int
    linear_kernel: str
    small_ops: str  # RMSNorm, RoPE, SiLU-and-mul: "triton" (GPU), "cpp" (CPU fp32) or "torch"
    compiled_decode: str | None
    reasons: dict[str, str]
    versions: dict[str, str]

    def describe(self) -> str:
        """One line: backend, graphs, dtype, the KV tensors, and the reason for each default taken."""
        graphs = f"CUDA graphs for decode batches {self.capture_sizes}" if self.cuda_graphs else "no graphs"
        if self.cuda_graphs and self.device == "cpu":
            graphs = f"decode graphs {self.capture_sizes} replayed eagerly (the CPU test of the CUDA path)"
        line = (f"attention {self.attention_backend!r}, {graphs}, small ops {self.small_ops}, "
                f"{self.dtype} on {self.device}; KV cache "
                f"{self.kv_cache} ({self.kv_cache_bytes / 2**20:,.0f} MiB)")
        if self.compiled_decode:
            line += f"; compiled decode steps {self.compiled_decode}"
        if self.reasons:
            line += " [" + "; ".join(f"{k}: {v}" for k, v in self.reasons.items()) + "]"
        return line

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Worker:
    """Sets up the device side of one engine (see the module doc) and releases it on ``close()``."""

    def __init__(self, model: torch.nn.Module, config: EngineConfig, graph_backend: Any = None,
                 tp_rank: int = 0) -> None:
        """``tp_rank``: under tensor parallelism, which rank this worker is (0, the default, drives the
        others; ``engine/tensor_parallel.py`` builds ranks 1..N-1 with their shard as ``model``)."""
        assert config.is_resolved, "resolve the EngineConfig first"
        self.config = config
        self.closed = True  # until everything below is built
        # Tensor parallelism: rank 0 starts the other ranks and keeps its own shard of the model.
        self.tp_ranks: TensorParallelRanks | None = None
        if config.tensor_parallel_size > 1 and tp_rank == 0:
            self.tp_ranks = TensorParallelRanks.start(model, config, run_tensor_parallel_rank)
            model = self.tp_ranks.model
        try:
            self._build(model, config, graph_backend)
        except BaseException:
            if self.tp_ranks is not None:
                self.tp_ranks.close()
            raise

    def _build(self, model: torch.nn.Module, config: EngineConfig, graph_backend: Any) -> None:
        self.model = model
        self.device: torch.device = model.device
        self.dtype: torch.dtype = model.dtype
        model_config = model.config
        self.linear_kernel = _pick_linear_kernel(model, config.linear_kernel, config.prepack_weights)
        # True: csrc/rms_norm.cpp, activation.cpp and rotary.cpp run (a CPU in fp32)
        self.small_op_kernels = _use_small_op_kernels(model)
        # On CUDA: RMSNorm, RoPE and SwiGLU's activation as one Triton kernel each (models/triton_ops.py):
        # a small model's graphed decode step is bound by its number of kernels
        self.triton_small_ops = self.device.type == "cuda" and triton_ops.use_triton_ops(model)
        self.plan = plan_execution(config, self.device, self.dtype)
        self.attn_backend = get_attention_backend(self.plan.attention_backend)
        self.num_blocks = determine_num_blocks(config, model_config, self.dtype, self.device, model)
        total = self.num_blocks + self.plan.extra_blocks
        check_kv_index_space(model_config, total, config.block_size, self.attn_backend.name)
        self.kv_cache = PagedKVCache.allocate(model_config, total, config.block_size, self.dtype, self.device)
        self.kv_cache.num_blocks = self.num_blocks  # the scheduler's blocks; the scratch block is extra
        if self.tp_ranks is not None:  # the other ranks hold the same blocks, for their own heads
            self.tp_ranks.wait_ready(self.num_blocks)
        self.sampler = Sampler(config.seed, self.device)
        if self.device.type == "cuda":
            self._warm_up_attention()
        self.model_runner = self._make_runner(graph_backend)
        self.runtime = self._runtime_info()
        self.closed = False
        if self.device.type == "cuda":
            # what the engine made cuBLAS keep (a workspace per stream) goes with it, ``del`` included
            weakref.finalize(self, _release_cuda_caches, self.device)

    @torch.inference_mode()
    def _warm_up_attention(self) -> None:
        """One mixed step (a prompt chunk and a decode) on blocks no request holds yet, so the kernels'
        compiles happen at start-up, not in a request's first steps (vLLM warms up the same way)."""
        bs = self.kv_cache.block_size
        if self.num_blocks < 4:
            return
        query_lens, seq_lens, tables = [2 * bs, 1], [2 * bs, bs + 1], [[0, 1], [2, 3]]
        meta = self.attn_backend.build_metadata(query_lens, seq_lens, tables, bs, self.device)
        positions = [p for q, s in zip(query_lens, seq_lens, strict=True) for p in range(s - q, s)]
        ids = torch.zeros(len(positions), dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        self.model(ids, pos, meta, self.kv_cache.kv_caches)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _make_runner(self, graph_backend: Any) -> ModelRunner:
        config, kv = self.config, self.kv_cache
        assert config.max_model_len is not None
        pad_block = int(kv.kv_caches[0][0].shape[0]) - 1
        width = cdiv(config.max_model_len, kv.block_size)
        graphs = None
        if self.plan.cuda_graphs:
            from minengine.engine.fast_path import (
                CudaGraphBackend,
                DecodeGraphRunner,
                EagerReplayBackend,
                capture_sizes,
            )

            if graph_backend is None:
                cuda = self.device.type == "cuda"
                graph_backend = CudaGraphBackend(self.device) if cuda else EagerReplayBackend()
            sizes = capture_sizes(config.max_num_seqs, config.cudagraph_capture_sizes)
            try:
                graphs = DecodeGraphRunner(
                    self.model, kv.kv_caches, sizes=sizes, max_blocks_per_seq=width, pad_block=pad_block,
                    attn_backend=self.attn_backend, graph_backend=graph_backend, device=self.device,
                )
            except Exception as e:  # never swap paths silently: say why, and how to run without graphs
                raise RuntimeError(
                    f"capturing the decode graphs failed ({type(e).__name__}: {e}); pass enforce_eager=True "
                    "(--enforce-eager) to run without CUDA graphs"
                ) from e
        runner = ModelRunner(self.model, kv, self.device, self.sampler, attn_backend=self.attn_backend,
                             graph_runner=graphs, tp_ranks=self.tp_ranks)
        if config.compile_decode:
            runner.compiled_decode = _compiled_decode(self.model, kv, self.device)
        return runner

    def _runtime_info(self) -> RuntimeInfo:
        c = self.model.config
        k0 = self.kv_cache.kv_caches[0][0]
        graphs = self.model_runner.graph_runner
        compiled = self.model_runner.compiled_decode
        compiled_state = None
        if compiled is not None:
            compiled_state = (f"off, running eagerly ({compiled.disabled})" if compiled.disabled
                              else f"on, compiled in {compiled.compile_seconds:.1f} s")
        reasons = dict(self.plan.reasons)
        if self.device.type == "cpu":
            reasons["linear"] = self.linear_kernel.describe()
        if self.tp_ranks is not None:
            reasons["tensor_parallel"] = (f"{self.tp_ranks.group.world_size} ranks over gloo, "
                                          f"{torch.get_num_threads()} threads each; this is rank 0's shard")
        return RuntimeInfo(
            device=str(self.device), dtype=str(self.dtype).removeprefix("torch."),
            attention_backend=self.attn_backend.name, cuda_graphs=graphs is not None,
            capture_sizes=list(graphs.sizes) if graphs is not None else [],
            kv_cache=(f"{c.num_hidden_layers} layers x (K, V) x [{k0.shape[0]} blocks, {k0.shape[1]} tokens, "
                      f"{k0.shape[2]} heads, {k0.shape[3]}] {str(k0.dtype).removeprefix('torch.')}"),
            kv_cache_bytes=self.kv_cache.num_bytes, linear_kernel=self.linear_kernel.describe(),
            small_ops="triton" if self.triton_small_ops else ("cpp" if self.small_op_kernels else "torch"),
            compiled_decode=compiled_state, reasons=reasons, versions=_versions(),
        )

    def close(self) -> None:
        """Release the device side: graphs and their pool, compiled steps, the KV cache, pinned buffers."""
        if self.closed:
            return
        self.closed = True
        runner = self.model_runner
        if runner.graph_runner is not None:
            runner.graph_runner.close()
        runner.close()
        if self.tp_ranks is not None:
            self.tp_ranks.close()
        self.kv_cache.kv_caches.clear()
        if self.triton_small_ops:
            triton_ops.use_triton_ops(self.model, on=False)  # the model may outlive the engine
        self.model = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            _release_cuda_caches(self.device)


def _release_cuda_caches(device: torch.device) -> None:
    """Give freed device memory back: cuBLAS's per-stream workspaces, then the allocator's cached blocks."""
    torch.cuda.synchronize(device)
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


def _versions() -> dict[str, str]:
    out = {"torch": torch.__version__}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.version.cuda:
        out["cuda"] = torch.version.cuda
    return out


def _compiled_decode(model: torch.nn.Module, kv_cache: PagedKVCache, device: torch.device) -> Any:
    """The CPU's compiled decode steps, compiled now (on block 0: nothing is allocated yet); batch-1 steps
    only when the Linear layers run on prepacked weights (``CompiledDecode.max_batch``)."""
    from minengine.engine.compiled_decode import CompiledDecode

    if device.type != "cpu":
        raise ValueError(f"compile_decode is a CPU fast path; on {device.type} leave it off "
                         "(on CUDA the engine replays CUDA graphs instead: enforce_eager=False)")
    prepacked = any(getattr(m, "packed", None) is not None for m in model.modules())
    compiled = CompiledDecode(model, kv_cache.kv_caches, kv_cache.block_size,
                              max_batch=1 if prepacked else None)
    compiled.warmup(free_block=0)
    return compiled


def _use_small_op_kernels(model: torch.nn.Module) -> bool:
    """On a CPU in fp32 with the C++ kernels built, every RMSNorm runs as one call (``RMSNorm``'s doc),
    and so do every SwiGLU activation (``LlamaMLP``'s) and every RoPE rotation (``RotaryEmbedding``'s)."""
    from minengine.models import cpu_kernels
    from minengine.models.llama import LlamaMLP, RMSNorm, RotaryEmbedding

    use = model.device.type == "cpu" and model.dtype == torch.float32 and cpu_kernels.load()
    for module in model.modules():
        if isinstance(module, RMSNorm | LlamaMLP | RotaryEmbedding):
            module.use_kernel = use
    return use


def _pick_linear_kernel(model: torch.nn.Module, asked: str | None,
                        prepack: bool | None = None) -> linear_kernels.KernelChoice:
    """The Linear layers' kernels on a CPU in fp32 (``models/linear_kernels.py``): as asked, or timed;
    weights prepacked for oneDNN when it runs the many-row calls (unless ``prepack`` is False)."""
    if model.device.type != "cpu" or model.dtype != torch.float32:
        if asked == "onednn" or prepack:
            what = "linear_kernel='onednn'" if asked == "onednn" else "prepack_weights=True"
            raise ValueError(f"{what} is for fp32 on a CPU; this model is {model.dtype} on "
                             f"{model.device.type}")
        return linear_kernels.KernelChoice("torch", "torch", f"{model.dtype} on {model.device.type}", {})
    choice = (linear_kernels.choose(model) if asked is None
              else linear_kernels.KernelChoice(asked, asked, "asked for", {}))
    if prepack and choice.many_rows != "onednn":  # insisted on: oneDNN runs the many-row calls
        choice = dataclasses.replace(choice, many_rows="onednn",
                                     reason=choice.reason + "; oneDNN for prepacking")
    packs = prepack is not False and choice.many_rows == "onednn"
    if packs and prepack is None:  # the default: only where a second copy of the weights fits easily
        packs, why = linear_kernels.prepack_fits(model)
        if not packs:
            choice = dataclasses.replace(choice, reason=f"{choice.reason}; {why}")
    choice = dataclasses.replace(choice, prepacked=packs)
    linear_kernels.apply(model, choice.one_row, choice.many_rows, prepack=choice.prepacked)
    return choice


def run_tensor_parallel_rank(rank: int, world: int, port: int, threads: int, local_config: Any,
                             weights: dict[str, torch.Tensor], config: EngineConfig,
                             pipe: multiprocessing.connection.Connection) -> None:
    """Tensor parallelism: the process of rank ``rank`` > 0 (``engine/tensor_parallel.py`` spawns it).
    It builds a Worker over its shard, then runs the forward pass of each step rank 0 sends, until told to
    stop (``None``) or rank 0's end of the pipe closes."""
    torch.set_num_threads(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    try:
        pipe.send("joining")
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        group = TensorParallelGroup(rank, world)
        model = build_shard(local_config, weights, group)
        del weights
        num_blocks = pipe.recv()
        if num_blocks is None:
            return
        # Rank 0 sized the cache; this rank holds the same blocks for its own heads.
        worker = Worker(model, dataclasses.replace(config, num_blocks=num_blocks, kv_cache_memory_bytes=None),
                        tp_rank=rank)
    except Exception:
        pipe.send(traceback.format_exc(limit=8))
        return
    pipe.send("ready")
    runner = worker.model_runner
    try:
        while True:
            try:
                step = pipe.recv()
            except EOFError:  # rank 0 has gone
                break
            if step is None:
                break
            runner.forward_hidden(runner.model_input(step))
    finally:
        worker.close()
        group.save_trace()
        TensorParallelGroup.destroy()
