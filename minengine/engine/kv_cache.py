"""The KV cache tensors: how many blocks fit, and allocating them per layer.

Size rule (REFERENCE.md): one token costs ``2 (K and V) x layers x num_key_value_heads x head_dim x
bytes per element``; a block costs ``block_size`` times that. The number of blocks comes from, in order:
``num_blocks``, ``kv_cache_memory_bytes``, or on CUDA vLLM's rule
``total memory x gpu_memory_utilization - memory already used (weights, other processes) - peak
activations of the largest step`` (measured with a dummy forward, like vLLM's profile run).

Where each token's K/V goes (its *slot*, ``block_id * block_size + offset``) is worked out per step from
the block tables by ``AttentionMetadata.build`` in ``minengine.models.attention``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minengine.config import DEFAULT_CPU_KV_CACHE_BYTES, EngineConfig
from minengine.models.attention import AttentionMetadata, KVCache, allocate_kv_cache
from minengine.models.config import ModelConfig

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8": 1, "fp8": 1}


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per element of a torch dtype or a dtype name."""
    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    return _DTYPE_BYTES[str(dtype).removeprefix("torch.")]


def kv_bytes_per_token(model_config: ModelConfig, dtype: torch.dtype | str) -> int:
    c = model_config
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * dtype_bytes(dtype)


def kv_bytes_per_block(model_config: ModelConfig, block_size: int, dtype: torch.dtype | str) -> int:
    return block_size * kv_bytes_per_token(model_config, dtype)


def kv_cache_budget_bytes(
    config: EngineConfig,
    model_config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    model: torch.nn.Module | None = None,
) -> int:
    """Bytes the KV cache may take on ``device`` (see the module docstring for the rule)."""
    assert config.is_resolved, "call EngineConfig.resolved() first"
    if config.kv_cache_memory_bytes is not None:
        return config.kv_cache_memory_bytes
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        activations = profile_peak_activation_bytes(model, config, device) if model is not None else 0
        budget = int(total * config.gpu_memory_utilization) - (total - free) - activations
        if budget <= 0:
            raise ValueError(
                f"no GPU memory left for the KV cache: {total / 2**30:.1f} GiB x gpu_memory_utilization "
                f"{config.gpu_memory_utilization} minus {(total - free) / 2**30:.1f} GiB in use and "
                f"{activations / 2**30:.2f} GiB for activations is {budget / 2**30:.2f} GiB. Raise "
                "gpu_memory_utilization, lower max_num_batched_tokens, or set kv_cache_memory_bytes"
            )
        return budget
    # CPU/MPS: a fixed budget, no larger than max_num_seqs full-length sequences could use.
    most = (
        config.max_num_seqs
        * kv_bytes_per_block(model_config, config.block_size, dtype)
        * (
            -(-config.max_model_len // config.block_size)  # type: ignore[operator]
        )
    )
    return min(DEFAULT_CPU_KV_CACHE_BYTES, most)


def determine_num_blocks(
    config: EngineConfig,
    model_config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    model: torch.nn.Module | None = None,
) -> int:
    if config.num_blocks is not None:
        return config.num_blocks
    budget = kv_cache_budget_bytes(config, model_config, dtype, device, model)
    per_block = kv_bytes_per_block(model_config, config.block_size, dtype)
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise ValueError(
            f"the KV cache budget ({budget} bytes) is smaller than one block ({per_block} bytes = "
            f"{config.block_size} tokens); raise kv_cache_memory_bytes or lower block_size"
        )
    return int(num_blocks)


@torch.inference_mode()
def profile_peak_activation_bytes(model: torch.nn.Module, config: EngineConfig, device: torch.device) -> int:
    """Peak extra CUDA memory of the largest step: a dummy prefill of ``max_num_batched_tokens`` tokens."""
    budget, max_len = config.max_num_batched_tokens, config.max_model_len
    assert budget is not None and max_len is not None
    seq_lens = [max_len] * (budget // max_len) + ([budget % max_len] if budget % max_len else [])
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    meta = AttentionMetadata.for_prefill(seq_lens)
    input_ids = torch.zeros(budget, dtype=torch.long, device=device)
    hidden = model(input_ids, meta.positions(device), meta)
    rows = torch.arange(min(budget, config.max_num_seqs), device=device)
    model.compute_logits(hidden[rows]).float()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del hidden
    torch.cuda.empty_cache()
    return int(peak)


@dataclass
class PagedKVCache:
    """One (k, v) pair of ``[num_blocks, block_size, num_kv_heads, head_dim]`` tensors per layer."""

    num_blocks: int
    block_size: int
    kv_caches: list[KVCache]

    @classmethod
    def allocate(
        cls,
        model_config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> PagedKVCache:
        c = model_config
        caches = allocate_kv_cache(
            c.num_hidden_layers, num_blocks, block_size, c.num_key_value_heads, c.head_dim, dtype, device
        )
        return cls(num_blocks, block_size, caches)

    @property
    def num_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv_caches)

    @property
    def num_tokens(self) -> int:
        """Capacity in tokens (vLLM prints this at start-up as "KV cache size: N tokens")."""
        return self.num_blocks * self.block_size
