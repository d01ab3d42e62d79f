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

# THE dtype table: bits per stored element, and the names people (and config.json files) use for each.
# "auto" means "the model's dtype", as in vLLM's --kv-cache-dtype auto. The engine's byte counts, the
# loader's accepted names and the roofline all read these two dicts.
DTYPE_BITS: dict[str, int] = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "fp64": 64}
DTYPE_ALIASES: dict[str, str] = {
    "float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "float8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8",
    "e5m2": "fp8", "float64": "fp64", "double": "fp64",
}
_DTYPE_ALIASES = DTYPE_ALIASES  # the old private name
KV_CACHE_DTYPES = ("auto", "fp32", "bf16", "fp16", "fp8", "int8", "int4")  # what a KV cache may be stored in


class KVCalcError(ValueError):
    """A bad model, dtype or size: the message is meant to be shown to a person as is."""


def normalise_dtype(dtype: Any) -> str:
    """The table's short name ("bf16") of any accepted spelling ("bfloat16", "torch.bfloat16", a
    torch.dtype)."""
    key = str(dtype).strip().lower().removeprefix("torch.")
    key = DTYPE_ALIASES.get(key, key)
    if key != "auto" and key not in DTYPE_BITS:
        raise KVCalcError(f"unknown dtype {dtype!r}; choose one of {', '.join(KV_CACHE_DTYPES)}")
    return key


def dtype_bits(dtype: Any) -> int:
    """Bits per element of a dtype name (any spelling ``normalise_dtype`` accepts; not "auto")."""
    key = normalise_dtype(dtype)
    if key == "auto":
        raise KVCalcError("dtype 'auto' has no size of its own: it means the model's dtype")
    return DTYPE_BITS[key]


def dtype_names(canonical: str) -> list[str]:
    """Every accepted spelling of one table dtype: its short name first, then its aliases."""
    return [canonical, *(alias for alias, name in DTYPE_ALIASES.items() if name == canonical)]


def dtype_of_bits(bits: float) -> str:
    """The first table dtype of that many bits (32 -> fp32, 16 -> bf16, 8 -> fp8, 4 -> int4)."""
    for name, size in DTYPE_BITS.items():
        if size == bits:
            return name
    raise KVCalcError(f"no dtype has {bits:g} bits per element")


def checkpoint_dtype(cfg: dict[str, Any]) -> str | None:
    """The checkpoint's dtype as config.json spells it (``torch_dtype``, or transformers 5's ``dtype``)."""
    value = cfg.get("torch_dtype") or cfg.get("dtype")
    return None if value is None else str(value).removeprefix("torch.")


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

    def kv_elements_per_token_per_layer(self, num_kv_heads: int | None = None) -> int:
        """Elements one token caches in one layer: K and V of each KV head (all, or ``num_kv_heads`` of
        them on one tensor-parallel rank), or for MLA the one latent that all heads share."""
        if self.is_mla:
            return self.head_dim
        return 2 * (self.num_kv_heads if num_kv_heads is None else num_kv_heads) * self.head_dim

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
            text += (f"; {self.num_sliding_layers}/{self.num_layers} layers slide over {self.sliding_window} "
                     "tokens")
        return text


