"""Lesson 04 in the browser: it runs clean, and its KV-cache calculator answers slider, dropdown, bad input.

The whole lesson runs once (Run All Cells) for this module. ``tests/test_kv_widget.py`` checks the
widget's logic without a front end; this checks the round trip a learner makes: a key press on the
slider in Chromium reaches the kernel, the Python callback recomputes, and the new text and plot come
back to the page. The widget carries ``me-kv-*`` CSS classes for this.
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
    find_cell,
    run_notebook,
    screenshot,
    scroll_to_cell,
    wait_changed,
)

from minengine.course.widgets.kv_widget import CONTEXT_CHOICES, _token_label

WIDGET = f"{NOTEBOOK} .me-kv-calculator"
UPDATE_MS = 30_000  # kernel round trip plus a matplotlib redraw on a busy 2-core machine
LESSON = "lessons/04_kv_cache.ipynb"


@pytest.fixture(scope="module")
def lesson04(browser: Any, lab_server: Any) -> Iterator[RanNotebook]:
    """Lesson 04 after Run All Cells, shared by this module's tests (one run of the lesson)."""
    yield from run_notebook(browser, lab_server, LESSON, RUN_ALL_S)


@pytest.mark.timeout(RUN_ALL_S + 120)
@pytest.mark.runs_lesson("04_kv_cache")
def test_lesson_04_runs_clean_in_the_browser(lesson04: RanNotebook) -> None:
    check_clean("lesson 04", lesson04.finished, lesson04.cells)
    check_claims("lesson 04", lesson04.cells)
    plots = cells_with_images(lesson04.cells)
    assert plots, "lesson 04 drew no plot"
    scroll_to_cell(lesson04.page, plots[0])
    expect_visible_image(lesson04.page)
    screenshot(lesson04.page, "lesson04_run_all")


def show_widget(lesson04: Any) -> Any:
    """Scroll the calculator into view and return its locator (skips if lesson 04 has no calculator)."""
    try:
        index = find_cell(lesson04.cells, r"KVCalculatorWidget\(|kv_calculator\(")
    except AssertionError:
        pytest.skip("lesson 04 has no KV calculator cell (yet)")
    scroll_to_cell(lesson04.page, index)
    widget = lesson04.page.locator(WIDGET)
    widget.wait_for(state="visible", timeout=UPDATE_MS)
    to_top(widget)
    return widget


def to_top(widget: Any) -> None:
    """Scroll so the widget starts at the top of the notebook view: controls, summary and plot on screen."""
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    widget.page.wait_for_timeout(300)


def image_src(widget: Any) -> str:
    """The plot's current image URL: ipywidgets makes a new blob URL for every new PNG."""
    return widget.locator("img.me-kv-plot").get_attribute("src") or ""


@pytest.mark.timeout(RUN_ALL_S + 120)
def test_kv_widget_slider_and_model_update_text_and_plot(lesson04: Any) -> None:
    page, widget = lesson04.page, show_widget(lesson04)
    table = widget.locator(".me-kv-table")
    readout = widget.locator(".me-kv-context .widget-readout")
    labels = [_token_label(n) for n in CONTEXT_CHOICES]
    now = labels.index(readout.inner_text().strip())
    after_label, after_tokens = labels[now + 1], CONTEXT_CHOICES[now + 1]
    assert f"{CONTEXT_CHOICES[now]:,} tokens" in table.inner_text()

    # Context slider: one step right with the keyboard, as a learner nudging the handle.
    text, src = table.inner_text(), image_src(widget)
    widget.locator(".me-kv-context .noUi-handle").focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function(f"() => document.querySelector('{WIDGET} .me-kv-context .widget-readout')"
                           f".textContent.trim() === '{after_label}'", timeout=UPDATE_MS)
    wait_changed(page, f"{WIDGET} .me-kv-table", text)
    assert f"{after_tokens:,} tokens" in table.inner_text()
    wait_changed(page, f"{WIDGET} img.me-kv-plot", src, "src")

    # Model dropdown: a different model changes the title, the numbers and the plot.
    text, src = table.inner_text(), image_src(widget)
    widget.locator(".me-kv-model select").select_option("qwen3-8b")
    wait_changed(page, f"{WIDGET} .me-kv-table", text)
    assert "qwen3-8b" in widget.locator(".me-kv-summary").inner_text()
    wait_changed(page, f"{WIDGET} img.me-kv-plot", src, "src")
    assert widget.locator(".me-kv-error").count() == 0
    to_top(widget)
    plot = widget.locator("img.me-kv-plot")
    box, view = plot.bounding_box(), page.viewport_size
    assert box and box["y"] + box["height"] <= view["height"], "the plot is off screen below the controls"
    assert box["x"] + box["width"] <= view["width"], "the plot is wider than the screen"
    screenshot(page, "lesson04_kv_widget_updated")


@pytest.mark.timeout(RUN_ALL_S + 120)
def test_kv_widget_bad_input_shows_a_friendly_message(lesson04: Any) -> None:
    page, widget = lesson04.page, show_widget(lesson04)
    config = widget.locator(".me-kv-config input")
    config.fill("no-such-org/no-such-model")
    config.press("Enter")  # the text box commits on Enter (continuous_update=False)
    error = widget.locator(".me-kv-error")
    error.wait_for(state="visible", timeout=UPDATE_MS)
    message = error.inner_text()
    assert "Cannot compute" in message and "no-such-org/no-such-model" in message
    assert "preset" in message, "the message should say what to do instead"
    assert "Traceback" not in widget.inner_text()
    # Numbers from the previous input would read as the answer to this one: they are hidden.
    assert not widget.locator("img.me-kv-plot").is_visible() and not widget.locator(".me-kv-table").is_visible()
    to_top(widget)
    screenshot(page, "lesson04_kv_widget_bad_input")

    # Clearing the box brings the calculator back: a mistake is never a dead end.
    config.fill("")
    config.press("Enter")
    error.wait_for(state="detached", timeout=UPDATE_MS)
    widget.locator("img.me-kv-plot").wait_for(state="visible", timeout=UPDATE_MS)
