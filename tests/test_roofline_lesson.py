"""Lesson 02's helpers (minengine.course.roofline_lesson) and its roofline widget, without a browser.

The arithmetic is checked against hand-derived values (matmul intensity, B* = ridge for bf16 weights,
GQA attention intensity = group size); the measuring loops, the lesson's own cells, are run on tiny
sizes to check what they count; the widget is driven by setting control values and reading its text,
view and error.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from notebook_cells import run_cells

from minengine.course import roofline_lesson as rl
from minengine.perf.hardware import get_accelerator
from minengine.perf.roofline import CostModel

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from minengine.course.widgets.roofline_widget import RooflineWidget, roofline_view  # noqa: E402

TINY = rl.SweepSizes(k=128, ms=(1, 4, 64), working_set_bytes=2**20, flop_budget=1e7, max_call_s=5.0,
                     repeats=2, attention_batches=(1, 3), attention_context=256,
                     attention_heads=(8, 2, 16), elementwise_shape=(16, 64))


# ------------------------------------------------------------------------------------------ arithmetic
def test_matmul_intensity_is_about_the_row_count_in_bf16() -> None:
    assert rl.matmul_intensity(1, 4096, 4096, 2) == pytest.approx(1.0, rel=1e-3)
    assert rl.matmul_intensity(8, 4096, 4096, 4) == pytest.approx(4.0, rel=1e-2)
    # exact: 2mkn / (b (mk + kn + mn)); at m = k = n it is 2n / 3b
    assert rl.matmul_intensity(1024, 1024, 1024, 2) == pytest.approx(2 * 1024 / 6)
    flops, nbytes = rl.matmul_flops_bytes(3, 5, 7, 4)
    assert (flops, nbytes) == (2 * 3 * 5 * 7, 4 * (15 + 35 + 21))


def test_roof_is_the_lower_of_the_two_ceilings() -> None:
    got = rl.roof([1.0, 10.0, 1000.0], peak=100.0, bandwidth=10.0)
    assert list(got) == [10.0, 100.0, 100.0]


def test_critical_batch_from_the_weights_is_the_ridge_in_bf16() -> None:
    cm = rl.ideal(CostModel.create("llama-3.1-8b", "h100-sxm", dtype="bf16"))
    bstar = rl.critical_batch(cm, 4096, include_kv=False)
    assert bstar == pytest.approx(cm.ridge_point, rel=0.02)
    # at B*, the weights-only FLOPs take as long as the weight bytes
    at = cm.decode_cost(round(bstar), 4096)
    assert at.linear_flops / cm.peak_flops == pytest.approx(
        at.weight_bytes / cm.accelerator.bandwidth_bytes_per_s, rel=0.02)
    # fp8 weights on an H100: half the bytes, twice the peak -> the same B*
    fp8 = rl.ideal(CostModel.create("llama-3.1-8b", "h100-sxm", dtype="fp8"))
    assert rl.critical_batch(fp8, 4096, include_kv=False) == pytest.approx(bstar, rel=0.02)


def test_kv_reads_make_bstar_infinite_past_a_context_limit() -> None:
    cm = rl.ideal(CostModel.create("llama-3.1-8b", "h100-sxm", dtype="bf16"))
    limit = rl.context_limit(cm)
    assert limit is not None and 100 < limit < 2000
    short, at_limit, past = (rl.critical_batch(cm, n) for n in (128, limit, limit + 1))
    assert math.isfinite(short) and short > rl.critical_batch(cm, 128, include_kv=False)
    assert math.isfinite(at_limit) and not math.isfinite(past)
    # at a finite B* the whole step's FLOPs and bytes take equal time
    step = cm.decode_cost(round(short), 128)
    assert step.flops / cm.peak_flops == pytest.approx(step.bytes / cm.accelerator.bandwidth_bytes_per_s,
                                                       rel=0.02)


def test_decode_attention_intensity_is_flat_at_the_gqa_group_size() -> None:
    cm = CostModel.create("llama-3.1-8b", "h100-sxm", dtype="bf16")  # 32 query heads share 8 KV heads
    by_batch = {b: {p.name: p for p in rl.step_points(cm, b, 4096)} for b in (1, 16, 256)}
    attention = [by_batch[b]["decode attention"].intensity for b in by_batch]
    assert attention[0] == pytest.approx(4.0, rel=0.01) and max(attention) - min(attention) < 1e-9
    projections = [by_batch[b]["decode projections"].intensity for b in by_batch]
    assert projections == pytest.approx([1.0, 16.0, 256.0], rel=0.01)
    assert by_batch[1]["decode projections"].bound == "memory"
    prefill = {p.name: p for p in rl.step_points(cm, 1, 4096, prompt=4096)}
    assert (prefill["prefill projections"].bound == "compute"
            and prefill["prefill projections"].intensity > 1000)


def test_h200_has_the_h100s_flops_and_a_lower_ridge() -> None:
    h100, h200 = get_accelerator("h100-sxm"), get_accelerator("h200")
    assert h200.bf16_tflops == h100.bf16_tflops and h200.ridge_point < h100.ridge_point
    twice = rl.scaled_gpu("h100-sxm", flops=2.0)
    assert twice.key == h100.key and twice.ridge_point == pytest.approx(2 * h100.ridge_point)
    assert twice.bandwidth_bytes_per_s == h100.bandwidth_bytes_per_s


def test_predicted_matmul_time_is_the_slower_of_compute_and_weights() -> None:
    machine = replace(get_accelerator("h100-sxm"), bf16_tflops=0.1, bandwidth_bytes_per_s=1e10)  # 100 GFLOP/s
    cm = CostModel.create("llama-3.1-8b", machine, compute_efficiency=0.5, memory_efficiency=1.0)
    small = rl.KernelPoint("matmul", "fp32", 1, flops=1e6, bytes=1e8, seconds=1.0)
    big = rl.KernelPoint("matmul", "fp32", 4096, flops=1e11, bytes=1e8, seconds=1.0)
    assert rl.predicted_matmul_seconds(cm, small) == pytest.approx(1e8 / 1e10)
    assert rl.predicted_matmul_seconds(cm, big) == pytest.approx(1e11 / 5e10)


def test_knee_is_the_first_point_at_half_the_peak() -> None:
    pts = [rl.KernelPoint("matmul", "fp32", m, flops=m * 1e9, bytes=1e9, seconds=1.0) for m in (1, 2, 4, 8)]
    assert rl.knee(pts, peak=8e9) == 4 and rl.knee(pts, peak=1e12) is None


# ------------------------------------------------------------------------------------------ measuring
def lesson_loops() -> dict:
    """The lesson's own ``matmul_sweep`` and ``decode_attention`` cells, on the CPU."""
    from functools import partial

    import torch
    import torch.nn.functional as F

    namespace = {"torch": torch, "F": F, "partial": partial, "rl": rl, "device": "cpu",
                 "tqdm": lambda it, **_: it}
    return run_cells("02_roofline", ["def project(", "def decode_attention("], namespace)