# ---------------------------------------------------------------------------------------------- parsing
def flatten_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs (Gemma 3, Llava, ...) keep the language model under ``text_config``."""
    if "text_config" in config and "num_hidden_layers" not in config:
        outer = {k: v for k, v in config.items() if k not in ("text_config", "vision_config")}
        return {**outer, **config["text_config"]}
    return dict(config)


_flatten = flatten_text_config


def _has_sliding_switch(cfg: dict[str, Any]) -> bool:
    """Qwen2/Qwen3 configs carry a ``sliding_window`` that is off unless ``use_sliding_window`` is true."""
    archs = cfg.get("architectures") or []
    qwen = str(cfg.get("model_type", "")).startswith("qwen") or any(str(a).startswith("Qwen") for a in archs)
    return qwen or "use_sliding_window" in cfg


def layer_windows(cfg: dict[str, Any], n_layers: int, disable_sliding_window: bool = False
                  ) -> tuple[int | None, ...]:
    """Which layers use a sliding window and how wide, following each family's transformers code.

    The one rule for the KV calculator, the roofline and ``ModelConfig`` (per layer: None = full
    attention, else the window in tokens; HF masks keys with kv_pos <= q_pos - window).
    """
    window = cfg.get("sliding_window")
    if disable_sliding_window:  # vLLM's --disable-sliding-window: cache every token in every layer
        return (None,) * n_layers
    switch = _has_sliding_switch(cfg)
    if switch and not cfg.get("use_sliding_window", False):
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
    if switch:  # Qwen2/Qwen3 with use_sliding_window: only layers >= max_window_layers slide
        first = int(cfg.get("max_window_layers", 0))
        return tuple(window if i >= first else None for i in range(n_layers))
    model_type = cfg.get("model_type", "")
    if model_type == "gemma2":  # even layers local, odd layers global
        return tuple(window if i % 2 == 0 else None for i in range(n_layers))
    if model_type in ("gemma3", "gemma3_text"):  # pattern-1 local layers, then one global
        pattern = int(cfg.get("sliding_window_pattern", 6))
        return tuple(window if (i + 1) % pattern else None for i in range(n_layers))
    return (window,) * n_layers  # Mistral-7B-v0.1, Phi-3: every layer slides


def _known_dtype(name: str | None) -> str | None:
    try:
        return normalise_dtype(name) if name else None
    except KVCalcError:
        return None


def model_dtype_of(cfg: dict[str, Any]) -> str:
    """The dtype servers compute in: torch_dtype, with fp32 checkpoints served in 16 bits (vLLM's auto)."""
    dtype = _known_dtype(checkpoint_dtype(cfg))
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


def read_config_json(path: str | Path) -> tuple[dict[str, Any], str]:
    """A config.json (the file, or the folder holding it) as a dict, and the name its folder gives."""
    path = Path(path).expanduser()
    path = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise KVCalcError(f"cannot read {path}: {exc}") from exc
    if not isinstance(config, dict):
        raise KVCalcError(f"cannot read {path}: it holds a JSON {type(config).__name__}, not a config object")
    return config, (path.parent.name if path.name == "config.json" else path.stem)


def from_hf_config(config: dict[str, Any] | str | Path, *, name: str | None = None,
                   num_params: int | None = None, hf_id: str | None = None,
                   disable_sliding_window: bool = False) -> KVSpec:
    """Build a KVSpec from a Hugging Face config.json (a dict or a path to the file or its folder)."""
    if not isinstance(config, dict):
        config, folder_name = read_config_json(config)
        name = name or folder_name
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
        layer_windows=layer_windows(cfg, n_layers, disable_sliding_window),
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
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


def hub_config_path(repo_id: str, revision: str | None = None) -> str:
    """The local path of ``repo_id``'s config.json, fetched from the Hub if not cached (never weights)."""
    try:
        import huggingface_hub
    except ImportError as exc:
        raise KVCalcError("huggingface_hub is not installed: use a preset or a local config.json") from exc
    try:
        path = huggingface_hub.hf_hub_download(repo_id, "config.json", revision=revision,
                                               local_files_only=True)
    except Exception:  # not cached: go online below
        try:
            if not _hub_reachable():
                raise OSError("the Hugging Face Hub is not reachable")
            path = huggingface_hub.hf_hub_download(repo_id, "config.json", revision=revision)
        except Exception as exc:  # offline, gated, missing repo: all end the same way for the user
            reason = " ".join(str(exc).split())[:200]  # hub errors can span lines; the CLI prints one
            raise KVCalcError(f"could not fetch config.json for {repo_id!r} from the Hugging Face Hub "
                              f"({reason}; offline?). Use a preset ({', '.join(PRESETS)}) or a path to a "
                              "config.json"
                              ) from exc
    return path


def from_hub(repo_id: str, *, revision: str | None = None, disable_sliding_window: bool = False) -> KVSpec:
    """Fetch only config.json from the Hugging Face Hub (never weights); offline gives a clear error.

    The local HF cache is tried first, so a model downloaded before works offline.
    """
    return from_hf_config(hub_config_path(repo_id, revision), name=repo_id, hf_id=repo_id,
                          disable_sliding_window=disable_sliding_window)
