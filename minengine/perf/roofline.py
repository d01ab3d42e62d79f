"""Roofline cost model of one engine step: FLOPs, bytes, and the time they predict on an accelerator.

A step runs one forward pass over a packed batch of prefill chunks and decodes. Its work (Williams,
Waterman and Patterson, "Roofline", CACM 2009; applied to LLM inference by Yuan et al., "LLM Inference
Unveiled: Survey and Roofline Model Insights", 2024, and by the Vidur simulator, MLSys 2024):

- **Linear layers**: every new token multiplies through every weight matrix once: ``2 x params x tokens``
  FLOPs (one multiply and one add per weight; Kaplan et al. 2020, "Scaling Laws", section 2.1). The
  embedding table is a lookup (no FLOPs); the LM head runs only for the tokens that are sampled.
- **Attention**: a query attends to each key of its context: ``QK^T`` and ``PV`` cost ``2 x head_dim``
  FLOPs per (query, key) pair and head each, so ``4 x heads x head_dim`` per pair and layer. A prefill
  chunk of ``c`` tokens after ``p`` cached ones has ``c x p + c(c+1)/2`` causal pairs: the quadratic
  term. A decode is a chunk of one token (``p`` = its KV length - 1).
- **Bytes**: all weights are read once per step, whatever the batch (``params x bytes``; the embedding
  rows are gathered rather than streamed, which this overcounts by 2-7 % for 7-8B models); each sequence
  reads its whole cached context once per layer (FlashAttention-style kernels stream K/V tiles through
  on-chip memory) and writes the K/V of its new tokens. Activations are left out: fused kernels keep
  most of them on chip, and where they are large (long prefills) the step is compute-bound anyway.

Then ``compute_time = FLOPs / (peak x compute_efficiency)``, ``memory_time = bytes / (bandwidth x
memory_efficiency)`` and the predicted step time is ``max(compute_time, memory_time) + overhead``: the
slower resource bounds the step (the roofline), and ``overhead`` covers what neither counts (CPU-side
scheduling, kernel launches, Python). Arithmetic intensity = FLOPs / bytes; below the accelerator's
ridge point (peak / bandwidth, ~295 FLOP/byte on an H100 SXM) a step is memory-bound.

Why decode is bandwidth-bound: at batch ``B`` in 16-bit weights, a decode step does ``2 x params x B``
FLOPs on ``2 x params`` bytes, so its intensity is about ``B`` FLOP/byte, far below the ridge until B
nears hundreds (and the KV reads, which grow with ``B``, keep attention's intensity near 1 always).

``ModelShape`` describes a model from anything ``perf.model_input.resolve_model`` accepts (a preset name,
an HF config dict or config.json path, a kvcalc ``KVSpec``, a ``ModelConfig``) or a loaded model. No torch here: the simulator uses this module on any machine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from minengine.perf.hardware import Accelerator, get_accelerator
from minengine.perf.model_input import resolve_model
from minengine.perf.model_spec import KVSpec, dtype_bits, dtype_of_bits, flatten_text_config

# Default efficiencies for datasheet accelerators. Round, documented assumptions, not measurements:
# gpt-fast decodes Llama-2-7B at 1,397 GB/s on an A100 whose datasheet says 2,039 GB/s (0.69); large
# bf16 GEMMs typically reach 60-70 % of the dense tensor-core peak. Calibrate (minengine.sim.calibrate)
# to replace them with fitted numbers for a machine you can measure.
DEFAULT_COMPUTE_EFFICIENCY = 0.6
DEFAULT_MEMORY_EFFICIENCY = 0.7
DEFAULT_OVERHEAD_S = 0.5e-3  # per step: scheduling, input preparation, launch gaps (with CUDA graphs)


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder that its step cost depends on (per GPU: no tensor parallelism)."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: int
    hidden_size: int = 0  # 0 when unknown (a bare KVSpec): the LM head is then counted as a body weight
    vocab_size: int = 0
    tie_word_embeddings: bool = False
    active_params: int | None = None  # params each token multiplies through (MoE: routed experts only)
    weight_bytes_per_param: float = 2.0
    kv_bytes_per_element: float = 2.0
    layer_windows: tuple[int | None, ...] = ()  # per layer: None = full attention, else the window
    kv_elements_per_token_per_layer: int = 0  # 0: 2 x kv_heads x head_dim (MLA: the latent's size)
    max_position_embeddings: int = 0  # the model's context length (0 = unknown)

    def __post_init__(self) -> None:
        if not self.layer_windows:
            object.__setattr__(self, "layer_windows", (None,) * self.num_layers)
        if not self.kv_elements_per_token_per_layer:
            object.__setattr__(self, "kv_elements_per_token_per_layer", 2 * self.num_kv_heads * self.head_dim)

    # ---- sizes ----
    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.weight_bytes_per_param

    @property
    def kv_bytes_per_token_per_layer(self) -> float:
        return self.kv_elements_per_token_per_layer * self.kv_bytes_per_element

    @property
    def kv_bytes_per_token(self) -> float:
        return self.num_layers * self.kv_bytes_per_token_per_layer

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def body_flop_params(self) -> int:
        """Params that every token multiplies through: all but the embedding table and the LM head."""
        params = self.active_params if self.active_params is not None else self.num_params
        return params - self.lm_head_params * (1 if self.tie_word_embeddings else 2)

    @property
    def attention_flops_per_pair(self) -> int:
        """QK^T + PV for one (query, key) pair in one layer: 2 x 2 x heads x head_dim."""
        return 4 * self.num_attention_heads * self.head_dim

    @property
    def window_groups(self) -> tuple[tuple[int | None, int], ...]:
        """(window, number of layers with it): full-attention layers have window None."""
        counts: dict[int | None, int] = {}
        for w in self.layer_windows:
            counts[w] = counts.get(w, 0) + 1
        return tuple(counts.items())

    def with_dtype(self, dtype: str, kv_cache_dtype: str | None = None) -> ModelShape:
        """The same model stored in another dtype ("fp32", "bf16", "fp8", "int4", ...)."""
        w = dtype_bits(dtype) / 8
        kv = dtype_bits(kv_cache_dtype) / 8 if kv_cache_dtype else w
        return replace(self, weight_bytes_per_param=w, kv_bytes_per_element=kv)

    # ---- construction ----
    @classmethod
    def from_model(cls, model: Any, dtype: str | None = None, kv_cache_dtype: str | None = None
                   ) -> ModelShape:
        """From a ModelShape, a loaded model (its parameters counted), or anything ``resolve_model``
        accepts: a preset name, an HF config dict, a config.json path or folder, a hub id, a KVSpec or a
        ModelConfig. Anything else raises a ValueError (``KVCalcError``) that lists what is accepted."""
        if isinstance(model, ModelShape):
            shape = model
        else:
            num_params = None
            if hasattr(model, "config") and hasattr(model, "parameters"):  # a loaded LlamaForCausalLM
                num_params = sum({id(p): p.numel() for p in model.parameters()}.values())
                model = model.config
            spec, raw = resolve_model(model)
            if num_params is not None:
                spec = replace(spec, num_params=num_params)
            shape = _from_kvspec(spec, raw)
        if dtype is not None or kv_cache_dtype is not None:
            weight_dtype = dtype or dtype_of_bits(8 * shape.weight_bytes_per_param)
            shape = shape.with_dtype(weight_dtype, kv_cache_dtype)
        return shape


def _from_kvspec(spec: KVSpec, raw: dict[str, Any]) -> ModelShape:
    """A KVSpec, plus its raw config (when known) for the hidden size, vocabulary and experts."""
    cfg = flatten_text_config(raw)
    if spec.num_params is None:
        raise ValueError(f"{spec.name}: the parameter count is unknown; pass a KVSpec with num_params")
    hidden, vocab = int(cfg.get("hidden_size") or 0), int(cfg.get("vocab_size") or 0)
    tied = bool(cfg.get("tie_word_embeddings", str(cfg.get("model_type", "")).startswith("gemma")))
    active = None
    experts, top_k = int(cfg.get("num_local_experts") or 0), int(cfg.get("num_experts_per_tok") or 0)
    if experts and top_k and cfg.get("intermediate_size"):  # Mixtral: each token uses top_k experts
        expert_params = 3 * hidden * int(cfg["intermediate_size"])
        active = spec.num_params - spec.num_layers * (experts - top_k) * expert_params
    return ModelShape(
        name=spec.name, num_layers=spec.num_layers, num_attention_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, num_params=spec.num_params,
        hidden_size=hidden, vocab_size=vocab, tie_word_embeddings=tied, active_params=active,
        weight_bytes_per_param=dtype_bits(spec.weight_dtype) / 8,
        kv_bytes_per_element=dtype_bits(spec.dtype) / 8, layer_windows=spec.layer_windows,
        kv_elements_per_token_per_layer=spec.kv_elements_per_token_per_layer(),
        max_position_embeddings=spec.max_position_embeddings or 0,
    )


# ------------------------------------------------------------------------------------------ one step
@dataclass(frozen=True)
class StepCost:
    """FLOPs, bytes and predicted time of one step. Times are in seconds and include efficiencies."""

    num_tokens: int
    linear_flops: float
    attention_flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    compute_time: float
    memory_time: float
    overhead: float

    @property
    def flops(self) -> float:
        return self.linear_flops + self.attention_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte moved from memory."""
        return self.flops / self.bytes if self.bytes else float("inf")

    @property
    def bound(self) -> str:
        """"compute" or "memory": whichever ceiling of the roofline limits this step."""
        return "compute" if self.compute_time >= self.memory_time else "memory"

    @property
    def time(self) -> float:
        """The predicted step time: max(compute, memory) + overhead."""
        return max(self.compute_time, self.memory_time) + self.overhead


