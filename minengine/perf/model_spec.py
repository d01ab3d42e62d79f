"""Model facts for the KV-cache calculator: KVSpec and the config.json / preset / hub loaders.

Split from ``minengine.kvcalc`` (which re-exports everything here) to keep files short. Like it, this
module must not import torch.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from minengine.perf.model_presets import PRESETS

# Bits per stored element. "auto" means "the model's dtype", as in vLLM's --kv-cache-dtype auto.
DTYPE_BITS: dict[str, int] = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                  "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8", "e5m2": "fp8"}
KV_CACHE_DTYPES = ("auto", *DTYPE_BITS)


class KVCalcError(ValueError):
    """A bad model, dtype or size: the message is meant to be shown to a person as is."""


def normalise_dtype(dtype: str) -> str:
    key = str(dtype).strip().lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key != "auto" and key not in DTYPE_BITS:
        raise KVCalcError(f"unknown dtype {dtype!r}; choose one of {', '.join(KV_CACHE_DTYPES)}")
    return key


@dataclass(frozen=True)
class KVSpec:
    """The facts about a model that its KV cache and weights depend on (parsed from config.json)."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int  # MLA: 1 (one latent shared by all heads)
    head_dim: int  # MLA: kv_lora_rank + qk_rope_head_dim
    layer_windows: tuple[int | None, ...]  # per layer: None = full attention, else the window in tokens
    kv_lora_rank: int = 0  # > 0 means MLA
    qk_rope_head_dim: int = 0
    max_position_embeddings: int | None = None
    num_params: int | None = None
    dtype: str = "bf16"  # compute dtype: what kv_cache_dtype="auto" resolves to
    weight_dtype: str = "bf16"  # storage dtype of the weights (differs from dtype when quantised)
    hf_id: str | None = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_type(self) -> str:
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def num_sliding_layers(self) -> int:
        return sum(w is not None for w in self.layer_windows)

    @property
    def sliding_window(self) -> int | None:
        windows = [w for w in self.layer_windows if w is not None]
        return max(windows) if windows else None

    def describe(self) -> str:
        """One line for tables: what is cached per token and layer."""
        if self.is_mla:
            text = (f"MLA: {self.num_layers} layers x (kv_lora_rank {self.kv_lora_rank} + rope "
                    f"{self.qk_rope_head_dim}) latent, {self.num_attention_heads} heads share it")
        else:
            text = (f"{self.attention_type}: {self.num_layers} layers x 2 x {self.num_kv_heads} KV heads x "
                    f"head_dim {self.head_dim} ({self.num_attention_heads} query heads)")
        if self.num_sliding_layers:
            text += f"; {self.num_sliding_layers}/{self.num_layers} layers slide over {self.sliding_window} tokens"
        return text


