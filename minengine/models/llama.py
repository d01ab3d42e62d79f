"""One readable decoder for Llama 2/3, Mistral, Qwen2/2.5 and Qwen3.

The four families differ only in small switches read from ``ModelConfig``: q/k/v bias (Qwen2), per-head
q/k RMSNorm (Qwen3), a sliding window (Mistral), Llama-3 RoPE scaling, and tied embeddings. Parameter
names equal Hugging Face's, so a safetensors state dict loads without renaming.

The forward pass works on a *packed* batch: ``input_ids`` and ``positions`` are [N] (all new tokens of
all sequences, concatenated), and ``AttentionMetadata`` tells attention where each sequence begins.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from minengine.models.attention import AttentionMetadata, KVCache, paged_attention
from minengine.models.config import ModelConfig


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and cast back before the weight multiply, exactly like HF."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


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
    token is rotated by where it sits in its own sequence.
    """

    def __init__(self, config: ModelConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = config
        self.build_cache(device)

    def build_cache(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the tables; the loader calls this after building the module on the meta device."""
        inv_freq = rope_inv_freq(self.config).to(device)
        positions = torch.arange(self.config.max_position_embeddings, device=device, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        self.register_buffer("cos_cached", freqs.cos(), persistent=False)
        self.register_buffer("sin_cached", freqs.sin(), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [N, H_q, D] and k [N, H_kv, D] (rotate-half convention, like HF)."""
        cos = self.cos_cached[positions].to(q.dtype).unsqueeze(1)  # [N, 1, D/2]
        sin = self.sin_cached[positions].to(q.dtype).unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.sliding_window = config.layer_sliding_window(layer_idx)
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, config.q_size, bias=bias)
        self.k_proj = nn.Linear(hidden, config.kv_size, bias=bias)
        self.v_proj = nn.Linear(hidden, config.kv_size, bias=bias)
        self.o_proj = nn.Linear(config.q_size, hidden, bias=config.o_proj_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary_emb: RotaryEmbedding,
        attn_metadata: AttentionMetadata,
        kv_cache: KVCache | None,
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):  # Qwen3 normalises each head before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary_emb(positions, q, k)
        out = paged_attention(q, k, v, kv_cache, attn_metadata, self.scaling, self.sliding_window)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden, inter, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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
        positions: torch.Tensor,
        rotary_emb: RotaryEmbedding,
        attn_metadata: AttentionMetadata,
        kv_cache: KVCache | None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, rotary_emb, attn_metadata, kv_cache)
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
        attn_metadata: AttentionMetadata,
        kv_caches: list[KVCache] | None = None,
    ) -> torch.Tensor:
        if kv_caches is not None and len(kv_caches) != len(self.layers):
            raise ValueError(f"got {len(kv_caches)} KV caches for {len(self.layers)} layers")
        x = self.embed_tokens(input_ids)
        # Gather indices for every layer's attention, built once per forward (one set per window size).
        attn_metadata.prepare(x.device, self.sliding_windows)
        for i, layer in enumerate(self.layers):
            cache = kv_caches[i] if kv_caches is not None else None
            x = layer(x, positions, self.rotary_emb, attn_metadata, cache)
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
        attn_metadata: AttentionMetadata,
        kv_caches: list[KVCache] | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [N] int64 (packed batch) -> hidden states [N, hidden_size]."""
        return self.model(input_ids, positions, attn_metadata, kv_caches)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, hidden_size] -> logits [M, vocab_size], in the model's dtype."""
        return self.lm_head(hidden)
