"""Lessons 00 and 01 run top to bottom in JupyterLab in Chromium, and every cell ends without an error.

``tests/test_lessons.py`` runs the same notebooks through nbclient; this is the learner's path: the page
loads, the kernel starts, Run All Cells runs everything, plots and widgets render. A lesson that only
breaks in the browser (a widget that fails to render, a cell that needs ``await`` in a front end, a
progress bar that writes to stderr) shows up here and in the screenshots. Lessons 03 and 04 have the same
check in their own files, next to their widgets' tests (one run serves both); lesson 01's widget is driven
from the browser in ``test_browser_experiment_widget.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from jlab_helpers import (
    RUN_ALL_S,
    cells_with_images,
    check_claims,
    check_clean,
    expect_visible_image,
    find_cell,
    notebook_cells,
    open_notebook,
    run_all,
    screenshot,
    scroll_to_cell,
    show_output,
)


@pytest.mark.timeout(RUN_ALL_S + 120)
@pytest.mark.runs_lesson("00_start_here")
def test_lesson_00_runs_clean_in_the_browser(page: Any, lab_server: Any) -> None:
    path = "lessons/00_start_here.ipynb"
    if not (lab_server.root / path).exists():
        pytest.skip(f"{path} is not in the course (yet)")
    open_notebook(page, lab_server, path)
    finished = run_all(page, RUN_ALL_S)
    cells = notebook_cells(page)
    check_clean("lesson 00", finished, cells)
    plots = cells_with_images(cells)
    assert plots, "lesson 00 drew no plot"
    check_claims("lesson 00", cells)
    # The picture of the lesson: the pause (prefill) and the stream (decode), as the learner sees it.
    try:
        scroll_to_cell(page, find_cell(cells, r"the pause and the stream"))
    except AssertionError:
        scroll_to_cell(page, plots[-1])
    expect_visible_image(page)
    screenshot(page, "lesson00_run_all")
    # The same measurement on the real model the switch picked (SmolLM2, or the tiny one as a fallback).
    assert len(plots) >= 2, "lesson 00 drew the tiny model's pause and stream but not the real model's"
    show_output(page, find_cell(cells, r"the pause and the stream, \{picked"))
    screenshot(page, "lesson00_real_model")


@pytest.mark.timeout(RUN_ALL_S + 120)
@pytest.mark.runs_lesson("01_two_phases")
def test_lesson_01_runs_clean_in_the_browser(page: Any, lab_server: Any) -> None:
    path = "lessons/01_two_phases.ipynb"
    if not (lab_server.root / path).exists():
        pytest.skip(f"{path} is not in the course (yet)")
    open_notebook(page, lab_server, path)
    finished = run_all(page, RUN_ALL_S)
    cells = notebook_cells(page)
    check_clean("lesson 01", finished, cells)
    plots = cells_with_images(cells)
    assert len(plots) >= 3, f"lesson 01 drew plots in {len(plots)} cells (prefill, decode, latency)"
    # The decode curve against the roofline from this machine's measured bandwidth and peak.
    check_claims("lesson 01", cells)
    show_output(page, find_cell(cells, r"decode step time vs batch"))
    screenshot(page, "lesson01_decode_roofline")
    show_output(page, find_cell(cells, r"prefill time vs prompt length"))
    screenshot(page, "lesson01_prefill")

