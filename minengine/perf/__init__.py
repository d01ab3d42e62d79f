"""Performance models: accelerator specs, this machine's measured limits, and the roofline cost model."""

from minengine.perf.hardware import (
    ACCELERATORS,
    Accelerator,
    UnknownAcceleratorError,
    get_accelerator,
    list_accelerators,
)

__all__ = ["ACCELERATORS", "Accelerator", "UnknownAcceleratorError", "get_accelerator", "list_accelerators"]
# The roofline (minengine.perf.roofline) and measure_this_machine (minengine.perf.measure) are imported
# from their modules: the measurement needs torch, and `minengine kv` must start without it.
