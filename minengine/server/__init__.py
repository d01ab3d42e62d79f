"""The OpenAI-compatible HTTP server (FastAPI + uvicorn + sse-starlette) and its Prometheus metrics.

``create_app`` builds the app; ``ServerThread`` runs it in the background (notebooks, tests);
``minengine serve`` runs it from the command line. Imported lazily: the server extra (fastapi,
uvicorn, sse-starlette, prometheus_client) is only needed when you use it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "create_app": "minengine.server.app",
    "ServerThread": "minengine.server.launcher",
    "ServerMetrics": "minengine.server.metrics",
    "OpenAIError": "minengine.server.serving_engine",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
