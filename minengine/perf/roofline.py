"""Per-operation roofline cost model of one engine step: FLOPs, bytes, and the time they predict.

A step runs one forward pass over a packed batch of prefill chunks and decodes. On a GPU its kernels run
one after another, and each is bound by its own ceiling (Williams, Waterman and Patterson, "Roofline",
CACM 2009; per-operator, as in the Vidur simulator, Agrawal et al., MLSys 2024). So the step time is a
sum over operations, each priced on its own roofline:

    step time = sum over ops of max(FLOPs / (peak x e_compute(op)), bytes / (bandwidth x e_memory(op)))
                + overhead + overhead_per_seq x sequences

The operations (all layers together; ``OpCost`` in ``StepCost.ops``):

- ``qkv_o_proj`` and ``mlp``: the matmuls on the packed tokens: ``2 x params x tokens`` FLOPs (Kaplan et
  al. 2020, section 2.1) over the op's weight bytes, read once per step whatever the batch. Efficiencies
  ``gemm_compute`` and ``weight_stream``. At small batch the weight read bounds them (decode), at large
  batch the FLOPs (prefill).
  An MoE model's tokens multiply through their routed experts only (``active_params``), and a step reads
  the experts its batch touches (``ModelShape.experts_touched``: expected coverage under uniform routing).
- ``lm_head``: the same on the sampled rows only (one per request that samples).
- ``prefill_attention``: the chunks of more than one token: the causal (query, key) pairs (``c x p +
  c(c+1)/2`` for ``c`` new tokens after ``p`` cached; ``4 x heads x head_dim`` FLOPs per pair and layer)
  over the K/V the chunk reads and writes. Efficiencies ``attention_compute`` (FlashAttention runs far
  below matmul peak at a few hundred tokens) and ``kv_stream``.
- ``decode_attention``: the one-token chunks: each reads its whole cached context once per layer (an
  intensity of a few FLOP/byte, always bandwidth-bound) and writes one token's K/V. ``kv_stream``.
- ``elementwise``: norms, RoPE, SiLU-and-mul, residual adds and the embedding gather: bytes only (the
  activations each such kernel reads and writes, ``ModelShape.elementwise_bytes_per_token``).
- ``sampling``: the fp32 logits of each sampled row, written by the LM head and read by the sampler.
- ``all_reduce`` (tensor parallelism only): the step is priced on one of ``tensor_parallel_size`` GPUs
  (``ModelShape.sharded``), plus two ring all-reduces per layer over the accelerator's link.

Pipeline parallelism (``pipeline_parallel_size`` p) splits the layers into p stages, one after another
on their own GPUs (``pipeline_stage_layers``). ``stage_times`` divides a step's cost between them: each
stage does its layers' share of every op but the LM head and sampling (the last stage's), the first also
the per-step overhead, and every stage but the last sends its activations on (``pipeline_send_time``).
One batch goes through the stages in turn, so alone it takes their sum: no faster than one GPU. The
throughput comes from keeping p batches in flight at once (``minengine.sim.pipeline``); with fewer, the
idle stages are the pipeline's bubble.

Expert parallelism (MoE experts spread over GPUs) is priced on its own, not inside ``step_cost``:
``all_to_all_cost`` gives the bytes and time of a step's dispatch and combine; the simulator does not run
expert-parallel instances.

Why a sum and not ``max(total compute, total memory)``: a mixed step of 100 decodes and a 512-token
prefill chunk does the chunk's compute-bound matmuls AND the decodes' bandwidth-bound attention; the two
do not overlap (different kernels), so the step costs about the sum of the two, not the larger. Only
what one kernel shares truly overlaps: the decode tokens ride along in the chunk's matmuls, which read
the weights once for both.

The efficiencies (``minengine.perf.efficiency``) are per accelerator and weight dtype, each with its
source; ``minengine.sim.calibrate`` fits them (and the overheads) to a machine you can measure.
Arithmetic intensity = FLOPs / bytes; below the ridge (peak / bandwidth, ~295 FLOP/byte on an H100 SXM)
an op is memory-bound: at batch ``B`` in 16-bit weights the matmuls have an intensity of about ``B``.

``ModelShape`` describes a model from anything ``perf.model_input.resolve_model`` accepts (a preset name,
an HF config dict or config.json path, a kvcalc ``KVSpec``, a ``ModelConfig``) or a loaded model. No torch
here: the simulator uses this module on any machine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from minengine.perf.efficiency import OP_EFFICIENCIES, Efficiency, efficiency_for
from minengine.perf.hardware import Accelerator, get_accelerator
from minengine.perf.model_input import resolve_model
from minengine.perf.model_spec import KVSpec, dtype_bits, dtype_of_bits, flatten_text_config
from minengine.perf.step_cost import OpCost, StepCost

__all__ = ["CostModel", "ModelShape", "OpCost", "StepCost", "attention_pairs", "pipeline_stage_layers",
           "roofline_points", "step_cost_of_record"]

DEFAULT_OVERHEAD_S = 0.5e-3  # per step: scheduling, input preparation, launch gaps (with CUDA graphs)
LOGIT_BYTES = 4  # fp32 logits per vocabulary entry of a sampled row
# One all-reduce's fixed cost (launch, synchronisation, the first bytes' trip), whatever its size. An
# assumption of the order NCCL's small-message all-reduce takes over NVLink, not a measured figure:
# fit it (with the link bandwidth) where you can measure, as benchmarks/tensor_parallel.py does for gloo.
DEFAULT_ALL_REDUCE_LATENCY_S = 10e-6
# One pipeline stage's send of its activations to the next: the same kind of assumption (a small
# point-to-point message over NVLink), to fit where it can be measured.
DEFAULT_SEND_LATENCY_S = 10e-6
HEAD_OPS = ("lm_head", "sampling")  # the ops of the last pipeline stage only


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
    # MoE: routed experts per layer, how many each token uses, and one expert's params in one layer
    num_experts: int = 0
    experts_per_token: int = 0
    expert_params: int = 0
    num_moe_layers: int = 0  # layers with routed experts (DeepSeek-V3's first 3 are dense); 0: all
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
    def proj_params(self) -> int:
        """Q, K, V and O projection weights of all layers (0 when the hidden size is unknown)."""
        q, kv = self.num_attention_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return self.num_layers * 2 * self.hidden_size * (q + kv)

    @property
    def proj_flop_params(self) -> int:
        return self.proj_params

    @property
    def streamed_body_params(self) -> int:
        """Weights every step reads, but the LM head's: all but the gathered embedding rows."""
        return self.num_params - self.lm_head_params * (1 if self.tie_word_embeddings else 2)

    def experts_touched(self, tokens: int) -> float:
        """Expected distinct routed experts per layer that ``tokens`` tokens use, under uniform routing:
        each token picks ``k`` of the ``E`` experts, so an expert is missed by all of them with chance
        ``(1 - k/E)^tokens``. One token reads k experts; a few dozen read nearly all E. Real routers are
        not uniform (a skewed one touches fewer), so this is the upper end of what a batch reads."""
        e, k = self.num_experts, self.experts_per_token
        if not e:
            return 0.0
        return e * (1.0 - (1.0 - k / e) ** tokens)

    def mlp_weight_bytes(self, tokens: int) -> float:
        """Bytes of MLP weights (all layers; the LM head and embeddings apart) a step of ``tokens`` reads.
        Dense: all of them, whatever the batch. MoE: the shared part and the router, plus only the routed
        experts the batch touches (``experts_touched``): why MoE decode is cheap alone and dear together."""
        body = self.streamed_body_params - self.proj_params
        if not self.num_experts:
            return body * self.weight_bytes_per_param
        layers = self.num_moe_layers or self.num_layers
        routed = layers * self.num_experts * self.expert_params
        touched = layers * self.experts_touched(tokens) * self.expert_params
        return (body - routed + touched) * self.weight_bytes_per_param

    @property
    def elementwise_bytes_per_token(self) -> float:
        """Activation bytes the element-wise kernels of one token move, all layers: per layer two fused
        add + RMSNorm (read x and the residual, write both: 8 x hidden), RoPE on q and k in place (2 x
        their width), SiLU-and-mul (read 2 x intermediate, write 1); plus the embedding row (2 x hidden).
        16-bit activations (fp32 for fp32 weights). The intermediate size is inferred from the params."""
        h = self.hidden_size
        if not h:
            return 0.0
        q, kv = self.num_attention_heads * self.head_dim, self.num_kv_heads * self.head_dim
        mlp_per_layer = (self.body_flop_params - self.proj_params) / self.num_layers
        inter = max(mlp_per_layer / (3 * h), 0.0)
        per_layer = 8 * h + 2 * (q + kv) + 3 * inter
        return (self.num_layers * per_layer + 2 * h) * max(self.weight_bytes_per_param, 2.0)

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

    def sharded(self, tensor_parallel_size: int) -> ModelShape:
        """What one GPU holds and computes under tensor parallelism (Megatron-LM's split, as vLLM and
        TensorRT-LLM run it): 1/t of the weights (the vocabulary too: vLLM's ``VocabParallelEmbedding``
        and ``ParallelLMHead``), of the query heads and of the MLP; the KV heads split as far as they go
        and are copied beyond (8 KV heads at t = 16: one on each GPU, twice over), as vLLM does. An MLA
        latent (DeepSeek) is not split by heads: each GPU keeps the whole latent."""
        t = tensor_parallel_size
        if t == 1:
            return self
        if self.num_attention_heads % t:
            raise ValueError(f"tensor_parallel_size={t} does not divide {self.name}'s "
                             f"{self.num_attention_heads} attention heads")
        kv_heads = max(1, self.num_kv_heads // t)
        standard = self.kv_elements_per_token_per_layer == 2 * self.num_kv_heads * self.head_dim
        return replace(
            self, name=f"{self.name} (1/{t})", num_attention_heads=self.num_attention_heads // t,
            num_kv_heads=kv_heads, num_params=self.num_params // t, vocab_size=self.vocab_size // t,
            active_params=None if self.active_params is None else self.active_params // t,
            expert_params=self.expert_params // t,  # each expert's MLP split t ways, as a dense one
            kv_elements_per_token_per_layer=(2 * kv_heads * self.head_dim if standard
                                             else self.kv_elements_per_token_per_layer))

    def stage_weight_bytes(self, layers: int, first: bool, last: bool) -> float:
        """Weights one pipeline stage holds: its ``layers`` of the body, the embedding table on the first
        stage and the LM head on the last (both, on a one-stage model; a tied table is held twice when
        they are different GPUs, as vLLM's pipeline ranks do)."""
        table = self.lm_head_params
        tables = (int(first) + int(last)) if first != last else (1 if self.tie_word_embeddings else 2)
        body = self.streamed_body_params * layers / self.num_layers
        return (body + table * tables) * self.weight_bytes_per_param

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
    active, expert_params, moe_layers = None, 0, 0
    # Mixtral names them num_local_experts, Qwen3-MoE num_experts, DeepSeek-V3 n_routed_experts (beside
    # n_shared_experts, always used, and first_k_dense_replace dense layers first)
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or 0)
    expert_inter = int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0)
    if experts and top_k and expert_inter:  # each token uses top_k routed experts of each MoE layer
        expert_params = 3 * hidden * expert_inter
        moe_layers = spec.num_layers - int(cfg.get("first_k_dense_replace") or 0)
        active = spec.num_params - moe_layers * (experts - top_k) * expert_params
    else:
        experts = top_k = 0
    return ModelShape(
        name=spec.name, num_layers=spec.num_layers, num_attention_heads=spec.num_attention_heads,
        num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim, num_params=spec.num_params,
        hidden_size=hidden, vocab_size=vocab, tie_word_embeddings=tied, active_params=active,
        num_experts=experts, experts_per_token=top_k, expert_params=expert_params,
        num_moe_layers=moe_layers,
        weight_bytes_per_param=dtype_bits(spec.weight_dtype) / 8,
        kv_bytes_per_element=dtype_bits(spec.dtype) / 8, layer_windows=spec.layer_windows,
        kv_elements_per_token_per_layer=spec.kv_elements_per_token_per_layer(),
        max_position_embeddings=spec.max_position_embeddings or 0,
    )


