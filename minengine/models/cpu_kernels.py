"""The CPU's C++ kernels (``csrc/``), built on first use and optional.

- ``paged_attention.cpp``: decode attention. A decode reads each sequence's whole context from the KV
  cache. The reference path gathers that context into a fresh tensor and runs SDPA on the copy; the
  kernel reads every K and V row once, where it lies, through the block table (what vLLM's
  ``paged_attention`` op does on a GPU). At batch 64 with 250-350-token contexts on a 2-core AMD EPYC:
  43 ms per step of 12 layers instead of 111 (``benchmarks/attention_decode.py``).
- ``gemv.cpp``: a batch-1 linear layer that keeps every core streaming the weights.
- ``onednn_linear.cpp``: oneDNN's linear as an op a compiled graph can call (``linear_kernels.py``).
- ``rms_norm.cpp``: RMSNorm in one call, where ``F.rms_norm`` runs about seven small ops (``RMSNorm``).
- ``activation.cpp``: SwiGLU's ``silu(gate) * up`` in one pass (vLLM's ``silu_and_mul``; ``LlamaMLP``).
- ``rotary.cpp``: RoPE's rotation of q and k in place, in one pass (vLLM's ``rotary_embedding``;
  ``RotaryEmbedding``).

How they are built: ``python -m minengine.models.cpu_kernels`` (``make setup`` and Binder's ``postBuild``
run it) compiles the files with the machine's compiler through ``torch.utils.cpp_extension`` (~10-30 s
on 2 cores) into the Python environment (``<sys.prefix>/share/minengine/kernels/``, so every user of a
shared environment, such as a hub's students, loads the one build), or into ``~/.cache/minengine/kernels/``
when the environment is read-only (``MINENGINE_KERNELS_DIR`` names one folder instead). The build is tuned
to the CPU it runs on (``-march=native``), so its folder is named after a hash of that CPU's feature
flags, the Python environment, torch and the sources. Engines only *load* a finished build (``load``),
as ``torch.ops.minengine.*``; without one (no compiler, a changed source not rebuilt yet, a read-only
cache) they run the reference paths, quietly, and ``build_error`` says why. ``MINENGINE_CPU_KERNELS=0``
turns the kernels off.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
from pathlib import Path

import torch

from minengine.models import data_dirs

SOURCES = [Path(__file__).with_name("csrc") / name
           for name in ("paged_attention.cpp", "onednn_linear.cpp", "gemv.cpp", "rms_norm.cpp",
                        "activation.cpp", "rotary.cpp")]
ENV_SWITCH = "MINENGINE_CPU_KERNELS"
# one folder for builds, instead of the environment's, then ~/.cache (_roots)
ENV_DIR = "MINENGINE_KERNELS_DIR"
# linear_kernels' measurements, kept with the build they timed. "_v2": timed in interleaved rounds since
# 2026-12-02; the first file's entries, timed one kernel after another, are not read (some were skewed).
TIMINGS_FILE = "linear_timings_v2.json"
BUILD_HINT = "not built here: run `python -m minengine.models.cpu_kernels` (make setup does)"

_state: dict[str, object] = {}  # "ok": bool once tried; "error": why not; "seconds": the load's time


def _build_tag() -> str:
    """A short hash of what a build is only valid for: this CPU's instruction-set flags (-march=native),
    this Python environment and torch (their headers), the flags and the sources themselves. A changed
    source or a second virtual environment gets a build of its own instead of rebuilding over one."""
    cflags, ldflags = _flags()
    key = f"{platform.machine()} {sys.prefix} {torch.__version__} {cflags} {ldflags}"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                key += line
                break
    except OSError:
        pass
    digest = hashlib.sha1(key.encode())
    for source in SOURCES:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


def _flags() -> tuple[list[str], list[str]]:
    """Compile and link flags. -ffast-math at compile time only: it lets gcc vectorize the softmax's exp
    through glibc's libmvec (hence -lmvec), and linking with it would set flush-to-zero process-wide."""
    cflags = ["-O3", "-fopenmp"]
    ldflags: list[str] = []
    if sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64"):
        cflags += ["-march=native", "-ffast-math"]
        ldflags += ["-lmvec"]
    return cflags, ldflags


def _roots() -> list[Path]:
    """Where builds live, in the order they are looked for (``data_dirs``): ``MINENGINE_KERNELS_DIR``
    alone when it is set; else the Python environment's own folder (a hub's students load the build its
    administrator's ``make setup`` made), then the user's cache (for an environment they cannot write to)."""
    return data_dirs.roots("kernels", ENV_DIR)


def _paths(for_build: bool = False) -> tuple[str, Path]:
    """The build's name and folder: the first root that holds a finished build (to load), or the first
    one this process can write to (to build; the last root if none)."""
    name = f"minengine_cpu_kernels_{_build_tag()}"
    roots = _roots()
    if not for_build and (found := data_dirs.find(name, roots, lambda f: (f / "BUILT").is_file())):
        return name, found
    root = next((r for r in roots if data_dirs.writable(r)), roots[-1]) if for_build else roots[-1]
    return name, root / name


