"""Course tooling: ``python -m minengine.course <command>``.

Learners: ``open`` sets up a workspace and starts JupyterLab; ``validate`` checks a lab or quiz.
Instructors: ``release``, ``submit``, ``autograde``, ``feedback``, ``export`` run nbgrader on a course
directory (``build/course/`` by default) assembled from ``labs/`` and ``quizzes/``.

The learner never edits the files under version control: lessons and the *student versions* of labs and
quizzes are copied into a git-ignored ``workspace/`` once, so ``git pull`` can update the course without
clobbering anyone's work. The nbgrader sources (with solutions) never go there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from minengine.course.templating import MIN_CLASS_SEED_BITS, SEED_FILE, seed_strength_bits

REPO_ROOT = Path(__file__).resolve().parents[2]
LESSONS_DIR = REPO_ROOT / "lessons"
WORKSPACE_DIR = REPO_ROOT / "workspace"
COURSE_DIR = REPO_ROOT / "build" / "course"
# Source folders and where their student versions go in the workspace.
GRADED_KINDS = {"labs": REPO_ROOT / "labs", "quizzes": REPO_ROOT / "quizzes"}

# Flags that keep JupyterLab quiet and offline: no update checks, no news feed.
OFFLINE_LAB_FLAGS = [
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    "--LabApp.news_url=None",
]


def _copy_missing(src_dir: Path, dst_dir: Path, pattern: str = "**/*") -> list[Path]:
    """Copy files that the destination lacks; never overwrite what a learner may have edited."""
    copied = []
    for src in sorted(src_dir.glob(pattern)):
        if not src.is_file() or ".ipynb_checkpoints" in src.parts:
            continue
        dst = dst_dir / src.relative_to(src_dir)
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            copied.append(dst)
    return copied


def prepare_workspace(workspace: Path = WORKSPACE_DIR, lessons: Path = LESSONS_DIR) -> list[Path]:
    """Copy lessons that the workspace does not have yet; never overwrite a learner's copy.

    Returns the notebooks that were newly copied.
    """
    target = workspace / "lessons"
    target.mkdir(parents=True, exist_ok=True)
    return _copy_missing(lessons, target, "*.ipynb")


def place_student_versions(workspace: Path = WORKSPACE_DIR, course_dir: Path = COURSE_DIR,
                           kinds: dict[str, Path] | None = None) -> list[Path]:
    """Put the student versions of labs and quizzes in ``workspace/{labs,quizzes}/<id>/``.

    They are generated first when missing or older than their sources. Returns the files newly copied.
    """
    from minengine.course import grading

    kinds = GRADED_KINDS if kinds is None else kinds
    per_kind = {kind: grading.discover_sources((root,)) for kind, root in kinds.items()}
    sources = {a: src for found in per_kind.values() for a, src in found.items()}
    if not sources:
        return []
    releases = grading.ensure_release(course_dir, sources)
    copied = []
    for kind, found in per_kind.items():
        for assignment in found:
            copied += _copy_missing(releases[assignment], workspace / kind / assignment)
    return copied


def open_course(lab_args: list[str], workspace: Path = WORKSPACE_DIR) -> int:
    copied = prepare_workspace(workspace)
    if copied:
        print(f"Copied {len(copied)} lesson(s) into {workspace / 'lessons'}")
    try:
        placed = place_student_versions(workspace)
    except Exception as exc:  # the lessons still work without the graded notebooks
        print(f"Could not prepare the labs and quizzes ({exc}); the lessons are unaffected.", file=sys.stderr)
    else:
        if placed:
            print(f"Copied {len(placed)} lab/quiz file(s) into {workspace / 'labs'} and "
                  f"{workspace / 'quizzes'}")
    _write_learner_nbgrader_config(workspace)
    print(f"Starting JupyterLab in {workspace} (Ctrl+C to stop) ...", flush=True)
    env = dict(os.environ)
    # Offline by default: the shipped model never needs the network, and a hub lookup would hang.
    env.setdefault("HF_HUB_OFFLINE", "1")
    # The venv's bin on PATH, so notebooks' shell commands and nbgrader's alembic find their tools.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace}", *OFFLINE_LAB_FLAGS,
           *lab_args]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in lab_args:
        cmd.append("--allow-root")  # containers and CI often run as root; JupyterLab refuses otherwise
    try:
        # cwd = workspace: nbgrader's Validate button reads nbgrader_config.py from the server's cwd
        return subprocess.call(cmd, env=env, cwd=workspace)
    except KeyboardInterrupt:
        return 0


LEARNER_NBGRADER_CONFIG = """\
# Written by `make course` for self-paced learners (not used for grading a class).
c = get_config()  # noqa: F821
c.CourseDirectory.root = {root!r}  # the workspace is the notebook root, so nbgrader stops warning
c.Validator.validate_all = True  # the Validate button lists every failing check, not just the first
"""


def _write_learner_nbgrader_config(workspace: Path) -> None:
    path = workspace / "nbgrader_config.py"
    if not path.exists():  # a learner's own edits win
        path.write_text(LEARNER_NBGRADER_CONFIG.format(root=str(workspace.resolve())))


# ------------------------------------------------------------------------------------- instructor side
def _print_scores(scores: list) -> None:
    if not scores:
        print("no graded submissions yet")
        return
    width = max(len(s.student) for s in scores)
    for s in sorted(scores, key=lambda s: (s.assignment, s.student)):
        flag = "  (needs manual grading)" if s.needs_manual_grade else ""
        print(f"  {s.assignment:24s} {s.student:{width}s} {s.score:6.1f} / {s.max_score:<5.1f}{flag}")


SEED_ADVICE = "python3 -c 'import secrets; print(secrets.token_urlsafe(16))'"


def class_seed_problem(course_dir: Path, seed: str | None, public: bool) -> str | None:
    """Why this release's seed would let a student render the keys from the public sources, or None.

    Every graded point depends on the course seed (``minengine.course.templating``): the default one is
    public, and a short one can be found by rendering every seed up to it. ``public`` (self-paced use, a
    demo) accepts either."""
    if public:
        return None
    given = seed if seed is not None else os.environ.get("MINENGINE_COURSE_SEED", "").strip() or None
    if given is None:
        if (course_dir / SEED_FILE).is_file():
            return None  # the seed this class's first release stored
        return ("a class needs a secret course seed: the sources are public, so with the default seed "
                "anyone can render this course's answers.")
    bits = seed_strength_bits(given)
    if bits < MIN_CLASS_SEED_BITS:
        return (f"this course seed is too easy to find (about {bits:.0f} bits; a class needs "
                f"{MIN_CLASS_SEED_BITS}): a student with the public sources could render every seed up to "
                "it.")
    return None


def cmd_release(args: argparse.Namespace) -> int:
    from minengine.course import grading

    problem = class_seed_problem(args.course_dir, args.seed, args.public_seed)
    if problem:
        print(f"error: {problem}\nPick a random seed once per class and keep it private:\n"
              f"  make release COURSE_SEED=$({SEED_ADVICE})\n"
              "(self-paced use or a demo, where the keys need not be secret: add --public-seed, or "
              "PUBLIC_SEED=1 to make)", file=sys.stderr)
        return 2
    sources = None
    if args.assignment:  # one assignment only (e.g. the next lab of a running class)
        found = grading.discover_sources()
        if args.assignment not in found:
            raise grading.GradingError(f"no assignment {args.assignment!r} (known: "
                                       f"{', '.join(sorted(found))})")
        sources = {args.assignment: found[args.assignment]}
    released = grading.release(args.course_dir, sources, timeout=args.timeout, seed=args.seed)
    for assignment, folder in released.items():
        print(f"released {assignment}: {folder}")
    print(f"course directory: {args.course_dir} (nbgrader_config.py, gradebook.db, source/, release/); "
          f"course seed {grading.course_seed(args.course_dir)} (keep source/ private: it holds the keys)")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from minengine.course import grading

    for path in grading.submit(args.student, args.paths, args.course_dir, args.assignment):
        print(f"submitted {path}")
    return 0


def cmd_autograde(args: argparse.Namespace) -> int:
    from minengine.course import grading
    from minengine.course.autograde_pool import default_workers

    workers = default_workers() if getattr(args, "workers", None) is None else args.workers
    if workers < 1:
        print(f"--workers must be 1 or more, not {workers}", file=sys.stderr)
        return 2
    print("autograding (each notebook runs in a fresh kernel) ...", flush=True)
    if workers > 1:
        print(f"  on {workers} worker processes (--workers 1 grades one at a time)", flush=True)
    try:
        graded = grading.autograde(args.course_dir, args.student, args.assignment, workers=workers,
                                   sandbox=getattr(args, "sandbox", True))
    except grading.AutogradeFailed as failed:
        _print_scores(failed.scores)
        print(f"error: {failed}", file=sys.stderr)
        return 1
    _print_scores(graded)
    return 0


def cmd_feedback(args: argparse.Namespace) -> int:
    from minengine.course import grading

    made = grading.feedback(args.course_dir, args.student, args.assignment)
    for path in made:
        print(f"feedback {path}")
    if not made:
        print("nothing autograded yet: run autograde first")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from minengine.course import grading

    dest = grading.export_grades(args.course_dir, args.to)
    print(f"grades written to {dest}")
    _print_scores(grading.scores(args.course_dir))
    return 0


# ---------------------------------------------------------------------------------------- learner side
@dataclass(frozen=True)
class Validation:
    path: Path
    passed: bool
    problems: list[str]


def _cell_title(source: str) -> str:
    """A test cell's opening comment if it has one (ours say what they test), else its last line."""
    lines = [ln.strip() for ln in source.strip().splitlines() if ln.strip()]
    if not lines:
        return "(empty cell)"
    return (lines[0] if lines[0].startswith("#") else lines[-1])[:100]


