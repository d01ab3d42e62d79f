"""Run a lesson's own cells in a test: the measuring loops live in the notebooks, where learners read and
change them, so their tests execute those cells (found by how they begin) rather than a copy."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import nbformat

LESSONS = Path(__file__).resolve().parents[1] / "lessons"


def cell_source(lesson: str, start: str) -> str:
    """The source of ``lesson``'s one code cell that begins with ``start``."""
    (cell,) = [c for c in nbformat.read(LESSONS / f"{lesson}.ipynb", as_version=4).cells
               if c.cell_type == "code" and c.source.startswith(start)]
    return cell.source


def run_cells(lesson: str, starts: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Execute each cell (by its beginning) in ``namespace``, in order, and return the namespace."""
    for start in starts:
        exec(cell_source(lesson, start), namespace)  # noqa: S102 (the lesson's own cell)
    return namespace


def define(lesson: str, starts: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Only the functions that each cell (by its beginning) defines, in ``namespace``: a cell that
    defines a stage and then runs it on the lesson's data is tested on the test's own data."""
    for start in starts:
        tree = ast.parse(cell_source(lesson, start))
        tree.body = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
        exec(compile(tree, f"<{lesson}: {start}>", "exec"), namespace)  # noqa: S102 (the lesson's own cell)
    return namespace
