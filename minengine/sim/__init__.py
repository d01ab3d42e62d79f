"""The simulator: the engine's own scheduler and block manager, timed by a roofline instead of a GPU.

``Simulator("llama-2-7b", "h100", max_num_batched_tokens=512).run(synthetic_workload(500, rate=4))``
returns the same records a real run writes, so ``result.summary()`` prints vLLM's benchmark table.
``DisaggregatedCluster`` splits prefill and decode over two pools; ``sweep`` runs a range of request
rates; ``minengine.sim.calibrate`` (which needs torch) fits the cost model to this machine's engine.

Nothing here imports torch: simulating an H100 takes a laptop CPU and a few seconds. Names load on first
use, so ``minengine --help`` (which imports ``minengine.cli.simulate``) stays instant.
"""

from __future__ import annotations

from minengine._lazy import lazy_exports

_EXPORTS = {
    "CostModel": "minengine.perf.roofline",
    "ModelShape": "minengine.perf.roofline",
    "StepCost": "minengine.perf.roofline",
    "DisaggregatedCluster": "minengine.sim.cluster",
    "RooflineExecutor": "minengine.sim.executor",
    "SimInstance": "minengine.sim.instance",
    "SimResult": "minengine.sim.simulator",
    "Simulator": "minengine.sim.simulator",
    "SweepResult": "minengine.sim.simulator",
    "simulate": "minengine.sim.simulator",
    "sweep": "minengine.sim.simulator",
    "Fixed": "minengine.sim.workload",
    "LengthDist": "minengine.sim.workload",
    "LogNormal": "minengine.sim.workload",
    "RequestSpec": "minengine.sim.workload",
    "Uniform": "minengine.sim.workload",
    "arrival_times": "minengine.sim.workload",
    "load_trace": "minengine.sim.workload",
    "save_trace": "minengine.sim.workload",
    "synthetic_workload": "minengine.sim.workload",
    "with_rate": "minengine.sim.workload",
    "calibrate": "minengine.sim.calibrate",
    "fit_cost_model": "minengine.sim.calibrate",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
