"""Lesson 00 runs top to bottom in JupyterLab in Chromium, and every cell ends without an error.

``tests/test_lessons.py`` runs the same notebooks through nbclient; this is the learner's path: the page
loads, the kernel starts, Run All Cells runs everything, plots and widgets render. A lesson that only
breaks in the browser (a widget that fails to render, a cell that needs ``await`` in a front end, a
progress bar that writes to stderr) shows up here and in the screenshots. Lesson 04 has the same check in
``test_browser_lesson04.py``, next to its widget's tests (one run serves both).
"""

from __future__ import annotations

from typing import Any

import pytest
from jlab_helpers import (
    RUN_ALL_S,
    cells_with_images,
    check_clean,
    expect_visible_image,
    find_cell,
    notebook_cells,
    open_notebook,
    run_all,
    screenshot,
    scroll_to_cell,
)


@pytest.mark.timeout(RUN_ALL_S + 120)
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
    # The picture of the lesson: the pause (prefill) and the stream (decode), as the learner sees it.
    try:
        scroll_to_cell(page, find_cell(cells, r"the pause and the stream"))
    except AssertionError:
        scroll_to_cell(page, plots[-1])
    expect_visible_image(page)
    screenshot(page, "lesson00_run_all")
