"""Accelerator spec table: datasheet numbers and the ridge points the roofline lessons quote."""

from __future__ import annotations

import dataclasses

import pytest

from minengine.perf import ACCELERATORS, Accelerator, UnknownAcceleratorError, get_accelerator
from minengine.perf.hardware import GiB


def test_required_accelerators_present() -> None:
    for key in ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "l4", "l40s", "rtx-4090",
                "mi300x"):
        acc = ACCELERATORS[key]
        assert acc.key == key and acc.source and acc.bf16_tflops > 0 and acc.bandwidth_bytes_per_s > 0
        assert acc.memory_bytes >= 24 * GiB


@pytest.mark.parametrize("key, ridge", [("a100-80gb", 153), ("h100-sxm", 295), ("h100-pcie", 378),
                                        ("h200", 206)])
def test_ridge_points_match_reference(key: str, ridge: float) -> None:
    """REFERENCE.md's roofline table: dense BF16 FLOP/s over bandwidth."""
    assert get_accelerator(key).ridge_point == pytest.approx(ridge, abs=1.5)


def test_datasheet_values() -> None:
    h100 = get_accelerator("h100")
    assert h100.bf16_tflops == pytest.approx(989, abs=1) and h100.fp8_tflops == pytest.approx(1979, abs=1)
    assert h100.bandwidth_bytes_per_s == pytest.approx(3.35e12) and h100.memory_gib == 80
    assert get_accelerator("h200").memory_gib == 141 and get_accelerator("a100-40gb").fp8_tflops is None
    assert get_accelerator("mi300x").memory_gib == 192


def test_lookup_aliases_and_errors() -> None:
    assert get_accelerator("H100").key == "h100-sxm"
    assert get_accelerator("A100_80GB").key == "a100-80gb"
    assert get_accelerator("4090").key == "rtx-4090"
    acc = get_accelerator("l4")
    assert get_accelerator(acc) is acc
    with pytest.raises(UnknownAcceleratorError) as info:
        get_accelerator("tpu-v9")
    message = str(info.value)
    assert "tpu-v9" in message and "h100-sxm" in message and "mi300x" in message
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)


def test_accelerator_is_frozen() -> None:
    acc: Accelerator = get_accelerator("l40s")
    with pytest.raises(dataclasses.FrozenInstanceError):
        acc.memory_bytes = 1  # type: ignore[misc]


def test_the_cpu_matmul_peak_is_the_faster_library(monkeypatch) -> None:
    """On a CPU in fp32 the peak is the better of torch's matmul (MKL) and oneDNN's: a peak is the
    machine's, and MKL ran at half of oneDNN's speed on an AMD EPYC."""
    import torch

    from minengine.perf import measure

    if not measure._has_onednn_linear():
        pytest.skip("this torch has no oneDNN")
    timed = iter([2.0, 1.0])  # seconds: torch's matmul first, then oneDNN's
    monkeypatch.setattr(measure, "_timeit", lambda fn, sync, repeats, budget_s: (fn(), next(timed))[1])
    assert measure.measure_matmul_flops("cpu", n=8) == 2 * 8**3 / 1.0
    timed = iter([1.0])  # bf16: torch's matmul only
    assert measure.measure_matmul_flops("cpu", n=8, dtype=torch.bfloat16) == 2 * 8**3 / 1.0
