"""Read a llama.cpp GGUF file into a Hugging Face model folder that the loader already understands.

A GGUF file holds three things, and each has a counterpart in an HF folder:

* **metadata** (``llama.block_count``, ``llama.embedding_length``, ...) -> ``config.json``
  (``hf_config``); only ``general.architecture == "llama"`` is read;
* **tensors** named ``blk.N.attn_q.weight`` etc., most of them quantized -> ``model.safetensors`` with
  HF names, dequantized to fp32 here (``dequantize``, ``hf_state_dict``);
* **the tokenizer** (``tokenizer.ggml.*``) and ``tokenizer.chat_template`` -> ``tokenizer.json`` and
  friends, converted by transformers' GGUF tokenizer converter (offline: it reads the same file).

The folder is written once per GGUF file and kept (``gguf_cache.py`` says where), so the first load of
SmolLM2-135M takes ~10 s (2 CPU cores) and later ones read plain safetensors.

Quantized block layouts (ggml; every block holds 32 consecutive weights of one row, little-endian):

==========  =====  ==========================================================================
type        bytes  layout and value of weight j (0 <= j < 32)
==========  =====  ==========================================================================
``F32``     4/w    plain float32
``F16``     2/w    plain IEEE float16
``BF16``    2/w    plain bfloat16 (the top half of a float32)
``Q8_0``    34     fp16 scale d, then 32 int8 q:  w_j = d * q_j
``Q4_0``    18     fp16 scale d, then 16 bytes of nibbles: byte i holds q_i (low 4 bits) and q_{i+16}
                   (high 4 bits):  w_j = d * (q_j - 8)
``Q4_1``    20     fp16 scale d, fp16 min m, then 16 bytes of nibbles as in Q4_0:  w_j = d * q_j + m
==========  =====  ==========================================================================

llama.cpp's converter also *permutes* the rows of every q/k projection: HF's RoPE rotates the two halves
of each head (``rotate_half``), llama.cpp rotates adjacent pairs, so the converter interleaves the halves.
``unpermute_qk`` undoes it (transformers' GGUF loader does the same).

``gguf`` (the llama.cpp project's reader) is imported inside functions, so ``import minengine`` stays
light.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minengine.models.errors import ModelLoadError, UnsupportedModelError

BLOCK_SIZE = 32  # weights per quantized block, for every type read here
# GGML type name -> bytes per block of 32 weights (plain float types: per weight).
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}
FLOAT_TYPES = {"F32": np.float32, "F16": np.float16}
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

# GGUF tensor name (per block: "blk.N." + key) -> HF parameter name.
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


# ---- dequantization ---------------------------------------------------------------------------------


def _fp16_column(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 stored at byte ``offset`` of each block, as a float32 column [n_blocks, 1]."""
    return np.ascontiguousarray(blocks[:, offset : offset + 2]).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] packed bytes -> [n, 32] values 0..15: low nibbles are weights 0-15, high ones 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def dequantize_blocks(raw: np.ndarray, type_name: str) -> np.ndarray:
    """Raw bytes of one tensor (any shape, uint8) -> its weights as a flat float32 array."""
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if type_name in FLOAT_TYPES:
        return raw.view(FLOAT_TYPES[type_name]).astype(np.float32)
    if type_name == "BF16":  # bfloat16 is the high 16 bits of a float32
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if type_name not in BLOCK_BYTES:
        raise UnsupportedModelError(
            f"GGUF tensor type {type_name} is not supported; supported: {', '.join(SUPPORTED_TYPES)}"
        )
    blocks = raw.reshape(-1, BLOCK_BYTES[type_name])
    d = _fp16_column(blocks, 0)
    if type_name == "Q8_0":
        out = d * blocks[:, 2:].view(np.int8).astype(np.float32)
    elif type_name == "Q4_0":
        out = d * (_nibbles(blocks[:, 2:]).astype(np.float32) - 8.0)
    else:  # Q4_1
        out = d * _nibbles(blocks[:, 4:]).astype(np.float32) + _fp16_column(blocks, 2)
    return out.reshape(-1)


