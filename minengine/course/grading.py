"""An nbgrader course directory built from ``labs/`` and ``quizzes/``, and the steps an instructor runs on it.

``labs/<id>/`` and ``quizzes/<id>/`` hold the nbgrader *sources* (solutions and hidden tests included).
:func:`release` renders them for the course seed into ``build/course/source/<id>/`` (this class's
numbers and answer order, ``minengine.course.templating``), writes ``nbgrader_config.py``, registers
each assignment in the gradebook and generates the student versions in ``release/<id>/``. Then
:func:`submit` (or nbgrader's exchange) fills ``submitted/<student>/<id>/``, and :func:`autograde`,
:func:`feedback` and :func:`export_grades` do the rest. nbgrader is called through its Python classes
in this process; the only things it shells out to (``alembic``, the kernel) are found through PATH, which
:func:`grading_environment` points at this interpreter's ``bin`` while a step runs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from minengine.course.autograde_pool import run_in_parallel
from minengine.course.templating import DEFAULT_COURSE_SEED, SEED_FILE, render_folder, seed_number

REPO_ROOT = Path(__file__).resolve().parents[2]
COURSE_DIR = REPO_ROOT / "build" / "course"
SOURCE_ROOTS = (REPO_ROOT / "labs", REPO_ROOT / "quizzes")
COURSE_ID = "minengine"
DEFAULT_TIMEOUT = 60  # seconds per cell; nbgrader interrupts a cell past it and grades the rest
CODE_STUB = '# YOUR CODE HERE\nraise NotImplementedError("replace this line with your answer")'
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]
# Markers generate_assignment must remove; a release that still holds one would leak answers.
LEAK_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS",
                "@@")
F = TypeVar("F", bound=Callable[..., Any])

CONFIG_TEMPLATE = '''\
"""nbgrader settings for the minengine course, written by `python -m minengine.course release`.

This file is rewritten on every release: put your own settings in nbgrader_config_extra.py next to it.
"""
import os

c = get_config()  # noqa: F821 (provided by traitlets)
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.db_url = {db_url!r}
# Per-cell limit: an infinite loop is interrupted after this many seconds and the rest is still graded.
c.Execute.timeout = {timeout}
# Quiet kernels: ipykernel's start-up warnings are noise in an instructor's terminal.
c.Execute.extra_arguments = {kernel_args!r}
c.ClearSolutions.code_stub = {{"python": {code_stub!r}}}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
# A deleted test cell is put back from the gradebook and graded, instead of "needs manual grade".
c.OverwriteCells.add_missing_cells = True
# Quiz answers are judged in the grader's process, from the test cell's own source and the answer its
# run reported, where no cell of the student's can replace the check (minengine/course/trusted_verdicts.py).
from minengine.course.trusted_verdicts import autograde_preprocessors  # noqa: E402
c.Autograde.autograde_preprocessors = autograde_preprocessors()

_extra = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nbgrader_config_extra.py")
if os.path.exists(_extra):
    load_subconfig(_extra)  # noqa: F821
'''


class GradingError(RuntimeError):
    """An nbgrader step failed; the message carries nbgrader's log."""


class AutogradeFailed(GradingError):
    """Some submissions could not be graded (their kernel died or stopped answering, say); every other
    one was. ``scores`` holds the graded ones, ``failures`` says what happened to the rest. A submission
    that could not be graded has no grade, which nbgrader's export counts as 0."""

    def __init__(self, scores: list[Score], failures: dict[tuple[str, str], str]) -> None:
        self.scores, self.failures = scores, failures
        lines = [f"  {s} / {a}: {why}" for (s, a), why in sorted(failures.items())]
        super().__init__(f"{len(failures)} submission(s) could not be graded (each scores 0 until a "
                         "regrade succeeds); the others were graded:\n" + "\n".join(lines))


@dataclass(frozen=True)
class Score:
    student: str
    assignment: str
    score: float
    max_score: float
    needs_manual_grade: bool = False


