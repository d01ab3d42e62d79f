"""Every lesson in JupyterLab in Chromium: Run All Cells ends clean, its plots are on screen, and its
widget answers a learner's new input, bad input included.

``tests/test_lessons.py`` runs the same notebooks through nbclient; this is the learner's path: the page
loads, the kernel starts, Run All Cells runs everything, plots and widgets render. A lesson that only
breaks in the browser (a widget that fails to render, a cell that needs ``await`` in a front end, a
progress bar that writes to stderr) shows up here and in the screenshots (``build/browser-artifacts/``).

One test per lesson, one run of the lesson each: the checks every lesson shares come from ``LESSONS``
(plots drawn, outputs to show and photograph, claims), then the lesson's own round trip with its widget
(``me-*`` CSS classes). The widgets' logic is tested without a front end in ``tests/test_*_widget*.py``
and the lessons' helper tests; here a value typed in Chromium must reach the kernel and new text and a
new plot must come back to the page. Where a browser test runs a lesson, the headless run of that lesson
steps aside (``runs_lesson``, ``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
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
    open_sessions,
    run_notebook,
    screenshot,
    scroll_to_cell,
    show_output,
    show_widget,
    wait_changed,
)

from minengine.course.widgets.kv_widget import CONTEXT_CHOICES, _token_label

# A kernel round trip, a simulation or an engine run, and a matplotlib redraw on a busy 2-core machine.
UPDATE_MS = 60_000


# ------------------------------------------------------------------------------------- shared steps
def outputs_text(ran: RanNotebook, pattern: str) -> str:
    """Everything the cell matching ``pattern`` output, as text."""
    return "\n".join(str(o) for o in ran.cells[find_cell(ran.cells, pattern)].get("outputs", []))


def to_top(widget: Any) -> None:
    """Scroll so the widget starts at the top of the notebook view: controls, summary and plot on screen."""
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    widget.page.wait_for_timeout(300)


def enter(widget: Any, css: str, value: object) -> None:
    """Type into a text box and commit it with Enter (the boxes use continuous_update=False)."""
    box = widget.locator(f"{css} input")
    box.fill(str(value))
    box.press("Enter")


def plot_src(widget: Any, css: str) -> str:
    """The plot's current image URL: ipywidgets makes a new blob URL for every new PNG."""
    return widget.locator(f"img.{css}").get_attribute("src") or ""


def check_new_answer(ran: RanNotebook, widget: Any, prefix: str, change: Callable[[], None],
                     root: str = "widget", watch: str = "summary", new_plot: bool = True) -> str:
    """Make ``change`` in the widget (``.{prefix}-{root}``); its text (``.{prefix}-{watch}``) and, with
    ``new_plot``, its plot must be replaced, with no error shown and the plot on screen within its width.
    (A change that moves no point may redraw the same PNG, which ipywidgets does not resend.) Returns the
    new summary."""
    page, selector = ran.page, f"{NOTEBOOK} .{prefix}-{root}"
    text, src = widget.locator(f".{prefix}-{watch}").inner_text(), plot_src(widget, f"{prefix}-plot")
    change()
    wait_changed(page, f"{selector} .{prefix}-{watch}", text, timeout_ms=UPDATE_MS)
    if new_plot:
        wait_changed(page, f"{selector} img.{prefix}-plot", src, "src", timeout_ms=UPDATE_MS)
    assert widget.locator(f".{prefix}-error").count() == 0
    to_top(widget)
    box, view = widget.locator(f"img.{prefix}-plot").bounding_box(), page.viewport_size
    assert box and box["x"] + box["width"] <= view["width"], "the plot is wider than the screen"
    return widget.locator(f".{prefix}-summary").inner_text()


def check_bad_input(widget: Any, prefix: str, change: Callable[[], None], words: tuple[str, ...],
                    hidden: tuple[str, ...]) -> None:
    """Bad input shows a sentence with ``words``, never a traceback, and hides the previous answer (the
    ``hidden`` elements), which would otherwise read as the answer to this input."""
    change()
    error = widget.locator(f".{prefix}-error")
    error.wait_for(state="visible", timeout=UPDATE_MS)
    message = error.inner_text()
    assert all(w in message for w in words), message
    assert "Traceback" not in widget.inner_text()
    for css in hidden:
        assert not widget.locator(css).is_visible(), f"the previous {css} stayed under the error message"