# ---- quantization (the inverse: what llama-quantize writes) ------------------------------------------


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C's ``roundf``: halves go away from zero (numpy's ``round`` sends them to the even neighbour)."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """[n, 32] values 0..15 -> [n, 16] bytes: weight i in the low nibble of byte i, weight i+16 in the
    high."""
    q = q.astype(np.uint8)
    return q[:, :16] | (q[:, 16:] << np.uint8(4))


def quantize_blocks(values: np.ndarray, type_name: str) -> np.ndarray:
    """Float weights (a multiple of 32 of them) -> the raw bytes of a ``Q8_0``, ``Q4_0`` or ``Q4_1`` tensor.

    The same arithmetic as ggml's reference quantizers (``quantize_row_*_ref``: float32 maths, the scale
    stored as fp16), so the bytes match what ``llama-quantize`` writes without an importance matrix:

    * ``Q8_0``: d = max|w| / 127, q = round(w / d) in -127..127;
    * ``Q4_0``: d = (the weight of largest magnitude, with its sign) / -8, q = w / d + 8 rounded, clipped
      to 0..15 -- the extreme weight lands exactly on q = 0, the grid's lone extra step;
    * ``Q4_1``: d = (max - min) / 15 and m = min, q = (w - m) / d rounded, 0..15.
    """
    if type_name not in BLOCK_BYTES:
        raise UnsupportedModelError(f"cannot quantize to {type_name}; supported: {', '.join(BLOCK_BYTES)}")
    x = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    if x.size % BLOCK_SIZE:
        raise ValueError(f"{x.size} weights is not a multiple of the block size {BLOCK_SIZE}")
    x = x.reshape(-1, BLOCK_SIZE)

    def inverse(d: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)

    if type_name == "Q8_0":
        d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
        q = _round_half_away(x * inverse(d)).astype(np.int8).view(np.uint8)
        return np.concatenate([d.astype(np.float16).view(np.uint8), q], axis=1).reshape(-1)
    if type_name == "Q4_0":
        extreme = np.take_along_axis(x, np.abs(x).argmax(axis=1, keepdims=True), axis=1)
        d = extreme / np.float32(-8)
        q = np.clip(np.trunc(x * inverse(d) + np.float32(8.5)), 0, 15)
        return np.concatenate([d.astype(np.float16).view(np.uint8), _pack_nibbles(q)], axis=1).reshape(-1)
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)  # Q4_1
    d = (hi - lo) / np.float32(15)
    q = np.clip(np.trunc((x - lo) * inverse(d) + np.float32(0.5)), 0, 15)
    head = np.concatenate([d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8)], axis=1)
    return np.concatenate([head, _pack_nibbles(q)], axis=1).reshape(-1)


def dequantize(tensor: Any) -> torch.Tensor:
    """A ``gguf.ReaderTensor`` -> fp32 torch tensor in PyTorch's [out, in] layout.

    GGUF lists shapes innermost first (``[in, out]`` for a matrix), so the torch shape is the reverse.
    """
    type_name = tensor.tensor_type.name
    shape = tuple(int(n) for n in reversed(tensor.shape))
    flat = dequantize_blocks(np.asarray(tensor.data), type_name)
    if flat.size != int(np.prod(shape)):
        raise ModelLoadError(f"GGUF tensor {tensor.name}: {flat.size} values for shape {shape}")
    return torch.from_numpy(flat.reshape(shape).copy())


def unpermute_qk(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute`` of a q/k projection [n_heads * head_dim, ...] (or its bias).

    Per head, llama.cpp reorders rows (half 0, half 1) into pairs (h0[0], h1[0], h0[1], h1[1], ...);
    reading them as [n_heads, head_dim/2, 2] and swapping the last two axes restores HF's order.
    """
    rows = weight.shape[0]
    half = rows // n_heads // 2
    w = weight.reshape(n_heads, half, 2, *weight.shape[1:])
    return w.transpose(1, 2).reshape(weight.shape).contiguous()


