"""Lazy package exports: ``from minengine import LLM`` imports torch only when ``LLM`` is first used.

Several packages re-export names from their modules; importing every module up front would make light
commands (``minengine kv``, ``minengine --help``, the simulator) pay for torch, httpx or matplotlib.
Each such ``__init__`` calls ``lazy_exports`` once with a {public name: defining module} map.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, exports: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Module-level ``__getattr__`` and ``__dir__`` for ``package`` that load ``exports`` on first use.

    A loaded name is stored in ``namespace`` (the package's globals), so the import runs once.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
