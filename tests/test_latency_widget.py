"""Lesson 03's latency widget, driven without a browser: set control values, read text, results and plots."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from minengine.course.widgets import LatencyWidget  # noqa: E402
from minengine.course.widgets.latency_widget import simulate_latency  # noqa: E402


@pytest.fixture(scope="module")
def widget() -> LatencyWidget:
    return LatencyWidget(rate=20, sigma=1.0, prompt_mean=512, gpu="h100-sxm", num_requests=300)


def test_initial_state(widget: LatencyWidget) -> None:
    r = widget.result
    assert widget.error is None and r is not None and r.num_requests == 300
    assert 0 < r.ttft_p50 <= r.ttft_p90 <= r.ttft_p99 and r.capacity > r.rate
    assert "p99" in widget.text and "H100" in widget.text and widget.plot.value[:4] == b"\x89PNG"
    for control, css in [(widget.rate, "me-lat-rate"), (widget.sigma, "me-lat-sigma"),
                         (widget.prompt, "me-lat-prompt"), (widget.gpu, "me-lat-gpu"),
                         (widget.message, "me-lat-message"), (widget.plot, "me-lat-plot")]:
        assert css in control._dom_classes
    assert "application/vnd.jupyter.widget-view+json" in widget._repr_mimebundle_()


def test_changes_update_text_plot_and_history(widget: LatencyWidget) -> None:
    png, text, runs = widget.plot.value, widget.text, len(widget.history)
    widget.sigma.value = 2.0
    assert widget.result.sigma == 2.0 and widget.text != text and widget.plot.value != png
    assert len(widget.history) == runs + 1
    # the mean prompt is fixed, so a wider spread shows in the tail: p99 grows much more than p50
    narrow = simulate_latency("h100-sxm", 20, 0.0, 512, 300)
    assert widget.result.ttft_p99 / narrow.ttft_p99 > 2 * widget.result.ttft_p50 / narrow.ttft_p50
    widget.rate.value = 3 * widget.result.capacity
    assert widget.result.load > 1.1 and "me-lat-warning" in widget.message.value
    widget.gpu.value = "a100-80gb"
    assert "A100" in widget.text


@pytest.mark.parametrize("bad, words", [(0, "positive"), (-5, "positive"), (1e9, "beyond any single GPU")])
def test_bad_rate_shows_a_friendly_message_and_recovers(widget: LatencyWidget, bad: float,
                                                        words: str) -> None:
    widget.rate.value = bad
    assert widget.result is None and words in widget.error
    assert "me-lat-error" in widget.message.value and "Traceback" not in widget.message.value
    assert all(part.layout.display == "none" for part in (widget.summary, widget.plot))
    widget.rate.value = 10
    assert widget.error is None and widget.result.rate == 10
    assert all(part.layout.display != "none" for part in (widget.summary, widget.plot))
