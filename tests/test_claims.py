"""Claim checks (``minengine.course.claims``): what they print, what they record, and that they never
raise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minengine.course import claims


@pytest.fixture(autouse=True)
def fresh() -> None:
    claims.reset()


def test_held_claim_prints_as_expected(capsys: pytest.CaptureFixture[str]) -> None:
    result = claims.check_claim("x", np.float64(3) > 2, "three is more than two", "arithmetic broke")
    out = capsys.readouterr().out
    assert out.startswith(claims.HELD_PREFIX) and "three is more than two" in out
    assert result.holds and not result.failed and claims.failed() == []


def test_failed_must_hold_claim_carries_the_marker(capsys: pytest.CaptureFixture[str]) -> None:
    result = claims.check_claim("y", False, "the queue was empty", "a request waited 3 ms")
    out = capsys.readouterr().out
    assert out.startswith(claims.FAILED_MARKER) and "[y]" in out and "a request waited 3 ms" in out
    assert result.failed and claims.failed() == [result]
    assert claims.FAILED_MARKER in claims.summary()


def test_machine_dependent_claim_explains_without_the_marker(capsys: pytest.CaptureFixture[str]) -> None:
    result = claims.check_claim("z", False, "decode is bandwidth-bound", "this CPU's caches hold the model",
                                must_hold=False)
    out = capsys.readouterr().out
    assert out.startswith(claims.DIFFERS_PREFIX) and "caches" in out and claims.FAILED_MARKER not in out
    assert not result.failed and "differ here: z" in claims.summary()


def test_nan_and_arrays_do_not_hold_and_do_not_raise() -> None:
    assert not claims.check_claim("nan", math.nan, "c", "o", quiet=True).holds
    assert not claims.check_claim("array", np.array([True, False]), "c", "o", quiet=True).holds


def test_rerun_replaces_its_entry() -> None:
    claims.check_claim("a", False, "c", "o", quiet=True)
    claims.check_claim("a", True, "c", "o", quiet=True)
    assert ([r.holds for r in claims.results()] == [True]
            and claims.summary() == "1 of 1 claims held on this run")


def test_a_claim_needs_its_words() -> None:
    with pytest.raises(ValueError):
        claims.check_claim("a", True, "", "o")


@pytest.mark.parametrize("predicted, expected", [(None, "no prediction written"), (10, "close"),
                                                 (2, "off by a factor 5.5"), ("ten", "not a number"),
                                                 (-1, "other side of zero")])
def test_compare_prediction(predicted: object, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = claims.compare_prediction(predicted, 11.0, "TTFT", "ms")  # type: ignore[arg-type]
    assert expected in text and text in capsys.readouterr().out