def check_recovers(widget: Any, prefix: str, change: Callable[[], None], shown: str) -> None:
    """A good value after a bad one brings the answer back: a mistake is never a dead end."""
    change()
    widget.locator(f".{prefix}-error").wait_for(state="detached", timeout=UPDATE_MS)
    widget.locator(shown).wait_for(state="visible", timeout=UPDATE_MS)


# ------------------------------------------------------------------------------ each lesson's widget
def lesson00_real_model(ran: RanNotebook) -> None:
    """The same measurement on the real model the switch picked (SmolLM2, or the tiny one as a fallback)."""
    plots = cells_with_images(ran.cells)
    assert len(plots) >= 2, "lesson 00 drew the tiny model's plots but not the real model's"
    show_output(ran.page, find_cell(ran.cells, r"the pause and the stream, \{picked"))
    screenshot(ran.page, "lesson00_real_model")


def lesson01_experiment(ran: RanNotebook) -> None:
    """The experiment widget measures the engine from the browser: set sizes, press Run, see the plot."""
    page = ran.page
    widget = show_widget(ran, r"TwoPhasesWidget\(", f"{NOTEBOOK} .me-exp-two-phases", UPDATE_MS)
    run_button = widget.locator("button.me-exp-run")
    assert run_button.is_enabled()
    # A small measurement: 2 requests of 96 prompt tokens, 12 output tokens, on the shipped model.
    for css, value in ((".me-exp-prompt", 96), (".me-exp-output", 12), (".me-exp-batch", 2)):
        enter(widget, css, value)
    src = plot_src(widget, "me-exp-plot")
    run_button.click()
    results = widget.locator(".me-exp-results")
    results.filter(has_text="for 2 x 96 tokens").wait_for(timeout=3 * UPDATE_MS)
    widget.locator(".me-exp-status").filter(has_text="done in").wait_for(timeout=3 * UPDATE_MS)
    page.wait_for_function("([sel, src]) => { const img = document.querySelector(sel);"
                           " return img && img.getAttribute('src') !== src && img.naturalWidth > 100; }",
                           arg=[f"{NOTEBOOK} .me-exp-two-phases img.me-exp-plot", src], timeout=UPDATE_MS)
    assert widget.locator(".me-exp-error").count() == 0
    text = results.inner_text()
    assert "TTFT" in text and "decode step" in text and "ms" in text
    assert run_button.is_enabled(), "Run stays disabled after the measurement"
    to_top(widget)
    screenshot(page, "lesson01_experiment_widget")
    # A request the engine cannot hold becomes a sentence, not a traceback.
    enter(widget, ".me-exp-prompt", 100_000)
    check_bad_input(widget, "me-exp", run_button.click, ("Cannot run",), ())


def lesson02_roofline(ran: RanNotebook) -> None:
    """Typing a batch re-prices the step; batch 0 is a sentence."""
    widget = show_widget(ran, r"RooflineWidget\(", f"{NOTEBOOK} .me-roof-widget", UPDATE_MS)
    summary = check_new_answer(ran, widget, "me-roof", lambda: enter(widget, ".me-roof-batch", 128))
    assert "batch 128" in summary and "B*" in summary
    screenshot(ran.page, "lesson02_roofline_widget")
    check_bad_input(widget, "me-roof", lambda: enter(widget, ".me-roof-batch", 0), ("at least 1",),
                    ("img.me-roof-plot",))
    screenshot(ran.page, "lesson02_roofline_widget_bad_input")
    check_recovers(widget, "me-roof", lambda: enter(widget, ".me-roof-batch", 32), "img.me-roof-plot")