def test_matmul_sweep_counts_every_matrix_it_cycles_through() -> None:
    matmul_sweep = lesson_loops()["matmul_sweep"]
    points, note = matmul_sweep("fp32", TINY)
    assert note is None and [p.size for p in points] == list(TINY.ms)
    most = TINY.working_set_bytes // (128 * 128 * 4)
    assert len(rl.weight_matrices("fp32", TINY)) == most
    assert points[0].repeats == most  # small M: the whole working set
    assert points[-1].repeats == max(1, int(TINY.flop_budget // (2 * 64 * 128 * 128)))  # large M: fewer
    for p in points:
        flops, nbytes = rl.matmul_flops_bytes(p.size, 128, 128, 4)
        assert (p.flops, p.bytes) == (p.repeats * flops, p.repeats * nbytes) and p.seconds > 0
    bf16, _ = matmul_sweep("bf16", TINY)
    assert bf16[0].intensity == pytest.approx(2 * points[0].intensity)


def test_sweep_stops_when_a_dtype_is_too_slow() -> None:
    points, note = lesson_loops()["matmul_sweep"]("fp32", replace(TINY, max_call_s=1e-9))
    assert len(points) == 1 and note and "stopped at M = 1" in note


def test_attention_and_elementwise_points_count_their_bytes() -> None:
    att = lesson_loops()["decode_attention"]("fp32", TINY)
    assert [p.size for p in att] == [1, 3]
    # grouped queries: intensity 2 x group / 4 bytes = 2 at a group of 4, whatever the batch (the
    # query and output add a little)
    for p in att:
        assert p.flops == 4 * 8 * 16 * 256 * p.size and p.intensity == pytest.approx(2.0, rel=0.1)
    assert att[0].intensity == pytest.approx(att[1].intensity)
    ops = {p.kind: p for p in rl.elementwise_points(TINY, "fp32")}
    assert ops["residual add"].intensity == pytest.approx(1 / 12)
    assert ops["SiLU"].intensity == pytest.approx(0.5) and ops["RMSNorm"].intensity == pytest.approx(0.5)


def test_sweep_sizes_cover_m_1_to_4096_on_a_cpu() -> None:
    s = rl.sweep_sizes("cpu", headless=True)
    assert s.ms[0] == 1 and s.ms[-1] == 4096 and s.working_set_bytes >= 256 * 2**20


def test_twice_the_flops_speeds_prefill_not_decode() -> None:
    served = rl.serve_whatif({"base": get_accelerator("h100-sxm"), "2x": rl.scaled_gpu("h100-sxm", flops=2.0),
                              "2x bw": rl.scaled_gpu("h100-sxm", bandwidth=2.0)}, num_requests=60,
                             progress=False)
    base, fast, wide = served["base"], served["2x"], served["2x bw"]
    assert fast.ttft.median < 0.75 * base.ttft.median
    assert abs(fast.tpot.median / base.tpot.median - 1) < 0.1
    assert wide.tpot.median < 0.7 * base.tpot.median


# ------------------------------------------------------------------------------------------ widget
@pytest.fixture(scope="module")
def machines() -> dict:
    here = replace(get_accelerator("h100-sxm"), name="this machine", key="this-machine-cpu", bf16_tflops=0.2,
                   fp8_tflops=None, bandwidth_bytes_per_s=2e10)
    return {"fp32": here, "bf16": rl.as_machine(here, 1e12, "bf16")}


@pytest.fixture()
def widget(machines: dict) -> RooflineWidget:
    return RooflineWidget(gpu="h100-sxm", model="llama-3.1-8b", batch=16, context=4096, machines=machines)


def test_widget_initial_state(widget: RooflineWidget) -> None:
    v = widget.view
    assert widget.error is None and v is not None and v.batch == 16 and v.fits
    assert "ridge 295" in widget.text and "B*" in widget.text and widget.plot.value[:4] == b"\x89PNG"
    for control, css in [(widget.gpu, "me-roof-gpu"), (widget.model, "me-roof-model"),
                         (widget.dtype, "me-roof-dtype"), (widget.batch, "me-roof-batch"),
                         (widget.context, "me-roof-context"), (widget.plot, "me-roof-plot")]:
        assert css in control._dom_classes
    assert "application/vnd.jupyter.widget-view+json" in widget._repr_mimebundle_()


def test_widget_changes_update_text_and_plot(widget: RooflineWidget) -> None:
    png, text = widget.plot.value, widget.text
    widget.gpu.value = "h200"
    assert "H200" in widget.text and "ridge 206" in widget.text and widget.plot.value != png
    widget.context.value = 128
    assert widget.view.context == 128 and math.isfinite(widget.view.bstar_kv) and widget.text != text
    widget.batch.value = 4096
    assert widget.view.batch == 4096
    proj = next(p for p in widget.view.points if p.name == "decode projections")
    assert proj.bound == "compute"
    widget.gpu.value = "this-machine"
    assert "this machine, bf16" in widget.text and widget.view.ridge == pytest.approx(50.0)
    widget.dtype.value = "fp32"
    assert "GFLOP/s" in widget.text and widget.view.ridge == pytest.approx(10.0)


def test_widget_notes_when_the_batch_does_not_fit(widget: RooflineWidget) -> None:
    widget.batch.value = 1024
    widget.context.value = 131072
    assert not widget.view.fits and "does not fit" in widget.text


@pytest.mark.parametrize("change, words", [
    (("batch", 0), "at least 1"), (("batch", 10**6), "beyond any server"),
    (("dtype", "fp32"), "no fp32 peak"), (("dtype", "fp8", "this-machine"), "measured in fp32, bf16 only"),
])
def test_widget_bad_input_shows_a_friendly_message_and_recovers(widget: RooflineWidget, change: tuple,
                                                                words: str) -> None:
    if len(change) == 3:
        widget.gpu.value = change[2]
    getattr(widget, change[0]).value = change[1]
    assert widget.view is None and words in widget.error
    assert "me-roof-error" in widget.message.value and "Traceback" not in widget.message.value
    assert all(part.layout.display == "none" for part in (widget.summary, widget.plot))
    widget.gpu.value, widget.dtype.value, widget.batch.value = "h100-sxm", "bf16", 32
    assert widget.error is None and widget.view.batch == 32
    assert all(part.layout.display != "none" for part in (widget.summary, widget.plot))


def test_roofline_view_without_a_measured_machine_says_so() -> None:
    with pytest.raises(ValueError, match="measured in no dtype"):
        roofline_view("this-machine", "llama-3.1-8b", "fp32", 1, 1024)
