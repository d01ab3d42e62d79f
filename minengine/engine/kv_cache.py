"""The KV cache tensors: how many blocks fit, and allocating them per layer.

Size rule (REFERENCE.md): one token costs ``2 (K and V) x layers x num_key_value_heads x head_dim x
bytes per element``; a block costs ``block_size`` times that. The number of blocks comes from, in order:
``num_blocks``, ``kv_cache_memory_bytes``, or on CUDA vLLM's rule
``total memory x gpu_memory_utilization - memory already used (weights, other processes) - peak
activations of the largest step`` (measured with a dummy forward, like vLLM's profile run), else a fixed
CPU budget. The byte count is ``kvcalc.kv_bytes_per_token`` and the order of the rules is
``EngineConfig.num_kv_blocks``, shared with the simulator; only the CUDA measurement lives here.

Where each token's K/V goes (its *slot*, ``block_id * block_size + offset``) is worked out per step from
the block tables by ``AttentionMetadata.build`` in ``minengine.models.attention``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from minengine.config import EngineConfig
from minengine.kvcalc.calculator import kv_bytes_per_token as _kvcalc_bytes_per_token
from minengine.models.attention import AttentionMetadata, KVCache, allocate_kv_cache
from minengine.models.config import ModelConfig
from minengine.perf.model_input import spec_from_model_config
from minengine.perf.model_spec import dtype_bits
from minengine.utils import cdiv


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per element of a torch dtype or a dtype name (names from ``perf.model_spec``'s table)."""
    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    return dtype_bits(dtype) // 8


def _dtype_name(dtype: torch.dtype | str) -> str:
    return str(dtype).removeprefix("torch.")


def kv_bytes_per_token(model_config: ModelConfig, dtype: torch.dtype | str) -> int:
    """``kvcalc.kv_bytes_per_token`` of the model: 2 x layers x KV heads x head_dim x bytes."""
    return _kvcalc_bytes_per_token(spec_from_model_config(model_config), _dtype_name(dtype))


# Block ids are int32 in every block table the kernels read (vLLM's too); slots and offsets are int64.
MAX_BLOCK_ID = 2**31 - 1


@dataclass(frozen=True)
class KVLayout:
    """The per-layer KV tensors' shape and size, worked out without allocating anything."""

    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    itemsize: int

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def numel(self) -> int:
        """Elements in one layer's K (or V) tensor: the largest flat index any kernel computes, plus one."""
        return self.num_blocks * self.block_size * self.num_kv_heads * self.head_dim

    @property
    def strides(self) -> tuple[int, int, int, int]:
        return (self.block_size * self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                self.head_dim, 1)


def check_kv_index_space(model_config: ModelConfig, num_blocks: int, block_size: int,
                         backend: str, itemsize: int = 2) -> KVLayout:
    """Refuse, at start, a cache that some kernel could not index; return its per-layer layout.

    Each layer has its own K and V tensors, and every kernel computes offsets in 64 bits from int32 block
    ids (the Triton kernel casts each block id to int64 before multiplying by the block stride; PyTorch's
    own indexing is 64-bit), so what can overflow is only the block id itself. A flat view of the whole
    cache as one sequence (what flex attention needed) would pass 2**31 elements on an H200 with a small
    model, and 32-bit offsets would then wrap: no kernel here takes such a view.
    """
    c = model_config
    layout = KVLayout(num_blocks, block_size, c.num_key_value_heads, c.head_dim, itemsize)
    if num_blocks - 1 > MAX_BLOCK_ID:
        raise ValueError(
            f"{num_blocks:,} KV blocks: block ids past {MAX_BLOCK_ID:,} do not fit the int32 block tables "
            f"the {backend!r} attention reads. Raise block_size or set num_blocks / kv_cache_memory_bytes"
        )
    return layout


def _useful_bytes(config: EngineConfig, per_token: int) -> int:
    """The most KV memory the scheduler could ever fill: max_num_seqs sequences of max_model_len tokens."""
    assert config.max_model_len is not None
    blocks_per_seq = cdiv(config.max_model_len, config.block_size)
    return config.max_num_seqs * blocks_per_seq * config.block_size * per_token


def _cuda_budget_bytes(config: EngineConfig, device: torch.device, model: torch.nn.Module | None,
                       per_token: int) -> int:
    """vLLM's rule: total x gpu_memory_utilization - memory in use - peak activations of the largest step,
    no more than ``max_num_seqs`` sequences of ``max_model_len`` tokens could ever use (a small model on
    a large GPU would otherwise take millions of blocks it can never fill, and the block manager's
    bookkeeping for each of them)."""
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
    return min(budget, _useful_bytes(config, per_token))


def _device_budget(
    config: EngineConfig, device: torch.device, model: torch.nn.Module | None, per_token: int
) -> Callable[[], int] | None:
    """The device-specific part of the budget (CUDA only; measured lazily), for ``EngineConfig``'s rule."""
    if device.type != "cuda":
        return None  # CPU/MPS: EngineConfig's fixed budget
    return lambda: _cuda_budget_bytes(config, device, model, per_token)


def kv_cache_budget_bytes(
    config: EngineConfig,
    model_config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    model: torch.nn.Module | None = None,
) -> int:
    """Bytes the KV cache may take on ``device``: ``EngineConfig.kv_cache_budget_bytes`` with this device."""
    per_token = kv_bytes_per_token(model_config, dtype)
    return int(config.kv_cache_budget_bytes(per_token, _device_budget(config, device, model, per_token)))


def determine_num_blocks(
    config: EngineConfig,
    model_config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    model: torch.nn.Module | None = None,
) -> int:
    """``EngineConfig.num_kv_blocks`` for this model on this device."""
    if config.num_blocks is not None:
        return config.num_blocks
    per_token = kv_bytes_per_token(model_config, dtype)
    return config.num_kv_blocks(per_token, _device_budget(config, device, model, per_token))


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
