"""torch's intra-op thread count, for the whole process or for one block of code.

Why a helper: tiny models on a shared CPU time best with one thread, big matmuls with a few, and a
measurement must not leave its setting behind for the next one. The lessons, the experiment widget,
calibration and the benchmarks all set threads through these two functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def set_torch_threads(n: int | None) -> int:
    """Use ``n`` intra-op threads from now on (None or 0: keep torch's setting); returns the count in use."""
    if n:
        torch.set_num_threads(max(1, n))
    return torch.get_num_threads()


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run a block with ``n`` intra-op threads (None or 0: torch's setting), then restore the previous
    count."""
    before = torch.get_num_threads()
    set_torch_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