def validate(path: Path, timeout: int = 60) -> Validation:
    """Run a notebook as nbgrader's Validate button does; failures come back as short readable lines.

    Uses ``nbgrader.validator.Validator`` directly: ``nbgrader validate`` exits 0 even when tests fail.
    """
    import nbformat
    from nbconvert.filters import strip_ansi
    from nbgrader.validator import Validator
    from traitlets.config import Config

    from minengine.course.grading import KERNEL_ARGS, GradingError, grading_environment

    path = Path(path).resolve()
    if not path.is_file():
        raise GradingError(f"no such notebook: {path}")
    nbformat.read(path, as_version=4)  # a clear error for a file that is not a notebook
    config = Config()
    config.Execute.timeout = int(timeout)
    config.Execute.extra_arguments = list(KERNEL_ARGS)
    with grading_environment():
        results = Validator(config=config).validate(str(path))
    problems = []
    for cell in results.get("type_changed", []):
        problems.append(f"a cell changed type ({cell['old_type']} -> {cell['new_type']}): "
                        f"{_cell_title(cell['source'])}")
    for cell in results.get("changed", []):
        problems.append(f"a test cell was edited (it is restored for grading): {_cell_title(cell['source'])}")
    for cell in results.get("failed", []):
        error = [ln for ln in strip_ansi(cell.get("raw_error", "")).strip().splitlines() if ln.strip()]
        problems.append(f"failed: {_cell_title(cell['source'])}\n      {error[-1] if error else ''}")
    return Validation(path, not problems, problems)


