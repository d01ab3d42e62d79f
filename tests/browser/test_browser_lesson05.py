"""Lesson 05 in the browser: it runs clean, its plots render, and its batching widget answers a new scheduler.

The whole lesson runs once (Run All Cells) for this module. ``tests/test_batching_widgets.py`` checks the
widget's logic without a front end; this checks the learner's round trip: picking another scheduler in
Chromium reaches the kernel, the simulator reruns, and new text and a new plot come back to the page.
The widget carries ``me-bat-*`` CSS classes for this.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from jlab_helpers import (
    NOTEBOOK,
    RUN_ALL_S,
    RanNotebook,
    cells_with_images,
    check_claims,
    check_clean,
    find_cell,
    run_notebook,
    screenshot,
    scroll_to_cell,
    show_output,
    wait_changed,
)

WIDGET = f"{NOTEBOOK} .me-bat-widget"
UPDATE_MS = 60_000  # kernel round trip, a simulation and a matplotlib redraw on a busy 2-core machine
LESSON = "lessons/05_batching.ipynb"


@pytest.fixture(scope="module")
def lesson05(browser: Any, lab_server: Any) -> Iterator[RanNotebook]:
    """Lesson 05 after Run All Cells, shared by this module's tests (one run of the lesson)."""
    yield from run_notebook(browser, lab_server, LESSON, RUN_ALL_S)




@pytest.mark.timeout(RUN_ALL_S + 120)
@pytest.mark.runs_lesson("05_batching")
def test_lesson_05_runs_clean_in_the_browser(lesson05: RanNotebook) -> None:
    check_clean("lesson 05", lesson05.finished, lesson05.cells)
    check_claims("lesson 05", lesson05.cells)
    assert len(cells_with_images(lesson05.cells)) >= 5
    show_output(lesson05.page, find_cell(lesson05.cells, r"how full the batch is"))
    screenshot(lesson05.page, "lesson05_static_vs_continuous")
    show_output(lesson05.page, find_cell(lesson05.cells, r"frontier = \{static"))
    screenshot(lesson05.page, "lesson05_frontier")


@pytest.mark.timeout(RUN_ALL_S + 120)
def test_batching_widget_answers_a_new_scheduler(lesson05: RanNotebook) -> None:
    page = lesson05.page
    scroll_to_cell(page, find_cell(lesson05.cells, r"BatchingWidget\("))
    widget = page.locator(WIDGET)
    widget.wait_for(state="visible", timeout=UPDATE_MS)
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    summary = widget.locator(".me-bat-summary")
    assert "static (batch by batch)" in summary.inner_text()  # the headless run picked static
    text, src = summary.inner_text(), widget.locator("img.me-bat-plot").get_attribute("src") or ""
    widget.locator(".me-bat-scheduler select").select_option(label="continuous (vLLM)")
    wait_changed(page, f"{WIDGET} .me-bat-summary", text, timeout_ms=UPDATE_MS)
    assert "continuous (vLLM) batching" in summary.inner_text()
    wait_changed(page, f"{WIDGET} img.me-bat-plot", src, "src", timeout_ms=UPDATE_MS)
    assert widget.locator(".me-bat-error").count() == 0
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    box, view = widget.locator("img.me-bat-plot").bounding_box(), page.viewport_size
    assert box and box["x"] + box["width"] <= view["width"], "the plot is wider than the screen"
    screenshot(page, "lesson05_batching_widget")
