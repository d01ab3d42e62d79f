"""Lesson 01's experiment widget, driven without a browser: set controls, click Run, read the results."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from minengine.course.lessons import ModelShape, device_profile, random_llama  # noqa: E402
from minengine.course.widgets import TwoPhasesWidget  # noqa: E402
from minengine.engine.llm import LLM  # noqa: E402

TINY_SHAPE = ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, max_len=512)


@pytest.fixture(scope="module")
def engines(torch_one_thread: None) -> dict[str, Any]:
    """The shipped model and a tiny random one, built once for the module (building is the slow part)."""
    return {"shipped": LLM(enable_prefix_caching=False, max_num_seqs=16),
            "random": LLM(random_llama(TINY_SHAPE), max_num_seqs=16, num_blocks=256,
                          enable_prefix_caching=False)}


@pytest.fixture
def widget(engines: dict[str, Any]) -> TwoPhasesWidget:
    profile = device_profile(headless=True, device="cpu")
    w = TwoPhasesWidget(prompt_len=40, output_len=5, batch=2, profile=profile,
                        llm_factory=engines.__getitem__)
    w.threads.value = 1  # tiny models: one thread is fastest, and robust on a busy machine
    return w


def _classes(w: TwoPhasesWidget) -> set[str]:
    parts = [w.widget, w.model, w.prompt_len, w.output_len, w.batch, w.threads, w.run_button, w.clear_button,
             w.progress, w.status_line, w.message, w.results, w.plot]
    return {c for part in parts for c in part._dom_classes}


def test_initial_state(widget: TwoPhasesWidget) -> None:
    assert widget.result is None and widget.history == [] and widget.error is None
    assert bytes(widget.plot.value).startswith(b"\x89PNG")  # empty axes are drawn before the first run
    for name in ("two-phases", "model", "prompt", "output", "batch", "threads", "run", "clear", "progress",
                 "status", "message", "results", "plot"):
        assert f"me-exp-{name}" in _classes(widget)


def test_run_updates_text_plot_and_history(widget: TwoPhasesWidget) -> None:
    before = bytes(widget.plot.value)
    widget.prompt_len.value, widget.output_len.value, widget.batch.value = 48, 6, 3
    widget.run_button.click()
    assert widget.error is None, widget.error
    r = widget.result
    assert r is not None and (r.prompt_len, r.output_len, r.batch, r.model) == (48, 6, 3, "shipped")
    assert r.output_tokens == 18 and r.prefill_time > 0 and r.decode_step > 0
    assert r.ttft_p50 > 0 and r.itl_p50 > 0
    steps = widget.last_run.steps
    assert steps[0].num_prefill_tokens == 3 * 48  # the first step holds all prompts
    assert all(s.num_decode_seqs == 3 and not s.num_prefill_tokens for s in steps[1:])
    assert "TTFT" in widget.text and "decode step" in widget.text and "TTFT" in widget.results.value
    assert bytes(widget.plot.value) != before and bytes(widget.plot.value).startswith(b"\x89PNG")
    assert widget.history == [r]
    # the run is over: the button works again and the progress bar is hidden
    assert not widget.run_button.disabled and widget.progress.layout.visibility == "hidden"
    assert widget.progress.value == widget.progress.max
    assert len(widget.ax_decode.lines) == 1 and len(widget.ax_ttft.lines) == 1


def test_second_model_and_clear(widget: TwoPhasesWidget) -> None:
    widget.run_button.click()
    widget.model.value = "random"
    widget.batch.value = 4
    widget.run_button.click()
    assert widget.error is None, widget.error
    assert [h.model for h in widget.history] == ["shipped", "random"]
    assert len(widget.ax_decode.lines) == 2  # one series per model
    widget.clear_button.click()
    assert widget.history == [] and widget.result is None and widget.text == ""


@pytest.mark.parametrize(
    ("control", "value", "words"),
    [
        ("prompt_len", 0, "at least 1"),
        ("output_len", -3, "at least 1"),
        ("batch", 0, "at least 1"),
        ("prompt_len", 2045, "context holds 2048"),
        ("batch", 10_000, "lower the batch"),
    ],
)
def test_bad_input_shows_a_message(widget: TwoPhasesWidget, control: str, value: int, words: str) -> None:
    getattr(widget, control).value = value
    assert widget.run() is None  # no exception escapes
    assert widget.error is not None and words in widget.error
    assert "me-exp-error" in widget.message.value and "Cannot run" in widget.message.value
    assert widget.history == [] and not widget.run_button.disabled
    getattr(widget, control).value = {"prompt_len": 40, "output_len": 5, "batch": 2}[control]
    widget.run_button.click()  # and it recovers
    assert widget.error is None and widget.message.value == "" and len(widget.history) == 1


def test_engine_failure_is_a_sentence() -> None:
    def broken(_model: str) -> Any:
        raise RuntimeError("out of memory (simulated)")

    w = TwoPhasesWidget(profile=device_profile(headless=True, device="cpu"), llm_factory=broken)
    w.run_button.click()
    assert w.error is not None and "RuntimeError" in w.error and "simulated" in w.error
    assert "me-exp-error" in w.message.value
