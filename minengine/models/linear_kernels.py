"""Which kernel the model's Linear layers call on a CPU in fp32: F.linear (MKL), oneDNN, or our GEMV.

Why it matters: ``F.linear`` on a CPU calls MKL's sgemm, which is fast on Intel CPUs. On an AMD EPYC
(2 cores, 2026-12-01) it was 2.2x slower than oneDNN's at one row: MKL's matrix-vector product stayed on
one core and read the weights at ~12 GB/s of the ~29 GB/s the bus gives, so a batch-1 decode step could
not get near its bandwidth floor. It was 2.2x slower at 64 rows too (71 vs 158 GFLOP/s), and 1.6x at
256-512 (``benchmarks/RESULTS.md``). PyTorch ships both libraries: oneDNN's linear
(``torch.ops.mkldnn._linear_pointwise``, the op inductor's CPU backend emits) takes the same dense
weight, so switching costs no memory and keeps every parameter where it was. At one row our own GEMV
(``csrc/gemv.cpp``: one output row per step, each thread streaming its share of W) read ~1.18x faster
than oneDNN on a decode step's matrices.

Prepacked weights: oneDNN multiplies in a blocked layout of the weight, and given the ordinary [out, in]
matrix it rearranges it on every call. ``pack_weight`` does that once; the engine keeps the copy beside
the ordinary weight (``EngineConfig.prepack_weights``) and the many-row calls read it: 1.18-1.42x faster at
a batched decode's 8-64 rows, 1.17x on the 64-request benchmark, for a second copy of the weights.

``choose`` times the candidates on a matrix of the model's largest weight shape when the engine starts,
at one row (a batch-1 decode) and at 128 (prefill, batched decode), and replaces F.linear in a regime only
where another kernel is ``MARGIN`` faster, so a CPU where they tie keeps torch's default. ``apply`` makes
every ``nn.Linear`` a ``KernelLinear``: the same module, whose forward picks the kernel by row count.

The timings are kept with the kernels' build (``cpu_kernels.TIMINGS_FILE``, per shape and thread count),
so they are measured once per machine, not in every process: at a real model's shape they took 1-2 s of
each server's and notebook's start-up on 2 cores, and every engine on the machine makes the same choice.
A user who cannot write beside the build (a hub's students, whose build the administrator made) keeps
the shapes they time in their own cache, under the build's folder name.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

KERNELS = ("torch", "onednn")  # what EngineConfig.linear_kernel may ask for (both regimes)
ONE_ROW_KERNELS = ("torch", "onednn", "gemv")  # gemv: csrc/gemv.cpp, one row only
MARGIN = 1.15  # a kernel must be this much faster than F.linear to replace it
MANY_ROWS = 128  # the prefill-sized measurement
# Rows oneDNN is told to expect when it reorders (prepacks) a weight. The layout it picks serves every row
# count: on a decode step's matrices (12 llama-100m layers + LM head, 2 threads, AMD EPYC family 26) a
# weight packed for 64 rows ran 8 to 512 rows within 4 % of one packed for that exact count
# (``benchmarks/linear_layers.py``, benchmarks/RESULTS.md §2); one copy per weight, not one per batch size.
PACK_ROWS = 64


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x @ weight.T + bias through oneDNN (fp32 CPU tensors; the weight in its ordinary layout, or
    the opaque one ``pack_weight`` made)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A copy of ``weight`` in the blocked layout oneDNN's GEMM reads (an opaque mkldnn tensor).

    Why: called with an ordinary [out, in] matrix, oneDNN first copies it into that layout, on every call.
    At a batched decode's 8-64 rows that copy is a large part of the work: a decode step's matrices ran
    1.18-1.42x faster prepacked, a 512-token prefill's 1.04x (``benchmarks/linear_layers.py``). The price is a
    second copy of every weight: the ordinary one stays for the GEMV, the embedding and the state dict.
    """
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def _gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.minengine.gemv(x, weight, bias)


