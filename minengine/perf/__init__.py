"""Performance models: accelerator specs (and, later, rooflines and measurements of this machine)."""

from minengine.perf.hardware import (
    ACCELERATORS,
    Accelerator,
    UnknownAcceleratorError,
    get_accelerator,
    list_accelerators,
)

__all__ = ["ACCELERATORS", "Accelerator", "UnknownAcceleratorError", "get_accelerator", "list_accelerators"]
