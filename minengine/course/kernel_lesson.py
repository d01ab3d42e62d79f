"""Lesson 02's kernel section: how fast a batch-1 GEMV reads its weights, on one core and on all of them.

Why a module: "decode is bandwidth-bound" names a floor, weight bytes / the machine's best read
bandwidth, but whether a framework reaches it depends on the matrix-vector kernel it calls. Some BLAS
GEMVs split their rows over every core; others stay on one core, which cannot keep enough cache-line
misses in flight to draw the machine's bandwidth. The lesson measures that on this CPU: a streaming
``sum`` (the probe of ``minengine.perf.measure``) and ``F.linear`` with one input row (what the engine
calls), and oneDNN's prepacked linear when this torch has it, each with one thread and with all of them.

Method. Every kernel reads the *same* buffer: ``matrices`` LM-head-sized fp32 matrices (32000 x 768,
98 MB each) stacked in one tensor, together at least twice the last-level cache (so no kernel is
served from cache on a second pass). The ``sum`` reads the whole stack; a GEMV pass multiplies one row
by each matrix in turn, like a decode step walking through a model's layers. Passes run round-robin over
the kernels (so drift on a shared machine hits all of them alike) and each kernel keeps its fastest pass.
The bandwidth is bytes read / seconds; the decode floor a kernel implies is a model's weight bytes over
that bandwidth. Always on the CPU, also on a GPU machine: the section is about CPU kernels and threads.
The timing loop itself (``time_kernels``) is in the notebook; this module holds the sizes, the weights,
the kernels' set-up and what a run's points mean.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minengine.perf.measure import blas_line, cpu_name
from minengine.perf.model_presets import PRESETS
from minengine.perf.model_spec import estimate_num_params

SUM, GEMV, ONEDNN = "sum (streaming read)", "GEMV: F.linear (MKL/BLAS)", "GEMV: oneDNN linear, prepacked"
NOISE = 1.25  # a kernel "faster than the sum" by less than this factor is timing noise on a shared machine
EXTRA_PASSES = 4  # more passes while a GEMV seems to beat the sum (a busy moment during its passes)

# SmolLM2-135M, the course's real model (its config.json, the keys the count needs): 134,515,008
# parameters, all read once per decode step (the tied LM head reads the whole embedding matrix), 538 MB
# in fp32 as benchmarks/RESULTS.md measures per step. Llama-3.1-8B's count is its preset's.
SMOLLM2_135M_CONFIG: dict[str, Any] = {
    "model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536,
    "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True}
FLOOR_MODELS: dict[str, float] = {
    "SmolLM2-135M, fp32": float((estimate_num_params(SMOLLM2_135M_CONFIG) or 0) * 4),
    "Llama-3.1-8B, bf16": PRESETS["llama-3.1-8b"]["num_params"] * 2.0,
}


# ------------------------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class KernelSizes:
    """The weight stack every kernel reads: ``matrices`` of ``rows`` x ``cols`` fp32, fastest of
    ``repeats``."""

    rows: int
    cols: int
    matrices: int
    repeats: int

    @property
    def matrix_bytes(self) -> int:
        return self.rows * self.cols * 4

    @property
    def total_bytes(self) -> int:
        return self.matrices * self.matrix_bytes


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache Linux reports (``/sys/.../cache/index*/size``), or None where it says nothing."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            sizes.append(_parse_size(entry.read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


def _parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if not match:
        raise ValueError(f"not a cache size: {text!r}")
    return int(match[1]) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match[2]]


def kernel_sizes(headless: bool = False, cache_bytes: int | None = None, rows: int = 32000, cols: int = 768
                 ) -> KernelSizes:
    """Enough LM-head matrices for twice the last-level cache and at least 256 MiB: 3-4 under tests,
    3-8 otherwise (each kernel holds the stack; oneDNN a prepacked copy too), 5 or 10 timed passes."""
    matrix = rows * cols * 4
    want = max(256 * 2**20, 2 * (cache_bytes or 0))
    count = min(max(3, math.ceil(want / matrix)), 4 if headless else 8)
    return KernelSizes(rows, cols, count, 5 if headless else 10)


# ------------------------------------------------------------------------------------------- points
@dataclass(frozen=True)
class ReadPoint:
    """One kernel at one thread count: the bytes it read in a pass and its fastest pass."""

    kernel: str
    threads: int
    bytes: int
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds

    @property
    def label(self) -> str:
        return f"{self.kernel}, {self.threads} thread{'s' if self.threads > 1 else ''}"

    def floor_ms(self, weight_bytes: float) -> float:
        """The batch-1 decode floor (ms per token) of a model with ``weight_bytes``, read at this speed."""
        return 1e3 * weight_bytes / self.bytes_per_s


@dataclass(frozen=True)
class KernelRun:
    """Every measured point, the thread count called "all", and why oneDNN is missing (None: measured)."""

    points: tuple[ReadPoint, ...]
    threads: int
    onednn_note: str | None = None

    @classmethod
    def of(cls, best: dict[tuple[str, int], float], nbytes: int, onednn_note: str | None = None) -> KernelRun:
        """The run from the fastest pass of each (kernel, threads), in measuring order; "all threads" is the
        largest count measured."""
        points = tuple(ReadPoint(kernel, n, nbytes, seconds) for (kernel, n), seconds in best.items())
        return cls(points, max(p.threads for p in points), onednn_note)

    def get(self, kernel: str, threads: int | None = None) -> ReadPoint | None:
        """The point of ``kernel`` at ``threads`` (default: all threads), or None if not measured."""
        want = self.threads if threads is None else threads
        return next((p for p in self.points if p.kernel == kernel and p.threads == want), None)

    def rate(self, kernel: str, threads: int | None = None) -> float:
        """Bytes/s of a point (NaN when it was not measured, so a claim on it does not hold)."""
        point = self.get(kernel, threads)
        return point.bytes_per_s if point else math.nan

    @property
    def best_read(self) -> ReadPoint:
        """The machine's best streaming read: the faster of the sum's thread counts (the floor's
        bandwidth)."""
        return max((p for p in self.points if p.kernel == SUM), key=lambda p: p.bytes_per_s)

    @property
    def fastest_gemv(self) -> ReadPoint:
        return max((p for p in self.points if p.kernel != SUM), key=lambda p: p.bytes_per_s)

    @property
    def gemv_beats_the_sum(self) -> bool:
        """A GEMV read faster than the streaming sum, by more than timing noise. It cannot on memory: a
        busy moment during the sum's passes (so measure more), or weights left in a cache."""
        return self.fastest_gemv.bytes_per_s > NOISE * self.best_read.bytes_per_s


