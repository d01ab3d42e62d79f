"""Tensor parallelism, the model's side: how a Llama is split across ranks, and the all-reduce that joins it.

Megatron-LM's split (Shoeybi et al., 2019), as vLLM and nano-vllm apply it to a Llama. Each of the
``world_size`` ranks holds:

- ``qkv_proj`` *column-parallel*: its share of the query heads and of the KV heads (so its KV cache holds
  only those heads), each rank computing attention for its own heads with no communication;
- ``o_proj`` *row-parallel*: the input columns that belong to its heads. Each rank's product is a partial
  sum of the full output, so the ranks add theirs together: **one all-reduce after attention**;
- ``gate_up_proj`` column-parallel (its share of the intermediate features, gate and up alike) and
  ``down_proj`` row-parallel: **one all-reduce after the MLP**;
- everything else whole: embeddings, norms, the LM head. vLLM also splits the vocabulary
  (``VocabParallelEmbedding``, ``ParallelLMHead``); here the LM head runs on rank 0 only, which samples.

A rank's model is an ordinary ``LlamaForCausalLM`` built from ``shard_config``: the same code with fewer
heads and a narrower MLP. The only difference is ``tp_group`` on its attention and MLP modules, which
makes them all-reduce their output (``llama.py``). A row-parallel layer's bias is added once, by rank 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from minengine.models.config import ModelConfig

TRACE_ENV = "MINENGINE_TP_TRACE"  # a folder: each rank writes rank<N>.json there when it leaves the group


class TensorParallelGroup:
    """This process's rank in the group, and the all-reduce the row-parallel layers call.

    It times every all-reduce (``seconds``, ``calls``), so each step's record shows what joining the ranks
    cost. On a CPU the time includes waiting for the slowest rank to reach the same layer. With
    :data:`TRACE_ENV` set, every rank also keeps each call's entry and exit time (``time.perf_counter``, one
    clock for all processes of a machine) and writes them out on leaving (:meth:`save_trace`), which
    separates waiting for the other rank from the all-reduce itself (``benchmarks/tensor_parallel.py
    --trace``)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.seconds = 0.0
        self.calls = 0
        self.trace_dir = os.environ.get(TRACE_ENV) or None
        self.trace: list[tuple[float, float, int]] = []  # (entry, exit, elements) of every call

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place, and return it."""
        start = time.perf_counter()
        dist.all_reduce(x)
        end = time.perf_counter()
        self.seconds += end - start
        self.calls += 1
        if self.trace_dir:
            self.trace.append((start, end, x.numel()))
        return x

    def save_trace(self) -> None:
        if self.trace_dir:
            Path(self.trace_dir, f"rank{self.rank}.json").write_text(json.dumps(self.trace))

    def take_timings(self) -> tuple[float, int]:
        """(seconds, calls) since the last take: one step's all-reduces."""
        out = (self.seconds, self.calls)
        self.seconds, self.calls = 0.0, 0
        return out

    @staticmethod
    def destroy() -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def check_divisible(config: ModelConfig, world_size: int) -> None:
    """Raise, saying what to change, unless each rank gets a whole share of every split dimension."""
    if world_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {world_size}")
    for what, n in (("attention heads", config.num_attention_heads),
                    ("KV heads", config.num_key_value_heads),
                    ("intermediate features (MLP width)", config.intermediate_size)):
        if n % world_size:
            sizes = [d for d in range(1, n + 1) if n % d == 0 and d <= 8]
            raise ValueError(f"tensor_parallel_size={world_size} does not divide this model's {n} {what}; "
                             f"each rank needs a whole share (sizes that do: {sizes})")


def shard_config(config: ModelConfig, world_size: int) -> ModelConfig:
    """One rank's model: 1/world_size of the heads, KV heads and MLP width; everything else unchanged."""
    check_divisible(config, world_size)
    return dataclasses.replace(
        config, num_attention_heads=config.num_attention_heads // world_size,
        num_key_value_heads=config.num_key_value_heads // world_size,
        intermediate_size=config.intermediate_size // world_size)


def _rows(t: torch.Tensor, sizes: list[int], rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s share of each consecutive block of rows (sizes), concatenated: a column-parallel
    layer's weight when several projections are fused in one matrix (q, k, v or gate, up)."""
    parts, start = [], 0
    for size in sizes:
        share = size // world_size
        parts.append(t[start + rank * share: start + (rank + 1) * share])
        start += size
    return torch.cat(parts)


def shard_weights(model: torch.nn.Module, rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s tensors of a whole model, under the module's own (fused) names, each a fresh copy."""
    config: ModelConfig = model.config
    qkv = [config.q_size, config.kv_size, config.kv_size]
    gate_up = [config.intermediate_size] * 2
    out = {}
    for name, t in model.named_parameters(remove_duplicate=False):
        if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
            t = _rows(t, qkv, rank, world_size)
        elif name.endswith("gate_up_proj.weight") or name.endswith("gate_up_proj.bias"):
            t = _rows(t, gate_up, rank, world_size)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):  # row-parallel: a share of the inputs
            share = t.shape[1] // world_size
            t = t[:, rank * share: (rank + 1) * share]
        elif name.endswith(("o_proj.bias", "down_proj.bias")) and rank != 0:
            t = torch.zeros_like(t)  # added once, by rank 0, after the partial sums are joined
        out[name] = t.contiguous().clone()
    return out


def build_shard(config: ModelConfig, weights: dict[str, torch.Tensor],
                group: TensorParallelGroup | None) -> torch.nn.Module:
    """A rank's ``LlamaForCausalLM`` from ``shard_config``'s shapes and ``shard_weights``' tensors, its
    row-parallel layers joined through ``group``."""
    from minengine.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
    from minengine.models.loader import _no_random_init

    device = next(iter(weights.values())).device
    with torch.device("meta"), _no_random_init():
        model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"shard weights do not fit the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.model.rotary_emb.build_cache(device)
    for module in model.modules():
        if isinstance(module, LlamaAttention | LlamaMLP):
            module.tp_group = group
    return model.eval().requires_grad_(False)
