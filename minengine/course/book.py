"""``make book``: the course as a static HTML site (Jupyter Book 1.x), lessons with their outputs.

Why Jupyter Book 1.x (Sphinx + MyST-NB): it installs from PyPI with no Node.js, renders notebooks with
their outputs as they are (``execute_notebooks: off``), and writes plain relative links, so the site
works opened from disk (``build/book/_build/html/index.html``) as well as served.

What goes in (staged into ``build/book_src/``, built into ``build/book/``):

* every ``lessons/*.ipynb`` (a glob, so lessons appear as they land), taken from
  ``build/executed/lessons/`` where ``tests/test_lessons.py`` left an executed copy (with
  ``machine.json`` saying where it ran); else, with ``execute=True``, executed here first (headless
  sizes, as the tests run them); else the clean notebook, marked "not executed";
* a landing page (``book/intro.md``): what the course is, the two commands, the module map with each
  lesson's labs and quizzes;
* one page per lab: the student version (rendered for the default course seed, solutions replaced by
  the stub a student sees, hidden tests and mark schemes removed); a page that still holds a solution
  or hidden-test marker stops the build.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BOOK_DIR = ROOT / "book"
LESSONS_DIR = ROOT / "lessons"
LABS_DIR = ROOT / "labs"
QUIZZES_DIR = ROOT / "quizzes"
EXECUTED_DIR = ROOT / "build" / "executed" / "lessons"
STAGE_DIR = ROOT / "build" / "book_src"
OUT_DIR = ROOT / "build" / "book"
MACHINE_FILE = "machine.json"
# After which lesson each graded assignment comes (COURSE.md's module table), by assignment id prefix.
GRADED_AFTER = {"01": ("quiz1",), "04": ("lab1", "quiz2"), "06": ("lab2", "quiz3"), "08": ("lab3", "quiz4"),
                "09": ("quiz5",), "10": ("quiz6",), "11": ("quiz7",)}
LAB_LINK = re.compile(r"\(\.\./labs/([\w-]+)/\1\.ipynb\)")
LEAKS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS",
         "BEGIN MARK SCHEME", "@@", "* [x]", "* [X]")


class BookError(RuntimeError):
    """The book cannot be built (a leak in a lab page, a failed Sphinx run); the message says why."""


# ------------------------------------------------------------------------------------------ machine
def machine_info() -> dict[str, Any]:
    """Where the executed outputs come from: CPU, cores, torch version, date (UTC)."""
    from minengine.perf.measure import cpu_name

    cpu = cpu_name()
    try:
        import torch

        torch_version = torch.__version__
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # torch missing or broken: the note just says so
        torch_version, gpu = "not installed", None
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "torch": torch_version,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def record_machine(folder: Path = EXECUTED_DIR) -> None:
    """Write ``machine.json`` next to executed lessons (tests/test_lessons.py calls this)."""
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{MACHINE_FILE}.{os.getpid()}"  # renamed whole: a test may be reading it
    partial.write_text(json.dumps(machine_info(), indent=1) + "\n")
    partial.replace(folder / MACHINE_FILE)


def describe_machine(info: dict[str, Any] | None) -> str:
    if not info:
        return "The lessons on this site were **not executed** (no run found): they show no outputs."
    gpu = f", GPU {info['gpu']}" if info.get("gpu") else ", no GPU"
    return (f"The outputs on this site were produced on **{info.get('cpu', '?')}** ({info.get('cores', '?')} "
            f"logical cores{gpu}), PyTorch {info.get('torch', '?')}, Python {info.get('python', '?')}, on "
            f"{info.get('date', '?')}, with the small sizes the tests use (`MINENGINE_HEADLESS=1`).")


# ------------------------------------------------------------------------------------------ lessons
def execute_lessons(lessons: Sequence[Path], folder: Path = EXECUTED_DIR, timeout: int = 600) -> None:
    """Run each lesson headless (as tests/test_lessons.py does) and keep the executed copy."""
    import nbformat
    from nbclient import NotebookClient

    os.environ.update({"MINENGINE_HEADLESS": "1", "HF_HUB_OFFLINE": "1",
                       "MPLBACKEND": "module://matplotlib_inline.backend_inline"})
    folder.mkdir(parents=True, exist_ok=True)
    for path in lessons:
        print(f"executing {path.name} ...", flush=True)
        nb = nbformat.read(path, as_version=4)
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute()
        except Exception as exc:  # one broken lesson must not take the whole site down
            print(f"  {path.name} failed ({type(exc).__name__}); its page shows no outputs", flush=True)
            continue
        nbformat.write(nb, folder / path.name)
        record_machine(folder)


def stage_lesson(path: Path, executed_dir: Path, dst: Path) -> bool:
    """Copy a lesson into the book (executed copy if there is one); links to labs point at lab pages.
    Returns whether the page has outputs."""
    executed = executed_dir / path.name
    use = executed if executed.exists() else path
    nb = json.loads(use.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            cell["source"] = LAB_LINK.sub(lambda m: f"(../labs/{m.group(1)}.ipynb)", text)
    if not executed.exists():
        note = {"cell_type": "markdown", "metadata": {}, "source": "*(This page was built without running "
                "the lesson, so it shows no outputs: run `make book` after `make test`.)*"}
        nb["cells"].insert(1, note)
    dst.write_text(json.dumps(nb, ensure_ascii=False))
    return executed.exists()


def title_of(path: Path) -> str:
    """The first ``# heading`` of a notebook (its file name when there is none)."""
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


