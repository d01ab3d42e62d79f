"""``EngineConfig``: every knob of the engine in one validated dataclass, with vLLM's names.

Why one object: the real engine and the simulator build the same ``Scheduler`` from it, so a lesson can
change ``max_num_batched_tokens`` once and see both a measurement and a prediction. This module imports
no torch (the simulator and ``minengine kv`` use it on machines where torch would only slow start-up).

The model's own shape lives in ``minengine.models.config.ModelConfig`` (read from HF ``config.json``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minengine.utils import cdiv

POLICY_NAMES = ("decode_first", "prefill_first")
LINEAR_KERNELS = ("torch", "onednn")  # see minengine.models.linear_kernels
ATTENTION_BACKENDS = ("gather", "cpp", "triton")  # the classes in minengine.models.attention.backends
# CPU/MPS have no "free memory" query worth trusting, so the KV cache gets a fixed budget there (it is
# also capped at what max_num_seqs sequences of max_model_len tokens could ever use).
DEFAULT_CPU_KV_CACHE_BYTES = 256 * 2**20
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM's default for online serving with chunked prefill


@dataclass
class EngineConfig:
    """How the engine runs a model. ``None`` fields are filled from the model by ``resolved()``.

    KV-cache size: give ``num_blocks``, or ``kv_cache_memory_bytes``, or neither; then a GPU uses
    ``gpu_memory_utilization`` of its total memory (minus weights and peak activations, like vLLM) and
    a CPU uses ``DEFAULT_CPU_KV_CACHE_BYTES``.

    Chunked prefill off: a prompt is computed in one step, so ``max_num_batched_tokens`` must be at least
    ``max_model_len`` (checked, as vLLM does): any request, even one recomputed after preemption, can
    then always run alone, and no request needs to be rejected for being longer than the budget.
    """

    model: str | None = None  # shipped name, local HF folder or hub id; None = the shipped default
    tokenizer: str | None = None  # defaults to the model's folder
    dtype: Any = None  # None (fp32 on CPU, bf16 on CUDA) | "auto" | "float32" | "bfloat16" | torch.dtype
    device: Any = None  # None/"auto" | "cpu" | "cuda" | "cuda:1" | "mps" | torch.device
    block_size: int = 16  # tokens per KV block
    num_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9  # only used on CUDA when neither of the two above is given
    max_num_seqs: int = 256  # most requests running at once
    max_num_batched_tokens: int | None = None  # the per-step token budget (prefill chunks + decodes)
    max_model_len: int | None = None  # prompt + output tokens per request; default: model's context
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    policy: Any = "decode_first"  # "decode_first" | "prefill_first" | a SchedulingPolicy object
    seed: int = 0  # seeds sampling of requests that carry no seed of their own
    # CUDA graphs for decode steps (minengine.engine.fast_path): None = on for CUDA with the triton backend.
    enforce_eager: bool | None = None  # True: no CUDA graphs (vLLM's name)
    # Attention (minengine.models.attention.backends): "gather" (the reference: copy each context out,
    # SDPA) | "cpp" (decodes in place in the CPU's C++ kernel) | "triton" (one kernel for the whole step,
    # in place; a GPU's). None: triton on CUDA, cpp on a CPU for fp32 when it builds, else gather.
    attention_backend: str | None = None
    # decode batch sizes to capture; None: 1, 2, 4, 8, ... max_num_seqs
    cudagraph_capture_sizes: list[int] | None = None
    # CPU only: run all-decode steps as one torch.compile'd graph (engine/compiled_decode.py). Off by
    # default: compiling takes tens of seconds at start-up and needs a C++ compiler.
    compile_decode: bool = False
    # CPU fp32 only: the library behind every Linear layer, "torch" (F.linear: MKL) | "onednn"; None: timed
    # when the engine starts, oneDNN where it is clearly faster (minengine.models.linear_kernels)
    linear_kernel: str | None = None
    # CPU fp32 with oneDNN for many rows: keep each weight also in oneDNN's blocked layout, so batched
    # steps skip re-laying it out on every call (1.2-1.4x faster at 8-64 rows), for a second copy of the
    # weights in memory. None: on whenever oneDNN runs the many-row calls and the copy takes at most a quarter
    # of the memory available (linear_kernels.prepack_fits); False: off; True: insist.
    prepack_weights: bool | None = None
    # Speculative decoding (vLLM's name): a SpeculativeConfig or its dict, e.g. {"method": "ngram",
    # "num_speculative_tokens": 3}; None: off. Drafts ride in a decode's step and are verified there.
    speculative_config: Any = None
    # Tensor parallelism (vLLM's name): split each layer's heads and MLP across this many ranks, one process
    # each, joined by an all-reduce after attention and after the MLP (engine/tensor_parallel.py). A CPU
    # (gloo) only in this version; each rank's KV cache is sized as one engine's (kv_cache_memory_bytes).
    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        _positive_int("block_size", self.block_size)
        _positive_int("tensor_parallel_size", self.tensor_parallel_size)
        if self.tensor_parallel_size > 1 and (self.compile_decode or self.enforce_eager is False):
            raise ValueError("tensor_parallel_size > 1 runs the eager path: it cannot go with compile_decode "
                             "or CUDA graphs (enforce_eager=False)")
        if isinstance(self.speculative_config, dict):
            try:
                self.speculative_config = SpeculativeConfig(**self.speculative_config)
            except TypeError as e:  # an unknown key
                raise ValueError(f"speculative_config: {e}; its keys are method, num_speculative_tokens, "
                                 "prompt_lookup_max and prompt_lookup_min") from None
        elif self.speculative_config is not None and not isinstance(self.speculative_config,
                                                                    SpeculativeConfig):
            raise ValueError("speculative_config must be a SpeculativeConfig, a dict of its fields or None, "
                             f"got {self.speculative_config!r}")
        _positive_int("max_num_seqs", self.max_num_seqs)
        for name in ("num_blocks", "kv_cache_memory_bytes", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        if self.num_blocks is not None and self.kv_cache_memory_bytes is not None:
            raise ValueError(
                "give either num_blocks or kv_cache_memory_bytes, not both "
                f"(got num_blocks={self.num_blocks}, kv_cache_memory_bytes={self.kv_cache_memory_bytes})"
            )
        g = self.gpu_memory_utilization
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 < g <= 1:
            raise ValueError(f"gpu_memory_utilization must be a fraction in (0, 1], got {g!r}")
        for name in ("enable_chunked_prefill", "enable_prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.compile_decode, bool):
            raise ValueError(f"compile_decode must be True or False, got {self.compile_decode!r}")
        if self.prepack_weights is not None and not isinstance(self.prepack_weights, bool):
            raise ValueError(f"prepack_weights must be True, False or None, got {self.prepack_weights!r}")
        if self.prepack_weights and self.linear_kernel == "torch":
            raise ValueError("prepack_weights=True packs weights for oneDNN: it cannot go with "
                             "linear_kernel='torch'")
        if self.linear_kernel is not None and self.linear_kernel not in LINEAR_KERNELS:
            raise ValueError(f"unknown linear_kernel {self.linear_kernel!r}: use one of "
                             f"{', '.join(LINEAR_KERNELS)} (or None to time both when the engine starts)")
        if self.enforce_eager is not None and not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True, False or None, got {self.enforce_eager!r}")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"unknown attention_backend {self.attention_backend!r}: use one of "
                f"{', '.join(ATTENTION_BACKENDS)} (or None to pick by device)"
            )
        if self.cudagraph_capture_sizes is not None:
            sizes = list(self.cudagraph_capture_sizes)
            if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
                raise ValueError("cudagraph_capture_sizes must be positive ints, got "
                                 f"{self.cudagraph_capture_sizes!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        if isinstance(self.policy, str):
            if self.policy not in POLICY_NAMES:
                raise ValueError(
                    f"unknown policy {self.policy!r}: use one of {', '.join(POLICY_NAMES)} "
                    "or pass a SchedulingPolicy object"
                )
        elif not callable(getattr(self.policy, "order", None)):
            raise ValueError(
                f"policy must be one of {', '.join(POLICY_NAMES)} or an object with an "
                f"order(running, waiting) method (see minengine.core.policies), got {self.policy!r}"
            )
        if self.max_model_len is not None and self.max_num_batched_tokens is not None:
            self._check_budget(self.max_model_len, self.max_num_batched_tokens)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Like ``EngineConfig(**kwargs)`` but an unknown name gets a list of the valid ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(
                f"unknown engine option(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}"
            )
        return cls(**kwargs)

    def resolved(self, max_position_embeddings: int) -> EngineConfig:
        """A copy with every ``None`` limit filled in for a model of that context length, re-validated."""
        max_model_len = self.max_model_len or max_position_embeddings
        if max_model_len > max_position_embeddings:
            raise ValueError(
                f"max_model_len={max_model_len} is longer than the model's context "
                f"(max_position_embeddings={max_position_embeddings}); lower max_model_len"
            )
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = DEFAULT_MAX_NUM_BATCHED_TOKENS
            if not self.enable_chunked_prefill:
                budget = max(budget, max_model_len)
        self._check_budget(max_model_len, budget)
        return dataclasses.replace(self, max_model_len=max_model_len, max_num_batched_tokens=budget)

    @property
    def is_resolved(self) -> bool:
        return self.max_model_len is not None and self.max_num_batched_tokens is not None

    # ---- KV-cache size: the one rule for the engine, the simulator and the course ----
    def kv_cache_budget_bytes(
        self, kv_bytes_per_token: float, device_budget_bytes: float | Callable[[], float] | None = None
    ) -> float:
        """Bytes the KV cache may take: ``kv_cache_memory_bytes`` if given, else the device's budget (a
        GPU: total x gpu_memory_utilization minus weights and activations, worked out by the caller, who
        may pass a function so that it is only measured when needed), else the fixed CPU budget, no
        larger than ``max_num_seqs`` sequences of ``max_model_len`` tokens could use."""
        assert self.is_resolved, "call EngineConfig.resolved() first"
        if self.kv_cache_memory_bytes is not None:
            return self.kv_cache_memory_bytes
        if device_budget_bytes is not None:
            return device_budget_bytes() if callable(device_budget_bytes) else device_budget_bytes
        blocks_per_seq = cdiv(self.max_model_len, self.block_size)  # type: ignore[operator]
        per_block = self.block_size * kv_bytes_per_token
        return min(DEFAULT_CPU_KV_CACHE_BYTES, self.max_num_seqs * blocks_per_seq * per_block)

    def num_kv_blocks(
        self,
        kv_bytes_per_token: float,
        device_budget_bytes: float | Callable[[], float] | None = None,
        *,
        context: str = "",
        hint: str = "raise kv_cache_memory_bytes or lower block_size",
    ) -> int:
        """KV blocks for a model whose token costs ``kv_bytes_per_token``: ``num_blocks`` if given, else
        the budget of ``kv_cache_budget_bytes`` in whole blocks. ``context`` and ``hint`` only word the
        error raised when not even one block fits."""
        if self.num_blocks is not None:
            return self.num_blocks
        budget = self.kv_cache_budget_bytes(kv_bytes_per_token, device_budget_bytes)
        per_block = self.block_size * kv_bytes_per_token
        if budget < per_block:
            raise ValueError(
                f"{context}the KV cache budget ({budget:.0f} bytes) is smaller than one block "
                f"({per_block:.0f} bytes = {self.block_size} tokens); {hint}"
            )
        return int(budget // per_block)

    def _check_budget(self, max_model_len: int, budget: int) -> None:
        if not self.enable_chunked_prefill and budget < max_model_len:
            raise ValueError(
                f"with chunked prefill off, max_num_batched_tokens ({budget}) must be >= max_model_len "
                f"({max_model_len}) so that every prompt fits in one step; raise max_num_batched_tokens, "
                "lower max_model_len, or turn enable_chunked_prefill on"
            )


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


SPECULATIVE_METHODS = ("ngram",)  # drafting by prompt lookup; a draft model comes next (issue 40)


@dataclass
class SpeculativeConfig:
    """How to guess tokens ahead (vLLM's ``speculative_config``, its names and defaults).

    ``method="ngram"`` drafts by prompt lookup: the longest n-gram of ``prompt_lookup_min`` to
    ``prompt_lookup_max`` tokens that ends the sequence and also occurs earlier in it proposes the
    ``num_speculative_tokens`` tokens that followed it there. Only one of the two lookup sizes given:
    the other takes its value; neither: both are 5, vLLM's default (``vllm/config/speculative.py``,
    v0.11, which calls them arbitrarily chosen).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method {self.method!r} is not one of "
                             f"{', '.join(SPECULATIVE_METHODS)}")
        _positive_int("num_speculative_tokens", self.num_speculative_tokens)
        if self.prompt_lookup_min is None and self.prompt_lookup_max is None:
            self.prompt_lookup_min = self.prompt_lookup_max = 5
        elif self.prompt_lookup_min is None:
            self.prompt_lookup_min = self.prompt_lookup_max
        elif self.prompt_lookup_max is None:
            self.prompt_lookup_max = self.prompt_lookup_min
        _positive_int("prompt_lookup_min", self.prompt_lookup_min)
        _positive_int("prompt_lookup_max", self.prompt_lookup_max)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max "
                             f"({self.prompt_lookup_max})")