def _sum_min(lo: int, hi: int, w: int) -> int:
    """sum(min(k, w) for k in range(lo, hi + 1)): keys seen by queries at positions lo-1 .. hi-1."""
    if hi < lo:
        return 0
    top = min(hi, w)
    below = (top - lo + 1) * (lo + top) // 2 if top >= lo else 0
    return below + (hi - max(lo - 1, w)) * w if hi > w else below


def attention_pairs(chunk: int, context: int, window: int | None = None) -> int:
    """Causal (query, key) pairs of a chunk of ``chunk`` tokens after ``context`` cached tokens."""
    if window is None:
        return chunk * context + chunk * (chunk + 1) // 2
    return _sum_min(context + 1, context + chunk, window)


@dataclass(frozen=True)
class CostModel:
    """Roofline step-time predictor for one model on one accelerator (fit ``*_efficiency`` and the
    overheads to measurements with ``minengine.sim.calibrate``)."""

    accelerator: Accelerator
    model: ModelShape
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY
    overhead_s: float = DEFAULT_OVERHEAD_S  # fixed cost per step
    overhead_per_seq_s: float = 0.0  # per scheduled request (per-request Python work, sampling)

    @classmethod
    def create(cls, model: Any, gpu: str | Accelerator = "h100", dtype: str | None = None,
               **kwargs: Any) -> CostModel:
        return cls(get_accelerator(gpu), ModelShape.from_model(model, dtype=dtype), **kwargs)

    @property
    def peak_flops(self) -> float:
        """Dense peak FLOP/s for the weights' dtype (FP8 peak for 8-bit weights where the chip has it)."""
        acc = self.accelerator
        eight_bit = self.model.weight_bytes_per_param <= 1 and acc.fp8_tflops
        tflops = acc.fp8_tflops if eight_bit else acc.bf16_tflops
        return tflops * 1e12

    @property
    def ridge_point(self) -> float:
        """Peak FLOP/s / bandwidth: intensity (FLOP/byte) above which a step is compute-bound."""
        return self.peak_flops / self.accelerator.bandwidth_bytes_per_s

    @property
    def effective_ridge_point(self) -> float:
        """The ridge after efficiencies: where this model's compute and memory times cross."""
        return self.ridge_point * self.compute_efficiency / self.memory_efficiency

    def step_cost(self, chunks: Iterable[tuple[int, int]], num_sampled: int | None = None) -> StepCost:
        """Cost of one step over ``chunks`` = (new tokens, tokens already cached) per request.

        A decode with KV length ``L`` (its new token included) is the chunk ``(1, L - 1)``.
        ``num_sampled`` (LM-head rows) defaults to one per chunk.
        """
        m, chunks = self.model, list(chunks)
        tokens = sum(c for c, _ in chunks)
        pairs = kv_tokens = 0  # summed over layers
        for window, layers in m.window_groups:
            pairs += layers * sum(attention_pairs(c, p, window) for c, p in chunks)
            kv_tokens += layers * sum(p + c if window is None else min(p + c, window) for c, p in chunks)
        sampled = len(chunks) if num_sampled is None else num_sampled
        linear = 2.0 * (m.body_flop_params * tokens + m.lm_head_params * sampled)
        return self._cost(tokens, len(chunks), linear, pairs * m.attention_flops_per_pair,
                          kv_tokens * m.kv_bytes_per_token_per_layer, tokens * m.kv_bytes_per_token)

    def _cost(self, tokens: int, num_seqs: int, linear: float, attention: float, kv_read: float,
              kv_write: float) -> StepCost:
        weights = self.model.weight_bytes if tokens else 0.0
        compute = (linear + attention) / (self.peak_flops * self.compute_efficiency)
        bandwidth = self.accelerator.bandwidth_bytes_per_s * self.memory_efficiency
        memory = (weights + kv_read + kv_write) / bandwidth
        overhead = self.overhead_s + self.overhead_per_seq_s * num_seqs if tokens else 0.0
        return StepCost(tokens, linear, attention, weights, kv_read, kv_write, compute, memory, overhead)

    def step_time(self, chunks: Iterable[tuple[int, int]], num_sampled: int | None = None) -> float:
        return self.step_cost(chunks, num_sampled).time

    # ---- the two textbook cases ----
    def decode_cost(self, batch_size: int, context_len: int) -> StepCost:
        """A step of ``batch_size`` decodes, each with ``context_len`` tokens of KV (its new one included)."""
        return self.step_cost([(1, context_len - 1)] * batch_size)

    def prefill_cost(self, num_tokens: int, context_len: int = 0, num_seqs: int = 1) -> StepCost:
        """A step of ``num_seqs`` prefills of ``num_tokens`` tokens each (after ``context_len`` cached)."""
        return self.step_cost([(num_tokens, context_len)] * num_seqs)

    def with_(self, **changes: Any) -> CostModel:
        return replace(self, **changes)

    def describe(self) -> str:
        return (f"{self.model.name} on {self.accelerator.name}: compute eff {self.compute_efficiency:.2f}, "
                f"memory eff {self.memory_efficiency:.2f}, overhead {1e3 * self.overhead_s:.2f} ms/step"
                + (f" + {1e6 * self.overhead_per_seq_s:.0f} us/seq" if self.overhead_per_seq_s else ""))


def step_cost_of_record(cost_model: CostModel, record: Any) -> StepCost:
    """The roofline cost of a recorded ``StepRecord`` (its prefill chunks and decode KV lengths)."""
    chunks: list[tuple[int, int]] = list(record.prefill_chunks)
    chunks += [(1, n - 1) for n in record.decode_context_lens]
    return cost_model.step_cost(chunks)


def roofline_points(cost_model: CostModel, batch_sizes: Sequence[int], context_len: int = 1
                    ) -> list[StepCost]:
    """Decode step costs over batch sizes: the curve a lesson plots against the ridge."""
    return [cost_model.decode_cost(b, context_len) for b in batch_sizes]
