"""minengine: a small, readable, instrumented LLM inference engine for learning how serving works.

Public names are imported lazily so that light commands (``minengine kv``) start without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "LLM": "minengine.llm",
    "AsyncLLM": "minengine.engine.async_llm",
    "SamplingParams": "minengine.engine.sequence",
    "EngineConfig": "minengine.config",
    "load_model": "minengine.models.loader",
    "load_tokenizer": "minengine.models.loader",
    "resolve_model_path": "minengine.models.loader",
    "DEFAULT_MODEL": "minengine.models.loader",
    "ModelConfig": "minengine.models.config",
    "ModelLoadError": "minengine.models.errors",
    "estimate": "minengine.kvcalc",
    "KVEstimate": "minengine.kvcalc",
    "KVSpec": "minengine.kvcalc",
    "KVCalcError": "minengine.kvcalc",
    "load_model_spec": "minengine.kvcalc",
    "kv_bytes_per_token": "minengine.kvcalc",
    "kv_bytes_per_sequence": "minengine.kvcalc",
    "kv_bytes_per_batch": "minengine.kvcalc",
    "Accelerator": "minengine.perf.hardware",
    "get_accelerator": "minengine.perf.hardware",
    "KVCalculatorWidget": "minengine.widgets",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'minengine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
