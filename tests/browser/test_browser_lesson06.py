"""Lesson 06 in the browser: it runs clean, its plots render, and its chunking widget answers a new budget.

The whole lesson runs once (Run All Cells) for this module. ``tests/test_batching_widgets.py`` checks the
widget's logic without a front end; this checks the learner's round trip: picking another budget in
Chromium reaches the kernel, the simulator reruns, and new text and a new plot come back to the page.
The widget carries ``me-chunk-*`` CSS classes for this.
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

WIDGET = f"{NOTEBOOK} .me-chunk-widget"
UPDATE_MS = 60_000
LESSON = "lessons/06_chunked_prefill.ipynb"


@pytest.fixture(scope="module")
def lesson06(browser: Any, lab_server: Any) -> Iterator[RanNotebook]:
    """Lesson 06 after Run All Cells, shared by this module's tests (one run of the lesson)."""
    yield from run_notebook(browser, lab_server, LESSON, RUN_ALL_S)


@pytest.mark.timeout(RUN_ALL_S + 120)
@pytest.mark.runs_lesson("06_chunked_prefill")
def test_lesson_06_runs_clean_in_the_browser(lesson06: RanNotebook) -> None:
    check_clean("lesson 06", lesson06.finished, lesson06.cells)
    check_claims("lesson 06", lesson06.cells)
    assert len(cells_with_images(lesson06.cells)) >= 5
    show_output(lesson06.page, find_cell(lesson06.cells, r'plot_streams\(axes\[0\], off'))
    screenshot(lesson06.page, "lesson06_spike")


@pytest.mark.timeout(RUN_ALL_S + 120)
def test_chunking_widget_answers_a_new_budget(lesson06: RanNotebook) -> None:
    page = lesson06.page
    scroll_to_cell(page, find_cell(lesson06.cells, r"ChunkingWidget\("))
    widget = page.locator(WIDGET)
    widget.wait_for(state="visible", timeout=UPDATE_MS)
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    summary = widget.locator(".me-chunk-summary")
    assert "budget 2,048 tokens" in summary.inner_text()
    text, src = summary.inner_text(), widget.locator("img.me-chunk-plot").get_attribute("src") or ""
    widget.locator(".me-chunk-budget select").select_option(label="512 tokens")
    wait_changed(page, f"{WIDGET} .me-chunk-summary", text, timeout_ms=UPDATE_MS)
    assert "budget 512 tokens" in summary.inner_text()
    wait_changed(page, f"{WIDGET} img.me-chunk-plot", src, "src", timeout_ms=UPDATE_MS)
    assert widget.locator(".me-chunk-error").count() == 0
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    box, view = widget.locator("img.me-chunk-plot").bounding_box(), page.viewport_size
    assert box and box["x"] + box["width"] <= view["width"], "the plot is wider than the screen"
    screenshot(page, "lesson06_chunking_widget")