def lesson03_latency(ran: RanNotebook) -> None:
    """A new arrival rate re-simulates the latency curve; a negative rate is a sentence."""
    widget = show_widget(ran, r"LatencyWidget\(", f"{NOTEBOOK} .me-lat-widget", UPDATE_MS)
    summary = check_new_answer(ran, widget, "me-lat", lambda: enter(widget, ".me-lat-rate", 45))
    assert "at 45 req/s" in summary
    screenshot(ran.page, "lesson03_latency_widget")
    check_bad_input(widget, "me-lat", lambda: enter(widget, ".me-lat-rate", -1), ("positive",),
                    ("img.me-lat-plot",))
    check_recovers(widget, "me-lat", lambda: enter(widget, ".me-lat-rate", 30), "img.me-lat-plot")


def lesson04_kv_calculator(ran: RanNotebook) -> None:
    """The context slider (a key press) and the model dropdown update the numbers; an unknown model is a
    sentence that says what to type instead."""
    page = ran.page
    widget = show_widget(ran, r"KVCalculatorWidget\(|kv_calculator\(", f"{NOTEBOOK} .me-kv-calculator",
                         UPDATE_MS)
    table, readout = widget.locator(".me-kv-table"), widget.locator(".me-kv-context .widget-readout")
    labels = [_token_label(n) for n in CONTEXT_CHOICES]
    now = labels.index(readout.inner_text().strip())
    assert f"{CONTEXT_CHOICES[now]:,} tokens" in table.inner_text()

    def nudge_right() -> None:  # one step right with the keyboard, as a learner nudging the handle
        widget.locator(".me-kv-context .noUi-handle").focus()
        page.keyboard.press("ArrowRight")

    check_new_answer(ran, widget, "me-kv", nudge_right, root="calculator", watch="table")
    assert readout.inner_text().strip() == labels[now + 1]
    assert f"{CONTEXT_CHOICES[now + 1]:,} tokens" in table.inner_text()
    summary = check_new_answer(ran, widget, "me-kv", lambda: widget.locator(".me-kv-model select")
                               .select_option("qwen3-8b"), root="calculator", watch="table")
    assert "qwen3-8b" in summary
    box = widget.locator("img.me-kv-plot").bounding_box()
    assert box and box["y"] + box["height"] <= page.viewport_size["height"], "the plot is off screen below"
    screenshot(page, "lesson04_kv_widget_updated")
    check_bad_input(widget, "me-kv", lambda: enter(widget, ".me-kv-config", "no-such-org/no-such-model"),
                    ("Cannot compute", "no-such-org/no-such-model", "preset"),
                    ("img.me-kv-plot", ".me-kv-table"))
    to_top(widget)
    screenshot(page, "lesson04_kv_widget_bad_input")
    check_recovers(widget, "me-kv", lambda: enter(widget, ".me-kv-config", ""), "img.me-kv-plot")


def dropdown_round_trip(cell: str, prefix: str, select: str, shown: str, option: dict[str, str],
                        expected: tuple[str, ...], shot: str) -> Callable[[RanNotebook], None]:
    """A widget whose dropdown re-runs its simulation or engine: the lesson's pick shows ``shown``;
    choosing ``option`` (``label=`` or ``value=``) brings a new summary with ``expected`` and a new plot."""
    def round_trip(ran: RanNotebook) -> None:
        widget = show_widget(ran, cell, f"{NOTEBOOK} .{prefix}-widget", UPDATE_MS)
        assert shown in widget.locator(f".{prefix}-summary").inner_text()
        summary = check_new_answer(ran, widget, prefix,
                                   lambda: widget.locator(f"{select} select").select_option(**option))
        assert all(text in summary for text in expected), summary
        screenshot(ran.page, shot)

    return round_trip


# Another scheduler, token budget or block size: the simulator or the engine runs again.
lesson05_batching = dropdown_round_trip(r"BatchingWidget\(", "me-bat", ".me-bat-scheduler",
                                        "static (batch by batch)", {"label": "continuous (vLLM)"},
                                        ("continuous (vLLM) batching",), "lesson05_batching_widget")
lesson06_chunking = dropdown_round_trip(r"ChunkingWidget\(", "me-chunk", ".me-chunk-budget",
                                        "budget 2,048 tokens", {"label": "512 tokens"},
                                        ("budget 512 tokens",), "lesson06_chunking_widget")