def workspace_notebooks(workspace: Path = WORKSPACE_DIR) -> list[Path]:
    """The labs and quizzes a learner has in the workspace (what ``validate`` checks by default)."""
    return sorted(p for kind in GRADED_KINDS for p in (workspace / kind).glob("*/*.ipynb")
                  if ".ipynb_checkpoints" not in p.parts)


def cmd_validate(args: argparse.Namespace) -> int:
    paths = args.notebooks or workspace_notebooks(args.workspace)
    if not paths:
        print(f"no notebooks to validate: pass one, or run `make course` to fill {args.workspace}")
        return 2
    failed = 0
    for path in paths:
        print(f"validating {path} ...", flush=True)
        result = validate(path, args.timeout)
        if result.passed:
            print("  PASSED: every test cell ran without error.")
        else:
            failed += 1
            print(f"  FAILED: {len(result.problems)} problem(s); you would not get full marks:")
            for problem in result.problems:
                print(f"  - {problem}")
    print(f"{len(paths) - failed} of {len(paths)} notebook(s) passed")
    return 1 if failed else 0


SELF_STUDENT = "self"  # the learner's own id in a self-paced course directory


def cmd_grade(args: argparse.Namespace) -> int:
    """Self-paced: grade your own notebooks against the course sources, with the hidden tests, and write
    feedback that explains every question. Classroom grades are unaffected (they use the class's seed)."""
    from minengine.course import grading

    paths = args.notebooks or workspace_notebooks(args.workspace)
    if not paths:
        print(f"nothing to grade: pass a notebook, or run `make course` to fill {args.workspace}")
        return 2
    grading.ensure_release(args.course_dir)
    from minengine.course.sandbox import sandbox_problem

    sandbox = sandbox_problem() is None  # your own notebook: the sandbox where there is one, else none
    pages = []
    for path in paths:
        (placed,) = grading.submit(SELF_STUDENT, [path], args.course_dir)
        assignment = placed.parent.name
        print(f"grading {path} as {assignment} (hidden tests included; each cell runs in a fresh kernel) ...",
              flush=True)
        (score,) = grading.autograde(args.course_dir, SELF_STUDENT, assignment, sandbox=sandbox)
        cells = grading.cell_scores(assignment, SELF_STUDENT, args.course_dir)
        print(f"  score {score.score:g} / {score.max_score:g}")
        for cell, points in cells.items():
            print(f"    {cell:28s} {points:g}")
        pages += grading.feedback(args.course_dir, SELF_STUDENT, assignment)
    for page in pages:
        print(f"feedback (why each answer is right): {page}")
    if pages and args.open:
        import webbrowser

        webbrowser.open(pages[0].as_uri())
    return 0


