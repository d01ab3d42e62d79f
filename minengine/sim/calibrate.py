"""Calibrate the roofline cost model against the real engine on this machine.

A datasheet roofline is an upper bound: kernels reach only part of the peak, and every step pays fixed
costs (Python, scheduling, launches) that no FLOP count sees. Calibration measures them. It runs the real
``LLMEngine`` on a small mixed workload (prefill chunks and decode batches of varying size), takes the
``StepRecord`` of every step (its prefill chunks, decode KV lengths and wall time), and fits

    step time = max(FLOPs / (peak x e_c), bytes / (bandwidth x e_m)) + overhead + per_seq x num_seqs

where peak and bandwidth come from ``measure_this_machine()``. The efficiencies ``e_c`` and ``e_m`` are
found by a grid search (the max makes the model non-linear in them); for each grid point, ``overhead``
and ``per_seq`` (both >= 0) come from a least-squares fit of the *relative* residuals, so a 5 ms step
counts as much as a 500 ms one. Vidur (Agrawal et al., MLSys 2024) fits per-operator profiles instead
and reports < 9 % error; a four-number roofline is coarser, and the reported error says by how much.

The reported error is the median absolute percentage error |predicted - measured| / measured over all
steps, and over held-out steps (fit on even steps, score on odd ones).

Run ``python -m minengine.sim.calibrate`` to print it for this machine.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minengine.core.records import StepRecord
from minengine.perf.roofline import CostModel, ModelShape, step_cost_of_record

# A random-weight Llama (GQA, 4 query heads per KV head, like Llama 3) big enough that its weights
# (~100 MB in fp32) spill out of the CPU caches, so decode steps are bandwidth-bound and 256-token prefill
# chunks compute-bound, and small enough to run a calibration workload in seconds.
MEDIUM_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
    "intermediate_size": 1408, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
    "vocab_size": 4096, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}

# Efficiencies are fractions of *measured* peaks, so they stay near or below 1; the cap (a little above 1:
# big GEMMs can beat our 1024^3 probe) keeps a fixed overhead from standing in for the weight reads.
MAX_EFFICIENCY = 1.5


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

    def report(self) -> str:
        cm, lines = self.cost_model, []
        lines.append(f"Calibrated {cm.describe()}")
        lines.append(f"  machine: {cm.accelerator.bf16_tflops * 1e3:.1f} GFLOP/s matmul, "
                     f"{cm.accelerator.bandwidth_bytes_per_s / 1e9:.1f} GB/s read (measured)")
        lines.append(f"  steps: {len(self.measured)}; median |error| {100 * self.mape:.1f} % (all steps), "
                     f"{100 * self.holdout_mape:.1f} % (held out)")
        kinds = {"decode-only": [s.num_prefill_tokens == 0 for s in self.steps],
                 "with prefill": [s.num_prefill_tokens > 0 for s in self.steps]}
        for name, mask in kinds.items():
            m = np.asarray(mask, bool)
            if m.any() and len(m) == len(self.measured):
                measured, predicted = np.median(self.measured[m]), np.median(self.predicted[m])
                lines.append(f"  {name:>12}: {m.sum():4d} steps, measured median {1e3 * measured:.2f} ms, "
                             f"predicted {1e3 * predicted:.2f} ms, median |error| "
                             f"{100 * np.median(np.abs(self.errors[m])):.1f} %")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


# ------------------------------------------------------------------------------------------ fitting
def _features(steps: Sequence[StepRecord], base: CostModel) -> tuple[np.ndarray, ...]:
    """Per step: roofline compute seconds and memory seconds at efficiency 1, sequences, measured time."""
    ideal = base.with_(compute_efficiency=1.0, memory_efficiency=1.0, overhead_s=0.0, overhead_per_seq_s=0.0)
    costs = [step_cost_of_record(ideal, s) for s in steps]
    compute = np.array([c.compute_time for c in costs])
    memory = np.array([c.memory_time for c in costs])
    seqs = np.array([len(s.prefill_chunks) + len(s.decode_context_lens) for s in steps], float)
    measured = np.array([s.duration for s in steps])
    return compute, memory, seqs, measured


def _fit_grid(compute: np.ndarray, memory: np.ndarray, seqs: np.ndarray, y: np.ndarray,
              ec: np.ndarray, em: np.ndarray, per_seq: bool) -> tuple[float, float, float, float, float]:
    """Best (loss, e_c, e_m, overhead, per_seq) over the grid ec x em, with non-negative overheads."""
    roof = np.maximum(compute[None, None, :] / ec[:, None, None], memory[None, None, :] / em[None, :, None])
    w = 1.0 / y
    r = ((y - roof) * w).reshape(-1, len(y))  # relative residual before the overhead terms
    cols = [w, seqs * w] if per_seq else [w]
    best = (np.inf, 0.0, 0.0, 0.0, 0.0)
    for keep in ([0, 1], [0], [1], []) if per_seq else ([0], []):  # free fit, then with terms forced to 0
        coef = np.zeros((r.shape[0], 2))
        if keep:
            a = np.stack([cols[k] for k in keep], axis=1)
            coef[:, keep] = r @ np.linalg.pinv(a).T
        loss = ((r - coef[:, 0:1] * w - coef[:, 1:2] * seqs * w) ** 2).sum(axis=1)
        loss[(coef < 0).any(axis=1)] = np.inf
        i = int(np.argmin(loss))
        if loss[i] < best[0]:
            a_i, b_i = np.unravel_index(i, (len(ec), len(em)))
            best = (float(loss[i]), float(ec[a_i]), float(em[b_i]), float(coef[i, 0]), float(coef[i, 1]))
    return best


def _fit(steps: Sequence[StepRecord], base: CostModel, per_seq: bool) -> CostModel:
    compute, memory, seqs, y = _features(steps, base)
    grid = np.geomspace(0.005, MAX_EFFICIENCY, 61)
    _, ec, em, _, _ = _fit_grid(compute, memory, seqs, y, grid, grid, per_seq)
    ratio = grid[1] / grid[0]  # refine around the coarse optimum
    fine_c, fine_m = (np.geomspace(x / ratio, min(x * ratio, MAX_EFFICIENCY), 21) for x in (ec, em))
    _, ec, em, overhead, per = _fit_grid(compute, memory, seqs, y, fine_c, fine_m, per_seq)
    return base.with_(compute_efficiency=ec, memory_efficiency=em, overhead_s=overhead,
                      overhead_per_seq_s=per)


def fit_cost_model(steps: Sequence[StepRecord], base: CostModel, *, per_seq: bool = True
                   ) -> CalibrationResult:
    """Fit efficiencies and overheads of ``base`` (its accelerator and model) to measured steps."""
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
    return list(llm.step_records), llm.llm_engine.model


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
