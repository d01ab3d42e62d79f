"""One simulated engine replica, the event loop that moves simulated time, and routers.

A ``SimInstance`` is an ``EngineCore`` (the engine's real ``Scheduler`` and ``BlockManager``) whose
executor is the roofline cost model and whose clock is simulated time. A step starts at ``now``;
``start_step`` returns when it will end; the event loop runs other events (arrivals, other instances'
steps, KV transfers) until then and calls ``finish_step``. Requests that arrive while a step runs wait
for the next ``schedule()``, as in the real engine.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

from minengine.config import EngineConfig
from minengine.core.engine_core import EngineCore, Executor, StepInFlight
from minengine.core.records import StepRecord
from minengine.core.request import Request
from minengine.core.scheduler import Scheduler
from minengine.sim.executor import SimDrafter


class SimInstance:
    """One engine replica: the real scheduler, a simulated executor and clock, its step records."""

    def __init__(self, name: str, config: EngineConfig, num_blocks: int, executor: Executor) -> None:
        drafter = None
        if config.speculative_config is not None:
            if getattr(executor, "acceptance_rate", None) is None:
                raise ValueError("simulating speculative decoding needs an acceptance_rate (0 to 1, the "
                                 "chance that each draft is kept): no model runs here to check the drafts")
            assert config.max_model_len is not None
            drafter = SimDrafter(config.speculative_config.num_speculative_tokens, config.max_model_len)
        self.name = name
        self.now = 0.0
        scheduler = Scheduler(config, num_blocks, clock=lambda: self.now, drafter=drafter)
        self.core = EngineCore(scheduler, executor, max_step_records=None)
        self.incoming = 0  # disaggregation: KV transfers on their way here
        self.busy = False
        self._inflight: StepInFlight | None = None

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def steps(self) -> list[StepRecord]:
        return list(self.core.step_records)

    @property
    def load(self) -> int:
        """Unfinished requests here, counting those whose KV is still on its way (least-loaded routing)."""
        return len(self.scheduler.requests) + self.incoming

    def add_request(self, request: Request, num_computed_tokens: int = 0) -> None:
        self.core.add_request(request, num_computed_tokens)

    def start_step(self, now: float) -> float | None:
        """Start a step at ``now``; returns when it ends, or None when there is nothing to run."""
        self.now = now
        self._inflight = self.core.start_step()
        return None if self._inflight is None else self._inflight.end

    def finish_step(self, end: float) -> list[Request]:
        """End the running step at ``end``; returns the requests that finished in it."""
        assert self._inflight is not None, "finish_step without a step in flight"
        inflight, self._inflight, self.now = self._inflight, None, end
        return self.core.finish_step(inflight).finished


class EventLoop:
    """A heap of (time, callback): the whole discrete-event machinery."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, time: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (time, next(self._seq), callback))

    def run(self) -> None:
        while self._heap:
            self.now, _, callback = heapq.heappop(self._heap)
            callback()


# ------------------------------------------------------------------------------------------ routing
def round_robin() -> Callable[[Sequence[SimInstance]], SimInstance]:
    counter = itertools.count()
    return lambda instances: instances[next(counter) % len(instances)]


def least_loaded() -> Callable[[Sequence[SimInstance]], SimInstance]:
    return lambda instances: min(instances, key=lambda inst: inst.load)


ROUTERS = {"round_robin": round_robin, "least_loaded": least_loaded}


def make_router(name: str) -> Callable[[Sequence[SimInstance]], SimInstance]:
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; use one of {', '.join(ROUTERS)}")
    return ROUTERS[name]()
