"""Lessons 05 and 06's simulator widgets, driven without a browser: set control values, read the results."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from minengine.course.widgets.batching_widget import BatchingWidget, check_rate  # noqa: E402
from minengine.course.widgets.chunking_widget import ChunkingWidget  # noqa: E402


@pytest.fixture(scope="module")
def batching() -> BatchingWidget:
    return BatchingWidget(max_num_seqs=32, num_requests=200)


@pytest.fixture(scope="module")
def chunking() -> ChunkingWidget:
    return ChunkingWidget(budget=2048, n_streams=16, long_len=4096)


def test_batching_widget_compares_schedulers(batching: BatchingWidget) -> None:
    first = batching.result
    assert batching.error is None and first is not None and first.label == "continuous"
    assert "H100" in batching.text and batching.plot.value[:4] == b"\x89PNG"
    assert ("me-bat-widget" in batching.widget._dom_classes
            and "me-bat-scheduler" in batching.scheduler._dom_classes)
    png, runs = batching.plot.value, len(batching.history)
    batching.scheduler.value = "static"
    static = batching.result
    assert static.label == "static" and "static" in batching.text and batching.plot.value != png
    assert len(batching.history) == runs + 1
    assert first.backlog_tok_s > static.backlog_tok_s
    batching.rate.value = 5.0
    assert batching.result.rate == 5.0 and "Poisson at 5 req/s" in batching.text
    batching.clear_button.click()
    assert len(batching.history) == 1


def test_batching_widget_bad_rate_is_a_message(batching: BatchingWidget) -> None:
    batching.rate.value = -3
    assert batching.result is None and "positive" in batching.error
    assert "me-bat-error" in batching.message.value and batching.plot.layout.display == "none"
    batching.rate.value = 0
    assert (batching.error is None and math.isinf(batching.result.rate)
            and batching.plot.layout.display is None)
    with pytest.raises(ValueError):
        check_rate("fast")


def test_chunking_widget_budget_and_policy(chunking: ChunkingWidget) -> None:
    first = chunking.result
    assert chunking.error is None and first.label == "2048" and "16 streams" in chunking.text
    assert chunking.plot.value[:4] == b"\x89PNG" and "me-chunk-budget" in chunking.budget._dom_classes
    chunking.budget.value = 0
    off = chunking.result
    assert off.label == "off" and off.spike > first.spike and "chunking off" in chunking.text
    chunking.policy.value = "prefill_first"
    assert chunking.result.spike > first.spike
    chunking.policy.value = "decode_first"
    assert len([h for k, h in chunking.history if k == chunking._key()]) >= 2


@pytest.mark.parametrize(("control", "value", "words"), [("streams", 0, "whole number"),
                                                         ("prompt", 50, "tokens"),
                                                         ("streams", 300, "1 to")])
def test_chunking_widget_bad_input_is_a_message(chunking: ChunkingWidget, control: str, value: int,
                                                words: str) -> None:
    widget = getattr(chunking, control)
    before = widget.value
    widget.value = value
    assert chunking.result is None and words in chunking.error and "me-chunk-error" in chunking.message.value
    widget.value = before
    assert chunking.error is None and chunking.result is not None


def test_chunking_widget_budget_below_the_streams(chunking: ChunkingWidget) -> None:
    chunking.streams.value = 100
    chunking.budget.value = 64
    assert chunking.result is None and "leaves nothing" in chunking.error
    chunking.streams.value = 16
    assert chunking.error is None