lesson07_prefix = dropdown_round_trip(r"PrefixWidget\(", "me-prefix", ".me-prefix-block",
                                      "came from the prefix cache", {"value": "64"},
                                      ("came from the prefix cache", "the rule predicts"),
                                      "lesson07_prefix_widget")


def lesson08_server_and_goodput(ran: RanNotebook) -> None:
    """The chat through the openai SDK printed an answer, the servers the lesson started are gone, and the
    goodput widget (which re-reads the measured sweep) answers a new TTFT SLO."""
    assert "model for this lesson" in outputs_text(ran, r"lu\.lesson_model\(\)")
    answer = outputs_text(ran, r"sl\.read_chat_stream\(")
    assert len(answer) > 40, f"the chat through the openai SDK printed no answer: {answer!r}"
    stopped = outputs_text(ran, r"server\.stop\(\)")
    assert "port" in stopped and "free again" in stopped, stopped
    widget = show_widget(ran, r"GoodputWidget\(", f"{NOTEBOOK} .me-goodput-widget", UPDATE_MS)
    assert "SLOs TTFT" in widget.locator(".me-goodput-summary").inner_text()
    # so loose that every measured rate meets it
    summary = check_new_answer(ran, widget, "me-goodput", lambda: enter(widget, ".me-goodput-ttft", 100000),
                               new_plot=False)
    assert re.search(r"TTFT ≤ 100000 ms", summary), summary
    screenshot(ran.page, "lesson08_goodput_widget")


def lesson09_capacity(ran: RanNotebook) -> None:
    """The capacity planner simulates every split on a click; a negative SLO is a sentence."""
    page = ran.page
    widget = show_widget(ran, r"CapacityWidget\(", f"{NOTEBOOK} .me-cap-widget", UPDATE_MS)
    summary = widget.locator(".me-cap-summary")
    # The headless run already simulated one setting (2 GPUs, short prompts): its answer is on screen.
    summary.wait_for(state="visible", timeout=UPDATE_MS)
    before = summary.inner_text()
    assert "goodput per GPU" in before and "1P:1D" in before
    enter(widget, ".me-cap-tpot", 30)
    widget.locator(".me-cap-run").click()
    wait_changed(page, f"{NOTEBOOK} .me-cap-widget .me-cap-summary", before, timeout_ms=2 * UPDATE_MS)
    after = summary.inner_text()
    assert "TPOT 30 ms" in after and "colocated" in after
    widget.locator("img.me-cap-plot").wait_for(state="visible", timeout=UPDATE_MS)
    screenshot(page, "lesson09_capacity_widget")
    enter(widget, ".me-cap-tpot", -5)
    check_bad_input(widget, "me-cap", widget.locator(".me-cap-run").click, ("TPOT SLO",),
                    (".me-cap-summary", "img.me-cap-plot"))
    screenshot(page, "lesson09_capacity_widget_bad_input")


def lesson10_speculative(ran: RanNotebook) -> None:
    """A new acceptance rate redraws the curve and re-simulates; a batch the KV cache cannot hold is a
    sentence, and a good value brings the answer back."""
    widget = show_widget(ran, r"SpeculativeWidget\(", f"{NOTEBOOK} .me-spec-widget", UPDATE_MS)
    assert "each kept with chance 0.6" in widget.locator(".me-spec-summary").inner_text()
    summary = check_new_answer(ran, widget, "me-spec", lambda: enter(widget, ".me-spec-acceptance", 0.9))
    assert "each kept with chance 0.9" in summary and "simulated" in summary, summary
    screenshot(ran.page, "lesson10_speculative_widget")
    check_bad_input(widget, "me-spec", lambda: enter(widget, ".me-spec-batch", 1000), ("KV cache",),
                    ("img.me-spec-plot",))
    check_recovers(widget, "me-spec", lambda: enter(widget, ".me-spec-batch", 8), "img.me-spec-plot")


# --------------------------------------------------------------------------------------- the lessons
@dataclass(frozen=True)
class LessonInBrowser:
    stem: str
    min_plots: int
    shows: tuple[tuple[str, str], ...]  # (a cell's pattern, a screenshot's name): the outputs to look at
    interact: Callable[[RanNotebook], None] | None = None
    extra_s: int = 120  # the interaction's time on top of the run

    @property
    def path(self) -> str:
        return f"lessons/{self.stem}.ipynb"