# ------------------------------------------------------------------------------------------ labs
def student_version(folder: Path) -> dict[str, Any]:
    """A lab as its students get it: rendered for the default seed, solutions stubbed, hidden tests and
    mark schemes removed (nbgrader's own preprocessors), checked for any leftover marker."""
    import nbformat
    from nbgrader.preprocessors import ClearHiddenTests, ClearMarkScheme, ClearSolutions

    from minengine.course.templating import DEFAULT_COURSE_SEED, load_params, render_notebook

    src = folder / f"{folder.name}.ipynb"
    rendered = render_notebook(json.loads(src.read_text()), DEFAULT_COURSE_SEED,
                               load_params(folder, DEFAULT_COURSE_SEED), folder.name).notebook
    nb = nbformat.from_dict(rendered)
    resources: dict[str, Any] = {}
    for pre in (ClearSolutions(), ClearHiddenTests(), ClearMarkScheme()):
        nb, resources = pre.preprocess(nb, resources)
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    text = json.dumps(nb)
    leaked = [m for m in LEAKS if m in text]
    if leaked:
        raise BookError(f"{src}: the student version still contains {', '.join(leaked)}")
    return dict(nb)


def graded_work() -> dict[str, tuple[str, Path]]:
    """Assignment id -> (kind, folder) for every lab and quiz in the repository."""
    found = {}
    for kind, root in (("lab", LABS_DIR), ("quiz", QUIZZES_DIR)):
        for folder in sorted(p for p in root.glob("*") if (p / f"{p.name}.ipynb").exists()):
            found[folder.name] = (kind, folder)
    return found


def module_map(lessons: Sequence[Path], work: dict[str, tuple[str, Path]]) -> str:
    """The landing page's table: each lesson, then the labs and quizzes that follow it."""
    rows = ["| Lesson | Graded work after it |", "|---|---|"]
    placed: set[str] = set()
    for path in lessons:
        after = []
        for prefix in GRADED_AFTER.get(path.name[:2], ()):
            for aid, (kind, folder) in work.items():
                if aid.startswith(prefix + "_") and aid not in placed:
                    placed.add(aid)
                    name = title_of(folder / f"{aid}.ipynb")
                    after.append(f"[{name}](labs/{aid}.ipynb)" if kind == "lab" else f"{name} (quiz)")
        rows.append(f"| [{title_of(path)}](lessons/{path.stem}.ipynb) | {'; '.join(after) or '—'} |")
    rest = [aid for aid in work if aid not in placed]
    if rest:
        rows.append("| (other graded work) | " + "; ".join(
            f"[{aid}](labs/{aid}.ipynb)" if work[aid][0] == "lab" else aid for aid in rest) + " |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------ build
def stage(stage_dir: Path = STAGE_DIR, executed_dir: Path = EXECUTED_DIR, lessons_dir: Path = LESSONS_DIR
          ) -> dict[str, Any]:
    """Write the book's sources: config, landing page, lessons, lab pages, table of contents."""
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    (stage_dir / "lessons").mkdir(parents=True)
    (stage_dir / "labs").mkdir()
    shutil.copy2(BOOK_DIR / "_config.yml", stage_dir / "_config.yml")
    shutil.copytree(BOOK_DIR / "_static", stage_dir / "_static")
    lessons = sorted(lessons_dir.glob("*.ipynb"))
    executed = [p.stem for p in lessons if stage_lesson(p, executed_dir, stage_dir / "lessons" / p.name)]
    work = graded_work()
    labs = [aid for aid, (kind, _) in work.items() if kind == "lab"]
    for aid in labs:
        (stage_dir / "labs" / f"{aid}.ipynb").write_text(json.dumps(student_version(work[aid][1]),
                                                                     ensure_ascii=False))
    machine = executed_dir / MACHINE_FILE
    info = json.loads(machine.read_text()) if machine.exists() and executed else None
    intro = (BOOK_DIR / "intro.md").read_text()
    intro = intro.replace("{machine_note}", describe_machine(info)).replace(
        "{module_map}", module_map(lessons, work))
    (stage_dir / "intro.md").write_text(intro)
    toc = ["format: jb-book", "root: intro", "parts:", "  - caption: Lessons", "    chapters:"]
    toc += [f"      - file: lessons/{p.stem}" for p in lessons]
    if labs:
        toc += ["  - caption: Labs", "    chapters:"] + [f"      - file: labs/{aid}" for aid in labs]
    (stage_dir / "_toc.yml").write_text("\n".join(toc) + "\n")
    return {"lessons": [p.stem for p in lessons], "executed": executed, "labs": labs, "machine": info}


def build(out_dir: Path = OUT_DIR, *, execute: bool = False, stage_dir: Path = STAGE_DIR,
          executed_dir: Path = EXECUTED_DIR, lessons_dir: Path = LESSONS_DIR, quiet: bool = True) -> Path:
    """Stage and build the site; returns the path of its ``index.html``. With ``execute``, lessons that
    have no executed copy are run first."""
    lessons = sorted(lessons_dir.glob("*.ipynb"))
    missing = [p for p in lessons if not (executed_dir / p.name).exists()]
    if execute and missing:
        execute_lessons(missing, executed_dir)
    staged = stage(stage_dir, executed_dir, lessons_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(stage_dir), "--path-output",
           str(out_dir), "--builder", "html"] + (["--quiet"] if quiet else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    index = out_dir / "_build" / "html" / "index.html"
    if done.returncode != 0 or not index.exists():
        raise BookError(f"jupyter-book build failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                        f"{done.stderr[-3000:]}")
    print(f"built {len(staged['lessons'])} lessons ({len(staged['executed'])} with outputs) and "
          f"{len(staged['labs'])} lab pages: {index}")
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the course as a static HTML site (Jupyter Book)")
    parser.add_argument("--no-execute", action="store_true",
                        help="never run lessons: pages without an executed copy show no outputs")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    try:
        build(args.out, execute=not args.no_execute, quiet=False)
    except BookError as exc:
        print(f"make book: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
