"""Lesson 02's arithmetic and helpers: sweep sizes and weights, kernel points, the critical batch, what-ifs.

Why a module: the lesson places *measured* kernels on a roofline (a matmul at M = 1 ... 4096, decode
attention over a batch, element-wise ops). The measuring loops are in the notebook, where learners read
and change them; the widget and the tests need the same FLOP and byte counts, which live here.

Conventions. A point's intensity is its FLOPs over the bytes the operation must move at least (each input
read once, each output written once): what a well-written kernel moves. Eager PyTorch may move more (a
temporary per step), and then its point lands below the roof; that gap is the kernel's, not the
hardware's. Times are the fastest of a few repeats after a warm-up (the least disturbed by other
programs on a shared machine), with ``torch.cuda.synchronize`` around GPU work.

The weights of a matmul sweep are several distinct matrices used in turn, like a model's layers, so the
small-M points stream their weights from memory instead of re-reading one matrix from a large cache.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from minengine.perf.hardware import Accelerator, get_accelerator
from minengine.perf.roofline import CostModel, ModelShape, StepCost
from minengine.sim.calibrate import MEDIUM_LLAMA

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# ------------------------------------------------------------------------------------------- points
@dataclass(frozen=True)
class KernelPoint:
    """One measured kernel: what it computed, the bytes it had to move, and how long it took."""

    kind: str  # "matmul", "decode attention", or an element-wise op's name
    dtype: str
    size: int  # M for a matmul, the batch for attention, tokens for an element-wise op
    flops: float
    bytes: float
    seconds: float
    repeats: int = 1  # matrices used in turn (a matmul sweep's "layers"); flops and bytes cover all

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds


def matmul_flops_bytes(m: int, k: int, n: int, bytes_per_element: float) -> tuple[float, float]:
    """[m, k] x [k, n]: 2mkn FLOPs over the input, weight and output bytes (each moved once)."""
    return 2.0 * m * k * n, bytes_per_element * (m * k + k * n + m * n)


def matmul_intensity(m: int, k: int, n: int, bytes_per_element: float) -> float:
    """FLOP/byte of [m, k] x [k, n]; about 2m / bytes_per_element while m is small next to k and n."""
    flops, nbytes = matmul_flops_bytes(m, k, n, bytes_per_element)
    return flops / nbytes


def fastest_time(fn: Callable[[], Any], device: torch.device, repeats: int = 3,
                 budget_s: float = 1.0) -> float:
    """Fastest of ``repeats`` calls after a warm-up; fewer (at least one) once ``budget_s`` is spent."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    best, start = math.inf, time.perf_counter()
    for i in range(repeats):
        if i and time.perf_counter() - start > budget_s:
            break
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


# ------------------------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class SweepSizes:
    """Sizes of the lesson's experiments for this device."""

    k: int  # the weight matrices are k x k
    ms: tuple[int, ...]
    working_set_bytes: int  # small-M points cycle through this many bytes of weights
    flop_budget: float  # per timed call: large-M points use fewer matrices
    max_call_s: float  # a dtype's sweep stops growing M past a call this slow
    repeats: int
    attention_batches: tuple[int, ...]
    attention_context: int
    attention_heads: tuple[int, int, int]  # query heads, KV heads, head dim (a GQA group of 4)
    elementwise_shape: tuple[int, int]  # tokens, hidden


def sweep_sizes(device: str | torch.device = "cpu", headless: bool = False) -> SweepSizes:
    """CPU: 2048 x 2048 weights (16 MiB in fp32), 256 MiB cycled, 64 MiB activations; a GPU: 8192 x 8192,
    2 GiB cycled, 256 MiB activations (all beyond the caches)."""
    if torch.device(device).type == "cuda":
        return SweepSizes(8192, tuple(2**i for i in range(15)), 2 * 2**30, 4e12, 2.0, 10,
                          (1, 4, 16, 64, 256), 8192, (32, 8, 128), (16384, 8192))
    ms = tuple(2**i for i in range(13))  # 1 ... 4096
    return SweepSizes(2048, ms, 256 * 2**20, 4e9 if headless else 8e9, 1.5 if headless else 4.0,
                      3 if headless else 5, (1, 4, 16, 64), 4096, (8, 2, 64), (8192, 2048))