# ---------------------------------------------------------------------------------------------- the CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minengine.course", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_open = sub.add_parser("open", help="prepare workspace/ and start JupyterLab (extra args go to it)")
    p_open.add_argument("--workspace", type=Path, default=WORKSPACE_DIR)

    def course_cmd(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--course-dir", type=Path, default=COURSE_DIR, help="nbgrader course directory")
        return p

    p_rel = course_cmd("release", "build the course directory and generate the student versions")
    p_rel.add_argument("--timeout", type=int, default=60, help="seconds per cell when grading (default 60)")
    p_rel.add_argument("--seed", default=None,
                       help="course seed, any text (a class needs a random one of 64 bits or more: "
                            f"{SEED_ADVICE}): this class's numbers and answer order (default: the last "
                            "release's, else $MINENGINE_COURSE_SEED)")
    p_rel.add_argument("--public-seed", action="store_true",
                       help="accept the public default seed or a short one: keys anyone can render "
                            "(self-paced use, a demo), never for a graded class")
    p_rel.add_argument("--assignment", help="release only this assignment (default: every lab and quiz)")
    p_sub = course_cmd("submit", "put a student's notebooks under submitted/<student>/<assignment>/")
    p_sub.add_argument("--student", required=True)
    p_sub.add_argument("--assignment", help="needed only when a notebook's name does not say it")
    p_sub.add_argument("paths", nargs="+", type=Path, help="notebooks, or folders of notebooks")
    for name, help_text in (("autograde", "grade submissions (all, or one student / assignment)"),
                            ("feedback", "write HTML feedback for autograded submissions")):
        p = course_cmd(name, help_text)
        p.add_argument("--student")
        p.add_argument("--assignment")
        if name == "autograde":
            p.add_argument("--workers", type=int, help="processes grading at once (default: one per core, "
                           "at most 4)")
            p.add_argument("--no-sandbox", dest="sandbox", action="store_false",
                           help="run the kernels unconfined: only for notebooks you trust (a class's "
                                "submissions run in a bubblewrap sandbox; see labs/README.md)")
    p_exp = course_cmd("export", "write every grade to a CSV file")
    p_exp.add_argument("--to", type=Path, help="CSV path (default: <course-dir>/grades.csv)")
    p_val = sub.add_parser("validate", help="check a lab or quiz notebook; exits non-zero when a test fails")
    p_val.add_argument("notebooks", nargs="*", type=Path, help="default: every lab and quiz in the workspace")
    p_val.add_argument("--workspace", type=Path, default=WORKSPACE_DIR)
    p_val.add_argument("--timeout", type=int, default=60, help="seconds per cell (default 60)")
    p_grade = course_cmd("grade", "self-paced: grade your own notebooks with the hidden tests, with feedback")
    p_grade.add_argument("notebooks", nargs="*", type=Path,
                         help="default: every lab and quiz in the workspace")
    p_grade.add_argument("--workspace", type=Path, default=WORKSPACE_DIR)
    p_grade.add_argument("--no-open", dest="open", action="store_false", help="do not open the feedback page")
    return parser


COMMANDS = {"grade": cmd_grade, "release": cmd_release, "submit": cmd_submit, "autograde": cmd_autograde,
            "feedback": cmd_feedback, "export": cmd_export, "validate": cmd_validate}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "open":
        return open_course(rest, args.workspace)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    from minengine.course.grading import GradingError
    from minengine.course.sandbox import SandboxError

    try:
        return COMMANDS[args.command](args)
    except (GradingError, SandboxError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
