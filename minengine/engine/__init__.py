"""The PyTorch side of the engine: model runner (executor), sampler, KV tensors, LLMEngine, LLM, AsyncLLM.

The scheduler, requests and step loop they drive live in the torch-free ``minengine.core``. Names load
lazily, so ``import minengine.engine`` alone does not pull in torch.
"""

from __future__ import annotations

from minengine._lazy import lazy_exports

# public name -> module that defines it
_EXPORTS = {
    "LLM": "minengine.engine.llm",
    "LLMEngine": "minengine.engine.llm_engine",
    "AsyncLLM": "minengine.engine.async_llm",
    "ModelRunner": "minengine.engine.model_runner",
    "Sampler": "minengine.engine.sampler",
    "RequestOutput": "minengine.engine.outputs",
    "CompletionOutput": "minengine.engine.outputs",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