# ------------------------------------------------------------------------------------------- sweeps
def weight_matrices(dtype: str, sizes: SweepSizes, device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """The [k, k] matrices the lesson's matmul sweep uses in turn, like a model's layers: enough of them
    to fill ``sizes.working_set_bytes``, so small-M points stream their weights from memory instead of
    re-reading one matrix that a large cache holds. Seeded random values: the speed depends on the
    bytes, not on them."""
    dev, dt = torch.device(device), DTYPES[dtype]
    count = max(1, math.ceil(sizes.working_set_bytes / (sizes.k * sizes.k * torch.finfo(dt).bits // 8)))
    gen = torch.Generator(device=dev).manual_seed(0)
    return [torch.randn(sizes.k, sizes.k, device=dev, dtype=dt, generator=gen) for _ in range(count)]


def elementwise_points(sizes: SweepSizes, dtype: str, device: str | torch.device = "cpu"
                       ) -> list[KernelPoint]:
    """A residual add, SiLU (in place) and RMSNorm over [tokens, hidden]: a few FLOPs per element moved.

    FLOPs counted: add 1, SiLU 4 (negate, exp, add, divide), RMSNorm 4 (square, sum, scale, weight)
    per element; bytes: what each must read and write once. RMSNorm runs as PyTorch's eager op."""
    dev, dt = torch.device(device), DTYPES[dtype]
    tokens, hidden = sizes.elementwise_shape
    size, n = torch.finfo(dt).bits // 8, tokens * hidden
    x, u = (torch.randn(tokens, hidden, device=dev, dtype=dt),
            torch.randn(tokens, hidden, device=dev, dtype=dt))
    out, weight = torch.empty_like(x), torch.ones(hidden, device=dev, dtype=dt)
    ops = (("residual add", lambda: torch.add(x, u, out=out), 1, 3),
           ("SiLU", lambda: F.silu(out, inplace=True), 4, 2),
           ("RMSNorm", lambda: F.rms_norm(x, (hidden,), weight), 4, 2))
    return [KernelPoint(name, dtype, tokens, float(fl * n), float(el * n * size), fastest_time(fn, dev, 5))
            for name, fn, fl, el in ops]


def knee(points: Sequence[KernelPoint], peak: float, share: float = 0.5) -> int | None:
    """The smallest M whose matmul reached ``share`` of ``peak`` FLOP/s (None if none did)."""
    return next((p.size for p in points if p.flops_per_s >= share * peak), None)


def roof(intensity: Any, peak: float, bandwidth: float) -> np.ndarray:
    """The roofline: attainable FLOP/s = min(peak, bandwidth x intensity)."""
    return np.minimum(peak, bandwidth * np.asarray(intensity, float))


def as_machine(measured: Accelerator, peak: float, label: str) -> Accelerator:
    """This machine's measured record with another matmul peak (e.g. its bf16 one)."""
    return replace(measured, bf16_tflops=peak / 1e12, name=f"this machine, {label} (measured)")


# ------------------------------------------------------------------------------- decode arithmetic
def ideal(cost_model: CostModel) -> CostModel:
    """The textbook roofline of the same model and chip: datasheet peaks reached, no overhead."""
    return cost_model.with_(compute_efficiency=1.0, memory_efficiency=1.0, overhead_s=0.0,
                            overhead_per_seq_s=0.0)


def _decode_flops_bytes(cost: StepCost, include_kv: bool) -> tuple[float, float]:
    """A decode step's FLOPs and bytes: all of them, or the weight matmuls only (no KV, no attention)."""
    if include_kv:
        return cost.flops, cost.bytes
    return cost.linear_flops, cost.weight_bytes


def decode_intensity(cost_model: CostModel, batch: int, context: int, include_kv: bool = True) -> float:
    """FLOP/byte of a decode step of ``batch`` sequences with ``context`` tokens of KV each."""
    flops, nbytes = _decode_flops_bytes(cost_model.decode_cost(batch, context), include_kv)
    return flops / nbytes


def critical_batch(cost_model: CostModel, context: int, include_kv: bool = True) -> float:
    """The batch B* at which a decode step's FLOPs take as long as its bytes at datasheet peaks.

    FLOPs and bytes are both linear in the batch (weights once, plus a fixed amount per sequence), so
    B* = (bytes0 / BW - flops0 / P) / (flops1 / P - bytes1 / BW). With KV reads, bytes1 grows with the
    context: past some context a sequence costs more bytes than compute time and B* is infinite.
    """
    peak, bw = cost_model.peak_flops, cost_model.accelerator.bandwidth_bytes_per_s
    f_one, b_one = _decode_flops_bytes(cost_model.decode_cost(1, context), include_kv)
    f_two, b_two = _decode_flops_bytes(cost_model.decode_cost(2, context), include_kv)
    f1, b1 = f_two - f_one, b_two - b_one
    f0, b0 = f_one - f1, b_one - b1
    denominator = f1 / peak - b1 / bw
    if denominator <= 0:
        return math.inf
    return max(1.0, (b0 / bw - f0 / peak) / denominator)


def context_limit(cost_model: CostModel, lo: int = 1, hi: int = 1 << 22) -> int | None:
    """The longest context at which decode can still become compute-bound with KV reads (None: any)."""
    if math.isfinite(critical_batch(cost_model, hi)):
        return None
    if not math.isfinite(critical_batch(cost_model, lo)):
        return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if math.isfinite(critical_batch(cost_model, mid)) else (lo, mid)
    return lo


@dataclass(frozen=True)
class OpPoint:
    """One operation of a step, priced by a cost model: where it lands on the roofline."""

    name: str
    flops: float
    bytes: float
    seconds: float
    bound: str

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds if self.seconds else 0.0


ELEMENTWISE_FLOPS_PER_BYTE = 0.5  # nominal for the plot: ~2 FLOPs per 16-bit element moved (see text)


def step_points(cost_model: CostModel, batch: int, context: int, prompt: int | None = None) -> list[OpPoint]:
    """Where a decode step's ops (batch, context) and a prefill's (one prompt of ``prompt`` tokens) land.

    The cost model counts no FLOPs for element-wise ops; they get a nominal intensity so they can be
    drawn (``ELEMENTWISE_FLOPS_PER_BYTE`` x 16 bits / the weights' bits)."""
    out = []
    decode = cost_model.decode_cost(batch, context)
    proj = [o for o in decode.ops if o.name in ("qkv_o_proj", "mlp")]
    out.append(OpPoint("decode projections", sum(o.flops for o in proj), sum(o.bytes for o in proj),
                       sum(o.time for o in proj),
                       "memory" if all(o.bound == "memory" for o in proj) else "compute"))
    for op in decode.ops:
        if op.name == "decode_attention":
            out.append(OpPoint("decode attention", op.flops, op.bytes, op.time, op.bound))
        if op.name == "elementwise":
            nominal = (op.bytes * ELEMENTWISE_FLOPS_PER_BYTE * 2
                       / max(cost_model.model.weight_bytes_per_param, 2))
            out.append(OpPoint("norms, element-wise (decode)", nominal, op.bytes, op.time, "memory"))
    if prompt:
        pre = cost_model.prefill_cost(prompt)
        proj = [o for o in pre.ops if o.name in ("qkv_o_proj", "mlp")]
        out.append(OpPoint("prefill projections", sum(o.flops for o in proj), sum(o.bytes for o in proj),
                           sum(o.time for o in proj),
                           "compute" if all(o.bound == "compute" for o in proj) else "memory"))
        att = pre.op("prefill_attention")
        if att is not None and att.flops:
            out.append(OpPoint("prefill attention", att.flops, att.bytes, att.time, att.bound))
    return out


# ---------------------------------------------------------------------------------- calibration
def predicted_matmul_seconds(cost_model: CostModel, point: KernelPoint) -> float:
    """A matmul point's time by a (calibrated) cost model: max(FLOPs / GEMM rate, bytes / weight rate)."""
    rates = cost_model.rates()
    return max(point.flops / rates["gemm_compute"], point.bytes / rates["weight_stream"])


def roofline_seconds(cost: StepCost) -> float:
    """A step's roofline time alone: the sum of its ops' times, without the fixed or per-sequence overhead."""
    return sum(op.time for op in cost.ops)


GPU_CALIBRATION_LLAMA: dict[str, Any] = {**MEDIUM_LLAMA, "hidden_size": 2048, "intermediate_size": 8192,
                                          "num_hidden_layers": 16, "num_attention_heads": 16,
                                          "num_key_value_heads": 4, "vocab_size": 32000}


def calibrate_here(device: str | torch.device = "cpu", threads: int | None = 1,
                   num_requests: int = 24) -> Any:
    """``minengine.sim.calibrate`` on this device: the real engine's steps fitted by the per-op roofline.

    On a CPU that is ``calibrate()`` itself (a random-weight Llama, hidden 512, fp32). On a GPU the same
    kind of workload runs a ~1B-parameter bf16 Llama with a 4 GiB KV cache (the engine's default would
    take 90 % of the GPU), fitted against the GPU's measured bandwidth and bf16 peak."""
    from minengine.sim.calibrate import calibrate, fit_cost_model

    dev = torch.device(device)
    if dev.type != "cuda":
        return calibrate(num_threads=threads, num_requests=num_requests)
    import random

    from minengine.core.sampling_params import SamplingParams
    from minengine.engine.llm import LLM
    from minengine.models.loader import build_random_model
    from minengine.perf.measure import measure_this_machine

    model = build_random_model(GPU_CALIBRATION_LLAMA, device=dev, dtype=torch.bfloat16, seed=0)
    llm = LLM(model, max_num_seqs=64, max_num_batched_tokens=2048, kv_cache_memory_bytes=4 * 2**30,
              enable_prefix_caching=False)
    rng, vocab = random.Random(0), GPU_CALIBRATION_LLAMA["vocab_size"]

    def prompt(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate([prompt(64) for _ in range(4)], SamplingParams(max_tokens=4, ignore_eos=True),
                 use_tqdm=False)
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(8, 64), ignore_eos=True)
              for _ in range(num_requests)]
    llm.generate([prompt(rng.randint(64, 2048)) for _ in range(num_requests)], params, use_tqdm=False)
    steps = list(llm.step_records)
    for n in (256, 512, 1024, 2048) * 2:  # pure prefill steps too, as calibrate() adds
        llm.generate([prompt(n)], one, use_tqdm=False)
        steps += llm.step_records
    base = CostModel(measure_this_machine(dev), ModelShape.from_model(model, dtype="bf16"), overhead_s=0.0)
    return fit_cost_model(steps, base)


# ------------------------------------------------------------------------------------------ what-ifs
def scaled_gpu(gpu: str | Accelerator, flops: float = 1.0, bandwidth: float = 1.0, name: str | None = None
               ) -> Accelerator:
    """A datasheet GPU with its peaks scaled (same key, so the same efficiency row applies)."""
    acc = get_accelerator(gpu)
    fp8 = acc.fp8_tflops * flops if acc.fp8_tflops else None
    label = name or f"{acc.name} x{flops:g} FLOP/s, x{bandwidth:g} bandwidth"
    return replace(acc, name=label, bf16_tflops=acc.bf16_tflops * flops, fp8_tflops=fp8,
                   bandwidth_bytes_per_s=acc.bandwidth_bytes_per_s * bandwidth)


def serve_whatif(gpus: dict[str, Accelerator], model: str = "llama-3.1-8b", num_requests: int = 300,
                 prompt: int = 1024, output: int = 128, rate: float = 4.0, seed: int = 0,
                 progress: bool = True) -> dict[str, Any]:
    """The same Poisson workload simulated on each GPU; label -> ``RunSummary`` (TTFT, TPOT, ...)."""
    from minengine.sim import Simulator, synthetic_workload

    work = synthetic_workload(num_requests, rate, input_len=prompt, output_len=output, seed=seed)
    return {label: Simulator(model, acc, max_num_batched_tokens=2048).run(work).summary()
            for label, acc in tqdm(gpus.items(), desc="simulated GPUs", total=len(gpus),
                                   disable=not progress)}


# ------------------------------------------------------------------------------------------ plotting
def plot_roofline(ax: Any, roofs: Sequence[tuple[str, float, float]],
                  groups: Sequence[tuple[str, Sequence[KernelPoint], str]], title: str = "") -> None:
    """Log-log roofline: each (label, peak FLOP/s, bandwidth) as a line, each (label, points, matplotlib
    format) as markers at (intensity, achieved FLOP/s), the ridges dotted."""
    xs = np.geomspace(0.03, 3000, 200)
    for i, (label, peak, bw) in enumerate(roofs):
        color = f"C{i}" if len(roofs) > 1 else "k"
        rate = f"{peak / 1e12:,.0f} TFLOP/s" if peak >= 1e13 else f"{peak / 1e9:,.0f} GFLOP/s"
        ax.plot(xs, roof(xs, peak, bw), "-", color=color, linewidth=1.5,
                label=f"{label}: {rate}, ridge {peak / bw:,.1f}")
        ax.axvline(peak / bw, color=color, linestyle=":", linewidth=0.8)
    for label, points, fmt in groups:
        if points:
            ax.plot([p.intensity for p in points], [p.flops_per_s for p in points], fmt, label=label,
                    markersize=6, markeredgecolor="k", markeredgewidth=0.5)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)", ylabel="FLOP/s",
           title=title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
