"""Lesson 10's widget without a browser: each setting answers with the closed form and a simulated run,
and every bad input is a sentence that hides the old answer."""

from __future__ import annotations

import pytest

from minengine.course.widgets.speculative_widget import SpeculativeWidget, kv_capacity
from minengine.perf.speculative import expected_tokens_per_step


def test_a_setting_answers_with_the_curve_and_a_simulated_run() -> None:
    w = SpeculativeWidget(k=3, acceptance_rate=0.6, batch=16)
    r = w.result
    assert r is not None and w.error is None and w.plot.value
    assert r.tokens_per_step == pytest.approx(expected_tokens_per_step(0.6, 3))
    assert r.simulated == pytest.approx(r.closed_form, rel=0.2)  # stragglers: close, not equal
    assert "3 drafts a step, each kept with chance 0.6" in w.text and "batch 16" in w.text
    w.batch.value = 512  # past the ridge a verify step costs more than twice a decode step
    assert w.result is not None and w.result.verify_over_decode > 2.0 and w.result.simulated < 1.1


@pytest.mark.parametrize(("control", "value", "words"), [
    ("k", 0, "drafts per step"), ("acceptance", 1.5, "from 0 to 1"), ("batch", 0, "whole number"),
    ("batch", 1000, "KV cache")])
def test_bad_input_is_a_sentence_and_a_good_one_recovers(control: str, value: object, words: str) -> None:
    w = SpeculativeWidget()
    getattr(w, control).value = value
    assert w.result is None and w.error is not None and words in w.error
    assert "me-spec-error" in w.message.value and w.plot.layout.display == "none"
    getattr(w, control).value = {"k": 3, "acceptance": 0.7, "batch": 8}[control]
    assert w.error is None and w.result is not None and w.plot.layout.display is None


def test_a_smaller_gpu_holds_fewer_requests() -> None:
    assert kv_capacity("l4", 3) < kv_capacity("h100-sxm", 3)
