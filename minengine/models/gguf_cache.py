"""The HF folders converted from GGUF files (``gguf.py``), kept so that only a file's first load converts it.

One folder per GGUF file, named ``<file stem>-<size>-<mtime_ns>-v<CACHE_VERSION>`` (a changed file or a
new converter version gets a new one), looked for where ``data_dirs`` says: the Python environment's
``share/minengine/gguf/`` first, then ``${XDG_CACHE_HOME:-~/.cache}/minengine/gguf/``
(``MINENGINE_GGUF_DIR`` names one folder instead). A load that finds none converts into the user's cache.

The environment's folder is filled on purpose, once: ``python -m minengine.models.gguf_cache`` converts
the packaged models there (``make setup`` and Binder's ``postBuild`` run it). On a JupyterHub, thirty
students then read the administrator's one copy of SmolLM2-135M (~540 MB of fp32 safetensors) instead
of each spending ~10 s and 540 MB of their home on their own.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from minengine.models import data_dirs
from minengine.models.errors import ModelLoadError
from minengine.models.packaged import PACKAGED_MODELS, ModelPackageMissingError, packaged_model_file

CACHE_VERSION = 1  # bump when the folder written by gguf.write_hf_folder changes, so old ones are not reused
ENV_DIR = "MINENGINE_GGUF_DIR"  # one folder for converted models, instead of the environment's, then ~/.cache


def roots() -> list[Path]:
    """Where converted folders are looked for, in order (read at call time)."""
    return data_dirs.roots("gguf", ENV_DIR)


def folder_name(path: str | os.PathLike[str]) -> str:
    """The converted folder's name for ``path``: its stem, size and mtime, and the converter's version."""
    file = Path(path).expanduser().resolve()
    st = file.stat()
    return f"{file.stem}-{st.st_size}-{st.st_mtime_ns}-v{CACHE_VERSION}"


def _finished(folder: Path) -> bool:
    return (folder / "config.json").is_file()  # written last; a half-converted folder is never renamed in


def cache_folder(path: str | os.PathLike[str]) -> Path:
    """Where the HF folder converted from ``path`` is: the first place that holds one, else where a load
    will write it (the user's cache)."""
    name, places = folder_name(path), roots()
    return data_dirs.find(name, places, _finished) or places[-1] / name


def gguf_model_folder(path: str | os.PathLike[str], *, for_everyone: bool = False) -> Path:
    """The converted HF folder of a GGUF file, converting it first if no place holds one yet.

    ``for_everyone`` converts into the environment's folder (the first place) for every user of this
    Python environment; it must be writable. The conversion goes to a temporary folder that is renamed
    into place, so an interrupted or concurrent one never leaves a half-written folder behind.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise ModelLoadError(f"no GGUF file at {file}")
    name, places = folder_name(file), roots()
    if not for_everyone and (found := data_dirs.find(name, places, _finished)):
        return found
    final = (places[0] if for_everyone else places[-1]) / name
    if _finished(final):
        return final
    if not data_dirs.writable(final.parent):
        raise ModelLoadError(f"cannot write the converted model to {final.parent}: run this as the owner of "
                             f"the Python environment ({sys.prefix}), or set {ENV_DIR} to a folder you own")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the folder is an ordinary, world-readable one
    try:
        from minengine.models.gguf import write_hf_folder

        write_hf_folder(file, tmp)
        try:
            tmp.rename(final)
        except OSError:  # another process finished first (or a stale folder without config.json)
            if not _finished(final):
                shutil.rmtree(final, ignore_errors=True)
                tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> int:
    """Convert the packaged models (or the ones named) into the environment's folder, for every user."""
    names = (sys.argv[1:] if argv is None else argv) or list(PACKAGED_MODELS)
    if unknown := [n for n in names if n not in PACKAGED_MODELS]:
        print(f"not a packaged model: {', '.join(unknown)} (packaged: {', '.join(PACKAGED_MODELS)})")
        return 2
    for name in names:
        try:
            file = packaged_model_file(name)
        except ModelPackageMissingError as e:  # make installs it; a bare pip install may not have
            print(f"{name}: not converted ({str(e).strip().splitlines()[0]})")
            continue
        if not data_dirs.writable(roots()[0]):
            print(f"{name}: {roots()[0]} is read-only here; each user converts it on first load, into their "
                  "cache")
            continue
        start, done = time.perf_counter(), _finished(roots()[0] / folder_name(file))
        try:
            folder = gguf_model_folder(file, for_everyone=True)
        except ModelLoadError as e:
            print(f"{name}: not converted ({e})")
            return 1
        how = "already converted" if done else f"converted in {time.perf_counter() - start:.1f} s"
        print(f"{name}: model folder for every user of this environment: {folder} ({how})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
