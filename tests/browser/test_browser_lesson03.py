"""Lesson 03 in the browser: it runs clean, its plots render, and its latency widget answers a new rate.

The whole lesson runs once (Run All Cells) for this module. ``tests/test_latency_widget.py`` checks the
widget's logic without a front end; this checks the learner's round trip: typing a rate in Chromium
reaches the kernel, the simulator reruns, and new text and a new plot come back to the page (and a bad
rate shows a message instead of a traceback). The widget carries ``me-lat-*`` CSS classes for this.
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

WIDGET = f"{NOTEBOOK} .me-lat-widget"
UPDATE_MS = 30_000  # kernel round trip, a simulation and a matplotlib redraw on a busy 2-core machine
LESSON = "lessons/03_measuring_latency.ipynb"


@pytest.fixture(scope="module")
def lesson03(browser: Any, lab_server: Any) -> Iterator[RanNotebook]:
    """Lesson 03 after Run All Cells, shared by this module's tests (one run of the lesson)."""
    yield from run_notebook(browser, lab_server, LESSON, RUN_ALL_S)



@pytest.mark.timeout(RUN_ALL_S + 120)
@pytest.mark.runs_lesson("03_measuring_latency")
def test_lesson_03_runs_clean_in_the_browser(lesson03: RanNotebook) -> None:
    check_clean("lesson 03", lesson03.finished, lesson03.cells)
    check_claims("lesson 03", lesson03.cells)
    plots = cells_with_images(lesson03.cells)
    assert len(plots) >= 5, f"lesson 03 drew only {len(plots)} plots"
    # The picture of the lesson: one request's life, queue -> prefill chunks -> first token -> decode.
    show_output(lesson03.page, find_cell(lesson03.cells, r"plot_request_timeline\(burst"))
    screenshot(lesson03.page, "lesson03_request_timeline")
    show_output(lesson03.page, find_cell(lesson03.cells, r"h100 = \[simulate_latency"))
    screenshot(lesson03.page, "lesson03_saturation")



def show_widget_here(lesson03: RanNotebook) -> Any:
    return show_widget(lesson03, r"LatencyWidget\(", WIDGET, UPDATE_MS)


@pytest.mark.timeout(RUN_ALL_S + 120)
def test_latency_widget_answers_a_new_rate(lesson03: RanNotebook) -> None:
    page, widget = lesson03.page, show_widget_here(lesson03)
    summary = widget.locator(".me-lat-summary")
    text, src = summary.inner_text(), widget.locator("img.me-lat-plot").get_attribute("src") or ""
    rate = widget.locator(".me-lat-rate input")
    rate.fill("45")
    rate.press("Enter")  # the box commits on Enter (continuous_update=False)
    wait_changed(page, f"{WIDGET} .me-lat-summary", text)
    assert "at 45 req/s" in summary.inner_text()
    wait_changed(page, f"{WIDGET} img.me-lat-plot", src, "src")
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    plot = widget.locator("img.me-lat-plot")
    box, view = plot.bounding_box(), page.viewport_size
    assert box and box["x"] + box["width"] <= view["width"], "the plot is wider than the screen"
    screenshot(page, "lesson03_latency_widget")

    rate.fill("-1")
    rate.press("Enter")
    error = widget.locator(".me-lat-error")
    error.wait_for(state="visible", timeout=UPDATE_MS)
    assert "positive" in error.inner_text() and "Traceback" not in widget.inner_text()
    assert not plot.is_visible(), "the previous plot stayed under the error message"
    rate.fill("30")
    rate.press("Enter")
    error.wait_for(state="detached", timeout=UPDATE_MS)
    plot.wait_for(state="visible", timeout=UPDATE_MS)
