"""Small helpers every layer uses (torch-free, import-free), named as vLLM names them (``vllm.utils``)."""

from __future__ import annotations

from collections.abc import Iterable


def cdiv(a: int, b: int) -> int:
    """Ceiling division of integers: how many blocks of ``b`` hold ``a`` items (``-(-a // b)``)."""
    return -(a // -b)


def cumsum(sizes: Iterable[int]) -> list[int]:
    """Offsets of consecutive runs: ``[0, a, a + b, ...]`` (a batch's ``query_start_loc``, a fused
    weight's row bounds)."""
    out = [0]
    for n in sizes:
        out.append(out[-1] + n)
    return out
