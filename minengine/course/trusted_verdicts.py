"""Quiz verdicts that the student's kernel cannot reach: the kernel reports answers, the grader judges.

Why: nbgrader runs a test cell in the student's own kernel, after the student's cells, and scores it by
whether it raised. A check that runs there can be replaced from an answer cell, for example by setting
every ``autocheck.grade_*`` to a no-op, which once earned full marks on every quiz with junk answers.

So a value check (``grade_choice``, ``grade_number``) first *reports* the student's answer from the
kernel, as one stdout line ``minengine-answer: {"name": ..., "value": ...}``, then checks it there too,
which gives the learner the usual message. After the kernel has run, ``TrustedVerdicts``, a preprocessor
in nbgrader's own autograde pipeline (the course's ``nbgrader_config.py`` puts it there, so ``make
autograde``, ``nbgrader autograde`` and the formgrader all use it), reads each check from the test cell's
*source* in the grader's process (nbgrader has restored it from the gradebook, so the student cannot
have edited it), finds exactly one report per check in that cell's output, and judges the value with the
same function. A cell whose check is missing its report, reported twice, or wrong gets an error output,
which nbgrader scores 0.

The kernel never sees a key. Whatever runs in the kernel can read the source of the cell about to run
(IPython hands it to every ``pre_run_cell`` hook), so a student's cell once read each key out of the
hidden test and made it the answer: 10/10 with one cell. ``HideKeys``, the step just before ``Execute``,
gives the kernel each check with its name and answer only (no key, tolerance or explanation), and
``TrustedVerdicts`` puts the cell's own source back before judging it, so the feedback shows it whole.

A forged report gains nothing: to pass it must carry the right answer, which is what the question asked
for; several reports for one check (one per option) fail. This covers answers that are values (the
quizzes). Code that must run (the labs' functions) is a separate matter: see ``labs/README.md``.
"""

from __future__ import annotations

import ast
import functools
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from minengine.course import autocheck
from minengine.course.autocheck import REPORT_MARKER


# ------------------------------------------------------------------------------------------ grader side
@dataclass(frozen=True)
class ValueCheck:
    """One ``grade_choice(...)`` or ``grade_number(...)`` call of a test cell's source, its arguments
    read as literals (the key, the tolerance, the explanation)."""

    function: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


VALUE_CHECKS = {"grade_choice": ("name", "answer", "key", "why"),
                "grade_number": ("name", "answer", "key", "tolerance", "why")}


def value_checks(source: str) -> list[ValueCheck]:
    """The value checks a test cell calls, in order. Every argument but the answer must be a literal
    (the course renders keys into the source); anything else is the instructor's mistake and raises."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if called not in VALUE_CHECKS:
            continue
        params = VALUE_CHECKS[called]
        given = dict(zip(params, node.args, strict=False)) | {k.arg: k.value for k in node.keywords if k.arg}
        try:
            arguments = {k: ast.literal_eval(v) for k, v in given.items() if k != "answer"}
        except ValueError as e:
            raise ValueError(f"{called} in a test cell needs literal arguments besides the answer: "
                             f"{e}") from None
        found.append(ValueCheck(called, str(arguments.pop("name")), arguments))
    return sorted(found, key=lambda c: c.name)


def keyless_source(source: str) -> str | None:
    """The source with every value check cut down to its name and answer (``grade_choice("q1", q1)``),
    for the kernel to run; None when the cell has no value check. Comments go too (it is only run)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    changed = False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")) not in VALUE_CHECKS:
            continue
        node.args = node.args[:2]
        node.keywords = [k for k in node.keywords if k.arg in ("name", "answer")]
        changed = True
    return ast.unparse(tree) + "\n" if changed else None