# ---------------------------------------------------------------------------------------------- parsing
def _flatten(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs (Gemma 3, Llava, ...) keep the language model under ``text_config``."""
    if "text_config" in config and "num_hidden_layers" not in config:
        outer = {k: v for k, v in config.items() if k not in ("text_config", "vision_config")}
        return {**outer, **config["text_config"]}
    return dict(config)


def _layer_windows(cfg: dict[str, Any], n_layers: int, disable_sliding_window: bool) -> tuple[int | None, ...]:
    """Which layers use a sliding window, following each model family's transformers code."""
    window = cfg.get("sliding_window")
    if disable_sliding_window:  # vLLM's --disable-sliding-window: cache every token in every layer
        return (None,) * n_layers
    if cfg.get("layer_types"):  # transformers >= 4.53 writes it out per layer
        windows: list[int | None] = []
        for kind in cfg["layer_types"]:
            if kind == "full_attention":
                windows.append(None)
            elif kind in ("sliding_attention", "chunked_attention"):
                size = window if kind == "sliding_attention" else cfg.get("attention_chunk_size")
                if not size:
                    raise KVCalcError(f"layer type {kind!r} without a window size in the config")
                windows.append(int(size))
            else:
                raise KVCalcError(f"layer type {kind!r} keeps no per-token KV cache; this calculator covers "
                                  "full, sliding-window and chunked attention layers")
        if len(windows) != n_layers:
            raise KVCalcError(f"layer_types has {len(windows)} entries but num_hidden_layers is {n_layers}")
        return tuple(windows)
    if not window:
        return (None,) * n_layers
    window = int(window)
    if "use_sliding_window" in cfg:  # Qwen2/Qwen3: off unless asked; then only layers >= max_window_layers
        if not cfg["use_sliding_window"]:
            return (None,) * n_layers
        first = int(cfg.get("max_window_layers", 0))
        return tuple(window if i >= first else None for i in range(n_layers))
    model_type = cfg.get("model_type", "")
    if model_type == "gemma2":  # even layers local, odd layers global
        return tuple(window if i % 2 == 0 else None for i in range(n_layers))
    if model_type in ("gemma3", "gemma3_text"):  # pattern-1 local layers, then one global
        pattern = int(cfg.get("sliding_window_pattern", 6))
        return tuple(window if (i + 1) % pattern else None for i in range(n_layers))
    return (window,) * n_layers  # Mistral-7B-v0.1, Phi-3: every layer slides


def model_dtype_of(cfg: dict[str, Any]) -> str:
    """The dtype servers compute in: torch_dtype, with fp32 checkpoints served in 16 bits (vLLM's auto)."""
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").lower()
    dtype = _DTYPE_ALIASES.get(name, name)
    return dtype if dtype in ("bf16", "fp16") else "bf16"


def weight_dtype_of(cfg: dict[str, Any]) -> str:
    """The dtype the weights are stored in: the quantisation method's if any, else the compute dtype."""
    quant = cfg.get("quantization_config") or {}
    text = f"{quant.get('quant_method', '')} {quant.get('fmt', '')}".lower()
    bits = quant.get("bits") or quant.get("w_bit")
    if "fp8" in text:
        return "fp8"
    if bits == 4 or quant.get("load_in_4bit"):
        return "int4"
    if bits == 8 or quant.get("load_in_8bit"):
        return "int8"
    return model_dtype_of(cfg)


def estimate_num_params(config: dict[str, Any]) -> int | None:
    """Parameter count of a Llama-style dense or Mixtral-style MoE decoder, from its config.

    Exact for the Llama, Mistral, Mixtral, Qwen2/3, Gemma 2 and Phi-3 presets; None for shapes it does not
    model (MLA, shared experts), in which case pass the count yourself.
    """
    cfg = _flatten(config)
    if cfg.get("kv_lora_rank") or cfg.get("shared_expert_intermediate_size") or cfg.get("n_shared_experts"):
        return None
    try:
        hidden, inter, vocab = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["vocab_size"])
        n_layers, n_heads = int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        return None
    model_type = str(cfg.get("model_type", ""))
    n_kv = int(cfg.get("num_key_value_heads") or n_heads)
    head_dim = int(cfg.get("head_dim") or hidden // n_heads)
    q_dim, kv_dim = n_heads * head_dim, n_kv * head_dim
    attn = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden
    if cfg.get("attention_bias", model_type == "qwen2"):  # Qwen2 has q/k/v biases
        attn += q_dim + 2 * kv_dim
    if model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"):  # per-head q/k RMSNorm
        attn += 2 * head_dim
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    if experts:
        expert_inter = int(cfg.get("moe_intermediate_size") or inter)
        mlp = experts * 3 * hidden * expert_inter + hidden * experts  # experts + router
    else:
        mlp = 3 * hidden * inter  # gate, up, down
    norms = (4 if model_type.startswith("gemma") else 2) * hidden
    tied = cfg.get("tie_word_embeddings", model_type.startswith("gemma"))
    embeddings = vocab * hidden * (1 if tied else 2)
    return n_layers * (attn + mlp + norms) + embeddings + hidden


def from_hf_config(config: dict[str, Any] | str | Path, *, name: str | None = None,
                   num_params: int | None = None, hf_id: str | None = None,
                   disable_sliding_window: bool = False) -> KVSpec:
    """Build a KVSpec from a Hugging Face config.json (a dict or a path to the file or its folder)."""
    if not isinstance(config, dict):
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise KVCalcError(f"cannot read {path}: {exc}") from exc
        name = name or (path.parent.name if path.name == "config.json" else path.stem)
    cfg = _flatten(config)
    try:
        n_layers = int(cfg.get("num_hidden_layers") or cfg.get("num_layers") or cfg["n_layer"])
        n_heads = int(cfg.get("num_attention_heads") or cfg["n_head"])
        hidden = int(cfg.get("hidden_size") or cfg["n_embd"])
    except (KeyError, TypeError, ValueError) as exc:
        raise KVCalcError(f"config lacks {exc} (need num_hidden_layers, num_attention_heads, hidden_size)"
                          ) from exc
    if cfg.get("kv_lora_rank"):  # MLA: cache the compressed latent plus the decoupled RoPE key
        n_kv, head_dim = 1, int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
    else:
        n_kv = int(cfg.get("num_key_value_heads") or cfg.get("num_kv_heads")
                   or (1 if cfg.get("multi_query") else n_heads))
        head_dim = int(cfg.get("head_dim") or hidden // n_heads)
    if min(n_layers, n_heads, n_kv, head_dim) <= 0:
        raise KVCalcError("config has a non-positive layer, head or head_dim count")
    max_pos = cfg.get("max_position_embeddings")
    return KVSpec(
        name=name or hf_id or str(cfg.get("_name_or_path") or cfg.get("model_type") or "custom"),
        num_layers=n_layers, num_attention_heads=n_heads, num_kv_heads=n_kv, head_dim=head_dim,
        layer_windows=_layer_windows(cfg, n_layers, disable_sliding_window),
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0), qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
        max_position_embeddings=int(max_pos) if max_pos else None,
        num_params=num_params if num_params is not None else estimate_num_params(config),
        dtype=model_dtype_of(cfg), weight_dtype=weight_dtype_of(cfg), hf_id=hf_id,
    )


def list_presets() -> list[str]:
    return list(PRESETS)


def _preset_key(model: str) -> str | None:
    key = model.strip().lower().replace("_", "-")
    if key in PRESETS:
        return key
    for name, preset in PRESETS.items():  # a preset's hub id works offline too
        if preset["hf_id"].lower() == key:
            return name
    return None


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe, so an offline machine fails in a second instead of after ~25 s of retries."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    if constants.HF_HUB_OFFLINE or not url.hostname:
        return False
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=timeout).close()
    except OSError:
        return False
    return True


