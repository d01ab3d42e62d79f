"""The one place that turns whatever a user passes as "the model" into a ``KVSpec`` (and its raw config).

``kvcalc`` (through ``load_model_spec``), ``ModelShape`` / ``CostModel.create`` and the engine's KV sizing
all call ``resolve_model``, so a preset name, an HF config dict, a config.json path or folder, a hub id, a
``KVSpec``, a ``minengine.models.ModelConfig`` or a ``transformers`` config mean the same model everywhere.
Torch-free, and it never imports ``minengine.models`` (a ``ModelConfig`` is recognised by its fields).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from minengine.perf.model_presets import PRESETS
from minengine.perf.model_spec import (
    KVCalcError,
    KVSpec,
    _preset_key,
    estimate_num_params,
    from_hf_config,
    hub_config_path,
    normalise_dtype,
    read_config_json,
)

ACCEPTED = ("a KVSpec, a Hugging Face config dict, a path to a config.json or its folder, a preset name "
            f"({', '.join(PRESETS)}), a hub id like org/name, or a minengine ModelConfig")


def is_model_config(obj: Any) -> bool:
    """Duck-typed ``minengine.models.ModelConfig`` (this module must not import torch-side code)."""
    return all(hasattr(obj, a) for a in ("num_hidden_layers", "num_key_value_heads", "head_dim",
                                         "intermediate_size", "layer_sliding_window"))


def model_config_dict(c: Any) -> dict[str, Any]:
    """The HF config fields of a ``ModelConfig`` that sizes and parameter counts depend on."""
    return {
        "model_type": c.model_type or "llama", "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size, "vocab_size": c.vocab_size,
        "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
        "tie_word_embeddings": c.tie_word_embeddings, "attention_bias": c.attention_bias,
        "max_position_embeddings": c.max_position_embeddings, "torch_dtype": c.torch_dtype,
    }


def spec_from_model_config(c: Any, disable_sliding_window: bool = False) -> KVSpec:
    """A ``ModelConfig`` as a KVSpec. Its dtype is the checkpoint's (fp32 stays fp32: minengine runs a
    model in the dtype it was saved in, unlike a server's 16-bit "auto"); anything else counts as bf16."""
    n = c.num_hidden_layers
    windows = (None,) * n if disable_sliding_window else tuple(c.layer_sliding_window(i) for i in range(n))
    try:
        dtype = normalise_dtype(c.torch_dtype) if c.torch_dtype else "bf16"
    except KVCalcError:
        dtype = "bf16"
    dtype = dtype if dtype in ("fp32", "fp16") else "bf16"
    return KVSpec(name=c.model_type or "model", num_layers=n, num_attention_heads=c.num_attention_heads,
                  num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, layer_windows=windows,
                  max_position_embeddings=c.max_position_embeddings,
                  num_params=estimate_num_params(model_config_dict(c)), dtype=dtype, weight_dtype=dtype)


def resolve_model(model: Any, *, disable_sliding_window: bool = False) -> tuple[KVSpec, dict[str, Any]]:
    """(KVSpec, raw HF config) for any accepted description of a model (``ACCEPTED``).

    The raw config is what the spec was parsed from (``{}`` for a bare KVSpec): the roofline reads the
    hidden size, vocabulary and experts from it. Anything else raises a ``KVCalcError`` (a ValueError).
    """
    dsw = disable_sliding_window
    if isinstance(model, KVSpec):
        return model, {}
    if isinstance(model, dict):
        return from_hf_config(model, disable_sliding_window=dsw), model
    if not isinstance(model, (str, os.PathLike)) and is_model_config(getattr(model, "config", None)):
        model = model.config  # a loaded minengine model
    if is_model_config(model):
        return spec_from_model_config(model, dsw), model_config_dict(model)
    if not isinstance(model, (str, os.PathLike)) and callable(getattr(model, "to_dict", None)):
        raw = model.to_dict()  # a transformers PretrainedConfig
        if isinstance(raw, dict):
            return from_hf_config(raw, disable_sliding_window=dsw), raw
    if not isinstance(model, (str, os.PathLike)):
        raise KVCalcError(f"cannot describe a model from a {type(model).__name__} ({model!r:.60}); "
                          f"pass {ACCEPTED}")
    text = str(model)
    key = _preset_key(text)
    if key is not None:
        preset = PRESETS[key]
        spec = from_hf_config(preset["config"], name=key, num_params=preset["num_params"],
                              hf_id=preset["hf_id"], disable_sliding_window=dsw)
        return spec, preset["config"]
    path = Path(text).expanduser()
    if path.exists():
        raw, name = read_config_json(path)
        return from_hf_config(raw, name=name, disable_sliding_window=dsw), raw
    if text.endswith(".json") or text.startswith((".", "/", "~")):
        raise KVCalcError(f"no such config file: {text}")
    if text.count("/") == 1 and all(text.split("/")):
        raw, _ = read_config_json(hub_config_path(text))
        return from_hf_config(raw, name=text, hf_id=text, disable_sliding_window=dsw), raw
    raise KVCalcError(f"unknown model {text!r}: use a preset ({', '.join(PRESETS)}), a config.json path "
                      "or a Hugging Face hub id like org/name")


def load_model_spec(model: Any, *, disable_sliding_window: bool = False) -> KVSpec:
    """Accept a KVSpec, a config dict, a preset key, a preset's hub id, a config.json path or folder, a hub
    id, or a ``ModelConfig``; anything else raises a ``KVCalcError`` saying what is accepted."""
    return resolve_model(model, disable_sliding_window=disable_sliding_window)[0]
