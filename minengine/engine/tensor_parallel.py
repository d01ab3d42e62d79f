"""Tensor parallelism, the engine's side: the other ranks' processes, and how rank 0 drives them.

The engine's process is rank 0. It owns the scheduler, the KV accounting and the sampler, exactly as
with one rank; the model and the KV cache are what is split (``models/tensor_parallel.py``). Ranks 1 to
N-1 are processes of their own (``torch.multiprocessing``, spawned), each with a ``Worker`` of its own
over its shard and its share of the KV cache: the same blocks, fewer heads in each (their loop is
``worker.run_tensor_parallel_rank``). Every step:

1. rank 0 sends each rank the step's packed inputs (``StepInputs``: token ids, positions, the block
   tables; a few hundred bytes through a pipe, as vLLM broadcasts each step's scheduler output) as soon
   as it has packed them, so the others build their tensors while it builds its own;
2. all ranks run the forward pass together; at each layer's two row-parallel projections they meet in an
   all-reduce (``torch.distributed``: gloo on a CPU), which is where they wait for each other;
3. rank 0 alone turns its hidden states into logits and samples. The other ranks send nothing back.

This version runs on a CPU (gloo). Each rank gets ``torch.get_num_threads() // N`` threads, so two ranks
on a two-core laptop split its cores instead of fighting over them.
"""

from __future__ import annotations

import multiprocessing.connection
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from minengine.config import EngineConfig
from minengine.models.tensor_parallel import TensorParallelGroup, build_shard, shard_config, shard_weights

START_TIMEOUT_S = 300.0  # a rank's start-up: import torch, build its shard, time its kernels


@dataclass
class StepInputs:
    """What every rank needs for one forward pass: the packed batch as plain lists (rank 0 builds it)."""

    input_ids: list[int]
    positions: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]


class TensorParallelRanks:
    """Ranks 1..N-1 of one engine, seen from rank 0: started with their shards, sent each step, stopped.

    ``TensorParallelRanks.start`` returns it with rank 0's own shard (``model``) and its group
    (``group``, whose all-reduce timings go into each step's record)."""

    def __init__(self, model: torch.nn.Module, group: TensorParallelGroup,
                 processes: list[Any], pipes: list[multiprocessing.connection.Connection],
                 threads_before: int) -> None:
        self.model = model
        self.group = group
        self.processes = processes
        self.pipes = pipes
        self.closed = False
        # ``del engine`` without close(): still stop the ranks and leave the process group
        self._finalizer = weakref.finalize(self, _stop, processes, pipes, threads_before, group)

    @classmethod
    def start(cls, model: torch.nn.Module, config: EngineConfig,
              rank_main: Callable[..., None]) -> TensorParallelRanks:
        """Spawn ranks 1..N-1, each running ``rank_main`` (``worker.run_tensor_parallel_rank``) on its
        shard, then join the process group as rank 0 with rank 0's own shard."""
        world = config.tensor_parallel_size
        if model.device.type != "cpu":
            raise ValueError(f"tensor_parallel_size={world} runs on a CPU (gloo) in this version; this model "
                             f"is on {model.device.type}. On GPUs, serve it with vLLM "
                             "(--tensor-parallel-size), or run one GPU here")
        if dist.is_initialized():
            raise RuntimeError("this process already holds a torch.distributed group (another engine with "
                               "tensor_parallel_size > 1?): close that engine first")
        local_config = shard_config(model.config, world)  # raises unless the heads and MLP divide
        threads_before = torch.get_num_threads()
        threads = max(1, threads_before // world)
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
        context = torch.multiprocessing.get_context("spawn")
        processes, pipes = [], []
        try:
            for rank in range(1, world):
                ours, theirs = context.Pipe()
                process = context.Process(
                    target=rank_main, name=f"minengine-tp-rank{rank}", daemon=True,
                    args=(rank, world, store.port, threads, local_config,
                          shard_weights(model, rank, world), config, theirs))
                process.start()
                theirs.close()
                processes.append(process)
                pipes.append(ours)
            weights = shard_weights(model, 0, world)
            for rank, (process, pipe) in enumerate(zip(processes, pipes, strict=True), start=1):
                _expect(rank, process, pipe, "joining")
            torch.set_num_threads(threads)
            dist.init_process_group("gloo", store=store, rank=0, world_size=world)
            group = TensorParallelGroup(0, world)
            shard = build_shard(local_config, weights, group)
        except BaseException:
            _stop(processes, pipes, threads_before)
            raise
        return cls(shard, group, processes, pipes, threads_before)

    def wait_ready(self, num_blocks: int) -> None:
        """Tell every rank how many KV blocks rank 0 sized, and wait until each has built its Worker."""
        for pipe in self.pipes:
            pipe.send(num_blocks)
        try:
            for rank, (process, pipe) in enumerate(zip(self.processes, self.pipes, strict=True), start=1):
                _expect(rank, process, pipe, "ready")
        except BaseException:
            self.close()
            raise

    def send(self, step: StepInputs) -> None:
        """Start this step's forward pass on every other rank."""
        for pipe in self.pipes:
            pipe.send(step)

    def close(self) -> None:
        """Stop the other ranks (they exit their loop) and leave the process group."""
        if not self.closed:
            self.closed = True
            self._finalizer()


def _expect(rank: int, process: Any, pipe: multiprocessing.connection.Connection, word: str) -> None:
    """Wait for rank ``rank`` to say ``word``; raise with what it said instead, or if it died or hung."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not pipe.poll(0.1):  # poll is also true once the rank has closed its end (it exited)
        if not process.is_alive():
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"tensor-parallel rank {rank} did not start in {START_TIMEOUT_S:.0f} s")
    try:
        said = pipe.recv()
    except EOFError:
        process.join(timeout=5)
        raise RuntimeError(
            f"tensor-parallel rank {rank} exited (code {process.exitcode}) while starting; its error is "
            "printed above. In a script, start the engine under `if __name__ == \"__main__\":`, since each "
            "rank is a new Python process that imports the script (as with vLLM)") from None
    if said != word:
        raise RuntimeError(f"tensor-parallel rank {rank} failed to start:\n{said}")


def _stop(processes: list[Any], pipes: list[multiprocessing.connection.Connection],
          threads_before: int, group: TensorParallelGroup | None = None) -> None:
    for pipe in pipes:
        try:
            pipe.send(None)
        except (BrokenPipeError, OSError):
            pass  # that rank has already gone
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)
    for pipe in pipes:
        pipe.close()
    if group is not None:
        group.save_trace()
    TensorParallelGroup.destroy()
    torch.set_num_threads(threads_before)
