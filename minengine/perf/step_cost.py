"""What one step costs: the per-op breakdown (``OpCost``) and its total (``StepCost``).

``minengine.perf.roofline.CostModel.step_cost`` fills them in; see its module docstring for the model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpCost:
    """One operation of a step: its FLOPs and bytes and the time each would take at its efficiency."""

    name: str
    flops: float
    bytes: float
    compute_time: float
    memory_time: float

    @property
    def time(self) -> float:
        return max(self.compute_time, self.memory_time)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_time >= self.memory_time else "memory"


@dataclass(frozen=True)
class StepCost:
    """FLOPs, bytes and predicted time of one step, with the per-op breakdown (``ops``). Seconds."""

    num_tokens: int
    linear_flops: float
    attention_flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    compute_time: float  # sum over ops of FLOPs / (peak x efficiency)
    memory_time: float  # sum over ops of bytes / (bandwidth x efficiency)
    overhead: float
    ops: tuple[OpCost, ...] = ()
    other_bytes: float = 0.0  # activations of the element-wise kernels and the logits

    @property
    def flops(self) -> float:
        return self.linear_flops + self.attention_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes + self.other_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte moved from memory."""
        return self.flops / self.bytes if self.bytes else float("inf")

    @property
    def bound(self) -> str:
        """"compute" or "memory": which kind of op takes most of this step's time."""
        compute = sum(op.time for op in self.ops if op.bound == "compute")
        return "compute" if compute >= sum(op.time for op in self.ops) - compute else "memory"

    @property
    def time(self) -> float:
        """The predicted step time: the sum of every op's own roofline time, plus the overhead."""
        return sum(op.time for op in self.ops) + self.overhead

    def op(self, name: str) -> OpCost | None:
        return next((op for op in self.ops if op.name == name), None)

    def breakdown(self) -> str:
        """One line per op: time, and what bounds it."""
        return "\n".join(f"{op.name:>18}: {1e3 * op.time:8.3f} ms ({op.bound})" for op in self.ops if op.time)