def _compiled_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # inductor cannot lower the mkldnn op with a dense weight: the same kernel behind an opaque op of ours
    return torch.ops.minengine.onednn_linear(x, weight, bias)


class KernelLinear(nn.Linear):
    """``nn.Linear`` whose forward calls the kernels ``apply`` chose: ``one_row`` for a single row (a
    batch-1 decode), ``many_rows`` otherwise. Parameters and state dict are nn.Linear's. Training falls
    back to ``F.linear``: the other kernels have no backward."""

    one_row: str = "torch"
    many_rows: str = "torch"
    # oneDNN's own copy of ``weight`` (``pack_weight``), used for many rows while it is current: made from
    # this very tensor, at this version (an in-place change, e.g. load_state_dict, bumps it)
    packed: torch.Tensor | None = None
    _packed_from: tuple[torch.Tensor, int] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)
        return self.run(x, self.weight, self.bias)

    def run(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x times ``weight`` (this layer's matrix, or some of its rows) with the kernel chosen for x's
        rows."""
        kernel = self.one_row if x.shape[0] == 1 else self.many_rows
        if kernel == "torch":
            return F.linear(x, weight, bias)
        if kernel == "gemv" and x.dim() == 2:
            return _gemv(x, weight, bias)
        if torch.compiler.is_compiling():  # the compiled graph takes the ordinary weight only
            return _compiled_onednn(x, weight, bias)
        return onednn_linear(x, self._current_pack(weight), bias)

    def pack(self) -> None:
        """Keep oneDNN's prepacked copy of this layer's weight (``pack_weight``) for many-row calls."""
        self.packed = pack_weight(self.weight)
        self._packed_from = (self.weight, _version(self.weight))

    def _current_pack(self, weight: torch.Tensor) -> torch.Tensor:
        """The packed copy if it was made from ``weight`` as it is now; else ``weight`` itself (a caller's
        other matrix), repacking first when this layer's own weight changed since (tokens must follow it)."""
        source = self._packed_from
        if source is None or weight is not source[0]:
            return weight
        if _version(weight) != source[1]:
            self.pack()
        return self.packed


def prepack_fits(model: nn.Module, available: int | None = None) -> tuple[bool, str]:
    """Whether a second copy of ``model``'s Linear weights fits comfortably: at most a quarter of the memory
    available now (``_available_memory``: the kernel's figure or the memory cgroup's room, whichever is
    less; where neither can be read, assume it fits). A hub gives each student a few GB: there the copy of
    a 135M model in fp32 (540 MB) would be better left unmade."""
    weights = {id(m.weight): m.weight.numel() * m.weight.element_size()
               for m in model.modules() if isinstance(m, nn.Linear)}
    need = sum(weights.values())
    if available is None:
        available = _available_memory()
    if available is None or need <= available // 4:
        return True, ""
    return False, (f"weights not prepacked: the copy ({need / 2**20:,.0f} MiB) would take more than a "
                   f"quarter of the {available / 2**20:,.0f} MiB available")


def _available_memory(root: str = "/") -> int | None:
    """Bytes a new allocation can get now (Linux), else None: the kernel's MemAvailable, or less where
    this process's memory cgroup (a hub's or a container's limit, which /proc/meminfo does not show) has
    less room left under its limit (cgroup v2's memory.max, else v1's memory.limit_in_bytes)."""
    base = Path(root)
    found: list[int] = []
    try:
        for line in (base / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"),
                         ("sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            cap = (base / limit).read_text().strip()
            if cap != "max" and int(cap) < 1 << 60:  # "max" / a huge number: no limit
                found.append(max(0, int(cap) - int((base / usage).read_text())))
            break
        except (OSError, ValueError):
            continue
    return min(found) if found else None


def _version(t: torch.Tensor) -> int:
    """The tensor's in-place change counter (-1 for an inference tensor, which keeps none: those cannot
    change outside inference mode, and the engine never writes its weights)."""
    try:
        return t._version
    except RuntimeError:
        return -1


@dataclass
class KernelChoice:
    """What ``choose`` decided (kernel for one row, for many rows) and the times it decided on (seconds
    per call, medians, on a matrix of the model's largest shape)."""

    one_row: str
    many_rows: str
    reason: str
    times: dict[str, float]
    prepacked: bool = False  # an engine's layers also keep oneDNN's layout of their weights (pack_weight)

    @property
    def kernel(self) -> str:
        """One word for the whole choice ("torch" when nothing was switched)."""
        return self.many_rows if self.one_row == self.many_rows else f"{self.one_row}+{self.many_rows}"

    def describe(self) -> str:
        names = {"torch": "F.linear", "onednn": "oneDNN", "gemv": "minengine's GEMV"}
        packed = " on prepacked weights" if self.prepacked else ""
        return (f"linear layers: {names[self.one_row]} at 1 row, {names[self.many_rows]}{packed} at more "
                f"({self.reason})")


def _fastest_times(calls: dict[str, Callable[[], object]], rounds: int = 7,
                   clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Each call's fastest time over ``rounds`` rounds, the calls taken in turn within a round (in reverse
    order every other round). Why interleaved: timed one kernel after another (5 calls each, the median),
    a burst of load from another process once made the GEMV look 1.1x faster than F.linear on SmolLM2's
    LM head instead of ~2.5x (benchmarks/RESULTS.md §2, engine changes), and that choice is kept for the
    machine. Now a burst slows one round of every kernel, and the fastest round is what each can do: load
    only adds."""
    for fn in calls.values():
        fn()  # warm-up: oneDNN's first call creates its primitive
    best = dict.fromkeys(calls, float("inf"))
    names = list(calls)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            start = clock()
            calls[name]()
            best[name] = min(best[name], clock() - start)
    return best


def choose(model: nn.Module) -> KernelChoice:
    """Time F.linear, oneDNN and (one row) the GEMV on the model's largest weight shape; see the module
    doc. Decided once per process for each shape and thread count, so engines agree with each other."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    weight = max((m.weight for m in linears), key=lambda w: w.numel(), default=None)
    if weight is None or weight.device.type != "cpu" or weight.dtype != torch.float32:
        return KernelChoice("torch", "torch", "not a CPU fp32 model", {})
    if not onednn_available():
        return KernelChoice("torch", "torch", "this torch has no oneDNN", {})
    return choose_for_shape(tuple(weight.shape))


def choose_for_shape(shape: tuple[int, int]) -> KernelChoice:
    """``choose`` for a weight matrix of this [out, in] shape, at torch's current thread count (a
    benchmark's machine line prints what an engine for a model of that shape would run)."""
    return _choose_for(shape, torch.get_num_threads())


@functools.cache
def _choose_for(shape: tuple[int, int], threads: int) -> KernelChoice:
    from minengine.models import cpu_kernels

    saved = _load_timings(shape, threads)
    if saved is not None:
        return decide(saved)
    weight = torch.randn(shape)  # fresh memory: the model's own matrix may sit in cache from loading
    candidates = {"torch": lambda x: F.linear(x, weight), "onednn": lambda x: onednn_linear(x, weight, None)}
    if cpu_kernels.load():
        candidates["gemv"] = lambda x: _gemv(x, weight, None)
    inputs = {rows: torch.randn(rows, shape[1]) for rows in (1, MANY_ROWS)}
    calls = {f"{name}@{rows}": (lambda fn=candidates[name], x=inputs[rows]: fn(x))
             for name, rows in _timed_cases(candidates)}
    with torch.inference_mode():
        times = _fastest_times(calls)
    _save_timings(shape, threads, times)
    return decide(times)


def _timed_cases(kernels: Iterable[str]) -> list[tuple[str, int]]:
    """(kernel, rows) pairs timed for a choice: every kernel at one row, the batched ones at many."""
    return [(name, rows) for rows in (1, MANY_ROWS) for name in kernels
            if rows == 1 or name in KERNELS]


def _timings_paths() -> list[Path]:
    """Where this machine's timings live, in the order they are read: beside the kernels' build, then the
    same folder name in the user's cache, for a build this user cannot write to (a hub's shared one:
    without it, every student process would time again). Empty without a build: time each time."""
    from minengine.models import cpu_kernels, data_dirs

    folder = cpu_kernels.build_folder()
    if folder is None:
        return []
    beside = folder / cpu_kernels.TIMINGS_FILE
    mine = data_dirs.roots("kernels", cpu_kernels.ENV_DIR)[-1] / folder.name / cpu_kernels.TIMINGS_FILE
    return [beside] if mine == beside else [beside, mine]


def _timings_key(shape: tuple[int, int], threads: int) -> str:
    return f"{shape[0]}x{shape[1]}@{threads}"


def _load_timings(shape: tuple[int, int], threads: int) -> dict[str, float] | None:
    needed = {f"{name}@{rows}" for name, rows in _timed_cases(ONE_ROW_KERNELS)}
    for path in _timings_paths():
        try:
            saved = json.loads(path.read_text())[_timings_key(shape, threads)]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if (isinstance(saved, dict) and needed <= set(saved)
                and all(isinstance(saved[k], float) for k in needed)):
            return {k: saved[k] for k in needed}
    return None


def _save_timings(shape: tuple[int, int], threads: int, times: dict[str, float]) -> None:
    """Add these timings to the first file this process may write, atomically (two processes may time at
    once); quietly skipped when none is writable."""
    from minengine.models import data_dirs

    path = next((p for p in _timings_paths() if data_dirs.writable(p.parent)), None)
    if path is None or "gemv@1" not in times:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
        table[_timings_key(shape, threads)] = times
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
            json.dump(table, tmp, indent=1)
        os.replace(tmp.name, path)
    except OSError:
        pass


def decide(times: dict[str, float]) -> KernelChoice:
    """The rule, from the timings ("name@rows": seconds per call): a kernel replaces F.linear in a regime
    only where it is ``MARGIN`` faster there."""
    def pick(rows: int) -> str:
        base = times[f"torch@{rows}"]
        fastest = min((t, name) for key, t in times.items() for name in [key.split("@")[0]]
                      if key.endswith(f"@{rows}"))
        return fastest[1] if base / fastest[0] >= MARGIN else "torch"

    one, many = pick(1), pick(MANY_ROWS)
    ratios = ", ".join(f"{k} {times[f'torch@{r}'] / times[f'{k}@{r}']:.1f}x faster than F.linear at {r} "
                       "row(s)"
                       for r, k in ((1, one), (MANY_ROWS, many)) if k != "torch")
    return KernelChoice(one, many, ratios or "no kernel clearly faster than F.linear here", times)


def apply(model: nn.Module, one_row: str, many_rows: str | None = None, prepack: bool = False) -> int:
    """Make every ``nn.Linear`` of ``model`` a ``KernelLinear`` running these kernels; returns how many.
    The class is swapped in place, so parameters (tied ones too) and the state dict stay as they were.
    ``prepack`` (with oneDNN for many rows) also keeps each weight's oneDNN layout (``pack_weight``)."""
    many_rows = many_rows or one_row
    if one_row not in ONE_ROW_KERNELS or many_rows not in KERNELS:
        raise ValueError(f"unknown linear kernel {one_row!r}/{many_rows!r}: use one of {', '.join(KERNELS)}")
    if "onednn" in (one_row, many_rows) and not onednn_available():
        raise ValueError("linear_kernel='onednn' needs a torch built with oneDNN (mkldnn); this one has none")
    if prepack and many_rows != "onednn":
        raise ValueError("prepacked weights are oneDNN's layout: they need oneDNN for many rows, not "
                         f"{many_rows!r}")
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            if type(module) is nn.Linear:
                module.__class__ = KernelLinear
            if isinstance(module, KernelLinear):
                module.one_row, module.many_rows = one_row, many_rows
                if prepack:
                    module.pack()
                else:
                    module.packed, module._packed_from = None, None
                count += 1
    return count