# ---- metadata and names -----------------------------------------------------------------------------


def _open(path: Path):
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(
            "reading GGUF files needs the `gguf` package: pip install gguf (or run make)"
        ) from None
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # gguf raises ValueError, struct errors, ... on a corrupt file
        raise ModelLoadError(f"could not read GGUF file {path}: {type(e).__name__}: {e}") from None


def metadata(reader: Any) -> dict[str, Any]:
    """Every metadata field except the tokenizer's big arrays, as plain Python values."""
    skip = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges")  # fmt: skip
    return {k: f.contents() for k, f in reader.fields.items() if k not in skip and not k.startswith("GGUF.")}


def hf_config(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """The HF ``config.json`` of a llama-architecture GGUF file."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise UnsupportedModelError(
            f"GGUF architecture {arch!r} is not supported by minengine's GGUF reader (only 'llama')"
        )
    if "rope_freqs.weight" in tensor_names:
        raise UnsupportedModelError(
            "GGUF file has a rope_freqs tensor (Llama-3.1 RoPE scaling): not supported"
        )

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"llama.{name}", default)
        if value is None:
            raise UnsupportedModelError(f"GGUF file lacks the metadata key llama.{name}")
        return value

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    vocab = meta.get("llama.vocab_size") or meta.get("tokenizer.ggml.vocab_size")
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "vocab_size": int(vocab) if vocab is not None else None,
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(
            meta.get("llama.attention.key_length")
            or meta.get("llama.rope.dimension_count")
            or hidden // heads
        ),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": "blk.0.ffn_up.bias" in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",  # what the dequantized weights are stored as
    }
    scaling = meta.get("llama.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif scaling not in (None, "none"):
        raise UnsupportedModelError(f"GGUF rope scaling {scaling!r} is not supported (only 'linear')")
    return config


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (and the global names)."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_NAMES and suffix in ("weight", "bias"):
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    m = _BLOCK_TENSOR.match(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    raise UnsupportedModelError(f"GGUF tensor {gguf_name!r} has no Llama counterpart")


def hf_state_dict(reader: Any, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """All tensors, dequantized to fp32, renamed to HF's names, q/k rows un-permuted."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    out: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        value = dequantize(tensor)
        if ".self_attn.q_proj." in name:
            value = unpermute_qk(value, heads)
        elif ".self_attn.k_proj." in name:
            value = unpermute_qk(value, kv_heads)
        out[name] = value
    return out


def read_config(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A GGUF file's metadata and the HF config it implies, without dequantizing any weight."""
    reader = _open(Path(path))
    meta = metadata(reader)
    return meta, hf_config(meta, {t.name for t in reader.tensors})


# ---- the HF folder ---------------------------------------------------------------------------------


def write_hf_folder(path: str | os.PathLike[str], out: Path) -> Path:
    """Convert one GGUF file into ``out``: config.json, model.safetensors, generation_config.json and,
    when the file carries a tokenizer, the tokenizer files (with the chat template)."""
    from safetensors.torch import save_file

    path = Path(path)
    reader = _open(path)
    meta = metadata(reader)
    names = {t.name for t in reader.tensors}
    config = hf_config(meta, names)
    state = hf_state_dict(reader, config)
    if config["vocab_size"] is None:
        config["vocab_size"] = int(state["model.embed_tokens.weight"].shape[0])
    config["gguf_file"] = str(path.resolve())  # provenance only; ModelConfig ignores it
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, out / "model.safetensors", metadata={"format": "pt", "source": "gguf"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id") if config[k] is not None}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if "tokenizer.ggml.model" in meta:
        _write_tokenizer(path, out)
    return out


def _write_tokenizer(path: Path, out: Path) -> None:
    """transformers' GGUF tokenizer converter (tokens, merges, special ids, chat template), saved."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # unknown tokenizer model, missing converter dependency, ...
        raise ModelLoadError(f"could not convert the tokenizer of {path}: {type(e).__name__}: {e}") from None
    tokenizer.save_pretrained(str(out))
