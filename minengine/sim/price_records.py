"""Price a real run's steps with the simulator's cost model: predicted against measured, step by step.

The simulator's claims at GPU scale rest on its cost model (``perf/roofline.py``). This tool holds that
model against a run of the real engine on any device: it reads the run's ``StepRecord``s (what each step
computed: its prefill chunks and decode context lengths, and how long it took), prices every step with
``step_cost_of_record`` for the accelerator and model given, and reports, per kind of step (prefill,
decode, mixed), the median measured and predicted times and their ratio, plus the totals. ``--fit`` also
fits the four efficiencies and the overheads to these steps (``sim/calibrate.fit_cost_model``) and
reports that model's error on held-out steps; ``--plot`` draws measured against predicted.

    python -m minengine.sim.price_records benchmarks/data/h200_llama2-7b_offline_2026-12-04.json
    python -m minengine.sim.price_records RUN.json --gpu h100 --model llama-2-7b --fit --plot out.png

A records file is JSON: either a list of step records (``dataclasses.asdict(StepRecord)``), or an object
with ``step_records`` and, optionally, ``model`` (an HF config dict), ``dtype`` and ``gpu``, as
``benchmarks/gpu_check.py`` writes them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from minengine.core.records import StepRecord
from minengine.perf.roofline import CostModel, step_cost_of_record
from minengine.sim.calibrate import fit_cost_model, step_kind


def load_records(path: str | Path) -> tuple[list[StepRecord], dict[str, Any]]:
    """The step records of a run file, and its metadata (model, dtype, gpu, ...) when it has any."""
    data = json.loads(Path(path).read_text())
    meta: dict[str, Any] = {}
    if isinstance(data, dict):
        meta = {k: v for k, v in data.items() if k != "step_records"}
        data = data.get("step_records")
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: no step records (a list, or an object with 'step_records')")
    fields = {f.name for f in dataclasses.fields(StepRecord)}
    records = []
    for row in data:
        row = {k: v for k, v in row.items() if k in fields}
        row["prefill_chunks"] = [tuple(c) for c in row.get("prefill_chunks", [])]
        records.append(StepRecord(**row))
    return records, meta


def price(records: Sequence[StepRecord], cost_model: CostModel) -> dict[str, dict[str, float]]:
    """Per kind of step: count, median measured and predicted ms, their ratio, and total seconds."""
    kinds: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        if r.num_tokens:
            kinds.setdefault(step_kind(r), []).append((r.duration, step_cost_of_record(cost_model, r).time))
    out = {}
    for kind in ("prefill", "decode", "mixed"):
        pairs = kinds.get(kind)
        if not pairs:
            continue
        measured, predicted = (statistics.median(x) for x in zip(*pairs, strict=True))
        out[kind] = {"steps": len(pairs), "measured_ms": measured * 1e3, "predicted_ms": predicted * 1e3,
                     "ratio": measured / predicted, "total_measured_s": sum(m for m, _ in pairs),
                     "total_predicted_s": sum(p for _, p in pairs)}
    return out


def table(priced: dict[str, dict[str, float]]) -> str:
    lines = [f"{'kind':<8} {'steps':>6} {'measured ms':>12} {'predicted ms':>13} {'ratio':>6} "
             f"{'total meas. s':>14} {'total pred. s':>14}"]
    for kind, row in priced.items():
        lines.append(f"{kind:<8} {row['steps']:>6} {row['measured_ms']:>12.2f} {row['predicted_ms']:>13.2f} "
                     f"{row['ratio']:>6.2f} {row['total_measured_s']:>14.2f} "
                     f"{row['total_predicted_s']:>14.2f}")
    return "\n".join(lines)


def plot(records: Sequence[StepRecord], cost_model: CostModel, path: str | Path) -> None:
    """Measured against predicted seconds per step, one colour per kind, the y = x line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    top = 0.0
    for kind, colour in (("prefill", "tab:blue"), ("decode", "tab:green"), ("mixed", "tab:orange")):
        steps = [r for r in records if r.num_tokens and step_kind(r) == kind]
        if steps:
            xs = [step_cost_of_record(cost_model, r).time * 1e3 for r in steps]
            ys = [r.duration * 1e3 for r in steps]
            ax.scatter(xs, ys, s=10, alpha=0.6, color=colour, label=f"{kind} ({len(steps)})")
            top = max(top, *xs, *ys)
    ax.plot([0, top], [0, top], color="grey", lw=1, label="measured = predicted")
    ax.set(xlabel="predicted step time (ms)", ylabel="measured step time (ms)",
           title=f"{cost_model.accelerator.name}: steps priced by the cost model")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", help="a run's step records (JSON)")
    ap.add_argument("--gpu", help="accelerator of the cost model (default: the file's 'gpu')")
    ap.add_argument("--model", help="a model preset name or an HF config.json (default: the file's 'model')")
    ap.add_argument("--dtype", help="default: the file's 'dtype', else bfloat16")
    ap.add_argument("--fit", action="store_true", help="also fit efficiencies and overheads to these steps")
    ap.add_argument("--plot", help="write measured-vs-predicted as a PNG here")
    args = ap.parse_args(argv)
    try:
        records, meta = load_records(args.records)
        gpu = args.gpu or meta.get("gpu")
        model: Any = args.model or meta.get("model")
        if gpu is None or model is None:
            raise ValueError("give --gpu and --model (the records file names neither)")
        if isinstance(model, str) and model.endswith(".json"):
            model = json.loads(Path(model).read_text())
        cost_model = CostModel.create(model, gpu=gpu, dtype=args.dtype or meta.get("dtype") or "bfloat16")
    except (OSError, ValueError, KeyError) as e:
        print(f"price_records: error: {e}", file=sys.stderr)
        return 2
    print(f"{len(records)} steps of {args.records}, priced by {cost_model.describe()}")
    print(table(price(records, cost_model)))
    if args.fit:
        result = fit_cost_model(records, cost_model)
        print("\nfitted to these steps:")
        print(result.report())
    if args.plot:
        plot(records, cost_model, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