def read_reports(outputs: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """name -> every report with that name in the cell's stdout (a line that isn't JSON is skipped)."""
    reports: dict[str, list[dict[str, Any]]] = {}
    for output in outputs:
        if output.get("output_type") != "stream" or output.get("name") != "stdout":
            continue
        text = output.get("text", "")
        for line in (text if isinstance(text, str) else "".join(text)).splitlines():
            if not line.startswith(REPORT_MARKER):
                continue
            try:
                report = json.loads(line[len(REPORT_MARKER):])
            except json.JSONDecodeError:
                continue
            if isinstance(report, dict) and isinstance(report.get("name"), str):
                reports.setdefault(report["name"], []).append(report)
    return reports


def _judges() -> dict[str, Callable[..., None]]:
    # the grader's own copy of the checks: the student's kernel can't touch it
    return {"grade_choice": autocheck.judge_choice, "grade_number": autocheck.judge_number}


def verdict(checks: list[ValueCheck], outputs: Iterable[dict[str, Any]]) -> str | None:
    """None when every check has exactly one report and its value passes; else why the cell scores 0."""
    reports, judges = read_reports(outputs), _judges()
    for check in checks:
        mine = reports.get(check.name, [])
        if not mine:
            return (f"{check.name}: no answer reached the grader (the test cell's check did not run as "
                    "written: was autocheck replaced, or the output redirected?)")
        if len(mine) > 1:
            return f"{check.name}: {len(mine)} answers reported for one question; a question takes one answer"
        report = mine[0]
        if "value" not in report:
            return f"{check.name}: the answer is a {report.get('unreadable', 'strange object')}, not a value"
        value = report["value"]
        if isinstance(value, float) and not math.isfinite(value) and check.function == "grade_choice":
            return f"{check.name}: the answer is {value}, not a letter"
        try:
            judges[check.function](check.name, value, **check.arguments)
        except AssertionError as e:
            return str(e)
    return None


def error_output(message: str) -> dict[str, Any]:
    """An error output as a kernel would write it: nbgrader scores a test cell with one 0."""
    return {"output_type": "error", "ename": "AssertionError", "evalue": message,
            "traceback": [f"AssertionError (judged by the grader, outside your kernel): {message}"]}


# Where HideKeys keeps a test cell's own source while the kernel runs the keyless one (cell metadata
# never reaches the kernel; TrustedVerdicts removes it again).
TRUSTED_SOURCE = "minengine_trusted_source"


@functools.cache
def hide_keys_preprocessor() -> type:
    """nbgrader's preprocessor class that hides the keys from the kernel, built on first use."""
    from nbgrader import utils
    from nbgrader.preprocessors import NbGraderPreprocessor

    class HideKeys(NbGraderPreprocessor):
        """Before ``Execute``: each test cell with a value check runs keyless (:func:`keyless_source`)."""

        def preprocess_cell(self, cell: Any, resources: dict, index: int) -> tuple[Any, dict]:
            if cell.cell_type == "code" and utils.is_grade(cell):
                keyless = keyless_source(cell.source)
                if keyless is not None:
                    cell.metadata[TRUSTED_SOURCE] = cell.source
                    cell.source = keyless
            return cell, resources

    return HideKeys


@functools.cache
def trusted_verdicts_preprocessor() -> type:
    """nbgrader's preprocessor class, built on first use (nbgrader is a course-side dependency)."""
    from nbformat import from_dict
    from nbgrader import utils
    from nbgrader.preprocessors import NbGraderPreprocessor

    class TrustedVerdicts(NbGraderPreprocessor):
        """After ``Execute``: put back each test cell's own source, then judge its value checks from that
        source and the answers its run reported; a cell that fails gets an error output (score 0)."""

        def preprocess_cell(self, cell: Any, resources: dict, index: int) -> tuple[Any, dict]:
            if cell.cell_type != "code" or not utils.is_grade(cell):
                return cell, resources
            if TRUSTED_SOURCE in cell.metadata:
                cell.source = cell.metadata.pop(TRUSTED_SOURCE)
            checks = value_checks(cell.source)
            if not checks or any(o.get("output_type") == "error" for o in cell.outputs):
                return cell, resources  # nothing to judge, or the cell failed in the kernel already
            message = verdict(checks, cell.outputs)
            if message is not None:
                self.log.info("%s: %s", cell.metadata.get("nbgrader", {}).get("grade_id"), message)
                cell.outputs.append(from_dict(error_output(message)))
            return cell, resources

    return TrustedVerdicts


def autograde_preprocessors() -> list[type]:
    """nbgrader's autograde pipeline with ``HideKeys`` right before ``Execute``, ``Execute`` itself in the
    sandbox (``minengine.course.sandbox``), and ``TrustedVerdicts`` right after it (before the output is
    limited and the grades saved)."""
    from nbgrader.converters import Autograde

    from minengine.course.sandbox import sandboxed_execute_preprocessor

    steps = list(Autograde.class_traits()["autograde_preprocessors"].make_dynamic_default())
    at = [step.__name__ for step in steps].index("Execute")
    hide, judge = hide_keys_preprocessor(), trusted_verdicts_preprocessor()
    return [*steps[:at], hide, sandboxed_execute_preprocessor(), judge, *steps[at + 1:]]
