"""COURSE.md's CI invariants for every graded notebook, checked by really running nbgrader.

One temporary course directory per module: release once, submit the source, the blank release and every
planted submission in tests/fixtures/grading/ (see its README), autograde them all in one pass, then
check each invariant on the gradebook and the autograded notebooks.
"""

from __future__ import annotations

import csv
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

from minengine.course import grading
from minengine.course import tooling as course
from minengine.course.autograde_pool import default_workers

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "grading"
# Every lab and quiz in the repository; GRADING_ONLY=lab2_x,quiz3_y narrows a run to some of them (while
# writing one assignment). Tests about one assignment's fixtures skip when it is filtered out.
SOURCES = {a: p for a, p in grading.discover_sources().items()
           if not os.environ.get("GRADING_ONLY") or a in os.environ["GRADING_ONLY"].split(",")}
# Seconds of autograde per submission: a few for a quiz; labs that run the engine, a simulator or a
# server while grading say how long theirs may take.
SECONDS_PER_SUBMISSION: dict[str, float] = {"lab3_streaming_server": 60}  # two servers start per notebook
SECONDS_PER_SUBMISSION["lab2_batching_scheduler"] = 40  # hypothesis, the tiny model and 4 simulated workloads


def needs(*assignments: str) -> pytest.MarkDecorator:
    """Skip a test about these assignments' fixtures when GRADING_ONLY leaves them out."""
    return pytest.mark.skipif(not set(assignments) <= set(SOURCES),
                              reason=f"GRADING_ONLY omits {assignments}")
TIMEOUT = 15  # seconds per cell: short, so the planted infinite loops cost little (torch imports in ~3 s)
SEED = 2026  # the course seed of the module's course directory (another seed is tested on its own)
PLANTED = [(a, p.stem) for a in SOURCES for p in sorted((FIXTURES / a).glob("*.txt"))]
SOLUTION_MARKERS = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$")
ADDED = "added before "  # a fixture's edits key for a cell the student added


# ------------------------------------------------------------------------------------ building students
def notebook_of(folder: Path) -> Path:
    (nb,) = folder.glob("*.ipynb")
    return nb


def grade_id(cell: nbformat.NotebookNode) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def rendered_keys(assignment: str, seed: int = SEED) -> dict[str, Any]:
    """The course's values for an assignment: choice keys and params.py's numbers."""
    from minengine.course.templating import load_params, render_notebook

    src = SOURCES[assignment]
    params = load_params(src, seed)
    nb = json.loads(notebook_of(src).read_text())
    return {**render_notebook(nb, seed, params, f"{src.name}/{notebook_of(src).name}").keys, **params}