def from_hub(repo_id: str, *, revision: str | None = None, disable_sliding_window: bool = False) -> KVSpec:
    """Fetch only config.json from the Hugging Face Hub (never weights); offline gives a clear error.

    The local HF cache is tried first, so a model downloaded before works offline.
    """
    try:
        import huggingface_hub
    except ImportError as exc:
        raise KVCalcError("huggingface_hub is not installed: use a preset or a local config.json") from exc
    try:
        path = huggingface_hub.hf_hub_download(repo_id, "config.json", revision=revision, local_files_only=True)
    except Exception:  # not cached: go online below
        try:
            if not _hub_reachable():
                raise OSError("the Hugging Face Hub is not reachable")
            path = huggingface_hub.hf_hub_download(repo_id, "config.json", revision=revision)
        except Exception as exc:  # offline, gated, missing repo: all end the same way for the user
            reason = " ".join(str(exc).split())[:200]  # hub errors can span lines; the CLI prints one
            raise KVCalcError(f"could not fetch config.json for {repo_id!r} from the Hugging Face Hub ({reason}; "
                              f"offline?). Use a preset ({', '.join(PRESETS)}) or a path to a config.json"
                              ) from exc
    return from_hf_config(path, name=repo_id, hf_id=repo_id, disable_sliding_window=disable_sliding_window)


def load_model_spec(model: KVSpec | dict[str, Any] | str | Path, *, disable_sliding_window: bool = False
                    ) -> KVSpec:
    """Accept a KVSpec, a config dict, a preset key, a preset's hub id, a config.json path or a hub id."""
    if isinstance(model, KVSpec):
        return model
    if isinstance(model, dict):
        return from_hf_config(model, disable_sliding_window=disable_sliding_window)
    text = str(model)
    key = _preset_key(text)
    if key is not None:
        preset = PRESETS[key]
        return from_hf_config(preset["config"], name=key, num_params=preset["num_params"],
                              hf_id=preset["hf_id"], disable_sliding_window=disable_sliding_window)
    path = Path(text).expanduser()
    if path.exists():
        return from_hf_config(path, disable_sliding_window=disable_sliding_window)
    if text.endswith(".json") or text.startswith((".", "/", "~")):
        raise KVCalcError(f"no such config file: {text}")
    if text.count("/") == 1 and all(text.split("/")):
        return from_hub(text, disable_sliding_window=disable_sliding_window)
    raise KVCalcError(f"unknown model {text!r}: use a preset ({', '.join(PRESETS)}), a config.json path "
                      "or a Hugging Face hub id like org/name")
