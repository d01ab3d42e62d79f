"""One readable decoder for Llama 2/3, Mistral, Qwen2/2.5 and Qwen3.

The four families differ only in small switches read from ``ModelConfig``: q/k/v bias (Qwen2), per-head
q/k RMSNorm (Qwen3), a sliding window (Mistral), Llama-3 RoPE scaling, and tied embeddings.

Fused projections: each layer holds q/k/v as one ``qkv_proj`` matrix and gate/up as one ``gate_up_proj``
(vLLM's names), so a decode step runs 4 weight GEMVs per layer instead of 7 (fewer, larger matmuls and
fewer small ops around them). The *state dict* still speaks Hugging Face: ``state_dict()`` splits the
fused matrices into ``q_proj``/``k_proj``/``v_proj``/``gate_proj``/``up_proj`` views and
``load_state_dict`` concatenates them back (state-dict hooks), so a safetensors checkpoint loads
without renaming and every name in an error message is a checkpoint's name.

The forward pass works on a *packed* batch: ``input_ids`` and ``positions`` are [N] (all new tokens of
all sequences, concatenated), and ``AttentionMetadata`` tells attention where each sequence begins (or,
in a compiled decode step, ``DecodeTensors`` says the same with tensors only).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from minengine.models import triton_ops
from minengine.models.attention import AttentionMetadata, KVCache, attention_forward
from minengine.models.config import ModelConfig
from minengine.models.paged_decode import DecodeTensors
from minengine.utils import cumsum


class AllReduce(Protocol):
    """What a tensor-parallel layer needs from its group: sum a tensor over the ranks, in place
    (``models/tensor_parallel.TensorParallelGroup``)."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor: ...


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and cast back before the weight multiply, like HF.

    One ``F.rms_norm`` call instead of the 6 ops of the textbook formula (a decode step runs 25 of
    these; each small op costs microseconds of dispatch on a CPU). In fp32 the weight goes into the same
    call; in bf16/fp16 the weight multiply stays outside, in the model's dtype, exactly as HF rounds it.
    On a CPU, ``F.rms_norm`` itself still runs as about seven ATen ops, so an engine in fp32 with the C++
    kernels built sets ``use_kernel``: one call of ``csrc/rms_norm.cpp`` instead (the same formula; a
    compiled graph keeps ``F.rms_norm``, which inductor fuses anyway).
    """

    use_kernel: bool = False
    use_triton: bool = False  # a GPU's one-kernel RMSNorm (models/triton_ops.py), set by the worker

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``out`` (with ``use_triton``): write the result there, e.g. in place (``out=x``)."""
        if self.use_triton:
            return triton_ops.rms_norm(x, self.weight, self.variance_epsilon, out=out)
        shape = (x.shape[-1],)
        if x.dtype == torch.float32:
            if self.use_kernel and not torch.compiler.is_compiling() and not (
                    # the kernel has no backward
                    torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
                return torch.ops.minengine.rms_norm(x, self.weight, self.variance_epsilon)
            return F.rms_norm(x, shape, self.weight, self.variance_epsilon)
        return self.weight * F.rms_norm(x.float(), shape, None, self.variance_epsilon).to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies [head_dim/2] in fp32, with linear or Llama-3 scaling.

    Mirrors transformers' ``_compute_llama3_parameters``: long wavelengths are divided by ``factor``,
    short ones kept, and the band in between interpolated smoothly.
    """
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


class RotaryEmbedding(nn.Module):
    """cos/sin tables [max_positions, head_dim/2] in fp32, indexed by each token's explicit position.

    Explicit positions (not "0..L-1") are what make packed batches, chunked prefill and decode work: every
    token is rotated by where it sits in its own sequence. ``tables`` looks the step's rows up once per
    forward (the model calls it before its first layer); each layer's call then rotates its q and k
    heads together, in 4 ops. An engine in fp32 on a CPU with the C++ kernels built sets ``use_kernel``:
    one in-place call of ``csrc/rotary.cpp`` instead, the same arithmetic bit for bit (a compiled graph
    keeps the 4 ops, which inductor fuses anyway).
    """

    use_kernel: bool = False
    use_triton: bool = False  # a GPU's one-kernel rotation, in place (models/triton_ops.py)

    def __init__(self, config: ModelConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = config
        if device is not None or torch.get_default_device().type != "meta":
            # On the meta device the tables would be shapes only, computed through torch's Python
            # reference ops (whose first use imports TorchDynamo, ~1 s); the loader builds them instead.
            self.build_cache(device)

    def build_cache(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the tables; the loader calls this after building the module on the meta device."""
        inv_freq = rope_inv_freq(self.config).to(device)
        positions = torch.arange(self.config.max_position_embeddings, device=device, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        self.register_buffer("cos_cached", freqs.cos(), persistent=False)
        self.register_buffer("sin_cached", freqs.sin(), persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin), each [N, 1, head_dim] in ``dtype``: the step's rows, built once per forward.

        Full width so a rotation is whole-tensor ops: ``sin`` is ``(-sin, sin)``, which with the halves of
        x swapped gives HF's ``rotate_half(x) * sin`` exactly (a negation is exact).
        """
        cos = self.cos_cached[positions].to(dtype)
        sin = self.sin_cached[positions].to(dtype)
        return torch.cat((cos, cos), -1).unsqueeze(1), torch.cat((-sin, sin), -1).unsqueeze(1)

    def forward(
        self, tables: tuple[torch.Tensor, torch.Tensor], qk: torch.Tensor, num_q_heads: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate qk [N, H_q + H_kv, D] (q's heads, then k's: adjacent in the fused projection's output)
        with ``tables`` (rotate-half convention, like HF); returns (q [N, H_q, D], k [N, H_kv, D])."""
        cos, sin = tables
        if self.use_triton:
            out = triton_ops.rotary_(qk, cos, sin)  # qk is this layer's fresh projection output
        elif self.use_kernel and qk.dtype == torch.float32 and not torch.compiler.is_compiling() and not (
                torch.is_grad_enabled() and qk.requires_grad):  # the kernel has no backward
            torch.ops.minengine.rotary_embedding_(qk, cos, sin)  # qk is this layer's fresh projection output
            out = qk
        else:
            x1, x2 = qk.chunk(2, -1)
            out = qk * cos + torch.cat((x2, x1), -1) * sin
        q, k = out.split((num_q_heads, qk.shape[1] - num_q_heads), 1)
        return q, k


class HookPoint(nn.Identity):
    """A named place in the forward pass that returns its input: somewhere a forward hook can look.

    ``LlamaAttention.v_proj`` is one: the values, as the cache will store them, pass through it (the
    projection itself is part of ``qkv_proj``), so ``course/kv_quant.py`` can round them with a hook.
    """


class LlamaAttention(nn.Module):
    """Self-attention over the paged KV cache. Under tensor parallelism (``models/tensor_parallel.py``)
    a rank holds some of the heads, and ``tp_group`` adds the ranks' partial ``o_proj`` outputs."""

    tp_group: AllReduce | None = None  # set on each rank's model under tensor parallelism

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.scaling = self.head_dim**-0.5
        self.sliding_window = config.layer_sliding_window(layer_idx)
        hidden, bias = config.hidden_size, config.attention_bias
        self.qkv_proj = nn.Linear(hidden, config.q_size + 2 * config.kv_size, bias=bias)
        self.o_proj = nn.Linear(config.q_size, hidden, bias=config.o_proj_bias)
        self.v_proj = HookPoint()
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        parts = {"q_proj": config.q_size, "k_proj": config.kv_size, "v_proj": config.kv_size}
        _fuse_in_state_dict(self, "qkv_proj", parts)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        rotary_emb: RotaryEmbedding,
        attn_metadata: AttentionMetadata | DecodeTensors,
        kv_cache: KVCache | None,
    ) -> torch.Tensor:
        n, heads, kv_heads, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qk, v = self.qkv_proj(x).split((self.q_size + self.kv_size, self.kv_size), -1)  # views
        qk = qk.view(n, heads + kv_heads, d)
        if self.qk_norm:  # Qwen3 normalises each head before RoPE
            q, k = qk.split((heads, kv_heads), 1)
            if self.q_norm.use_triton:  # in place, in the projection's fresh output: no copy, no cat
                self.q_norm(q, out=q)
                self.k_norm(k, out=k)
            else:
                qk = torch.cat((self.q_norm(q), self.k_norm(k)), 1)
        q, k = rotary_emb(rope, qk, heads)
        v = self.v_proj(v).view(n, kv_heads, d)
        out = attention_forward(q, k, v, kv_cache, attn_metadata, self.scaling, self.sliding_window)
        out = self.o_proj(out.reshape(n, heads * d))
        return out if self.tp_group is None else self.tp_group.all_reduce(out)


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up as one matrix (``gate_up_proj``).

    An engine in fp32 on a CPU with the C++ kernels built sets ``use_kernel``: the activation then runs as
    one pass over the projection's output (``csrc/activation.cpp``, vLLM's ``silu_and_mul``) instead of
    ``F.silu`` and a multiply, each writing a fresh tensor (a compiled graph keeps the two ops: inductor
    fuses them anyway)."""

    use_kernel: bool = False
    use_triton: bool = False  # a GPU's one-kernel activation (models/triton_ops.py)
    tp_group: AllReduce | None = None  # under tensor parallelism: add the ranks' down_proj outputs

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inter, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        _fuse_in_state_dict(self, "gate_up_proj", {"gate_proj": inter, "up_proj": inter})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(self.act_and_mul(self.gate_up_proj(x)))
        return out if self.tp_group is None else self.tp_group.all_reduce(out)

    def act_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up, from the fused projection's output [N, 2 x intermediate]."""
        if self.use_triton:
            return triton_ops.silu_and_mul(gate_up)
        if self.use_kernel and gate_up.dtype == torch.float32 and not torch.compiler.is_compiling() and not (
                torch.is_grad_enabled() and gate_up.requires_grad):  # the kernel has no backward
            return torch.ops.minengine.silu_and_mul(gate_up)
        gate, up = gate_up.chunk(2, -1)
        return F.silu(gate) * up


