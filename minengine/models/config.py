"""``ModelConfig``: the few numbers of an HF ``config.json`` that the decoder actually needs.

We read the plain JSON dict (not a ``transformers`` config class) so the engine, the roofline model and
the simulator can all describe a model without importing ``transformers``. Both the transformers 4.x
spelling (``rope_theta`` + ``rope_scaling``, ``torch_dtype``) and the 5.x spelling (``rope_parameters``,
``dtype``) are accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minengine.models.errors import (  # re-exported: `minengine.models.config` is where users look
    ModelLoadError,
    ModelNotFoundError,
    UnsupportedModelError,
    WeightMismatchError,
)
from minengine.perf.model_spec import KVCalcError, checkpoint_dtype, flatten_text_config, layer_windows

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "ModelConfig",
    "ModelLoadError",
    "ModelNotFoundError",
    "UnsupportedModelError",
    "WeightMismatchError",
]

SUPPORTED_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass
class ModelConfig:
    """Shape and options of a Llama-family decoder (names follow HF ``config.json``)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # None for plain RoPE, else {"rope_type": "linear"|"llama3", ...} with the type's parameters.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (Qwen2 always; Llama/Qwen3 per config)
    o_proj_bias: bool = False  # Llama/Qwen3 put `attention_bias` on o_proj too; Qwen2 never does
    mlp_bias: bool = False  # Llama's `mlp_bias`
    qk_norm: bool = False  # Qwen3: per-head RMSNorm on q and k before RoPE
    sliding_window: int | None = None  # tokens a query may see (itself included), None = unlimited
    # Per layer: "full_attention" or "sliding_attention" (Qwen2/3 only slide from `max_window_layers`).
    layer_types: tuple[str, ...] = field(default_factory=tuple)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    torch_dtype: str | None = None  # the checkpoint's dtype name, e.g. "bfloat16"
    model_type: str = ""

    def __post_init__(self) -> None:
        if not self.layer_types:
            kind = "sliding_attention" if self.sliding_window else "full_attention"
            self.layer_types = (kind,) * self.num_hidden_layers
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedModelError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    # ---- derived sizes (used by the KV-cache calculator and the roofline model) ----
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def layer_sliding_window(self, layer_idx: int) -> int | None:
        """The sliding window of one layer (None: the layer attends to the whole context)."""
        return self.sliding_window if self.layer_types[layer_idx] == "sliding_attention" else None

    @property
    def eos_token_ids(self) -> list[int]:
        """``eos_token_id`` as a list (HF allows an int, a list, or nothing)."""
        if self.eos_token_id is None:
            return []
        return [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id)

    # ---- construction ----
    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``<path>/config.json`` (``path`` may also be the JSON file itself)."""
        path = Path(path)
        file = path if path.is_file() else path / "config.json"
        if not file.is_file():
            raise ModelNotFoundError(f"no config.json in {path}: is this a Hugging Face model folder?")
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as e:
            raise UnsupportedModelError(f"{file} is not valid JSON: {e}") from None
        return cls.from_hf(data)

    @classmethod
    def from_hf(cls, hf: dict[str, Any] | Any) -> ModelConfig:
        """Build from an HF config dict or a ``transformers.PretrainedConfig``."""
        d = flatten_text_config(dict(hf) if isinstance(hf, dict) else hf.to_dict())
        arch = _architecture(d)
        if d.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"{arch}: hidden_act={d['hidden_act']!r} (only 'silu' is supported)")
        try:
            hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
            n_layers = int(d["num_hidden_layers"])
            base = dict(
                vocab_size=int(d["vocab_size"]),
                intermediate_size=int(d["intermediate_size"]),
            )
        except KeyError as e:
            raise UnsupportedModelError(f"{arch} config is missing the required field {e}") from None
        rope_theta, rope_scaling = _rope(d, arch)
        sliding_window, layer_types = _sliding(d, arch, n_layers)
        is_qwen2 = arch == "Qwen2ForCausalLM"
        attention_bias = is_qwen2 or bool(d.get("attention_bias", False))
        return cls(
            architecture=arch,
            hidden_size=hidden,
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or hidden // heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            o_proj_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(d.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            sliding_window=sliding_window,
            layer_types=layer_types,
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            torch_dtype=checkpoint_dtype(d),
            model_type=str(d.get("model_type", "")),
            **base,
        )


def _architecture(d: dict[str, Any]) -> str:
    archs = d.get("architectures") or []
    if not archs:
        # Configs saved without `architectures` still carry model_type (e.g. "qwen2").
        by_type = {"llama": 0, "mistral": 1, "qwen2": 2, "qwen3": 3}
        if d.get("model_type") in by_type:
            return SUPPORTED_ARCHITECTURES[by_type[d["model_type"]]]
        raise UnsupportedModelError(
            f"config has no 'architectures' (model_type={d.get('model_type')!r}); "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    arch = archs[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"architecture {arch!r} is not supported by minengine; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def _rope(d: dict[str, Any], arch: str) -> tuple[float, dict[str, Any] | None]:
    """Return (rope_theta, normalised rope_scaling or None) from either HF spelling."""
    params = d.get("rope_parameters") or {}
    if "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]  # per-layer-type form of transformers 5
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    scaling = d.get("rope_scaling") or params
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if rope_type == "default":
        return theta, None
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"{arch}: rope scaling type {rope_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    needed = ("factor",) if rope_type == "linear" else _LLAMA3_KEYS
    missing = [k for k in needed if k not in scaling]
    if missing:
        raise UnsupportedModelError(f"{arch}: rope_scaling of type {rope_type!r} lacks {missing}")
    out: dict[str, Any] = {"rope_type": rope_type}
    out.update({k: scaling[k] for k in needed})
    return theta, out


def _sliding(d: dict[str, Any], arch: str, n_layers: int) -> tuple[int | None, tuple[str, ...]]:
    """Which layers use a sliding window, and its size: ``perf.model_spec.layer_windows``, the one rule
    shared with the KV calculator and the roofline (HF masks keys with kv_pos <= q_pos - window)."""
    if "chunked_attention" in (d.get("layer_types") or ()):
        raise UnsupportedModelError(f"{arch}: chunked attention layers are not supported")
    try:
        windows = layer_windows(d, n_layers)
    except KVCalcError as e:
        raise UnsupportedModelError(f"{arch}: {e}") from None
    sizes = [w for w in windows if w is not None]
    if not sizes:
        return None, ("full_attention",) * n_layers
    return max(sizes), tuple("full_attention" if w is None else "sliding_attention" for w in windows)
