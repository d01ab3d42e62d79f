"""Calibrate the per-operation roofline against the real engine on this machine.

A datasheet roofline is an upper bound: kernels reach only part of the peak, and every step pays fixed
costs (Python, scheduling, launches) that no FLOP count sees. Calibration measures them. It runs the real
``LLMEngine`` on a small workload (all requests at once, so steps mix prefill chunks with decode batches
of varying size; then a few prompts alone for pure prefill steps), takes the ``StepRecord`` of every
step (its prefill chunks, decode KV lengths and wall time), and fits the per-op model of
``minengine.perf.roofline``:

    step time = sum over ops of max(FLOPs / (peak x e_compute(op)), bytes / (bandwidth x e_memory(op)))
                + overhead + per_seq x num_seqs

with peak and bandwidth from ``measure_this_machine()``. Six parameters: the four efficiencies (GEMM
compute, weight streaming, KV streaming, attention compute) by coordinate descent on log grids (the
maxes make the model non-linear in them), and for every trial ``overhead`` and ``per_seq`` (both >= 0)
by least squares of the *relative* residuals (a 5 ms step counts as much as a 500 ms one), each kind of
step (prefill, decode, mixed) weighted alike so the many decode steps do not drown the others. Vidur
(Agrawal et al., MLSys 2024) fits per-operator profiles and reports < 9 % error.

The reported error is the median absolute percentage error |predicted - measured| / measured over all
steps, over held-out steps (fit on even steps, score on odd ones), and per kind of step with its median
signed error (a model that prices mixed steps too low shows a negative one).

Run ``python -m minengine.sim.calibrate`` to print it for this machine.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minengine.core.records import StepRecord
from minengine.perf.efficiency import OP_EFFICIENCIES, Efficiency
from minengine.perf.roofline import CostModel, ModelShape, step_cost_of_record

# A random-weight Llama (GQA, 4 query heads per KV head, like Llama 3) big enough that its weights
# (~100 MB in fp32) spill out of the CPU caches, so decode steps are bandwidth-bound and 256-token prefill
# chunks compute-bound, and small enough to run a calibration workload in seconds.
MEDIUM_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
    "intermediate_size": 1408, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
    "vocab_size": 4096, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}

# Efficiencies are fractions of *measured* peaks, so they stay near or below 1. Compute may go a little
# above (big GEMMs can beat our 1024^3 probe); memory may not (the probe is the best streaming read), which
# keeps the weight reads, a constant per step like the fixed overhead, from being fitted as overhead.
MAX_EFFICIENCY = 1.5
MAX_MEMORY_EFFICIENCY = 1.0


@dataclass
class CalibrationResult:
    """A fitted cost model and how well it predicts the measured steps."""

    cost_model: CostModel
    measured: np.ndarray  # seconds per step
    predicted: np.ndarray
    holdout_mape: float  # fitted on even steps, scored on odd steps
    steps: list[StepRecord] = field(default_factory=list, repr=False)

    @property
    def errors(self) -> np.ndarray:
        """Relative error of every step: (predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured

    @property
    def mape(self) -> float:
        """Median absolute percentage error over all steps (as a fraction: 0.1 = 10 %)."""
        return float(np.median(np.abs(self.errors)))

    def kind_errors(self) -> dict[str, tuple[int, float, float]]:
        """Per kind of step (prefill, decode, mixed): (steps, median signed error, median |error|)."""
        kinds = np.array([step_kind(s) for s in self.steps])
        out = {}
        for kind in ("prefill", "decode", "mixed"):
            e = self.errors[kinds == kind]
            if len(e):
                out[kind] = (len(e), float(np.median(e)), float(np.median(np.abs(e))))
        return out

    def report(self) -> str:
        cm, lines = self.cost_model, []
        lines.append(f"Calibrated {cm.describe()}")
        lines.append(f"  machine: {cm.accelerator.bf16_tflops * 1e3:.1f} GFLOP/s matmul, "
                     f"{cm.accelerator.bandwidth_bytes_per_s / 1e9:.1f} GB/s read (measured)")
        lines.append(f"  steps: {len(self.measured)}; median |error| {100 * self.mape:.1f} % (all steps), "
                     f"{100 * self.holdout_mape:.1f} % (held out)")
        for kind, (n, signed, absolute) in self.kind_errors().items():
            m = np.array([step_kind(s) == kind for s in self.steps])
            lines.append(f"  {kind:>8}: {n:4d} steps, measured median "
                         f"{1e3 * np.median(self.measured[m]):.2f} ms, predicted "
                         f"{1e3 * np.median(self.predicted[m]):.2f} ms, median error {100 * signed:+.1f} %, "
                         f"median |error| {100 * absolute:.1f} %")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


# ------------------------------------------------------------------------------------------ fitting
EFFICIENCY_NAMES = ("gemm_compute", "weight_stream", "kv_stream", "attention_compute")


def step_kind(step: StepRecord) -> str:
    """"prefill" (chunks only), "decode" (decodes only) or "mixed"."""
    if not step.decode_context_lens:
        return "prefill"
    return "mixed" if step.prefill_chunks else "decode"


@dataclass
class _Features:
    """Per op and step: seconds of compute and of memory traffic at efficiency 1; the efficiency each
    uses (an index into EFFICIENCY_NAMES, -1: none); sequences and measured seconds per step; weights
    that give every kind of step (prefill, decode, mixed) the same say in the fit."""

    compute: np.ndarray  # (ops, steps)
    memory: np.ndarray
    compute_eff: list[int]
    memory_eff: list[int]
    seqs: np.ndarray
    y: np.ndarray
    weight: np.ndarray

    def roofline(self, eff: np.ndarray) -> np.ndarray:
        """Sum over ops of max(compute / e_compute, memory / e_memory), per step."""
        total = np.zeros_like(self.y)
        for i, (ci, mi) in enumerate(zip(self.compute_eff, self.memory_eff, strict=True)):
            c = self.compute[i] / eff[ci] if ci >= 0 else 0.0
            total += np.maximum(c, self.memory[i] / eff[mi])
        return total


def _features(steps: Sequence[StepRecord], base: CostModel) -> _Features:
    ideal = base.with_(efficiency=Efficiency(1.0, 1.0, 1.0, 1.0), compute_efficiency=None,
                       memory_efficiency=None, overhead_s=0.0, overhead_per_seq_s=0.0)
    costs = [step_cost_of_record(ideal, s) for s in steps]
    names = [op.name for op in costs[0].ops]
    compute = np.array([[c.ops[i].compute_time for c in costs] for i in range(len(names))])
    memory = np.array([[c.ops[i].memory_time for c in costs] for i in range(len(names))])
    index = {n: k for k, n in enumerate(EFFICIENCY_NAMES)}
    compute_eff = [index[OP_EFFICIENCIES[n][0]] if OP_EFFICIENCIES[n][0] else -1 for n in names]
    memory_eff = [index[OP_EFFICIENCIES[n][1]] for n in names]
    kinds = [step_kind(s) for s in steps]
    counts = {k: kinds.count(k) for k in set(kinds)}
    weight = np.array([1.0 / np.sqrt(counts[k]) for k in kinds])
    seqs = np.array([len(s.prefill_chunks) + len(s.decode_context_lens) for s in steps], float)
    return _Features(compute, memory, compute_eff, memory_eff, seqs, np.array([s.duration for s in steps]),
                     weight)


def _overheads(f: _Features, roof: np.ndarray, per_seq: bool) -> tuple[float, float, float]:
    """Best (loss, overhead, per_seq >= 0) for a roofline: least squares of weighted relative residuals."""
    w = f.weight / f.y
    r = (f.y - roof) * w
    cols = [w, f.seqs * w]
    best = (float(r @ r), 0.0, 0.0)
    for keep in ([0, 1], [0], [1]) if per_seq else ([0],):
        a = np.stack([cols[k] for k in keep], axis=1)
        coef = np.zeros(2)
        coef[keep] = np.linalg.lstsq(a, r, rcond=None)[0]
        if (coef < 0).any():
            continue
        res = r - coef[0] * cols[0] - coef[1] * cols[1]
        if float(res @ res) < best[0]:
            best = (float(res @ res), float(coef[0]), float(coef[1]))
    return best


def _fit(steps: Sequence[StepRecord], base: CostModel, per_seq: bool) -> CostModel:
    """Coordinate descent over the four efficiencies (log grids, coarse then fine), with the overheads
    solved in closed form at every point; starts from the best two-number (compute, memory) roofline."""
    f = _features(steps, base)
    grid = np.geomspace(0.005, MAX_EFFICIENCY, 41)
    start = min(((ec, em) for ec in grid for em in grid if em <= MAX_MEMORY_EFFICIENCY),
                key=lambda e: _overheads(f, f.roofline(np.array([e[0], e[1], e[1], e[0]])), per_seq)[0])
    eff = np.array([start[0], start[1], start[1], start[0]])
    ratio = grid[1] / grid[0]
    for rnd in range(4):
        for j in range(len(eff)):
            cap = (MAX_MEMORY_EFFICIENCY if EFFICIENCY_NAMES[j] in ("weight_stream", "kv_stream")
                   else MAX_EFFICIENCY)
            lo, hi = (grid[0], cap) if rnd < 2 else (eff[j] / ratio, min(eff[j] * ratio, cap))
            best = (np.inf, eff[j])
            for g in np.geomspace(lo, hi, 41 if rnd < 2 else 21):
                trial = eff.copy()
                trial[j] = g
                loss = _overheads(f, f.roofline(trial), per_seq)[0]
                if loss < best[0]:
                    best = (loss, g)
            eff[j] = best[1]
    _, overhead, per = _overheads(f, f.roofline(eff), per_seq)
    fitted = Efficiency(*(float(e) for e in eff), source="calibrated on this machine's engine steps")
    return base.with_(efficiency=fitted, compute_efficiency=None, memory_efficiency=None, overhead_s=overhead,
                      overhead_per_seq_s=per)


def fit_cost_model(steps: Sequence[StepRecord], base: CostModel, *, per_seq: bool = True
                   ) -> CalibrationResult:
    """Fit the four per-op efficiencies and the overheads of ``base`` (its accelerator and model) to
    measured steps."""
    steps = [s for s in steps if s.num_tokens > 0 and s.duration > 0]
    if len(steps) < 8:
        raise ValueError(f"need at least 8 measured steps to calibrate, got {len(steps)}")
    fitted = _fit(steps, base, per_seq)
    half = _fit(steps[0::2], base, per_seq)
    held = steps[1::2]
    held_err = [abs(step_cost_of_record(half, s).time - s.duration) / s.duration for s in held]
    measured = np.array([s.duration for s in steps])
    predicted = np.array([step_cost_of_record(fitted, s).time for s in steps])
    return CalibrationResult(fitted, measured, predicted, float(np.median(held_err)), list(steps))


# ------------------------------------------------------------------------------ running the engine
def random_llama(config: dict[str, Any] | None = None, seed: int = 0, device: str = "cpu") -> Any:
    """A random-weight ``LlamaForCausalLM`` of the given HF config (default ``MEDIUM_LLAMA``), fp32
    (``minengine.models.loader.build_random_model``)."""
    import torch

    from minengine.models.loader import build_random_model

    return build_random_model(config or MEDIUM_LLAMA, device=device, dtype=torch.float32, seed=seed)


def run_engine_workload(model: Any = None, *, num_requests: int = 24,
                        prompt_range: tuple[int, int] = (16, 384), output_range: tuple[int, int] = (8, 48),
                        max_num_seqs: int = 16, max_num_batched_tokens: int = 256, seed: int = 0
                        ) -> tuple[list[StepRecord], Any]:
    """Run the real engine (``LLM``) on a mixed workload; returns its StepRecords and the loaded model.

    ``model``: None (a ``MEDIUM_LLAMA`` with random weights), "shipped" (``minengine.LLM()``'s model), a
    config dict, or a loaded model. All requests are added at once; as they finish, the decode batch
    shrinks from ``max_num_seqs`` to 1, which spreads the steps over the roofline.
    """
    from minengine.core.sampling_params import SamplingParams
    from minengine.engine.llm import LLM

    if model == "shipped":
        llm = LLM(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                  enable_prefix_caching=False)
    else:
        loaded = model if hasattr(model, "parameters") else random_llama(model, seed)
        llm = LLM(loaded, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                  enable_prefix_caching=False)
    vocab = llm.llm_engine.model_config.vocab_size
    rng = random.Random(seed)
    lengths = [rng.randint(*prompt_range) for _ in range(num_requests)]
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(*output_range), ignore_eos=True)
              for _ in range(num_requests)]
    llm.generate([p[:32] for p in prompts[:4]], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    llm.generate(prompts, params, use_tqdm=False)  # warmed up: first-call costs stay out of the fit
    steps = list(llm.step_records)
    # Then a few prefill-only steps (one prompt at a time, one output token): the all-at-once run above
    # has only one, and the fit needs pure prefill, pure decode and mixed steps alike.
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    for n in 2 * sorted({max(8, max_num_batched_tokens * k // 4) for k in (1, 2, 3, 4)}):
        llm.generate([prompts[0][:1] + [rng.randrange(3, vocab) for _ in range(n - 1)]], one, use_tqdm=False)
        steps += llm.step_records
    return steps, llm.llm_engine.model


def calibrate(model: Any = None, *, num_threads: int | None = 1, seed: int = 0, **workload: Any
              ) -> CalibrationResult:
    """Measure this machine, run the real engine, fit the cost model (see the module docstring).

    CPU only for now: ``num_threads`` intra-op threads (default 1, the most stable on a shared machine;
    None keeps torch's setting) for both the machine measurement and the engine run.
    """
    from minengine.engine.threads import torch_threads
    from minengine.perf.measure import measure_this_machine

    with torch_threads(num_threads):
        machine = measure_this_machine("cpu")
        steps, loaded = run_engine_workload(model, seed=seed, **workload)
    shape = ModelShape.from_model(loaded, dtype={4: "fp32", 2: "bf16"}[loaded.dtype.itemsize])
    base = CostModel(machine, shape, overhead_s=0.0)
    return fit_cost_model(steps, base)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Fit the roofline cost model to the real engine on this CPU")
    parser.add_argument("--model", default=None, help="'shipped' for tinystories-4m (default: a random "
                        "Llama with hidden 512, 8 layers)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--num-requests", type=int, default=24)
    args = parser.parse_args()
    print(calibrate(args.model, num_threads=args.threads, num_requests=args.num_requests).report())


if __name__ == "__main__":
    main()
