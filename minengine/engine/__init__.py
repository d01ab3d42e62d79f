"""The engine: requests, KV blocks, the scheduler and its policies, the step loop, offline and async APIs.

Names load lazily, so ``from minengine.engine.scheduler import Scheduler`` (the simulator's import)
does not pull in torch; ``from minengine.engine import LLMEngine`` does.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module that defines it
_EXPORTS = {
    "LLM": "minengine.llm",
    "LLMEngine": "minengine.engine.llm_engine",
    "AsyncLLM": "minengine.engine.async_llm",
    "EngineConfig": "minengine.config",
    "SamplingParams": "minengine.engine.sequence",
    "Request": "minengine.engine.sequence",
    "RequestStatus": "minengine.engine.sequence",
    "RequestOutput": "minengine.engine.outputs",
    "CompletionOutput": "minengine.engine.outputs",
    "Scheduler": "minengine.engine.scheduler",
    "SchedulerOutput": "minengine.engine.scheduler",
    "SchedulingPolicy": "minengine.engine.scheduler",
    "DecodeFirstPolicy": "minengine.engine.scheduler",
    "PrefillFirstPolicy": "minengine.engine.scheduler",
    "BlockManager": "minengine.engine.block_manager",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