def build(verbose: bool = False) -> bool:
    """Compile the kernels now (tens of seconds on 2 cores) and register them; ``make setup`` runs this.
    The build is marked complete only once it has finished, so an interrupted one is never loaded."""
    start = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load as compile_and_load

        name, folder = _paths(for_build=True)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "BUILT").unlink(missing_ok=True)
        (folder / TIMINGS_FILE).unlink(missing_ok=True)  # a new build is timed afresh
        cflags, ldflags = _flags()
        compile_and_load(name=name, sources=[str(p) for p in SOURCES], extra_cflags=cflags,
                         extra_ldflags=ldflags, build_directory=str(folder), is_python_module=False,
                         verbose=verbose)
        (folder / "BUILT").write_text(f"{name}.so\n")
        _register_fake()
        _state.update(ok=True, error=None)
    except Exception as e:  # no compiler, no ninja, no headers, no writable cache
        _state.update(ok=False,
                      error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e) else ''}")
    _state["seconds"] = time.perf_counter() - start
    return bool(_state["ok"])


def load() -> bool:
    """Register the kernels if this machine has built them (``build``); True if they run. Once per process.

    Never compiles: a build inside an engine's start-up would take tens of seconds in whichever notebook
    cell started the first engine (past nbgrader's per-cell limit, which then kills it half-built). And
    quietly: a warning would put stderr into that cell, which zeroes a graded one. ``describe()``
    (printed by ``minengine serve``, the benchmarks and ``make setup``) says why they are not in use;
    asking for ``attention_backend="cpp"`` raises with it."""
    if "ok" in _state:
        return bool(_state["ok"])
    if os.environ.get(ENV_SWITCH, "1") == "0":
        _state.update(ok=False, error=f"turned off ({ENV_SWITCH}=0)")
        return False
    start = time.perf_counter()
    try:
        name, folder = _paths()
        if not (folder / "BUILT").is_file():
            _state.update(ok=False, error=BUILD_HINT)
        else:
            torch.ops.load_library(str(folder / f"{name}.so"))
            _register_fake()
            _state.update(ok=True, error=None)
    except Exception as e:  # a build for another torch, a deleted file
        _state.update(ok=False, error=f"{type(e).__name__}: {e}")
    _state["seconds"] = time.perf_counter() - start
    return bool(_state["ok"])


def build_folder() -> Path | None:
    """The folder of the build in use (None when the kernels are not loaded): per-machine facts that go
    with the build, such as the Linear layers' timings (``linear_kernels``), are kept there too."""
    return _paths()[1] if load() else None


def build_error() -> str | None:
    """Why the kernels are not in use (None when they are, or were never tried)."""
    return _state.get("error")  # type: ignore[return-value]


def describe() -> str:
    """One line for a benchmark's or server's start-up: which decode attention runs on the CPU."""
    if not _state:
        return "decode attention: not chosen yet"
    if _state["ok"]:
        return f"decode attention: C++ paged kernel ({_state['seconds']:.1f} s to load)"
    return f"decode attention: reference gather + SDPA ({_state['error']})"


def _register_fake() -> None:
    """Shapes for torch.compile's tracing (the compiled decode graph calls the ops as opaque kernels)."""
    if getattr(_register_fake, "done", False):
        return

    @torch.library.register_fake("minengine::paged_decode_attention")
    def _(q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window=0):  # noqa: ANN001, ANN202
        return torch.empty_like(q)

    @torch.library.register_fake("minengine::onednn_linear")
    def _linear(x, weight, bias):  # noqa: ANN001, ANN202
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.register_fake("minengine::gemv")
    def _gemv(x, weight, bias):  # noqa: ANN001, ANN202
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.register_fake("minengine::rms_norm")
    def _rms_norm(x, weight, eps):  # noqa: ANN001, ANN202
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake("minengine::silu_and_mul")
    def _silu_and_mul(x):  # noqa: ANN001, ANN202
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))

    _register_fake.done = True  # type: ignore[attr-defined]


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           sliding_window: int | None = None) -> torch.Tensor:
    """q [B, H_q, D] fp32 against each row's first seq_lens[b] cached tokens -> [B, H_q, D] (see module
    doc)."""
    if not _state.get("ok") and not load():
        raise RuntimeError(f"the C++ decode-attention kernel is not available ({build_error()})")
    return torch.ops.minengine.paged_decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window or 0)


if __name__ == "__main__":  # `python -m minengine.models.cpu_kernels`: build now (make setup runs this)
    if not load():
        build(verbose="-v" in sys.argv)
    print(describe() + (f"; build in {build_folder()}" if _state.get("ok") else ""))
    sys.exit(0)  # a failed build is not an error: the reference path runs
