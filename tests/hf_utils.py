"""Build tiny random-weight Hugging Face models of each supported family, saved as HF folders.

Tests load them back through *our* loader, so the comparison covers config parsing, weight names and
the forward pass together. No download: configs and weights are made here.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
import transformers

# transformers 5 renamed `torch_dtype=` to `dtype=`.
_DTYPE_KW = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"

# Shared tiny shape: hidden 64, 2-3 layers, vocab 512. initializer_range=0.2 (not HF's 0.02) so that
# greedy decoding of a random model wanders over many tokens instead of repeating one.
_BASE: dict[str, Any] = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=512,
    initializer_range=0.2,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
)

# name -> (transformers config class name, overrides). GQA everywhere, one MQA, tied and untied heads.
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    # Llama's optional biases switched on, to cover o_proj/MLP bias loading (Qwen2 covers q/k/v only).
    "llama": (
        "LlamaConfig",
        dict(num_key_value_heads=2, tie_word_embeddings=False, attention_bias=True, mlp_bias=True),
    ),
    "llama3": (
        "LlamaConfig",
        dict(
            num_key_value_heads=1,  # MQA
            num_hidden_layers=3,
            tie_word_embeddings=True,
            max_position_embeddings=1024,
            # Small original context (and theta 1e4) so the llama3 rule rescales frequencies that matter
            # within a few dozen positions, and smooths one of them.
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=256,
            ),
        ),
    ),
    # head_dim 32 != hidden/heads (16), and a window shorter than the generated text.
    "mistral": ("MistralConfig", dict(num_key_value_heads=2, head_dim=32, sliding_window=24)),
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)),
}


def hf_config(family: str, **overrides: Any):
    """A ``transformers`` config for one family (eager attention: the plainest HF reference)."""
    cls_name, extra = FAMILIES[family]
    kwargs = {**_BASE, **extra, **overrides}
    if "rope_parameters" in inspect.signature(getattr(transformers, cls_name).__init__).parameters:
        # transformers >= 5 spells rope_theta + rope_scaling as one `rope_parameters` dict.
        rope = dict(kwargs.pop("rope_scaling", None) or {"rope_type": "default"})
        rope["rope_theta"] = kwargs.pop("rope_theta", 10000.0)
        kwargs["rope_parameters"] = rope
    config = getattr(transformers, cls_name)(**kwargs)
    config._attn_implementation = "eager"
    return config


def build_hf_model(family: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A random-weight HF ``*ForCausalLM`` in fp32 eval mode.

    Norm weights and biases are randomised too (HF initialises them to 1 and 0), so a loader that
    forgot them, or a model that applied them wrongly, would be caught.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(family, **overrides), **{_DTYPE_KW: torch.float32})
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


def save_hf_model(model: torch.nn.Module, path: Path, max_shard_size: str | None = None) -> Path:
    """Save as an HF folder of safetensors (sharded when ``max_shard_size`` is given)."""
    kwargs: dict[str, Any] = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True  # transformers 4.x; 5.x always writes safetensors
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(path, **kwargs)
    return path


def load_hf_reference(path: Path) -> torch.nn.Module:
    """The HF model read back from ``path`` (fp32, eager attention), to compare against."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, **{_DTYPE_KW: torch.float32}, attn_implementation="eager"
    )
    return model.eval()


def byte_tokenizer():
    """A byte-level tokenizer for the 512-token random models: ids 0-255 are single bytes, 256-511 pairs.

    Random models then write random bytes, many of them invalid or multi-byte UTF-8: a stress test for
    incremental detokenization.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    for i in range(256, 512):
        vocab[alphabet[i % 256] + alphabet[(i * 7 + 3) % 256]] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)