def fill_fixture(text: str, values: dict[str, Any]) -> str:
    """A fixture's ``@@q1@@`` is this course's key for q1, ``@@wrong_q1@@`` a wrong answer to it."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1)
        if name.startswith("wrong_"):
            key = str(values[name.removeprefix("wrong_")])
            return next(c for c in "ABCD" if c not in key) if len(key) == 1 else key[0]
        value = values[name]
        return value if isinstance(value, str) else repr(value)

    return re.sub(r"@@(\w+)@@", one, text)


def parse_fixture(path: Path, values: dict[str, Any] | None = None) -> tuple[set[str], dict[str, str | None]]:
    """(cells expected to score 0, edits: grade_id -> new source, or None to delete the cell;
    ``ADDED + grade_id`` -> the source of a cell the student added just before that one)."""
    lost: set[str] | None = None
    edits: dict[str, str | None] = {}
    current: str | None = None
    for line in fill_fixture(path.read_text(), values or {}).splitlines():
        if line.startswith("# lost:"):
            lost = set(line.removeprefix("# lost:").split())
        elif line.startswith("# %% delete "):
            edits[line.split()[-1]], current = None, None
        elif line.startswith("# %% add before "):
            current = ADDED + line.split()[-1]
            edits[current] = ""
        elif line.startswith("# %% "):
            current = line.split()[-1]
            edits[current] = ""
        elif current is not None:
            edits[current] += line + "\n"
    assert lost is not None, f"{path} has no '# lost:' line"
    return lost, {k: (v.strip("\n") if v is not None else None) for k, v in edits.items()}


def perfect_student(release_nb: Path, source_nb: Path) -> nbformat.NotebookNode:
    """The student version with every answer cell replaced by the source's solution (markers dropped)."""
    solutions = {grade_id(c): c.source for c in nbformat.read(source_nb, as_version=4).cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    nb = nbformat.read(release_nb, as_version=4)
    for cell in nb.cells:
        if grade_id(cell) in solutions:
            cell.source = "\n".join(ln for ln in solutions[grade_id(cell)].splitlines()
                                    if not SOLUTION_MARKERS.match(ln))
    return nb


def planted_student(release_nb: Path, source_nb: Path, edits: dict[str, str | None]) -> nbformat.NotebookNode:
    nb = perfect_student(release_nb, source_nb)
    ids = {grade_id(c) for c in nb.cells}
    targets = {k.removeprefix(ADDED) for k in edits}
    assert targets <= ids, f"fixture edits unknown cells: {targets - ids}"
    nb.cells = [c for c in nb.cells if not (grade_id(c) in edits and edits[grade_id(c)] is None)]
    for cell in nb.cells:
        if edits.get(grade_id(cell)) is not None:
            cell.source = edits[grade_id(cell)]
    cells = []
    for cell in nb.cells:
        added = edits.get(ADDED + str(grade_id(cell)))
        if added is not None:
            cells.append(nbformat.v4.new_code_cell(added))  # no nbgrader metadata, as JupyterLab adds it
        cells.append(cell)
    nb.cells = cells
    return nb


# An answer cell's code that tries to pass every check without the answers (each scored 0 in class):
QUIZ_ATTACKS = {
    # replace every checking function in the kernel with a no-op (this once scored 10/10 on each quiz)
    "patched_checks": ("import minengine.course.autocheck as _ac\n"
                       "for _n in dir(_ac):\n"
                       "    if _n.startswith(('grade_', 'check_', 'judge_', 'expect_', 'require_')):\n"
                       "        setattr(_ac, _n, lambda *a, **k: None)\n"),
    # report every option to the grader, hoping one of them is judged
    "forged_reports": ("import minengine.course.autocheck as _ac\n"
                       "_report = _ac.report_answer\n"
                       "def _every_option(name, *a, **k):\n"
                       "    for letter in 'ABCD':\n"
                       "        _report(name, letter)\n"
                       "_ac.grade_choice = _ac.check_choice_form = _every_option\n"
                       "_ac.grade_number = _ac.check_number_form = lambda n, *a, **k: _report(n, 1.0)\n"),
    # read the key out of each test cell's own source just before it runs, and make it the answer
    "keys_from_the_test_cell": (
        "import ast as _ast\n"
        "def _take_the_key(info):\n"
        "    try:\n"
        "        tree = _ast.parse(info.raw_cell)\n"
        "    except SyntaxError:\n"
        "        return\n"
        "    for n in _ast.walk(tree):\n"
        "        f = getattr(n, 'func', None)\n"
        "        if getattr(f, 'id', getattr(f, 'attr', '')) in ('grade_choice', 'grade_number'):\n"
        "            key = [k.value for k in n.keywords if k.arg == 'key'] or n.args[2:3]\n"
        "            if key:\n"
        "                get_ipython().user_ns[n.args[0].value] = _ast.literal_eval(key[0])\n"
        "get_ipython().events.register('pre_run_cell', _take_the_key)\n"),
    # read the keys from the course directory: the rendered sources and the gradebook's copy of every test
    # cell (nbgrader runs the kernel in autograded/<student>/<assignment>/, three levels down)
    "keys_from_the_course_files": (
        "import ast as _ast, glob as _glob, json as _json, os as _os, sqlite3 as _sql\n"
        "_root = _os.path.abspath(_os.path.join(_os.getcwd(), '..', '..', '..'))\n"
        "_texts = [''.join(c['source']) for p in _glob.glob(_os.path.join(_root, 'source', '*', '*.ipynb'))\n"
        "          for c in _json.load(open(p))['cells']]\n"
        "try:\n"
        "    _texts += [r[0] for r in _sql.connect(_os.path.join(_root, 'gradebook.db'))\n"
        "               .execute('select source from source_cell') if r[0]]\n"
        "except Exception:\n"
        "    pass\n"
        "_keys = {}\n"
        "for _t in _texts:\n"
        "    try:\n"
        "        _tree = _ast.parse(_t)\n"
        "    except SyntaxError:\n"
        "        continue\n"
        "    for _n in _ast.walk(_tree):\n"
        "        _f = getattr(_n, 'func', None)\n"
        "        if getattr(_f, 'id', getattr(_f, 'attr', '')) in ('grade_choice', 'grade_number'):\n"
        "            _k = [k.value for k in _n.keywords if k.arg == 'key'] or _n.args[2:3]\n"
        "            if _k:\n"
        "                _keys[_n.args[0].value] = _ast.literal_eval(_k[0])\n"
        "get_ipython().events.register('pre_run_cell', lambda info: get_ipython().user_ns.update(_keys))\n"
        "open(_os.path.join(_root, 'planted_by_a_student.txt'), 'w').write('was here')\n"),
    # replace the builtins the checks compare with, so any comparison in the kernel passes
    "redefined_builtins": ("import builtins as _b\n"
                           "_b.abs = lambda x: 0\n"
                           "_b.isinstance = lambda *a: True\n"
                           "_b.sorted = lambda x, **k: ['A']\n"),
}


def junk_answers(source_nb: Path, attack: str) -> dict[str, str]:
    """Edits that answer every question of a quiz wrongly, the first answer cell starting with ``attack``."""
    edits: dict[str, str] = {}
    for c in nbformat.read(source_nb, as_version=4).cells:
        if not c.metadata.get("nbgrader", {}).get("solution") or c.cell_type != "code":
            continue
        answer: dict[str, Any] = {}
        exec("\n".join(ln for ln in c.source.splitlines() if not SOLUTION_MARKERS.match(ln)), answer)
        name, key = next((k, v) for k, v in answer.items() if re.fullmatch(r"q\d+", k))
        wrong = next(x for x in "ABCD" if x not in key) if isinstance(key, str) else float(key) * 3 + 7
        edits[grade_id(c)] = ("" if edits else attack) + f"{name} = {wrong!r}\n"
    return edits


def graded_cells(nb_path: Path) -> dict[str, float]:
    """grade_id -> points of every test cell of a notebook."""
    cells = nbformat.read(nb_path, as_version=4).cells
    return {grade_id(c): float(c.metadata["nbgrader"]["points"])
            for c in cells if c.metadata.get("nbgrader", {}).get("grade")}


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("grading")
    course_dir = tmp / "course"
    released = grading.release(course_dir, SOURCES, timeout=TIMEOUT, seed=SEED)
    expected_lost: dict[tuple[str, str], set[str]] = {}
    for assignment in SOURCES:
        # The source as rendered for this course's seed (its keys and numbers), markers and all.
        source_nb, release_nb = (notebook_of(course_dir / "source" / assignment),
                                 notebook_of(released[assignment]))
        points = graded_cells(source_nb)
        grading.submit("solution", [source_nb], course_dir)
        expected_lost[assignment, "solution"] = set()
        grading.submit("blank", [release_nb], course_dir)
        expected_lost[assignment, "blank"] = set(points)
        for fixture in sorted((FIXTURES / assignment).glob("*.txt")):
            lost, edits = parse_fixture(fixture, rendered_keys(assignment))
            assert lost <= set(points), f"{fixture}: unknown cells in '# lost:'"
            path = tmp / "students" / fixture.stem / release_nb.name
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(planted_student(release_nb, source_nb, edits), path)
            grading.submit(fixture.stem, [path], course_dir)
            expected_lost[assignment, fixture.stem] = lost
        if assignment.startswith("quiz"):  # students who attack the checks instead of answering
            for attack, code in QUIZ_ATTACKS.items():
                path = tmp / "students" / attack / release_nb.name
                path.parent.mkdir(parents=True, exist_ok=True)
                nbformat.write(planted_student(release_nb, source_nb, junk_answers(source_nb, code)), path)
                grading.submit(attack, [path], course_dir)
                expected_lost[assignment, attack] = set(points)
    start = time.monotonic()
    try:
        grading.autograde(course_dir, workers=default_workers())  # the class graded on every core
        failures: dict[tuple[str, str], str] = {}
    except grading.AutogradeFailed as failed:  # a kernel an attack broke; the rest of the class is graded
        failures = failed.failures
    return dict(course_dir=course_dir, released=released, expected_lost=expected_lost,
                autograde_s=time.monotonic() - start, failures=failures)


def autograded_nb(graded: dict, student: str, assignment: str) -> nbformat.NotebookNode:
    folder = graded["course_dir"] / "autograded" / student / assignment
    return nbformat.read(notebook_of(folder), as_version=4)


def cell(nb: nbformat.NotebookNode, gid: str) -> nbformat.NotebookNode:
    (found,) = [c for c in nb.cells if grade_id(c) == gid]
    return found


# ----------------------------------------------------------------------------------------- invariants
@pytest.mark.parametrize("assignment", SOURCES)
def test_generate_succeeds_and_sizes(graded: dict, assignment: str) -> None:
    release_dir = graded["released"][assignment]
    for f in (p for p in SOURCES[assignment].iterdir() if p.is_file()):  # data files travel along
        assert (release_dir / f.name).is_file() == (f.name != "params.py"), f.name  # the key maker stays home
    points = graded_cells(notebook_of(SOURCES[assignment]))
    if assignment.startswith("lab"):
        assert sum(points.values()) >= 10 and len(points) >= 4
    else:
        assert len(points) >= 8


@pytest.mark.parametrize("assignment", SOURCES)
def test_release_holds_no_solution_and_no_hidden_test(graded: dict, assignment: str) -> None:
    source_text = notebook_of(SOURCES[assignment]).read_text()
    release_nb = nbformat.read(notebook_of(graded["released"][assignment]), as_version=4)
    release_code = "\n".join(c.source for c in release_nb.cells if c.cell_type == "code")
    assert "### BEGIN SOLUTION" in source_text  # the source uses the markers ...
    for marker in grading.LEAK_MARKERS:
        assert marker not in nbformat.writes(release_nb)  # ... and the release has none left
    hidden = re.findall(r"### BEGIN (SOLUTION|HIDDEN TESTS)\n(.*?)### END \1",
                        "\n".join(c.source for c in nbformat.read(notebook_of(SOURCES[assignment]),
                                                                  as_version=4).cells), flags=re.S)
    secret_lines = {ln.strip() for _, block in hidden for ln in block.splitlines() if len(ln.strip()) >= 6}
    assert secret_lines
    release_lines = {ln.strip() for ln in release_code.splitlines()}
    assert not secret_lines & release_lines
    # Quiz answers can't be read off: no answer variable is assigned anywhere in the release.
    assert not re.search(r"^\s*q\d+\s*=", release_code, flags=re.M)


@pytest.mark.parametrize("assignment", SOURCES)
def test_source_submitted_as_a_student_gets_full_marks(graded: dict, assignment: str) -> None:
    scores = grading.cell_scores(assignment, "solution", graded["course_dir"])
    assert scores == graded_cells(notebook_of(SOURCES[assignment]))


@pytest.mark.parametrize("assignment", SOURCES)
def test_unedited_release_scores_zero(graded: dict, assignment: str) -> None:
    scores = grading.cell_scores(assignment, "blank", graded["course_dir"])
    assert scores and set(scores.values()) == {0.0}


@pytest.mark.parametrize(("assignment", "student"), PLANTED)
def test_planted_submission_loses_exactly_the_expected_points(graded: dict, assignment: str,
                                                               student: str) -> None:
    points = graded_cells(notebook_of(SOURCES[assignment]))
    lost = graded["expected_lost"][assignment, student]
    expected = {gid: (0.0 if gid in lost else p) for gid, p in points.items()}
    assert grading.cell_scores(assignment, student, graded["course_dir"]) == expected
    (score,) = [s for s in grading.scores(graded["course_dir"])
                if (s.student, s.assignment) == (student, assignment)]
    assert not score.needs_manual_grade


QUIZZES = [a for a in SOURCES if a.startswith("quiz")]


@pytest.mark.parametrize("attack", QUIZ_ATTACKS)
@pytest.mark.parametrize("assignment", QUIZZES)
def test_a_student_who_attacks_the_grader_scores_zero(graded: dict, assignment: str, attack: str) -> None:
    assert not (graded["course_dir"] / "planted_by_a_student.txt").exists()  # nothing written outside
    if (attack, assignment) in graded["failures"]:  # the attack broke its own kernel: no grade, so 0
        assert attack == "redefined_builtins", graded["failures"][attack, assignment]
        row = {(r["assignment"], r["student_id"]): r for r in csv.DictReader(
            grading.export_grades(graded["course_dir"], graded["course_dir"] / "attacks.csv").open())}
        assert float(row[assignment, attack]["score"]) == 0.0
        return
    scores = grading.cell_scores(assignment, attack, graded["course_dir"])
    assert scores and set(scores.values()) == {0.0}, {g: p for g, p in scores.items() if p}


def test_only_broken_kernels_fail_to_grade(graded: dict) -> None:
    """A submission nbgrader cannot grade is reported and skipped; it must be one an attack broke."""
    assert {student for student, _ in graded["failures"]} <= {"redefined_builtins"}, graded["failures"]


@needs("lab1_kv_calculator")
def test_wrong_answers_fail_on_the_arithmetic_not_on_a_crash(graded: dict) -> None:
    nb = autograded_nb(graded, "forgot_factor_two", "lab1_kv_calculator")
    (error,) = [o for o in cell(nb, "test_per_token_mha").outputs if o.output_type == "error"]
    assert error.ename == "AssertionError" and "expected 524,288, got 262,144" in error.evalue


@needs("lab1_kv_calculator", "quiz1_two_phases")
@pytest.mark.parametrize(("student", "assignment", "gid"), [
    ("deleted_test_cell", "lab1_kv_calculator", "test_plot"),
    ("tampered_test_cell", "lab1_kv_calculator", "test_concurrency"),
    ("sabotage", "quiz1_two_phases", "check_q4"),
    ("sabotage", "quiz1_two_phases", "check_q7"),
])
def test_deleted_or_tampered_test_cells_are_restored(graded: dict, student: str, assignment: str,
                                                     gid: str) -> None:
    original = cell(nbformat.read(notebook_of(graded["released"][assignment]), as_version=4), gid)
    restored = cell(autograded_nb(graded, student, assignment), gid)
    # The autograded copy runs the instructor's cell (with its hidden tests; nbgrader may add a comment).
    assert original.source.strip() in restored.source
    assert any(o.output_type == "error" for o in restored.outputs)


@needs("lab1_kv_calculator", "quiz1_two_phases", "quiz2_roofline_latency_kv", "quiz4_prefix_serving")
@pytest.mark.parametrize(("student", "assignment", "gid"), [
    ("infinite_loop", "lab1_kv_calculator", "answer_concurrency"),  # a busy loop
    ("sabotage", "quiz1_two_phases", "answer_q3"),  # a busy loop
    ("sabotage", "quiz2_roofline_latency_kv", "answer_q3"),  # an hour's sleep
    ("sabotage", "quiz4_prefix_serving", "answer_q6"),  # a wait on an event nobody sets
])
def test_an_infinite_loop_times_out_and_the_rest_is_graded(graded: dict, student: str, assignment: str,
                                                           gid: str) -> None:
    nb = autograded_nb(graded, student, assignment)
    errors = [o for o in cell(nb, gid).outputs if o.output_type == "error"]
    assert errors and errors[0].ename in ("KeyboardInterrupt", "CellTimeoutError")
    later = nb.cells[nb.cells.index(cell(nb, gid)) + 1:]
    assert any(c.cell_type == "code" and c.get("execution_count") for c in later)  # the kernel carried on


@needs("lab1_kv_calculator")
def test_widgets_stay_off_while_grading(graded: dict) -> None:
    nb = autograded_nb(graded, "solution", "lab1_kv_calculator")
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert "skipped while grading" in "".join(o.get("text", "") for o in last.outputs)


def test_autograde_is_reasonably_fast(graded: dict) -> None:
    loops = sum(1 for (_, student) in graded["expected_lost"] if student in ("infinite_loop", "sabotage"))
    budget = sum(SECONDS_PER_SUBMISSION.get(a, 12) for (a, _) in graded["expected_lost"])
    # Each planted infinite loop costs one timeout; the rest is a few seconds a notebook.
    assert graded["autograde_s"] < loops * TIMEOUT + budget, graded["autograde_s"]


@needs("lab1_kv_calculator")
def test_feedback_and_grades_csv(graded: dict) -> None:
    course_dir = graded["course_dir"]
    made = grading.feedback(course_dir, student="ignores_head_dim")
    assert [p.name for p in made] == ["lab1_kv_calculator.html"]
    html = made[0].read_text()
    assert "hidden_head_dim_cases" in html  # the hidden test that failed is shown to the student
    rows = list(csv.DictReader(grading.export_grades(course_dir).open()))
    got = {(r["assignment"], r["student_id"]): float(r["score"]) for r in rows}
    for (assignment, student), lost in graded["expected_lost"].items():
        points = graded_cells(notebook_of(SOURCES[assignment]))
        assert got[assignment, student] == sum(p for gid, p in points.items() if gid not in lost)


# -------------------------------------------------------------------------------------------- validate
@pytest.mark.parametrize("assignment", SOURCES)
def test_validator_passes_the_solution(graded: dict, assignment: str) -> None:
    result = course.validate(notebook_of(graded["course_dir"] / "source" / assignment), timeout=TIMEOUT)
    assert result.passed, result.problems


@pytest.mark.parametrize("assignment", SOURCES)
def test_validate_command_fails_on_the_blank_release(graded: dict, assignment: str,
                                                     capsys: pytest.CaptureFixture) -> None:
    nb = notebook_of(graded["released"][assignment])
    assert course.main(["validate", str(nb), "--timeout", str(TIMEOUT)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "0 of 1 notebook(s) passed" in out


@needs("lab1_kv_calculator")
def test_validator_ignores_stderr_noise_from_a_correct_answer(graded: dict, tmp_path: Path) -> None:
    """Validate has no IgnorePattern: the test cells' own silencing must keep torch's warnings out."""
    rel = graded["released"]["lab1_kv_calculator"]
    _, edits = parse_fixture(FIXTURES / "lab1_kv_calculator" / "noisy_but_correct.txt",
                             rendered_keys("lab1_kv_calculator"))
    (tmp_path / "models.json").write_bytes((rel / "models.json").read_bytes())
    path = tmp_path / "lab1_kv_calculator.ipynb"
    source = graded["course_dir"] / "source" / "lab1_kv_calculator"
    nbformat.write(planted_student(notebook_of(rel), notebook_of(source), edits), path)
    result = course.validate(path, timeout=TIMEOUT)
    assert result.passed, result.problems


# ------------------------------------------------------------------------------------- cheap unit tests
@needs("quiz1_two_phases")
def test_submit_finds_the_assignment_and_refuses_strays(graded: dict, tmp_path: Path) -> None:
    course_dir = graded["course_dir"]
    renamed = tmp_path / "quiz (1).ipynb"
    renamed.write_bytes(notebook_of(graded["released"]["quiz1_two_phases"]).read_bytes())
    with pytest.raises(grading.GradingError, match="--assignment"):
        grading.submit("carol", [renamed], course_dir)
    (placed,) = grading.submit("carol", [renamed], course_dir, assignment="quiz1_two_phases")
    assert placed == course_dir.resolve() / "submitted/carol/quiz1_two_phases/quiz1_two_phases.ipynb"
    assert (placed.parent / "timestamp.txt").read_text().strip().endswith("UTC")
    with pytest.raises(grading.GradingError, match="bad student id"):
        grading.submit("../x", [renamed], course_dir)


def test_quiz_form_checks_accept_any_well_formed_answer_and_hidden_grades_compare() -> None:
    from minengine.course import autocheck

    for fine in ("A", "b", " c ", "(D)"):
        autocheck.check_choice_form("q1", fine)
    for bad, message in ((None, "no answer yet"), ("E", "letter"), (3, "letter"), ("AB", "one answer")):
        with pytest.raises(AssertionError, match=message):
            autocheck.check_choice_form("q1", bad)
    autocheck.check_choice_form("q8", "ca", multi=True)
    for fine in ("AC", "ca", " a, c ", "(C)(A)"):
        autocheck.grade_choice("q8", fine, "AC")
    with pytest.raises(AssertionError, match="the answer is AC.*because"):
        autocheck.grade_choice("q8", "A", "AC", why="because")
    autocheck.check_number_form("q5", 295.2)
    for bad in (None, True, "295", float("nan"), -1):
        with pytest.raises(AssertionError):
            autocheck.check_number_form("q5", bad)
    for fine in (290, 295.2, 305):
        autocheck.grade_number("q5", fine, 295.2, tolerance=10)
    for wrong in (280, 310):
        with pytest.raises(AssertionError, match="the answer is 295.2"):
            autocheck.grade_number("q5", wrong, 295.2, tolerance=10)


def test_reference_calls_are_found_however_they_are_reached() -> None:
    import functools

    from minengine import kvcalc
    from minengine.course.autocheck import reference_calls, require_own_code

    def own(config: dict, nbytes: float = 2) -> float:
        return 2 * config["num_hidden_layers"] * config["hidden_size"] * nbytes

    def imports_inside(config: dict, nbytes: float = 2) -> float:
        from minengine import kvcalc as k

        return k.kv_bytes_per_token(config)

    def helper(config: dict) -> float:
        return kvcalc.kv_bytes_per_token(config)

    def via_helper(config: dict, nbytes: float = 2) -> float:
        return helper(config)

    def sneaky(config: dict, nbytes: float = 2) -> float:
        return __import__("minengine").kvcalc.kv_bytes_per_token(config)

    assert reference_calls(own) == []
    require_own_code(own, part="part 1")
    for fn in (imports_inside, via_helper, sneaky, kvcalc.kv_bytes_per_token,
               functools.partial(kvcalc.kv_bytes_per_token, kv_cache_dtype="bf16"),
               lambda c: kvcalc.estimate(c)):
        assert reference_calls(fn), fn
        with pytest.raises(AssertionError, match="write it yourself"):
            require_own_code(fn, part="part 1")


def test_quiet_swallows_python_and_c_level_stderr(capfd: pytest.CaptureFixture) -> None:
    import os
    import sys
    import warnings

    from minengine.course.autocheck import quiet

    with quiet():
        warnings.warn("drill", UserWarning, stacklevel=1)
        print("python-level", file=sys.stderr)
        os.write(2, b"c-level\n")
    assert capfd.readouterr().err == ""
    with pytest.raises(AssertionError), quiet():
        raise AssertionError("still propagates")


def test_release_check_looks_at_every_file(tmp_path: Path) -> None:
    """A file the source wrote when run in place (lab 3 writes its server module) must not ship."""
    (tmp_path / "lab.ipynb").write_text("{}")
    (tmp_path / "weights.bin").write_bytes(bytes(range(256)))  # binary data is skipped, not an error
    grading.check_release_clean(tmp_path)
    (tmp_path / "lab3_server.py").write_text("### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION\n")
    with pytest.raises(grading.GradingError, match="lab3_server.py"):
        grading.check_release_clean(tmp_path)