LESSONS = (
    # The picture of lesson 00: the pause (prefill) and the stream (decode), as the learner sees it.
    LessonInBrowser("00_start_here", 1, ((r"the pause and the stream", "lesson00_run_all"),),
                    lesson00_real_model),
    # The decode curve against the roofline from this machine's measured bandwidth and peak.
    LessonInBrowser("01_two_phases", 3, ((r"decode step time vs batch", "lesson01_decode_roofline"),
                                          (r"prefill time vs prompt length", "lesson01_prefill")),
                    lesson01_experiment, extra_s=300),
    # Every op of a step on this machine's roofline, and the calibrated simulator against the sweep.
    LessonInBrowser("02_roofline", 5,
                    ((r'\("decode attention \(batch', "lesson02_ops_on_the_roofline"),
                     (r"calibrated simulator's prediction", "lesson02_calibrated_vs_sweep")),
                    lesson02_roofline),
    # One request's life, queue -> prefill chunks -> first token -> decode; then saturation.
    LessonInBrowser("03_measuring_latency", 5,
                    ((r"plot_request_timeline\(burst", "lesson03_request_timeline"),
                     (r"h100 = \[simulate_latency", "lesson03_saturation")),
                    lesson03_latency),
    LessonInBrowser("04_kv_cache", 1, (), lesson04_kv_calculator),
    LessonInBrowser("05_batching", 5, ((r"how full the batch is", "lesson05_static_vs_continuous"),
                                       (r"frontier = \{static", "lesson05_frontier")), lesson05_batching),
    LessonInBrowser("06_chunked_prefill", 5, ((r"plot_streams\(axes\[0\], off", "lesson06_spike"),),
                    lesson06_chunking),
    LessonInBrowser("07_prefix_caching", 2,
                    ((r"one shared system prompt, four ways", "lesson07_real_model"),),
                    lesson07_prefix, extra_s=180),
    LessonInBrowser("08_streaming_serving", 1, (), lesson08_server_and_goodput, extra_s=180),
    LessonInBrowser("09_disaggregation_capacity", 2, (), lesson09_capacity, extra_s=300),
    # Speedup against batch and acceptance on the simulated H100, the simulator's dots on the closed form.
    LessonInBrowser("10_speculative_decoding", 3, ((r"CURVE_BATCHES, kv_capacity", "lesson10_gpu_scale"),),
                    lesson10_speculative),
    # The all-reduce's share of a step against batch, TP and link; no widget (everything is a run).
    LessonInBrowser("11_beyond_one_gpu", 3, ((r"the all-reduce tax", "lesson11_all_reduce_tax"),)),
)


@pytest.mark.parametrize("lesson", [
    pytest.param(lesson, id=lesson.stem,
                 marks=[pytest.mark.runs_lesson(lesson.stem),
                        pytest.mark.timeout(RUN_ALL_S + lesson.extra_s)])
    for lesson in LESSONS])
def test_lesson_in_the_browser(lesson: LessonInBrowser, browser: Any, lab_server: Any) -> None:
    name = f"lesson {lesson.stem[:2]}"
    with contextlib.contextmanager(run_notebook)(browser, lab_server, lesson.path, RUN_ALL_S) as ran:
        check_clean(name, ran.finished, ran.cells)
        check_claims(name, ran.cells)
        plots = cells_with_images(ran.cells)
        assert len(plots) >= lesson.min_plots, \
            f"{name} drew {len(plots)} plots, fewer than {lesson.min_plots}"
        scroll_to_cell(ran.page, plots[0])  # the first plot is on screen, rendered
        expect_visible_image(ran.page)
        screenshot(ran.page, f"lesson{lesson.stem[:2]}_first_plot")
        for pattern, shot in lesson.shows:
            show_output(ran.page, find_cell(ran.cells, pattern))
            screenshot(ran.page, shot)
        if lesson.interact is not None:
            lesson.interact(ran)
    assert lesson.path not in open_sessions(lab_server), f"{name}'s kernel was left running"
