"""minengine: a small, readable, instrumented LLM inference engine for learning how serving works.

Public names are imported lazily so that light commands (``minengine kv``) start without torch.
"""

from __future__ import annotations

from minengine._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "LLM": "minengine.engine.llm",
    "AsyncLLM": "minengine.engine.async_llm",
    "LLMEngine": "minengine.engine.llm_engine",
    "SamplingParams": "minengine.core.sampling_params",
    "RequestOutputKind": "minengine.core.sampling_params",
    "EngineConfig": "minengine.config",
    "EngineCore": "minengine.core.engine_core",
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
    "KVCalculatorWidget": "minengine.course.widgets",
}

__all__ = ["__version__", *_EXPORTS]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
