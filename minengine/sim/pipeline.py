"""Pipeline parallelism in the simulator: p stages shared by p virtual engines, and the bubble.

A pipeline-parallel replica puts each stage's layers on its own GPUs. One batch crosses the stages in
turn, so on its own it is no faster than one GPU holding the whole model, and while it is in stage 2
stage 1 has nothing to do. To keep every stage busy the replica runs p batches at once, each a step
behind the other (GPipe's micro-batches, Huang et al. 2019). vLLM's V0 engine did this with p *virtual
engines*: p schedulers, each with 1/p of the KV blocks (``num_gpu_blocks //= pipeline_parallel_size``
in its ``Scheduler``), new requests going to the one with fewest unfinished. That is what this module
builds from the engine's own ``EngineCore``s; vLLM's V1 engine gets the same overlap from one scheduler
and a queue of p batches in flight.

A decode batch cannot start its next step until its last one has left the last stage (the next token
depends on it), so with m < p batches in flight the stages are busy m/p of the time at most: the
bubble. With one request, there is one batch: PP then buys memory (each GPU holds 1/p of the weights and
of the KV cache), not speed.
"""

from __future__ import annotations

from collections.abc import Callable

from minengine.core.engine_core import ModelRunnerOutput
from minengine.core.sched_output import SchedulerOutput
from minengine.sim.executor import RooflineExecutor


class Pipeline:
    """The stages of one replica: when each is next free, and how long each has worked."""

    def __init__(self, num_stages: int) -> None:
        self.free_at = [0.0] * num_stages
        self.busy_s = [0.0] * num_stages

    def run(self, start: float, stage_times: list[float]) -> float:
        """Send a batch in at ``start``: each stage takes it when the batch arrives and the stage is free
        (first come, first served); returns when it leaves the last stage."""
        t = start
        for i, work in enumerate(stage_times):
            t = max(t, self.free_at[i]) + work
            self.free_at[i] = t
            self.busy_s[i] += work
        return t

    def utilization(self, elapsed_s: float) -> list[float]:
        """The share of ``elapsed_s`` each stage spent working; 1 minus it is the bubble."""
        return [b / elapsed_s if elapsed_s > 0 else 0.0 for b in self.busy_s]


class PipelineExecutor:
    """One virtual engine's executor: the shared roofline executor prices the batch stage by stage, and
    the step lasts until the batch leaves the pipeline (waiting for any stage another engine holds)."""

    def __init__(self, executor: RooflineExecutor, pipeline: Pipeline, clock: Callable[[], float]) -> None:
        self.executor, self.pipeline, self.clock = executor, pipeline, clock

    @property
    def acceptance_rate(self) -> float | None:  # SimInstance checks it for speculative decoding
        return self.executor.acceptance_rate

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        out = self.executor.execute_model(scheduler_output)
        now = self.clock()
        out.elapsed = self.pipeline.run(now, self.executor.last_stage_times) - now
        return out
