"""The KV-calculator widget, driven without a browser: set control values, read text and figure data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from minengine.course.widgets import KVCalculatorWidget  # noqa: E402
from minengine.kvcalc import PRESETS, GiB  # noqa: E402


@pytest.fixture
def widget() -> KVCalculatorWidget:
    return KVCalculatorWidget(model="llama-3.1-8b", context_len=8192, batch_size=16, gpu="h100-sxm")


def test_initial_state(widget: KVCalculatorWidget) -> None:
    assert widget.error is None and widget.estimate is not None
    assert "128.0 KiB" in widget.text and "128.0 KiB" in widget.table.value
    assert widget.plot.value[:4] == b"\x89PNG"
    for control, css in [(widget.model, "me-kv-model"), (widget.context, "me-kv-context"),
                         (widget.batch, "me-kv-batch"), (widget.kv_dtype, "me-kv-dtype"),
                         (widget.gpu, "me-kv-gpu"), (widget.utilization, "me-kv-utilization"),
                         (widget.message, "me-kv-message"), (widget.plot, "me-kv-plot")]:
        assert css in control._dom_classes
    assert "application/vnd.jupyter.widget-view+json" in widget._repr_mimebundle_()


def test_slider_updates_text_and_figure(widget: KVCalculatorWidget) -> None:
    curve = list(widget.ax_kv.lines[0].get_ydata())
    png, text = widget.plot.value, widget.text
    widget.batch.value = 32
    assert widget.estimate.batch_size == 32 and widget.text != text and widget.plot.value != png
    assert list(widget.ax_kv.lines[0].get_ydata()) == pytest.approx([2 * y for y in curve])
    assert "32.00 GiB" in widget.text  # 32 x 8,192 tokens x 128 KiB
    widget.context.value = 32768
    assert widget.ax_kv.lines[1].get_ydata()[0] == pytest.approx(32 * 4)  # the marker, in GiB
    widget.kv_dtype.value = "fp8"
    assert widget.estimate.bytes_per_token == 65_536 and "64.0 KiB" in widget.text
    before = widget.estimate.kv_budget_bytes
    widget.utilization.value = 0.8
    assert widget.estimate.kv_budget_bytes == pytest.approx(before - 0.1 * 80 * GiB, abs=1)


def test_memory_bar_shows_weights_and_kv(widget: KVCalculatorWidget) -> None:
    widget.gpu.value = "h200"
    est = widget.estimate
    bars = {c.get_label().rsplit(" ", 1)[0]: c.patches[0].get_width() for c in widget.ax_mem.containers}
    assert bars == pytest.approx(widget.memory_parts)
    assert bars["weights"] == pytest.approx(est.weight_bytes / GiB)
    assert bars["KV in use"] == pytest.approx(est.total_bytes / GiB)
    assert sum(bars.values()) == pytest.approx(141)  # the bar adds up to the whole GPU
    widget.batch.value = 512  # 512 x 8 GiB of KV cannot fit: an overflow segment appears
    assert not widget.estimate.fits and "NO" in widget.text
    assert any(c.get_label().startswith("KV over budget") for c in widget.ax_mem.containers)
    assert "H200" in widget.ax_mem.get_title()


def test_bad_input_shows_message_and_recovers(widget: KVCalculatorWidget) -> None:
    widget.config.value = "/no/such/config.json"
    assert (widget.error and "no such config file" in widget.message.value
            and "me-kv-error" in widget.message.value)
    # the previous answer must not stay on screen under the error, as if it answered the bad input
    assert all(part.layout.display == "none" for part in (widget.summary, widget.plot, widget.table))
    widget.config.value = ""
    widget.model.value = "qwen2.5-7b"  # 28 query heads cannot split over 8 GPUs
    widget.tp.value = 8
    assert widget.estimate is None and "TP=8" in widget.message.value
    widget.tp.value = 1
    assert widget.error is None and widget.estimate.spec.name == "qwen2.5-7b"
    assert all(part.layout.display != "none" for part in (widget.summary, widget.plot, widget.table))
    assert "56.0 KiB" in widget.text  # 28 layers x 2 x 4 KV heads x 128 x 2 bytes


def test_config_path_input(widget: KVCalculatorWidget, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(PRESETS["deepseek-v3"]["config"]))
    widget.config.value = str(path)
    assert widget.error is None and widget.estimate.spec.is_mla
