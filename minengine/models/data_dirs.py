"""Where minengine keeps what it makes once and reads often: compiled CPU kernels, converted GGUF models.

Two places, looked in in this order:

1. the Python environment's own folder, ``<sys.prefix>/share/minengine/<kind>/``. Everyone who runs
   that environment reads what is there: on a JupyterHub, the administrator's ``make setup`` fills it
   once and thirty students load the same files instead of each making a copy in their home;
2. the user's cache, ``${XDG_CACHE_HOME:-~/.cache}/minengine/<kind>/``, for what a user makes in an
   environment they cannot write to.

An environment variable (``MINENGINE_KERNELS_DIR``, ``MINENGINE_GGUF_DIR``) names one folder instead,
and then nothing else is looked at: tests and unusual set-ups use it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path


def roots(kind: str, env_var: str) -> list[Path]:
    """The folders for ``kind`` ("kernels", "gguf"), in the order they are looked in; read at call time."""
    if os.environ.get(env_var):
        return [Path(os.environ[env_var]).expanduser()]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [Path(sys.prefix) / "share" / "minengine" / kind, Path(cache).expanduser() / "minengine" / kind]


def writable(folder: Path) -> bool:
    """Could this process create files in ``folder`` (its nearest existing ancestor, if not there yet)?"""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return os.access(folder, os.W_OK | os.X_OK)


def find(name: str, places: list[Path], finished: Callable[[Path], bool]) -> Path | None:
    """``root / name`` for the first root that holds a finished ``name`` (``finished`` says), or None."""
    return next((root / name for root in places if finished(root / name)), None)
