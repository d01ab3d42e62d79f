"""Lesson 07's widget without a browser: controls drive the engine, the rule and the engine agree, bad
input becomes a message."""

from __future__ import annotations

import pytest

import minengine
from minengine.course import prefix_lesson as pl
from minengine.course.widgets.prefix_widget import PrefixWidget


@pytest.fixture(scope="module")
def widget(torch_one_thread):
    tok = minengine.load_tokenizer()
    return PrefixWidget(minengine.load_model(), tok, pl.system_prompt(tok, 200), position=0, block_size=16)


def test_position_moves_the_hit(widget):
    assert widget.error is None and widget.result.cached == 0
    assert widget.plot.value  # a PNG was drawn
    widget.position.value = widget.position.max  # the id after the whole system prompt
    r = widget.result
    assert r.cached == r.expected > 150 and "came from the prefix cache" in widget.text
    widget.position.value = 40  # the ids differ a few tokens into the inserted text
    assert widget.result.cached == widget.result.expected and 32 <= widget.result.cached < 40 + 16


def test_block_size_changes_the_granularity(widget):
    widget.position.value = 40
    widget.block.value = 16
    at16 = widget.result.cached
    widget.block.value = 64
    assert widget.result.block_size == 64 and widget.result.cached == widget.result.expected == 0
    widget.block.value = 8
    assert widget.result.cached == widget.result.expected >= at16


def test_bad_template_is_a_friendly_message_and_recovers(widget):
    widget.template.value = "no placeholder here"
    assert widget.result is None and "{id}" in widget.error
    assert "Cannot run this" in widget.message.value and widget.plot.layout.display == "none"
    widget.template.value = "   "
    assert "type the text" in widget.error
    widget.template.value = "x{id}" * 200
    assert "under 300 characters" in widget.error
    widget.template.value = "[id {id}]"
    assert widget.error is None and widget.plot.layout.display is None
