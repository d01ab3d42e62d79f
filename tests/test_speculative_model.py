"""The roofline's account of speculative decoding (``minengine.perf.speculative``): a verify step rides
on the weight read while decode is memory-bound, and stops paying as the batch pushes it to the ridge."""

from __future__ import annotations

import pytest

from minengine.perf.roofline import CostModel
from minengine.perf.speculative import breakeven_batch, estimate, expected_tokens_per_step

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@pytest.fixture(scope="module")
def h100_8b() -> CostModel:
    return CostModel.create("llama-3.1-8b", "h100-sxm", dtype="bf16")


def test_expected_tokens_per_step() -> None:
    assert expected_tokens_per_step(0.0, 4) == 1.0  # nothing accepted: the target's own token
    assert expected_tokens_per_step(1.0, 4) == 5.0  # every draft and the bonus
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)  # 1 + 1/2 + 1/4
    assert expected_tokens_per_step(0.8, 0) == 1.0
    for bad in ((1.5, 2), (-0.1, 2), (0.5, -1), (0.5, 2.0)):
        with pytest.raises(ValueError):
            expected_tokens_per_step(*bad)


def test_at_batch_one_a_verify_step_costs_a_decode_step(h100_8b: CostModel) -> None:
    e = estimate(h100_8b, 1, 1024, 4, 0.7)
    # 16 GB of weights read either way; five rows instead of one add almost nothing
    assert e.verify_time == pytest.approx(e.decode_time, rel=0.05)
    assert e.speedup == pytest.approx(expected_tokens_per_step(0.7, 4), rel=0.05)


def test_the_speedup_falls_with_the_batch_and_ends_below_one(h100_8b: CostModel) -> None:
    speedups = [estimate(h100_8b, b, 1024, 4, 0.3).speedup for b in BATCHES]
    assert all(a >= b for a, b in zip(speedups, speedups[1:], strict=False)), speedups
    assert speedups[0] > 1.3 and speedups[-1] < 1.0
    flip = breakeven_batch(h100_8b, 1024, 4, 0.3)
    assert flip is not None and flip in BATCHES
    assert estimate(h100_8b, flip, 1024, 4, 0.3).speedup < 1.0 <= estimate(h100_8b, flip // 2, 1024, 4,
                                                                            0.3).speedup
    # higher acceptance keeps it paying to a larger batch
    later = breakeven_batch(h100_8b, 1024, 4, 0.6)
    assert later is None or later > flip


def test_a_draft_model_as_large_as_the_target_never_pays(h100_8b: CostModel) -> None:
    # k decode steps of the draft cost k decode steps of the target: only acceptance near 1 could win
    assert estimate(h100_8b, 1, 1024, 4, 0.5, draft_model=h100_8b).speedup < 1.0
    assert breakeven_batch(h100_8b, 1024, 4, 0.5, draft_model=h100_8b) == 1
