"""The OpenAI-compatible HTTP server (FastAPI + uvicorn + sse-starlette) and its Prometheus metrics.

``create_app`` builds the app; ``ServerThread`` runs it in the background (notebooks, tests);
``minengine serve`` runs it from the command line. Imported lazily: the server extra (fastapi,
uvicorn, sse-starlette, prometheus_client) is only needed when you use it.
"""

from __future__ import annotations

from minengine._lazy import lazy_exports

_EXPORTS = {
    "create_app": "minengine.server.app",
    "ServerThread": "minengine.server.launcher",
    "ServerMetrics": "minengine.server.metrics",
    "OpenAIError": "minengine.server.serving_engine",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
