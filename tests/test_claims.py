"""Claim checks (``minengine.course.claims``): what they print, what they record, and that they never
raise."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

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


# ------------------------------------------------------------------------------------- exercises
CASES = [((80, 2.0), 0.9625), ((40, 3.0, 1.0), 0.9)]


def test_an_exercise_not_written_yet_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    def mine(gpu_gib: float, outside_gib: float, margin_gib: float = 1.0) -> None:
        return None

    assert claims.check_exercise("e", mine, CASES) is None
    assert "not written yet" in capsys.readouterr().out


@pytest.mark.parametrize(("body", "says"), [
    (lambda g, o, m=1.0: 1 - o / g, "expected 0.9625"),  # forgot the margin
    (lambda g, o, m=1.0: 1 / 0, "raised ZeroDivisionError: division by zero"),
    (lambda g, o, m=1.0: "0.9", "returned 0.9, expected 0.9625"),  # a numeric string is read as a number
    (lambda g, o, m=1.0: "lots", "not a number"),
])
def test_a_wrong_exercise_names_the_case_and_never_raises(body: Any, says: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert claims.check_exercise("e", body, CASES) is False
    out = capsys.readouterr().out
    assert says in out and "Traceback" not in out


def test_a_right_exercise_passes_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert claims.check_exercise("e", lambda g, o, m=1.0: 1 - (o + m) / g, CASES) is True
    assert "right on all 2 cases" in capsys.readouterr().out


def test_each_lesson_exercise_model_answer_passes_its_own_check() -> None:
    """The folded model answer under every exercise cell, run through that cell's own check call."""
    lessons = sorted((Path(__file__).resolve().parents[1] / "lessons").glob("*.ipynb"))
    checked, exercised = 0, set()
    for path in lessons:
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or "check_exercise(" not in source:
                continue
            answer = re.search(r"```python\n(.*?)```", "".join(cells[i + 1]["source"]), re.S)
            assert answer, f"{path.name}: no model answer in the cell after exercise cell {i}"
            namespace: dict[str, Any] = {"check_exercise": claims.check_exercise}
            exec(answer.group(1), namespace)  # the model answer defines the function...
            exercise = source.split("\n\n\ncheck_exercise(", 1)
            assert len(exercise) == 2, f"{path.name} cell {i}: the check call follows the function"
            call = "check_exercise(" + exercise[1]
            assert eval(call.rstrip().rstrip(";"), namespace) is True, (path.name, i)  # ...which passes
            checked += 1
            exercised.add(path.name)
    assert exercised == {path.name for path in lessons}, "lessons without a code exercise"
    assert checked >= len(lessons)


def test_each_lesson_asks_the_learner_to_explain_before_a_model_answer() -> None:
    """Every lesson has a place where the learner writes an explanation, with a folded model answer after
    it (issue 39: the learner writes the conclusion, the claim lines only confirm it)."""
    for path in sorted((Path(__file__).resolve().parents[1] / "lessons").glob("*.ipynb")):
        cells = ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]]
        places = [i for i, text in enumerate(cells) if re.search(r"^\*Your explanation", text, re.M)]
        assert places, f"{path.name}: no cell for the learner's explanation"
        for i in places:
            after = "\n".join(cells[i : i + 2])
            assert "<details><summary>" in after, f"{path.name} cell {i}: no folded answer after it"
