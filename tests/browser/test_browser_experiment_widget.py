"""Lesson 01's experiment widget measures the engine from the browser: set sizes, press Run, see the plot.

Running the whole of lesson 01 takes minutes on a CPU (``tests/test_lessons.py`` does it), so this opens
the lesson and runs only what the widget needs, its set-up cell and the widget's cell, as a learner who
jumps to the experiment would. Then it types new sizes into the widget, presses *Run* and waits for the
engine's measurement to come back as numbers and a plot (``me-exp-*`` CSS classes).
"""

from __future__ import annotations

from typing import Any

import pytest
from jlab_helpers import NOTEBOOK, find_cell, notebook_cells, open_notebook, problems, run_cells, screenshot

LESSON = "lessons/01_two_phases.ipynb"
WIDGET = f"{NOTEBOOK} .me-exp-two-phases"
RUN_S = 150  # set-up (times the thread counts), the headless first run, an engine start on a busy CPU


def set_number(widget: Any, css: str, value: int) -> None:
    """Type a number into an ``IntText`` and commit it (Enter), as a learner does."""
    box = widget.locator(f"{css} input")
    box.fill(str(value))
    box.press("Enter")


@pytest.mark.timeout(RUN_S * 2 + 60)
def test_experiment_widget_runs_a_measurement_from_the_browser(page: Any, lab_server: Any) -> None:
    if not (lab_server.root / LESSON).exists():
        pytest.skip(f"{LESSON} is not in the course (yet)")
    open_notebook(page, lab_server, LESSON)
    cells = notebook_cells(page)
    try:
        # The set-up cell defines `profile` (device-sized settings) that the widget's cell uses.
        setup, experiment = find_cell(cells, r"(?m)^profile\s*="), find_cell(cells, r"TwoPhasesWidget\(")
    except AssertionError:
        pytest.skip(f"{LESSON} has no TwoPhasesWidget cell (yet)")
    run_cells(page, [setup, experiment], RUN_S)
    found = problems(notebook_cells(page))
    assert not found, "errors in lesson 01's set-up or widget cell:\n" + "\n".join(found)

    widget = page.locator(WIDGET)
    widget.wait_for(state="visible", timeout=RUN_S * 1000)
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    run_button = widget.locator("button.me-exp-run")
    assert run_button.is_enabled()

    # A small measurement: 2 requests of 96 prompt tokens, 12 output tokens, on the shipped model.
    set_number(widget, ".me-exp-prompt", 96)
    set_number(widget, ".me-exp-output", 12)
    set_number(widget, ".me-exp-batch", 2)
    plot = widget.locator("img.me-exp-plot")
    src = plot.get_attribute("src")
    run_button.click()
    results = widget.locator(".me-exp-results")
    results.filter(has_text="for 2 x 96 tokens").wait_for(timeout=RUN_S * 1000)
    widget.locator(".me-exp-status").filter(has_text="done in").wait_for(timeout=RUN_S * 1000)
    page.wait_for_function("([sel, src]) => { const img = document.querySelector(sel);"
                           " return img && img.getAttribute('src') !== src && img.naturalWidth > 100; }",
                           arg=[f"{WIDGET} img.me-exp-plot", src], timeout=30_000)
    assert widget.locator(".me-exp-error").count() == 0
    text = results.inner_text()
    assert "TTFT" in text and "decode step" in text and "ms" in text
    assert run_button.is_enabled(), "Run stays disabled after the measurement"
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    screenshot(page, "lesson01_experiment_widget")

    # A request the engine cannot hold becomes a sentence, not a traceback.
    set_number(widget, ".me-exp-prompt", 100_000)
    run_button.click()
    error = widget.locator(".me-exp-error")
    error.wait_for(state="visible", timeout=60_000)
    assert "Cannot run" in error.inner_text() and "Traceback" not in widget.inner_text()