def _fuse_in_state_dict(module: nn.Module, fused: str, parts: dict[str, int]) -> None:
    """Make ``module``'s state dict show the fused Linear ``fused`` as its HF parts (rows in order).

    ``state_dict()`` replaces ``{fused}.weight``/``.bias`` by views of each part's rows;
    ``load_state_dict`` concatenates a full set of parts back (an incomplete set is left alone, so the
    usual missing/unexpected-key errors name the checkpoint's keys).
    """
    names = list(parts)
    bounds = cumsum(list(parts.values()))

    def split(mod: nn.Module, state: dict, prefix: str, local_metadata: dict) -> None:
        for suffix in ("weight", "bias"):
            value = state.pop(f"{prefix}{fused}.{suffix}", None)
            if value is not None:
                for name, a, b in zip(names, bounds, bounds[1:], strict=False):
                    state[f"{prefix}{name}.{suffix}"] = value[a:b]

    def join(mod: nn.Module, state: dict, prefix: str, *args: object) -> None:
        for suffix in ("weight", "bias"):
            keys = [f"{prefix}{name}.{suffix}" for name in names]
            if all(k in state for k in keys):
                state[f"{prefix}{fused}.{suffix}"] = torch.cat([state.pop(k) for k in keys])

    module.register_state_dict_post_hook(split)
    module.register_load_state_dict_pre_hook(join)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        rotary_emb: RotaryEmbedding,
        attn_metadata: AttentionMetadata | DecodeTensors,
        kv_cache: KVCache | None,
    ) -> torch.Tensor:
        """``rope``: this step's (cos, sin) rows from ``RotaryEmbedding.tables``."""
        x = x + self.self_attn(self.input_layernorm(x), rope, rotary_emb, attn_metadata, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        self.sliding_windows = {layer.self_attn.sliding_window for layer in self.layers}  # None = full

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata | DecodeTensors,
        kv_caches: list[KVCache] | None = None,
    ) -> torch.Tensor:
        if kv_caches is not None and len(kv_caches) != len(self.layers):
            raise ValueError(f"got {len(kv_caches)} KV caches for {len(self.layers)} layers")
        x = self.embed_tokens(input_ids)
        # Built once per forward, read by every layer: the gather indices of attention (one set per
        # window size) and RoPE's cos/sin rows for these positions.
        attn_metadata.prepare(x.device, self.sliding_windows)
        rope = self.rotary_emb.tables(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            cache = kv_caches[i] if kv_caches is not None else None
            x = layer(x, rope, self.rotary_emb, attn_metadata, cache)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """Decoder + LM head. ``forward`` returns hidden states; ``compute_logits`` maps chosen rows to logits.

    Splitting the two lets the engine compute logits only for the last token of each sequence, which
    saves a [N, vocab] matmul on every prefill.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model_path: Path | None = None  # set by the loader
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding matrix with the LM head when the config says so (small models do)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata | DecodeTensors,
        kv_caches: list[KVCache] | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [N] int64 (packed batch) -> hidden states [N, hidden_size]."""
        return self.model(input_ids, positions, attn_metadata, kv_caches)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, hidden_size] -> logits [M, vocab_size], in the model's dtype."""
        return self.lm_head(hidden)
