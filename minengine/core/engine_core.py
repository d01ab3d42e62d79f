"""``EngineCore``: the one step loop, shared by the real engine and the simulator.

    step() = scheduler.schedule() -> executor.execute_model(scheduler_output)
             -> scheduler.update_from_output(...) -> a StepRecord

An *executor* is anything with ``execute_model(scheduler_output) -> ModelRunnerOutput`` (vLLM v1's
shape). The engine's ``ModelRunner`` runs the PyTorch model and samples; the simulator's
``RooflineExecutor`` predicts how long the step would take on a GPU and samples a dummy token;
``NullExecutor`` does neither (scheduler tests and benchmarks). The scheduler never learns which one it
talks to, so a policy measured on a laptop and predicted at H100 scale is the same object.

A step has two halves, ``start_step`` (schedule and execute) and ``finish_step`` (apply the results),
because a simulated step *ends later*: the simulator starts it, lets simulated time pass while other
events happen, and finishes it at its predicted end. The real engine calls ``step()``, both at once.

Torch-free, like everything in ``minengine.core``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from minengine.core.records import StepRecord
from minengine.core.request import Request
from minengine.core.sched_output import SchedulerOutput
from minengine.core.scheduler import Scheduler, StopChecker

MAX_STEP_RECORDS = 100_000  # kept by a long-running engine (a server); older ones are dropped


@dataclass
class ModelRunnerOutput:
    """What an executor returns for one step (vLLM v1's name).

    ``sampled_token_ids`` maps each request that got a new token (``ScheduledRequest.sample``) to it, or,
    for a decode that verified drafts (speculative decoding), to the list of tokens it keeps.
    ``elapsed`` is the step's duration for executors that *predict* it (the simulator); real executors
    leave it None and the core reads its clock. ``timings`` are phase times in seconds for the
    StepRecord: ``t_prepare``, ``t_forward``, ``t_sample``; ``timing`` says how they were taken.
    """

    sampled_token_ids: dict[str, int | list[int]]
    elapsed: float | None = None
    timings: dict[str, float] = field(default_factory=dict)
    timing: str = ""


class Executor(Protocol):
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...


@dataclass
class StepInFlight:
    """A step that was scheduled and executed but whose results are not applied yet."""

    scheduler_output: SchedulerOutput
    runner_output: ModelRunnerOutput
    start: float
    t_schedule: float

    @property
    def end(self) -> float | None:
        """When the step ends, for executors that predict it (None: ask the clock at finish)."""
        elapsed = self.runner_output.elapsed
        return None if elapsed is None else self.start + elapsed


@dataclass
class EngineCoreOutput:
    """One finished step: what ran, the tokens it produced, who finished, and its record."""

    scheduler_output: SchedulerOutput
    sampled_token_ids: dict[str, int | list[int]]
    finished: list[Request]
    record: StepRecord


class EngineCore:
    """Drives one ``Scheduler`` with one executor and writes a ``StepRecord`` per step.

    ``clock`` is the time source for the scheduler and the records: ``time.perf_counter`` for a real
    engine (a CUDA executor synchronises before reading it), the simulated time for the simulator.
    ``stop_checker`` lets the engine's detokenizer end a request on a stop string.
    """

    def __init__(
        self, scheduler: Scheduler, executor: Executor, clock: Callable[[], float] | None = None,
        stop_checker: StopChecker | None = None, max_step_records: int | None = MAX_STEP_RECORDS,
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock if clock is not None else scheduler.clock
        self.stop_checker = stop_checker
        self.step_records: deque[StepRecord] = deque(maxlen=max_step_records)
        self.num_steps = 0

    # ---- requests (through the scheduler's public seams) ----
    def add_request(self, request: Request, num_computed_tokens: int = 0) -> None:
        self.scheduler.add_request(request, num_computed_tokens)

    def abort_request(self, request_id: str) -> Request | None:
        return self.scheduler.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ---- the step ----
    def step(self) -> EngineCoreOutput | None:
        """Run one whole step; None when there is nothing to run."""
        inflight = self.start_step()
        return None if inflight is None else self.finish_step(inflight)

    def start_step(self) -> StepInFlight | None:
        """Schedule a batch and execute it; None when nothing is unfinished."""
        start = self.clock()
        scheduler_output = self.scheduler.schedule()
        t_schedule = self.clock() - start
        if not scheduler_output.entries:
            if self.scheduler.has_unfinished_requests():
                raise RuntimeError(
                    f"the scheduler scheduled nothing although {len(self.scheduler.requests)} requests "
                    f"are unfinished: policy {self.scheduler.policy!r} left every request out"
                )
            return None
        runner_output = self.executor.execute_model(scheduler_output)
        return StepInFlight(scheduler_output, runner_output, start, t_schedule)

    def finish_step(self, inflight: StepInFlight) -> EngineCoreOutput:
        """Apply a step's sampled tokens (at its end time), stop finished requests, write the record."""
        out, result = inflight.scheduler_output, inflight.runner_output
        end = inflight.end
        now = self.clock() if end is None else end
        finished = self.scheduler.update_from_output(out, result.sampled_token_ids, now, self.stop_checker)
        self.num_steps += 1
        timings = {"t_schedule": inflight.t_schedule, **result.timings}
        if end is not None and "t_forward" not in timings:
            timings["t_forward"] = result.elapsed or 0.0  # a predicted step is all forward time
        record = out.to_step_record(
            self.num_steps, inflight.start, self.clock() if end is None else end, **timings
        )
        record.timing = result.timing or ("predicted" if end is not None else "")
        self.step_records.append(record)
        return EngineCoreOutput(out, result.sampled_token_ids, finished, record)


class NullExecutor:
    """Computes nothing and takes no time: for scheduler tests and the scheduler-overhead benchmark.

    Every request that samples gets ``token``: one id for all (cheapest), or ``token(request)``.
    """

    def __init__(self, token: int | Callable[[Request], int] = 1, elapsed: float | None = None) -> None:
        self.token = token
        self.elapsed = elapsed

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        token, entries = self.token, scheduler_output.entries
        if isinstance(token, int):
            sampled = {e[0].request_id: token for e in entries if e[4]}
        else:
            sampled = {e[0].request_id: token(e[0]) for e in entries if e[4]}
        return ModelRunnerOutput(sampled, elapsed=self.elapsed)
