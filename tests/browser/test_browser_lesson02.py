"""Lesson 02 in the browser: it runs clean, its rooflines render, and its widget answers a new batch.

The whole lesson runs once (Run All Cells) for this module. ``tests/test_roofline_lesson.py`` checks the
widget's logic without a front end; this checks the learner's round trip: typing a batch in Chromium
reaches the kernel, the widget re-prices the step, and new text and a new plot come back to the page
(and a bad batch shows a message instead of a traceback). The widget carries ``me-roof-*`` CSS classes.
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
    show_output,
    show_widget,
    wait_changed,
)

WIDGET = f"{NOTEBOOK} .me-roof-widget"
UPDATE_MS = 30_000  # kernel round trip and a matplotlib redraw on a busy 2-core machine
LESSON = "lessons/02_roofline.ipynb"


@pytest.fixture(scope="module")
def lesson02(browser: Any, lab_server: Any) -> Iterator[RanNotebook]:
    """Lesson 02 after Run All Cells, shared by this module's tests (one run of the lesson)."""
    yield from run_notebook(browser, lab_server, LESSON, RUN_ALL_S)




@pytest.mark.timeout(RUN_ALL_S + 120)
@pytest.mark.runs_lesson("02_roofline")
def test_lesson_02_runs_clean_in_the_browser(lesson02: RanNotebook) -> None:
    check_clean("lesson 02", lesson02.finished, lesson02.cells)
    check_claims("lesson 02", lesson02.cells)
    plots = cells_with_images(lesson02.cells)
    assert len(plots) >= 5, f"lesson 02 drew only {len(plots)} plots"
    # The picture of the lesson: every op of a step on this machine's roofline.
    show_output(lesson02.page, find_cell(lesson02.cells, r'\("decode attention \(batch'))
    screenshot(lesson02.page, "lesson02_ops_on_the_roofline")
    show_output(lesson02.page, find_cell(lesson02.cells, r"calibrated simulator's prediction"))
    screenshot(lesson02.page, "lesson02_calibrated_vs_sweep")


def show_widget_here(lesson02: RanNotebook) -> Any:
    return show_widget(lesson02, r"RooflineWidget\(", WIDGET, UPDATE_MS)


@pytest.mark.timeout(RUN_ALL_S + 120)
def test_roofline_widget_answers_a_new_batch(lesson02: RanNotebook) -> None:
    page, widget = lesson02.page, show_widget_here(lesson02)
    summary = widget.locator(".me-roof-summary")
    text, src = summary.inner_text(), widget.locator("img.me-roof-plot").get_attribute("src") or ""
    batch = widget.locator(".me-roof-batch input")
    batch.fill("128")
    batch.press("Enter")  # the box commits on Enter
    wait_changed(page, f"{WIDGET} .me-roof-summary", text)
    assert "batch 128" in summary.inner_text() and "B*" in summary.inner_text()
    wait_changed(page, f"{WIDGET} img.me-roof-plot", src, "src")
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    plot = widget.locator("img.me-roof-plot")
    box, view = plot.bounding_box(), page.viewport_size
    assert box and box["x"] + box["width"] <= view["width"], "the plot is wider than the screen"
    screenshot(page, "lesson02_roofline_widget")

    batch.fill("0")
    batch.press("Enter")
    error = widget.locator(".me-roof-error")
    error.wait_for(state="visible", timeout=UPDATE_MS)
    assert "at least 1" in error.inner_text() and "Traceback" not in widget.inner_text()
    assert not plot.is_visible(), "the previous plot stayed under the error message"
    screenshot(page, "lesson02_roofline_widget_bad_input")
    batch.fill("32")
    batch.press("Enter")
    error.wait_for(state="detached", timeout=UPDATE_MS)
    plot.wait_for(state="visible", timeout=UPDATE_MS)