# ------------------------------------------------------------------------------------------ environment
@contextlib.contextmanager
def grading_environment() -> Iterator[None]:
    """Reproducible grading, undone afterwards: this venv's tools first on PATH (nbgrader runs ``alembic``
    from PATH), no progress bars (stderr in a test cell scores 0), no network; kernels inherit it."""
    saved = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    os.environ["TQDM_DISABLE"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        with warnings.catch_warnings():
            # nbgrader 0.9 trips SQLAlchemy 2.x's autoflush warning on every autograde: harmless noise.
            warnings.filterwarnings("ignore", message=r".*not in session, add operation along.*")
            # ... and restores a deleted cell without a cell id, which nbformat warns about.
            warnings.filterwarnings("ignore", message=r"Cell is missing an id field")
            yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _in_grading_environment(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with grading_environment():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def discover_sources(roots: tuple[Path, ...] = SOURCE_ROOTS) -> dict[str, Path]:
    """Assignment id -> source folder: every folder under the roots that holds a notebook."""
    found: dict[str, Path] = {}
    for root in roots:
        for folder in sorted(p for p in root.glob("*") if p.is_dir() and not p.name.startswith((".", "_"))):
            if any(folder.glob("*.ipynb")):
                if folder.name in found:
                    raise GradingError(f"two assignments are called {folder.name!r}: {found[folder.name]} "
                                       f"and {folder}")
                found[folder.name] = folder
    return found


def course_seed(course_dir: Path = COURSE_DIR, seed: int | str | None = None) -> int:
    """The seed this course's assignments are rendered with: ``seed`` if given (a number, or any text,
    hashed), else the one the last release used (``course.json``), else ``MINENGINE_COURSE_SEED``, else
    the public default."""
    if seed is not None:
        return seed_number(seed)
    saved = course_dir / SEED_FILE
    if saved.is_file():
        return int(json.loads(saved.read_text())["seed"])
    env = os.environ.get("MINENGINE_COURSE_SEED", "").strip()
    if env:
        return seed_number(env)
    return DEFAULT_COURSE_SEED


def write_config(course_dir: Path = COURSE_DIR, timeout: int = DEFAULT_TIMEOUT) -> Path:
    course_dir = course_dir.resolve()
    course_dir.mkdir(parents=True, exist_ok=True)
    path = course_dir / "nbgrader_config.py"
    path.write_text(CONFIG_TEMPLATE.format(root=str(course_dir), course_id=COURSE_ID, timeout=int(timeout),
                                           db_url=f"sqlite:///{course_dir / 'gradebook.db'}",
                                           code_stub=CODE_STUB, kernel_args=KERNEL_ARGS))
    return path


def load_config(course_dir: Path = COURSE_DIR) -> Any:
    from traitlets.config.loader import PyFileConfigLoader

    course_dir = course_dir.resolve()
    if not (course_dir / "nbgrader_config.py").exists():
        raise GradingError(f"{course_dir} is not a course directory yet: run `python -m minengine.course "
                           "release` (or `make release`) first")
    return PyFileConfigLoader("nbgrader_config.py", path=str(course_dir)).load_config()


def _coursedir(config: Any) -> Any:
    from nbgrader.coursedir import CourseDirectory

    return CourseDirectory(config=config)


def _run(app: Any, what: str) -> str:
    """Run an nbgrader converter, turning its captured failure into a GradingError."""
    from nbgrader.utils import capture_log

    result = capture_log(app)
    if not result["success"]:
        raise GradingError(f"{what} failed:\n{result.get('log', '')}\n{result.get('error', '')}".strip())
    return result.get("log", "")


def _gradebook(config: Any) -> Any:
    from nbgrader.api import Gradebook

    cd = _coursedir(config)
    return Gradebook(cd.db_url, cd.course_id)


# ------------------------------------------------------------------------------------------------ release
@_in_grading_environment
def release(course_dir: Path = COURSE_DIR, sources: dict[str, Path] | None = None,
            timeout: int = DEFAULT_TIMEOUT, seed: int | str | None = None) -> dict[str, Path]:
    """Render the sources for the course seed, register them, generate the student versions; returns
    id -> release folder. The seed is kept in ``course.json`` so later releases and regrades agree."""
    from nbgrader.converters import GenerateAssignment

    course_dir = course_dir.resolve()
    sources = discover_sources() if sources is None else sources
    seed = course_seed(course_dir, seed)
    write_config(course_dir, timeout)
    (course_dir / SEED_FILE).write_text(json.dumps({"seed": seed}) + "\n")
    config = load_config(course_dir)
    coursedir = _coursedir(config)
    released = {}
    with _gradebook(config) as gb:
        for assignment in sources:
            gb.update_or_create_assignment(assignment)
    for assignment, src in sources.items():
        dst = course_dir / "source" / assignment
        if dst.exists():
            shutil.rmtree(dst)
        render_folder(src, dst, seed)
        coursedir.assignment_id = assignment
        app = GenerateAssignment(coursedir=coursedir, config=config)
        app.force = True
        app.create_assignment = True
        _run(app, f"generate_assignment {assignment}")
        out = course_dir / "release" / assignment
        check_release_clean(out)
        released[assignment] = out
    return released


def check_release_clean(release_dir: Path) -> None:
    """Refuse a student version that still holds a solution or hidden-test marker, in any of its files:
    a data file travels with the notebook, and so would a file the source wrote when an instructor ran it
    in place (lab 3's ``%%writefile lab3_server.py`` holds the solution)."""
    for path in sorted(p for p in release_dir.rglob("*") if p.is_file()):
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary data cannot hold a marker nbgrader would have stripped
        leaked = [m for m in LEAK_MARKERS if m in text]
        if leaked:
            raise GradingError(f"{path} still contains {', '.join(leaked)}: not releasing it (delete it from "
                               f"the source folder if running the source wrote it)")


def release_is_stale(assignment: str, src: Path, course_dir: Path = COURSE_DIR) -> bool:
    """True when a student version is missing or older than any file of its source."""
    out = course_dir / "release" / assignment
    notebooks = list(out.glob("*.ipynb"))
    if not notebooks:
        return True
    built = min(p.stat().st_mtime for p in notebooks)
    return any(p.stat().st_mtime > built for p in src.rglob("*") if p.is_file())


def ensure_release(course_dir: Path = COURSE_DIR, sources: dict[str, Path] | None = None) -> dict[str, Path]:
    """Student versions for every source, generating only the missing or stale ones."""
    sources = discover_sources() if sources is None else sources
    stale = {a: s for a, s in sources.items() if release_is_stale(a, s, course_dir)}
    if stale:
        timeout = DEFAULT_TIMEOUT
        if (course_dir / "nbgrader_config.py").exists():  # keep the timeout an instructor chose
            timeout = int(load_config(course_dir).Execute.get("timeout", DEFAULT_TIMEOUT))
        release(course_dir, stale, timeout)
    return {a: course_dir / "release" / a for a in sources}


# ------------------------------------------------------------------------------------------ submissions
def submit(student: str, paths: list[Path], course_dir: Path = COURSE_DIR, assignment: str | None = None
           ) -> list[Path]:
    """Put a student's notebooks (files or folders) under ``submitted/<student>/<assignment>/``.

    The assignment is found from each notebook's name unless given; a notebook that was renamed is
    accepted when the assignment has exactly one notebook (nbgrader matches notebooks by file name).
    """
    if not student or "/" in student or student.startswith("."):
        raise GradingError(f"bad student id {student!r}")
    course_dir = course_dir.resolve()
    source_root = course_dir / "source"
    by_name = {p.name: p.parent.name for p in source_root.glob("*/*.ipynb")}
    files = [f for p in map(Path, paths) for f in (sorted(p.rglob("*.ipynb")) if p.is_dir() else [p])
             if ".ipynb_checkpoints" not in f.parts]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    placed = []
    for f in files:
        if not f.is_file():
            raise GradingError(f"no such notebook: {f}")
        target = assignment or by_name.get(f.name)
        if target is None:
            known = ", ".join(sorted({*by_name.values()})) or "none; run release first"
            raise GradingError(f"cannot tell which assignment {f.name} belongs to: pass --assignment "
                               f"(known: {known})")
        expected = sorted(p.name for p in (source_root / target).glob("*.ipynb"))
        if not expected:
            raise GradingError(f"unknown assignment {target!r}: run release first")
        name = f.name if f.name in expected else (expected[0] if len(expected) == 1 else None)
        if name is None:
            raise GradingError(f"{f.name} is not one of {target}'s notebooks ({', '.join(expected)})")
        dest_dir = course_dir / "submitted" / student / target
        dest_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest_dir / name)
        (dest_dir / "timestamp.txt").write_text(stamp + "\n")
        placed.append(dest_dir / name)
    return placed


def submissions(course_dir: Path = COURSE_DIR, student: str | None = None, assignment: str | None = None
                ) -> list[tuple[str, str]]:
    """(student, assignment) pairs found under ``submitted/``, filtered."""
    root = course_dir.resolve() / "submitted"
    pairs = [(d.parent.name, d.name) for d in sorted(root.glob("*/*")) if d.is_dir()]
    return [(s, a) for s, a in pairs if (student in (None, s)) and (assignment in (None, a))]


# --------------------------------------------------------------------------------------------- grading
@_in_grading_environment
def autograde(course_dir: Path = COURSE_DIR, student: str | None = None, assignment: str | None = None,
              workers: int = 1, sandbox: bool = True) -> list[Score]:
    """Autograde the matching submissions, one (student, assignment) at a time; returns their scores.
    ``workers`` > 1 grades on that many processes (``minengine.course.autograde_pool``). Each kernel runs
    in the sandbox (``minengine.course.sandbox``); ``sandbox=False`` runs them unconfined, for notebooks
    you trust, and a machine that cannot sandbox raises :class:`SandboxError` unless it is given."""
    from minengine.course.sandbox import SANDBOX_ENV, require_sandbox

    if not sandbox:
        os.environ[SANDBOX_ENV] = "off"  # grading_environment puts the old value back; workers inherit it
    require_sandbox()
    config = load_config(course_dir)
    pairs = submissions(course_dir, student, assignment)
    if not pairs:
        raise GradingError(f"no submissions under {course_dir / 'submitted'} match "
                           f"student={student or '*'} assignment={assignment or '*'}")
    if workers > 1 and len(pairs) > 1:
        with _gradebook(config) as gb:  # every row first: two workers must never insert the same one
            for s in sorted({s for s, _ in pairs}):
                gb.update_or_create_student(s)
            for a in sorted({a for _, a in pairs}):
                gb.update_or_create_assignment(a)
        shares = run_in_parallel(functools.partial(_autograde_pairs, str(course_dir)), pairs, workers)
        failures = {k: v for share in shares for k, v in share.items()}
    else:
        failures = _autograde_pairs(course_dir, pairs, config)
    graded = [sc for sc in scores(course_dir) if (sc.student, sc.assignment) in set(pairs) - set(failures)]
    if failures:
        raise AutogradeFailed(graded, failures)
    return graded


def _autograde_pairs(course_dir: Path | str, pairs: list[tuple[str, str]], config: Any = None
                     ) -> dict[tuple[str, str], str]:
    """nbgrader's ``Autograde`` on each (student, assignment) pair, one after another, in this process
    (a pool worker's body too, so it sets up the grading environment itself). A submission nbgrader
    cannot grade is skipped, so one student's broken kernel never stops the class; returns why each
    skipped one failed (the last lines of nbgrader's log)."""
    from nbgrader.converters import Autograde

    failures: dict[tuple[str, str], str] = {}
    with grading_environment():
        config = load_config(Path(course_dir)) if config is None else config
        coursedir = _coursedir(config)
        for s, a in pairs:
            coursedir.student_id, coursedir.assignment_id = s, a
            app = Autograde(coursedir=coursedir, config=config)
            app.force = True
            app.create_student = True
            try:
                _run(app, f"autograde {a} for {s}")
            except GradingError as e:
                causes = [ln.strip() for ln in str(e).splitlines() if "Error" in ln and "Traceback" not in ln]
                failures[s, a] = (causes[-1] if causes else str(e).splitlines()[0])[:300]
    return failures


@_in_grading_environment
def scores(course_dir: Path = COURSE_DIR) -> list[Score]:
    """Every graded submission in the gradebook."""
    from nbgrader.api import MissingEntry

    out = []
    with _gradebook(load_config(course_dir)) as gb:
        for a in gb.assignments:
            for st in gb.students:
                try:
                    sub = gb.find_submission(a.name, st.id)
                except MissingEntry:
                    continue
                out.append(Score(st.id, a.name, float(sub.score), float(sub.max_score),
                                 bool(sub.needs_manual_grade)))
    return out


@_in_grading_environment
def cell_scores(assignment: str, student: str, course_dir: Path = COURSE_DIR) -> dict[str, float]:
    """Points per graded cell (grade_id -> score) of one submission: what tests and reports look at."""
    with _gradebook(load_config(course_dir)) as gb:
        sub = gb.find_submission(assignment, student)
        return {g.name: float(g.score) for nb in sub.notebooks for g in nb.grades}


@_in_grading_environment
def feedback(course_dir: Path = COURSE_DIR, student: str | None = None, assignment: str | None = None
             ) -> list[Path]:
    """HTML feedback (hidden tests included, by nbgrader's design) for autograded submissions."""
    from nbgrader.converters import GenerateFeedback

    config = load_config(course_dir)
    config.HTMLExporter.template_name = "feedback"
    coursedir = _coursedir(config)
    course_dir = course_dir.resolve()
    made = []
    for s, a in submissions(course_dir, student, assignment):
        if not (course_dir / "autograded" / s / a).exists():
            continue
        coursedir.student_id, coursedir.assignment_id = s, a
        app = GenerateFeedback(coursedir=coursedir, config=config)
        app.force = True
        _run(app, f"generate_feedback {a} for {s}")
        made.extend(sorted((course_dir / "feedback" / s / a).glob("*.html")))
    return made


@_in_grading_environment
def export_grades(course_dir: Path = COURSE_DIR, dest: Path | None = None) -> Path:
    """One CSV row per (assignment, student), as ``nbgrader export`` writes it (missing work scores 0)."""
    from nbgrader.plugins import CsvExportPlugin

    config = load_config(course_dir)
    dest = (dest or course_dir / "grades.csv").resolve()
    with _gradebook(config) as gb:
        CsvExportPlugin(to=str(dest), config=config).export(gb)
    return dest
