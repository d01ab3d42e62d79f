"""The torch-free core shared by the real engine and the simulator.

request -> scheduler (policies, block manager) -> SchedulerOutput -> an executor -> update -> records.
``EngineCore`` runs that loop; ``minengine.engine`` plugs the PyTorch model runner into it and
``minengine.sim`` a roofline cost model. Nothing here imports torch or anything above this package.
"""

from minengine.core.block_manager import BlockManager
from minengine.core.engine_core import (
    EngineCore,
    EngineCoreOutput,
    Executor,
    ModelRunnerOutput,
    NullExecutor,
    StepInFlight,
)
from minengine.core.policies import DecodeFirstPolicy, PrefillFirstPolicy, SchedulingPolicy, make_policy
from minengine.core.records import RequestRecord, StepRecord
from minengine.core.request import Request, RequestStatus
from minengine.core.sampling_params import RequestOutputKind, SamplingParams
from minengine.core.sched_output import ScheduledRequest, SchedulerOutput
from minengine.core.scheduler import Scheduler, check_request_size

__all__ = [
    "BlockManager",
    "DecodeFirstPolicy",
    "EngineCore",
    "EngineCoreOutput",
    "Executor",
    "ModelRunnerOutput",
    "NullExecutor",
    "PrefillFirstPolicy",
    "Request",
    "RequestRecord",
    "RequestOutputKind",
    "RequestStatus",
    "SamplingParams",
    "ScheduledRequest",
    "SchedulerOutput",
    "Scheduler",
    "SchedulingPolicy",
    "StepInFlight",
    "StepRecord",
    "check_request_size",
    "make_policy",
]
