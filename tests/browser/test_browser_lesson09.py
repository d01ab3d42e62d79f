"""Lesson 09 in the browser: it runs clean, and its P:D-split widget answers a click and bad input.

``tests/test_capacity_lesson.py`` checks the widget's logic without a front end; this checks the round
trip a learner makes: a new SLO typed in Chromium and a click on *Simulate* reach the kernel, the
simulator runs, and the new summary and plot come back. The widget carries ``me-cap-*`` CSS classes.
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
    expect_visible_image,
    run_notebook,
    screenshot,
    scroll_to_cell,
    show_widget,
    wait_changed,
)

WIDGET = f"{NOTEBOOK} .me-cap-widget"
UPDATE_MS = 90_000  # a simulation of every split plus a redraw, on a busy 2-core machine
LESSON = "lessons/09_disaggregation_capacity.ipynb"


@pytest.fixture(scope="module")
def lesson09(browser: Any, lab_server: Any) -> Iterator[RanNotebook]:
    """Lesson 09 after Run All Cells, shared by this module's tests (one run of the lesson)."""
    yield from run_notebook(browser, lab_server, LESSON, RUN_ALL_S)


@pytest.mark.timeout(RUN_ALL_S + 120)
@pytest.mark.runs_lesson("09_disaggregation_capacity")
def test_lesson_09_runs_clean_in_the_browser(lesson09: RanNotebook) -> None:
    check_clean("lesson 09", lesson09.finished, lesson09.cells)
    check_claims("lesson 09", lesson09.cells)
    plots = cells_with_images(lesson09.cells)
    assert len(plots) >= 2, "lesson 09 drew fewer plots than it should"
    scroll_to_cell(lesson09.page, plots[0])
    expect_visible_image(lesson09.page)
    screenshot(lesson09.page, "lesson09_pools_plot")


def show_widget_here(lesson09: RanNotebook) -> Any:
    return show_widget(lesson09, r"CapacityWidget\(", WIDGET, UPDATE_MS)


def set_number(widget: Any, css: str, value: str) -> None:
    box = widget.locator(f".{css} input")
    box.fill(value)
    box.press("Enter")


@pytest.mark.timeout(RUN_ALL_S + 300)
def test_capacity_widget_simulates_on_click_and_reports_bad_input(lesson09: Any) -> None:
    page, widget = lesson09.page, show_widget_here(lesson09)
    summary = widget.locator(".me-cap-summary")
    # The headless run already simulated one setting (2 GPUs, short prompts): its answer is on screen.
    summary.wait_for(state="visible", timeout=UPDATE_MS)
    before = summary.inner_text()
    assert "goodput per GPU" in before and "1P:1D" in before

    set_number(widget, "me-cap-tpot", "30")
    widget.locator(".me-cap-run").click()
    wait_changed(page, f"{WIDGET} .me-cap-summary", before)
    after = summary.inner_text()
    assert "TPOT 30 ms" in after and "colocated" in after
    widget.locator("img.me-cap-plot").wait_for(state="visible", timeout=UPDATE_MS)
    screenshot(page, "lesson09_capacity_widget")

    set_number(widget, "me-cap-tpot", "-5")
    widget.locator(".me-cap-run").click()
    error = widget.locator(".me-cap-error")
    error.wait_for(state="visible", timeout=UPDATE_MS)
    assert "TPOT SLO" in error.inner_text() and "Traceback" not in widget.inner_text()
    # The previous answer must not read as the answer to this input.
    assert not summary.is_visible() and not widget.locator("img.me-cap-plot").is_visible()
    screenshot(page, "lesson09_capacity_widget_bad_input")
