"""Quiz verdicts judged outside the student's kernel (minengine/course/trusted_verdicts.py).

The whole path, a class autograded through nbgrader with students who patch or forge the checks, runs in
tests/test_grading.py (``QUIZ_ATTACKS``). Here: the parts on their own, fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbgrader.utils import determine_grade

from minengine.course import grading
from minengine.course.autocheck import REPORT_MARKER, report_answer
from minengine.course.templating import DEFAULT_COURSE_SEED, load_params, render_notebook
from minengine.course.trusted_verdicts import (
    TRUSTED_SOURCE,
    ValueCheck,
    autograde_preprocessors,
    hide_keys_preprocessor,
    keyless_source,
    read_reports,
    trusted_verdicts_preprocessor,
    value_checks,
    verdict,
)

QUIZZES = {a: p for a, p in grading.discover_sources().items() if a.startswith("quiz")}
WHY = "Prefill is compute-bound."
SOURCE = f'grade_choice("q1", q1, "B", why="{WHY}")\ngrade_number("q2", q2, 4.8, 0.5)\n'


def stdout(*lines: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": "".join(line + "\n" for line in lines)}


def reported(name: str, answer: object, capsys: pytest.CaptureFixture) -> str:
    report_answer(name, answer)
    return capsys.readouterr().out.rstrip("\n")


def test_a_test_cells_checks_are_read_from_its_source_with_their_keys() -> None:
    assert value_checks(SOURCE) == [ValueCheck("grade_choice", "q1", {"key": "B", "why": WHY}),
                                    ValueCheck("grade_number", "q2", {"key": 4.8, "tolerance": 0.5})]
    assert value_checks("check_choice_form('q1', q1)\n") == []  # a form check judges nothing
    with pytest.raises(ValueError, match="literal"):
        value_checks("grade_choice('q1', q1, KEY)\n")  # a key the grader can't read is the author's bug


@pytest.mark.parametrize("assignment", sorted(QUIZZES))
def test_every_quiz_question_is_judged_by_the_grader(assignment: str) -> None:
    """Each rendered test cell of each quiz has exactly one value check, named after its question."""
    src = QUIZZES[assignment]
    (nb_path,) = src.glob("*.ipynb")
    rendered = render_notebook(json.loads(nb_path.read_text()), DEFAULT_COURSE_SEED,
                               load_params(src, DEFAULT_COURSE_SEED), f"{src.name}/{nb_path.name}").notebook
    tests = [c for c in rendered["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert tests
    for cell in tests:
        checks = value_checks("".join(cell["source"]))
        grade_id = cell["metadata"]["nbgrader"]["grade_id"]
        assert [c.name for c in checks] == [grade_id.removeprefix("check_")], grade_id


def test_one_right_report_per_check_passes(capsys: pytest.CaptureFixture) -> None:
    outputs = [stdout(reported("q1", " b ", capsys), "some print of the student's",
                      reported("q2", 5, capsys))]
    assert read_reports(outputs) == {"q1": [{"name": "q1", "value": " b "}],
                                     "q2": [{"name": "q2", "value": 5}]}
    assert verdict(value_checks(SOURCE), outputs) is None


@pytest.mark.parametrize(("lines", "expected"), [
    ([("q1", "C"), ("q2", 4.8)], "the answer is B, you gave 'C'. " + WHY),
    ([("q1", "B"), ("q2", 9.0)], "the answer is 4.8 (within 0.5)"),
    ([("q1", "B")], "q2: no answer reached the grader"),
    ([("q1", "A"), ("q1", "B"), ("q2", 4.8)], "q1: 2 answers reported"),
    ([("q1", "B"), ("q2", "4.8")], "answer with a number"),
    ([("q1", "B"), ("q2", True)], "answer with a number"),
    ([("q1", float("nan")), ("q2", 4.8)], "not a letter"),
    ([("q1", object()), ("q2", 4.8)], "the answer is a object, not a value"),
])
def test_a_wrong_missing_repeated_or_odd_answer_fails(lines: list, expected: str,
                                                      capsys: pytest.CaptureFixture) -> None:
    outputs = [stdout(*(reported(name, value, capsys) for name, value in lines))]
    message = verdict(value_checks(SOURCE), outputs)
    assert message is not None and expected in message


def test_only_the_cells_own_stdout_counts(capsys: pytest.CaptureFixture) -> None:
    report = reported("q1", "B", capsys)
    elsewhere = [{"output_type": "stream", "name": "stderr", "text": report + "\n"},
                 {"output_type": "display_data", "data": {"text/plain": report}, "metadata": {}},
                 stdout(REPORT_MARKER + "{not json", REPORT_MARKER + '["a list"]')]
    assert read_reports(elsewhere) == {}


def grade_cell(source: str, outputs: list[dict]) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "points": 1,
                                 "grade_id": "check_q1", "schema_version": 3}
    cell.outputs = [nbformat.from_dict(o) for o in outputs]
    return cell


def test_the_preprocessor_turns_a_failed_verdict_into_zero_points(capsys: pytest.CaptureFixture) -> None:
    """nbgrader scores a test cell by its outputs: the preprocessor's error output makes it 0, and a cell
    whose answer the grader accepts keeps its point."""
    source = 'grade_choice("q1", q1, "B")\n'
    judge = trusted_verdicts_preprocessor()()
    passed, _ = judge.preprocess_cell(grade_cell(source, [stdout(reported("q1", "B", capsys))]), {}, 0)
    assert determine_grade(passed) == (1, 1)
    silent, _ = judge.preprocess_cell(grade_cell(source, []), {}, 0)  # checks replaced: nothing reported
    assert determine_grade(silent) == (0, 1) and "no answer reached" in silent.outputs[-1].evalue


def test_the_course_config_runs_the_judge_right_after_the_kernel(tmp_path: Path) -> None:
    names = [step.__name__ for step in autograde_preprocessors()]
    assert names[:3] == ["HideKeys", "SandboxedExecute", "TrustedVerdicts"]
    assert names.index("SaveAutoGrades") > 2
    grading.write_config(tmp_path)
    steps = grading.load_config(tmp_path).Autograde.autograde_preprocessors
    assert [step.__name__ for step in steps] == names


def test_the_kernel_runs_each_check_without_its_key() -> None:
    """IPython shows a cell's source to the student's hooks before running it, so the kernel gets the
    checks with name and answer only; the trusted source comes back before the verdict."""
    source = ("from minengine.course.autocheck import check_choice_form, grade_choice\n"
              "check_choice_form('q1', globals().get('q1'))\n" + SOURCE)
    keyless = keyless_source(source)
    assert keyless is not None
    for secret in ('"B"', "'B'", "4.8", "0.5", WHY):
        assert secret not in keyless
    assert "grade_choice('q1', q1)" in keyless and "grade_number('q2', q2)" in keyless
    assert "check_choice_form('q1', globals().get('q1'))" in keyless  # the rest runs as written
    assert keyless_source("check_choice_form('q1', q1)\n") is None
    assert keyless_source("this is not python") is None


def test_hide_keys_and_the_verdict_round_trip(capsys: pytest.CaptureFixture) -> None:
    cell = grade_cell(SOURCE, [])
    hidden, _ = hide_keys_preprocessor()().preprocess_cell(cell, {}, 0)
    assert hidden.source == keyless_source(SOURCE) and hidden.metadata[TRUSTED_SOURCE] == SOURCE
    hidden.outputs = [nbformat.from_dict(stdout(reported("q1", "B", capsys), reported("q2", 4.9, capsys)))]
    judged, _ = trusted_verdicts_preprocessor()().preprocess_cell(hidden, {}, 0)
    assert judged.source == SOURCE and TRUSTED_SOURCE not in judged.metadata
    assert determine_grade(judged) == (1, 1)


def test_a_keyless_check_in_the_kernel_only_reports(capsys: pytest.CaptureFixture) -> None:
    from minengine.course import autocheck

    autocheck.grade_choice("q1", "D")  # wrong, but the kernel cannot know: the grader judges
    autocheck.grade_number("q2", 1e9)
    assert capsys.readouterr().out.count(REPORT_MARKER) == 2