def floor_rows(run: KernelRun,
               models: dict[str, float] | None = None) -> list[tuple[str, float, list[float]]]:
    """(label, GB/s, ms per token for each model) per point, in measuring order: the implied floors."""
    models = FLOOR_MODELS if models is None else models
    return [(p.label, p.bytes_per_s / 1e9, [p.floor_ms(b) for b in models.values()]) for p in run.points]


# ------------------------------------------------------------------------------------------- kernels
def build_weights(sizes: KernelSizes, seed: int = 0) -> torch.Tensor:
    """The [matrices, rows, cols] fp32 stack (random values: the speed depends on the bytes, not on them)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.empty(sizes.matrices, sizes.rows, sizes.cols).uniform_(-1.0, 1.0, generator=gen)


def onednn_linears(weights: torch.Tensor
                   ) -> tuple[list[Callable[[torch.Tensor], torch.Tensor]] | None, str | None]:
    """oneDNN's linear with each matrix prepacked in its own layout, or (None, why) where torch lacks it."""
    if not torch.backends.mkldnn.is_available():
        return None, "this torch build has no oneDNN (MKL-DNN)"
    try:
        with warnings.catch_warnings():
            # MkldnnLinear is a TorchScript module: torch 2.13 flags script_method
            warnings.simplefilter("ignore", DeprecationWarning)
            import torch.utils.mkldnn as mkldnn

            layers = []
            for w in weights:
                dense = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
                dense.weight = torch.nn.Parameter(w, requires_grad=False)
                layers.append(mkldnn.MkldnnLinear(dense, torch.float32))
            with torch.no_grad():
                layers[0](torch.zeros(1, weights.shape[2]))
    except (AttributeError, ImportError, RuntimeError, TypeError) as err:
        # an API that moved or a CPU it rejects
        return None, f"oneDNN's prepacked linear did not run here ({type(err).__name__}: {err})"
    return layers, None


# ------------------------------------------------------------------------------------------- this machine
def machine_line() -> str:
    """One line naming the CPU, its cores and the libraries: what the measured numbers belong to."""
    return f"{cpu_name()}, {os.cpu_count()} logical CPU(s), torch {torch.__version__}: {blas_line()}"


# ------------------------------------------------------------------------------------------- plotting
def plot_kernels(ax: Any, run: KernelRun, model: str = "SmolLM2-135M, fp32") -> None:
    """Horizontal bars of GB/s per point, each labelled with the decode floor it implies for ``model``,
    and a dotted line at the machine's best read (the floor's bandwidth)."""
    weight_bytes = FLOOR_MODELS[model]
    points: Sequence[ReadPoint] = run.points
    colors = {SUM: "tab:gray", GEMV: "tab:blue", ONEDNN: "tab:green"}
    ys = range(len(points))[::-1]
    rates = [p.bytes_per_s / 1e9 for p in points]
    from matplotlib.colors import to_rgba

    ax.barh(list(ys), rates,
            color=[to_rgba(colors[p.kernel], 0.55 if p.threads == 1 else 1.0) for p in points])
    for y, p, r in zip(ys, points, rates, strict=True):
        ax.text(r, y, f" {r:.1f} GB/s → {p.floor_ms(weight_bytes):.1f} ms/token", va="center", fontsize=8)
    best = run.best_read.bytes_per_s / 1e9
    ax.axvline(best, color="k", linestyle=":", linewidth=1, label=f"best read: {best:.1f} GB/s (the floor's)")
    ax.set_yticks(list(ys), [p.label for p in points], fontsize=8)
    ax.set_xlim(0, 1.5 * max(rates))
    ax.set(xlabel="GB/s read (fastest pass); after the arrow: the decode floor of "
                  f"{model.replace(', ', ' in ')} at that speed",
           title=f"the same {run.points[0].bytes / 1e6:,.0f} MB of fp32 weights, read by each kernel")
    ax.legend(fontsize=8, loc="upper right")
