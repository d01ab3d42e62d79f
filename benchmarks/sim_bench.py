"""Simulator speed (10,000 requests) and fidelity (calibrated step-time error against the real engine).

    .venv/bin/python benchmarks/sim_bench.py                       # 10k requests x 2 patterns, calibration
    .venv/bin/python benchmarks/sim_bench.py --skip-calibration --repeats 3
    .venv/bin/python benchmarks/sim_bench.py --smoke
    .venv/bin/python benchmarks/sim_bench.py --skip-calibration --num-requests 100000 --workloads poisson

Both the wall time and the process's CPU time are reported: on a shared machine the CPU time moves
less with the neighbours' load (the run is single-threaded, so alone the two agree).

Speed matters because lessons sweep request rates and cluster shapes interactively: a simulator that
takes minutes per point kills the exploration. The simulator runs the engine's real ``Scheduler`` and
``BlockManager`` in Python, so its speed is the scheduler's speed times the number of steps. Two
workloads of nano-vllm's lengths (prompt and output uniform in [100, 1024]) on Llama-3.1-8B / H100:
Poisson arrivals at ``--rate`` and an offline batch (everything at time 0, the largest batches).

Fidelity: ``minengine.sim.calibrate`` runs the real engine on this CPU (a random Llama, hidden 512, 8
layers, one thread), fits the per-op roofline (four efficiencies + overheads) to its StepRecords and
reports the median absolute step-time error over all steps, over held-out steps (fit on even, scored on
odd), and per kind of step (prefill, decode, mixed) with its median signed error.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tqdm.auto import tqdm

from minengine.sim import Simulator, Uniform, synthetic_workload

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/sim_bench.py
    import common  # type: ignore[no-redef]


def sim_speed(num_requests: int, rate: float, repeats: int, model: str, gpu: str, bar: Any) -> dict[str, Any]:
    lengths = Uniform(100, 1024)
    work = synthetic_workload(num_requests, rate, lengths, lengths, seed=0)
    walls, cpus, loads, result = [], [], [], None
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        result = Simulator(model, gpu).run(work)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
        loads.append(common.loadavg()[0])
        bar.update(1)
    assert result is not None
    s = result.summary()
    wall = common.median(walls)
    return {"requests": num_requests, "rate": rate, "wall_s": wall, "walls": walls,
            "cpu_s": common.median(cpus), "cpus": cpus,
            "steps": len(result.steps), "steps_per_s": len(result.steps) / wall,
            "requests_per_wall_s": num_requests / wall, "simulated_s": s.duration,
            "sim_output_tok_s": s.output_throughput, "loads": loads}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=20.0, help="Poisson arrival rate (requests/s)")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--repeats", type=int, default=1, help="runs per workload (~1 min each here)")
    ap.add_argument("--calib-requests", type=int, default=24, help="requests of the calibration workload")
    ap.add_argument("--skip-calibration", action="store_true")
    ap.add_argument("--workloads", default="poisson,offline", help="comma-separated: poisson, offline")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="200 requests, 1 repeat, tiny calibration")
    args = ap.parse_args(argv)
    if args.smoke:
        args.num_requests, args.repeats, args.calib_requests = 200, 1, 6
    print(common.machine_line())
    out: dict[str, Any] = {}
    workloads = [w for w in (("poisson", args.rate), ("offline", float("inf")))
                 if w[0] in args.workloads.split(",")]
    if not workloads:
        ap.error(f"--workloads {args.workloads!r}: name poisson, offline or both")
    total = len(workloads) * args.repeats + (not args.skip_calibration)
    with tqdm(total=total, desc="simulations", dynamic_ncols=True) as bar:
        for name, rate in workloads:
            out[name] = sim_speed(args.num_requests, rate, args.repeats, args.model, args.gpu, bar)
        if not args.skip_calibration:
            from minengine.sim.calibrate import MEDIUM_LLAMA, calibrate

            model = None
            if args.smoke:
                model = {**MEDIUM_LLAMA, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
            start = time.perf_counter()
            cal = calibrate(model, num_requests=args.calib_requests)
            out["calibration"] = {"mape": cal.mape, "holdout_mape": cal.holdout_mape,
                                  "kinds": cal.kind_errors(), "steps": len(cal.measured),
                                  "wall_s": time.perf_counter() - start, "report": cal.report(),
                                  "load": common.loadavg()[0]}
            bar.update(1)

    print(f"\ncommand: {common.command_line()}")
    print(common.machine_line())
    print(f"simulated {args.model} on {args.gpu} (per-op roofline, table efficiencies), prompt and output "
          f"lengths uniform in [100, 1024], engine defaults; median of {args.repeats} runs\n")
    rows = [[f"{name} ({'rate ' + format(r['rate'], 'g') + '/s' if name == 'poisson' else 'all at t=0'})",
             f"{r['requests']:,}", f"**{r['wall_s']:.2f}**", f"{r['cpu_s']:.2f}", f"{r['steps']:,}",
             f"{r['steps_per_s']:,.0f}", f"{r['requests_per_wall_s']:,.0f}", f"{r['simulated_s']:.0f}",
             f"{r['sim_output_tok_s']:,.0f}", " ".join(f"{x:.2f}" for x in r["loads"])]
            for name, r in out.items() if name != "calibration"]
    print(common.md_table(["workload", "requests", "wall s", "CPU s", "sim steps", "steps/s", "requests/s",
                           "simulated s", "sim output tok/s", "load avg"], rows))
    if "calibration" in out:
        c = out["calibration"]
        print(f"\nCalibration ({c['wall_s']:.0f} s, load {c['load']:.2f}): median |step-time error| "
              f"**{100 * c['mape']:.1f} %** over {c['steps']} steps, **{100 * c['holdout_mape']:.1f} %** "
              f"held out\n\n```\n{c['report']}\n```")
    common.save_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