# ------------------------------------------------------------------------------------------ one step
def pipeline_stage_layers(num_layers: int, pipeline_parallel_size: int) -> list[int]:
    """Layers per pipeline stage, split as vLLM's ``get_pp_indices`` does (vllm/distributed/utils.py,
    v0.6 on): ``num_layers // p`` each, and any remainder one layer each to the stages just before the
    last, which already holds the LM head (Llama-2-70B's 80 layers on 3 stages: 27, 27, 26)."""
    p = pipeline_parallel_size
    if not 1 <= p <= num_layers:
        raise ValueError(f"pipeline_parallel_size must be between 1 and the model's {num_layers} layers, "
                         f"got {p}")
    layers = [num_layers // p] * p
    for i in range(2, num_layers % p + 2):
        layers[-i] += 1
    return layers


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
    """Per-operation roofline step-time predictor for one model on one accelerator.

    ``efficiency``: the four per-op efficiencies (default: the table row of ``minengine.perf.efficiency``
    for this accelerator and dtype). ``compute_efficiency`` / ``memory_efficiency``, where given,
    override all compute (GEMM, attention) / all memory (weights, KV) efficiencies at once: the textbook
    two-number roofline, e.g. ``1.0, 1.0`` for the ideal one. Fit everything to measurements with
    ``minengine.sim.calibrate``.
    """

    accelerator: Accelerator
    model: ModelShape
    compute_efficiency: float | None = None
    memory_efficiency: float | None = None
    overhead_s: float = DEFAULT_OVERHEAD_S  # fixed cost per step
    overhead_per_seq_s: float = 0.0  # per scheduled request (per-request Python work, sampling)
    efficiency: Efficiency | None = None
    # Tensor parallelism: the model split over this many GPUs (ModelShape.sharded); a step is priced on
    # one of them, plus its all-reduces over the accelerator's link (all_reduce_time).
    tensor_parallel_size: int = 1
    all_reduce_latency_s: float = DEFAULT_ALL_REDUCE_LATENCY_S
    # Pipeline parallelism: the layers in this many stages, each on its own (tensor-parallel) GPUs;
    # step_cost still prices the whole model on one GPU, stage_times splits it between the stages.
    pipeline_parallel_size: int = 1
    pipeline_send_latency_s: float = DEFAULT_SEND_LATENCY_S

    def __post_init__(self) -> None:
        pipeline_stage_layers(self.model.num_layers, self.pipeline_parallel_size)  # a clear error early

    @property
    def num_gpus(self) -> int:
        """GPUs one instance uses: tensor_parallel_size x pipeline_parallel_size (vLLM's world size)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @classmethod
    def create(cls, model: Any, gpu: str | Accelerator = "h100", dtype: str | None = None,
               **kwargs: Any) -> CostModel:
        return cls(get_accelerator(gpu), ModelShape.from_model(model, dtype=dtype), **kwargs)

    @property
    def eff(self) -> Efficiency:
        """The efficiencies in use: the given or table row, with the two-number overrides applied."""
        base = self.efficiency or efficiency_for(self.accelerator.key, self.model.weight_bytes_per_param)
        return base.scaled(self.compute_efficiency, self.memory_efficiency)

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
        """The matmuls' ridge after efficiencies: the batch where their compute and weight times cross."""
        return self.ridge_point * self.eff.gemm_compute / self.eff.weight_stream

    def rates(self) -> dict[str, float]:
        """FLOP/s or byte/s each efficiency stands for on this accelerator."""
        e, bw = self.eff, self.accelerator.bandwidth_bytes_per_s
        return {"gemm_compute": self.peak_flops * e.gemm_compute, "weight_stream": bw * e.weight_stream,
                "kv_stream": bw * e.kv_stream, "attention_compute": self.peak_flops * e.attention_compute}

    def step_cost(self, chunks: Iterable[tuple[int, int]], num_sampled: int | None = None) -> StepCost:
        """Cost of one step over ``chunks`` = (new tokens, tokens already cached) per request.

        A decode with KV length ``L`` (its new token included) is the chunk ``(1, L - 1)``; every chunk of
        one token is priced as a decode, longer ones as prefill. ``num_sampled`` (LM-head rows) defaults
        to one per chunk.
        """
        m, chunks = self.model.sharded(self.tensor_parallel_size), list(chunks)
        tokens = sum(c for c, _ in chunks)
        if not tokens:
            return StepCost(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        sampled = len(chunks) if num_sampled is None else num_sampled
        pairs, kv_read = {"p": 0, "d": 0}, {"p": 0, "d": 0}  # summed over layers
        writes = {"p": sum(c for c, _ in chunks if c > 1), "d": sum(1 for c, _ in chunks if c == 1)}
        for window, layers in m.window_groups:
            for c, p in chunks:
                k = "d" if c == 1 else "p"
                pairs[k] += layers * attention_pairs(c, p, window)
                kv_read[k] += layers * (p + c if window is None else min(p + c, window))
        r, bpp, per_pair = self.rates(), m.weight_bytes_per_param, m.attention_flops_per_pair

        def op(name: str, flops: float, nbytes: float) -> OpCost:
            compute_eff, memory_eff = OP_EFFICIENCIES[name]
            compute = flops / r[compute_eff] if compute_eff else 0.0
            return OpCost(name, flops, nbytes, compute, nbytes / r[memory_eff])

        proj, mlp = m.proj_flop_params, m.body_flop_params - m.proj_flop_params
        kv_layer, kv_token = m.kv_bytes_per_token_per_layer, m.kv_bytes_per_token
        ops = (
            op("qkv_o_proj", 2.0 * proj * tokens, m.proj_params * bpp),
            op("mlp", 2.0 * mlp * tokens, m.mlp_weight_bytes(tokens)),
            op("lm_head", 2.0 * m.lm_head_params * sampled, m.lm_head_params * bpp if sampled else 0.0),
            op("prefill_attention", pairs["p"] * per_pair, kv_read["p"] * kv_layer + writes["p"] * kv_token),
            op("decode_attention", pairs["d"] * per_pair, kv_read["d"] * kv_layer + writes["d"] * kv_token),
            op("elementwise", 0.0, tokens * m.elementwise_bytes_per_token),
            op("sampling", 0.0, sampled * 2 * LOGIT_BYTES * m.vocab_size),
        )
        if self.tensor_parallel_size > 1:
            ops += (self.all_reduce_cost(tokens),)
        weights = ops[0].bytes + ops[1].bytes + ops[2].bytes
        kv_write = (writes["p"] + writes["d"]) * kv_token
        overhead = self.overhead_s + self.overhead_per_seq_s * len(chunks)
        return StepCost(tokens, ops[0].flops + ops[1].flops + ops[2].flops, ops[3].flops + ops[4].flops,
                        weights, ops[3].bytes + ops[4].bytes - kv_write, kv_write,
                        sum(o.compute_time for o in ops), sum(o.memory_time for o in ops), overhead, ops,
                        ops[5].bytes + ops[6].bytes)

    def all_reduce_cost(self, tokens: int) -> OpCost:
        """A step's all-reduces under tensor parallelism: two per layer (after attention, after the MLP),
        each summing ``tokens x hidden`` activations across the t GPUs. A ring all-reduce sends and
        receives ``2 (t - 1) / t`` of the message on every GPU (Patarasuk and Yuan, 2009; NCCL's ring), so
        one costs ``latency + 2 (t - 1) / t x bytes / link bandwidth``."""
        t, m, acc = self.tensor_parallel_size, self.model, self.accelerator
        if not acc.link_bandwidth_bytes_per_s:
            raise ValueError(f"{acc.name} has no link bandwidth in the hardware table: tensor parallelism "
                             "cannot be priced on it")
        message = tokens * m.hidden_size * max(m.weight_bytes_per_param, 2.0)  # 16-bit activations
        calls = 2 * m.num_layers
        wire = calls * 2 * (t - 1) / t * message
        time = calls * self.all_reduce_latency_s + wire / acc.link_bandwidth_bytes_per_s
        return OpCost("all_reduce", 0.0, wire, 0.0, time)

    def step_time(self, chunks: Iterable[tuple[int, int]], num_sampled: int | None = None) -> float:
        return self.step_cost(chunks, num_sampled).time

    def all_to_all_cost(self, tokens: int, expert_parallel_size: int,
                        link_bandwidth_bytes_per_s: float | None = None, dispatch_bytes: float = 2.0,
                        combine_bytes: float = 2.0) -> OpCost:
        """A step's expert-parallel all-to-alls, seen from one GPU with ``tokens`` tokens (MoE only). In
        every MoE layer each token's hidden state goes to the GPUs of its k routed experts (dispatch) and
        their outputs come back (combine); with the experts spread evenly over ``expert_parallel_size``
        GPUs, a share (e - 1) / e of those trips leave the GPU. So one GPU sends and receives ``tokens x k
        x hidden x (dispatch + combine bytes) x (e - 1) / e`` per layer, plus a latency for each of the
        layer's two all-to-alls. DeepSeek-V3's deployment dispatches in FP8 (``dispatch_bytes=1``) and
        combines in bf16 (its technical report, arXiv 2412.19437, section 3.4).
        ``link_bandwidth_bytes_per_s``: default the accelerator's link (NVLink in a node); between nodes,
        the network's (50e9 for a 400 Gb/s InfiniBand port per GPU)."""
        m = self.model
        if not m.num_experts:
            raise ValueError(f"{m.name} has no routed experts: expert parallelism does not apply")
        e = expert_parallel_size  # may exceed the experts: copies of busy ones (DeepSeek-V3: 256 on 320 GPUs)
        if e < 1:
            raise ValueError(f"expert_parallel_size must be at least 1, got {e}")
        link = link_bandwidth_bytes_per_s or self.accelerator.link_bandwidth_bytes_per_s
        if not link:
            raise ValueError(f"{self.accelerator.name} has no link bandwidth: give "
                             "link_bandwidth_bytes_per_s")
        layers = m.num_moe_layers or m.num_layers
        wire = (layers * tokens * m.experts_per_token * m.hidden_size * (dispatch_bytes + combine_bytes)
                * (e - 1) / e)
        latency = 2 * layers * self.all_reduce_latency_s if e > 1 else 0.0
        return OpCost("all_to_all", 0.0, wire, 0.0, latency + wire / link)

    # ---- pipeline parallelism ----
    def pipeline_send_time(self, tokens: int) -> float:
        """One stage handing a batch on to the next: the hidden states and the residual of every token
        (vLLM's ``IntermediateTensors`` for a Llama), 16-bit, over the accelerator's link."""
        nbytes = 2 * tokens * self.model.hidden_size * max(self.model.weight_bytes_per_param, 2.0)
        link = self.accelerator.link_bandwidth_bytes_per_s
        if not link:
            raise ValueError(f"{self.accelerator.name} has no link bandwidth in the hardware table: "
                             "pipeline parallelism cannot be priced on it")
        return self.pipeline_send_latency_s + nbytes / link

    def split_stages(self, body: float, head: float, fixed: float, tokens: int) -> list[float]:
        """Seconds each stage works on one batch, from the step's three parts on one GPU: ``body`` (the
        layers' ops, split by layer count), ``head`` (LM head and sampling: the last stage) and ``fixed``
        (the per-step overhead: scheduling and input preparation happen before the first stage)."""
        layers = pipeline_stage_layers(self.model.num_layers, self.pipeline_parallel_size)
        send = self.pipeline_send_time(tokens) if len(layers) > 1 else 0.0
        times = [body * n / self.model.num_layers + send for n in layers]
        times[-1] += head - send
        times[0] += fixed
        return times

    def stage_times_of(self, cost: StepCost) -> list[float]:
        """``split_stages`` of a priced step (one element, its time, without pipeline parallelism)."""
        if self.pipeline_parallel_size == 1:
            return [cost.time]
        head = sum(o.time for o in cost.ops if o.name in HEAD_OPS)
        return self.split_stages(sum(o.time for o in cost.ops) - head, head, cost.overhead, cost.num_tokens)

    def stage_times(self, chunks: Iterable[tuple[int, int]], num_sampled: int | None = None) -> list[float]:
        """Seconds each pipeline stage spends on one batch of ``chunks``. Their sum is the batch's
        latency through the pipeline; the largest bounds how often a new batch can enter it."""
        return self.stage_times_of(self.step_cost(chunks, num_sampled))

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
        e = self.eff
        return (f"{self.model.name} on {self.accelerator.name}: efficiencies GEMM {e.gemm_compute:.2f}, "
                f"weights {e.weight_stream:.2f}, KV {e.kv_stream:.2f}, attention {e.attention_compute:.2f}; "
                f"overhead {1e3 * self.overhead_s:.2f} ms/step"
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
