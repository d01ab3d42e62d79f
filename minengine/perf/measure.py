"""``measure_this_machine()``: the two roofline numbers of the device you are on, measured in ~1-3 s.

Datasheets say what a chip could do; a roofline of *this* machine needs what it does. Method:

- **Read bandwidth**: sum a tensor much larger than the last-level cache (256 MiB on CPU, 1 GiB on a
  GPU) and divide its size by the median time of a few repeats. A reduction reads every byte once and
  writes almost nothing, like a decode step streaming the weights. (STREAM's "copy" would count a read
  and a write per element; we want reads.)
- **Matmul FLOP/s**: a square matmul (fp32 1024 x 1024 on CPU, bf16 8192 x 8192 on a GPU), ``2 n^3``
  FLOPs over the median time. This is what a prefill's big GEMMs get; small or skinny matmuls get less.

Both are timed after a warm-up, with ``torch.cuda.synchronize()`` around GPU work (kernels run
asynchronously). The numbers depend on the chip and on ``torch.get_num_threads()`` on a CPU, so the cache key
includes both. Results are cached in memory (``functools.cache``) and, with ``persist=True``, in
``~/.cache/minengine/machine.json`` so that lessons show the same numbers from one run to the next
(absolute CPU timings drift 15-30 % over an hour on a shared machine; pass ``refresh=True`` to redo).

The result is an ``Accelerator`` like the datasheet rows, so the roofline and the simulator take it as
is: ``bf16_tflops`` holds the measured matmul rate in the dtype the engine computes in on that device
(fp32 on CPU).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minengine.perf.hardware import Accelerator

CACHE_FILE = Path("~/.cache/minengine/machine.json")


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's marketing name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``), with its x86
    family and model: a cloud VM often shows a bare "AMD EPYC", and two generations behind that name
    differ 2x in matmul peak (AMD family 25 is Zen 3/4, with 256-bit multiply-add units; 26 is Zen 5, with
    512-bit ones). ``cpuinfo``: that file's text (read here when not given)."""
    import platform

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the first processor's block is enough
            continue
        fields.setdefault(key.strip().lower(), value.strip())
    name = fields.get("model name")
    if not name:
        return platform.processor() or platform.machine() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def blas_line(config: str | None = None) -> str:
    """Which math libraries this torch calls, from ``torch.__config__.show()``: BLAS, its version, oneDNN,
    the SIMD level; e.g. "BLAS_INFO=mkl; Math Kernel Library Version 2024.2; ...". The same ``F.linear``
    gets different kernels from different libraries and CPUs, so a measured figure belongs to this line."""
    import re

    import torch

    text = torch.__config__.show() if config is None else config
    blas = re.search(r"BLAS_INFO=([\w-]+)", text)
    parts = [f"BLAS_INFO={blas[1]}" if blas else "BLAS_INFO not reported"]
    for pattern in (r"Math Kernel Library Version [\w.]+", r"OpenBLAS[^\n]*", r"MKL-DNN v[\w.]+",
                    r"CPU capability usage: \w+"):
        found = re.search(pattern, text)
        if found:
            parts.append(found[0].strip())
    return "; ".join(parts)


def measure_this_machine(device: Any = None, *, persist: bool = False, refresh: bool = False,
                         cache_file: str | Path | None = None) -> Accelerator:
    """Measured bandwidth and matmul peak of ``device`` (default: CUDA if available, else CPU)."""
    import torch

    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    # The chip is part of the key: a home folder outlives the machine under it (a hub's pods, a cloud VM
    # moved to another host: one "AMD EPYC" here was two generations 2x apart in matmul peak).
    chip = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name()
    key = f"{dev}|{chip}|threads={torch.get_num_threads()}|torch={torch.__version__}"
    path = Path(cache_file or CACHE_FILE).expanduser()
    if persist and not refresh:
        stored = _read_json(path).get(key)
        if stored:
            return Accelerator(**stored)
    if refresh:
        _measure.cache_clear()
    acc = _measure(key, str(dev))
    if persist:
        data = _read_json(path)
        data[key] = acc.__dict__
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
    return acc


@functools.cache
def _measure(key: str, device: str) -> Accelerator:
    import torch

    dev = torch.device(device)
    bandwidth = measure_read_bandwidth(dev)
    flops = measure_matmul_flops(dev)
    threads = torch.get_num_threads()
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        name, memory = f"{props.name} (measured)", int(props.total_memory)
        method = "bf16 8192^3 matmul, 1 GiB sum"
    else:
        name, memory = f"this machine: CPU, {threads} thread(s) (measured)", _cpu_memory_bytes()
        method = "fp32 1024^3 matmul, 256 MiB sum"
    return Accelerator(
        name=name, key=f"this-machine-{dev.type}", bf16_tflops=flops / 1e12, fp8_tflops=None,
        memory_bytes=memory, bandwidth_bytes_per_s=bandwidth,
        source=f"measured by minengine.perf.measure ({method}, median of repeats; {key})",
    )


def _timeit(fn: Callable[[], Any], sync: Callable[[], None], repeats: int, budget_s: float) -> float:
    """Median seconds of ``fn`` after one warm-up call, stopping early once ``budget_s`` is spent."""
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats and (len(times) < 3 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _sync_for(dev: Any) -> Callable[[], None]:
    import torch

    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


def measure_read_bandwidth(device: Any = "cpu", num_bytes: int | None = None, repeats: int = 7) -> float:
    """Bytes per second read by a full reduction over a tensor far larger than the caches."""
    import torch

    dev = torch.device(device)
    num_bytes = num_bytes or (2**30 if dev.type == "cuda" else 2**28)
    x = torch.ones(num_bytes // 4, dtype=torch.float32, device=dev)
    seconds = _timeit(lambda: x.sum(), _sync_for(dev), repeats, budget_s=1.0)
    return x.numel() * x.element_size() / seconds


def measure_matmul_flops(device: Any = "cpu", n: int | None = None, repeats: int = 7,
                         dtype: Any = None) -> float:
    """FLOP/s of an n x n matmul (2 n^3 FLOPs): by default fp32 on CPU, bf16 on a GPU (``dtype``, a
    torch.dtype, picks another: a CPU's bf16 peak can be far above or below its fp32 one). On a CPU in
    fp32, the faster of torch's matmul and oneDNN's."""
    import torch

    dev = torch.device(device)
    n = n or (8192 if dev.type == "cuda" else 1024)
    dtype = dtype or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    seconds = _timeit(lambda: a @ b, _sync_for(dev), repeats, budget_s=1.0)
    if dev.type == "cpu" and dtype == torch.float32 and _has_onednn_linear():
        # A peak is the machine's, not one library's: on an AMD EPYC MKL's fp32 matmul (what `a @ b`
        # calls) reached ~140 GFLOP/s with 2 threads where oneDNN's reached ~195 (the engine's Linear
        # layers use whichever is faster: models/linear_kernels.py)
        onednn = _timeit(lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""),
                         _sync_for(dev), repeats, budget_s=1.0)
        seconds = min(seconds, onednn)
    return 2 * n**3 / seconds


def _has_onednn_linear() -> bool:
    import torch

    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _cpu_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX
        return 0


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
