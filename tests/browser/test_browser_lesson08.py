"""Lesson 08 in the browser: Run All Cells runs clean (the servers it starts are gone at the end), the
chat through the openai SDK prints its answer, and its goodput widget answers a new TTFT SLO.

The widget re-reads the lesson's measured sweep, so it works after the server has stopped; the text box
commits on Enter. ``tests/test_serving_lesson.py`` checks its logic without a front end.
"""

from __future__ import annotations

import re
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
    wait_changed,
)

WIDGET = f"{NOTEBOOK} .me-goodput-widget"
UPDATE_MS = 30_000
LESSON = "lessons/08_streaming_serving.ipynb"


@pytest.fixture(scope="module")
def lesson08(browser: Any, lab_server: Any) -> Iterator[RanNotebook]:
    yield from run_notebook(browser, lab_server, LESSON, RUN_ALL_S)


def outputs_text(cells: list[dict], index: int) -> str:
    return "\n".join(str(o) for o in cells[index].get("outputs", []))


@pytest.mark.timeout(RUN_ALL_S + 180)
@pytest.mark.runs_lesson("08_streaming_serving")
def test_lesson_08_runs_clean_stops_its_server_and_its_widget_answers(lesson08: RanNotebook) -> None:
    check_clean("lesson 08", lesson08.finished, lesson08.cells)
    page = lesson08.page
    picked = outputs_text(lesson08.cells, find_cell(lesson08.cells, r"lu\.lesson_model\(\)"))
    assert "model for this lesson" in picked, picked
    answer = outputs_text(lesson08.cells, find_cell(lesson08.cells, r"sl\.read_chat_stream\("))
    assert len(answer) > 40, f"the chat through the openai SDK printed no answer: {answer!r}"
    stop = find_cell(lesson08.cells, r"server\.stop\(\)")
    assert "port" in outputs_text(lesson08.cells, stop) and "free again" in outputs_text(lesson08.cells, stop)
    plots = cells_with_images(lesson08.cells)
    assert plots, "lesson 08 drew no plot"
    scroll_to_cell(page, plots[0])
    expect_visible_image(page)
    screenshot(page, "lesson08_run_all")

    scroll_to_cell(page, find_cell(lesson08.cells, r"GoodputWidget\("))
    widget = page.locator(WIDGET)
    widget.wait_for(state="visible", timeout=UPDATE_MS)
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    summary = widget.locator(".me-goodput-summary")
    before = summary.inner_text()
    assert "SLOs TTFT" in before
    box = widget.locator(".me-goodput-ttft input")
    box.fill("100000")  # so loose that every measured rate meets it
    box.press("Enter")
    wait_changed(page, f"{WIDGET} .me-goodput-summary", before)
    assert re.search(r"TTFT ≤ 100000 ms", summary.inner_text())
    assert widget.locator(".me-goodput-error").count() == 0
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    screenshot(page, "lesson08_goodput_widget")
