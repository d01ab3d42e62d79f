"""Lesson 07 in the browser: Run All Cells runs clean, and its prefix widget answers a block-size change.

``tests/test_prefix_widget.py`` checks the widget's logic without a front end; this checks the round trip
a learner makes: a dropdown change in Chromium reaches the kernel, the engine runs the two requests
again, and the new summary and plot come back to the page (``me-prefix-*`` CSS classes).
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
    check_clean,
    expect_visible_image,
    find_cell,
    run_notebook,
    screenshot,
    scroll_to_cell,
    show_output,
    wait_changed,
)

WIDGET = f"{NOTEBOOK} .me-prefix-widget"
UPDATE_MS = 60_000  # two engine runs of a 1,000-token prompt plus a redraw, on a busy 2-core machine
LESSON = "lessons/07_prefix_caching.ipynb"


@pytest.fixture(scope="module")
def lesson07(browser: Any, lab_server: Any) -> Iterator[RanNotebook]:
    yield from run_notebook(browser, lab_server, LESSON, RUN_ALL_S)


@pytest.mark.timeout(RUN_ALL_S + 180)
@pytest.mark.runs_lesson("07_prefix_caching")
def test_lesson_07_runs_clean_and_its_widget_answers(lesson07: RanNotebook) -> None:
    check_clean("lesson 07", lesson07.finished, lesson07.cells)
    page = lesson07.page
    plots = cells_with_images(lesson07.cells)
    assert plots, "lesson 07 drew no plot"
    scroll_to_cell(page, plots[0])
    expect_visible_image(page)
    screenshot(page, "lesson07_run_all")
    assert len(plots) >= 2, "lesson 07 drew no plot of the real model's TTFTs"
    show_output(page, find_cell(lesson07.cells, r"one shared system prompt, four ways"))
    screenshot(page, "lesson07_real_model")

    scroll_to_cell(page, find_cell(lesson07.cells, r"PrefixWidget\("))
    widget = page.locator(WIDGET)
    widget.wait_for(state="visible", timeout=UPDATE_MS)
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    summary = widget.locator(".me-prefix-summary")
    before, src = summary.inner_text(), widget.locator("img.me-prefix-plot").get_attribute("src") or ""
    assert "came from the prefix cache" in before
    widget.locator(".me-prefix-block select").select_option("64")
    wait_changed(page, f"{WIDGET} .me-prefix-summary", before)
    after = summary.inner_text()
    assert "came from the prefix cache" in after and "the rule predicts" in after
    wait_changed(page, f"{WIDGET} img.me-prefix-plot", src, "src")
    assert widget.locator(".me-prefix-error").count() == 0
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    screenshot(page, "lesson07_prefix_widget")
