"""Lesson 02's GEMV-kernel section (minengine.course.kernel_lesson), on tiny sizes.

What is checked (the timing loop is the lesson's own cell): the sizes rule (twice the cache, at least
256 MiB, capped), that every kernel reads the same bytes and torch's thread count is restored, the loop's
warm-up and round-robin, that oneDNN's prepacked linear computes what F.linear does, the floor
arithmetic, the degenerate one-thread run, the library/CPU lines and the plot.
No timing is asserted (a shared machine decides those); only what the code counts.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from notebook_cells import run_cells

from minengine.course import kernel_lesson as kl

TINY = kl.KernelSizes(rows=512, cols=64, matrices=3, repeats=2)


# ------------------------------------------------------------------------------------------- sizes
def test_cache_sizes_parse_as_linux_writes_them() -> None:
    assert kl._parse_size("516096K\n") == 516096 * 1024
    assert kl._parse_size("4M") == 4 * 2**20
    assert kl._parse_size("48") == 48
    with pytest.raises(ValueError):
        kl._parse_size("lots")


def test_the_stack_is_larger_than_twice_the_cache_within_the_caps() -> None:
    matrix = 32000 * 768 * 4
    small = kl.kernel_sizes(headless=False, cache_bytes=None)
    assert small.matrix_bytes == matrix
    assert small.matrices == 3 and small.total_bytes >= 256 * 2**20  # the 256 MiB minimum
    mid = kl.kernel_sizes(headless=False, cache_bytes=200 * 2**20)
    assert mid.total_bytes >= 2 * 200 * 2**20 and mid.matrices == math.ceil(400 * 2**20 / matrix)
    assert kl.kernel_sizes(headless=False, cache_bytes=2**30).matrices == 8  # capped: memory
    assert kl.kernel_sizes(headless=True, cache_bytes=2**30).matrices == 4
    assert kl.kernel_sizes(headless=True).repeats < kl.kernel_sizes(headless=False).repeats


def test_last_level_cache_is_a_size_or_none() -> None:
    got = kl.last_level_cache_bytes()
    assert got is None or got >= 2**10


# ------------------------------------------------------------------------------------------- measuring
def lesson_kernels(sizes: kl.KernelSizes, threads: int) -> kl.KernelRun:
    """The lesson's own ``time_kernels`` loop and measuring cell, on ``sizes``, with torch at ``threads``."""
    import time

    from minengine.engine.threads import torch_threads

    namespace = {"torch": torch, "F": F, "math": math, "time": time, "rk": kl, "stack": sizes,
                 "torch_threads": torch_threads, "tqdm": lambda it, **_: it}
    with torch_threads(threads):
        return run_cells("02_roofline", ["def time_kernels(", "weights = rk.build_weights("],
                         namespace)["kernel_run"]


def test_every_kernel_reads_the_same_bytes_and_threads_are_restored() -> None:
    before = torch.get_num_threads()
    run = lesson_kernels(TINY, threads=2)
    assert torch.get_num_threads() == before
    assert run.threads == 2
    kernels = {p.kernel for p in run.points}
    assert {kl.SUM, kl.GEMV} <= kernels
    assert (kl.ONEDNN in kernels) == (run.onednn_note is None)
    assert len(run.points) == 2 * len(kernels)  # each at 1 and 2 threads
    assert {p.bytes for p in run.points} == {TINY.total_bytes}
    assert all(p.seconds > 0 and math.isfinite(p.bytes_per_s) for p in run.points)
    sums = [p for p in run.points if p.kernel == kl.SUM]
    assert run.best_read.bytes_per_s == max(p.bytes_per_s for p in sums)
    assert run.fastest_gemv.kernel != kl.SUM
    assert run.get(kl.GEMV, 1) is not None and run.get(kl.GEMV) is run.get(kl.GEMV, 2)


def test_one_thread_measures_only_one_thread_and_missing_points_are_nan() -> None:
    run = lesson_kernels(TINY, threads=1)
    assert run.threads == 1 and {p.threads for p in run.points} == {1}
    assert [p.kernel for p in run.points][:2] == [kl.SUM, kl.GEMV]
    assert run.get(kl.GEMV, 2) is None and math.isnan(run.rate(kl.GEMV, 2))
    assert run.rate(kl.GEMV) == run.points[1].bytes_per_s  # "all threads" is the one thread


def test_time_kernels_keeps_each_fastest_pass_after_a_warm_up() -> None:
    from minengine.engine.threads import torch_threads

    namespace = {"math": math, "time": __import__("time"), "torch_threads": torch_threads,
                 "tqdm": lambda it, **_: it}
    time_kernels = run_cells("02_roofline", ["def time_kernels("], namespace)["time_kernels"]
    calls: list[str] = []
    passes = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    best = time_kernels(passes, (1, 2), rounds=2)
    assert calls == ["a", "a", "b", "b"] * 3  # a warm-up round, then 2 kept, round-robin over the kernels
    assert list(best) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    calls.clear()
    more = time_kernels(passes, (1, 2), rounds=1, best={k: 0.0 for k in best})
    assert calls == ["a", "a", "b", "b"]  # no warm-up when adding passes to earlier ones
    assert set(more.values()) == {0.0}  # the fastest of old and new


def test_a_gemv_faster_than_the_sum_by_more_than_noise_is_flagged() -> None:
    fast_gemv = kl.KernelRun.of({(kl.SUM, 1): 1.0, (kl.GEMV, 1): 1.0 / (kl.NOISE + 0.1)}, 10**9)
    assert fast_gemv.gemv_beats_the_sum and fast_gemv.threads == 1
    within_noise = kl.KernelRun.of({(kl.SUM, 1): 1.0, (kl.GEMV, 1): 1.0 / (kl.NOISE - 0.1)}, 10**9)
    assert not within_noise.gemv_beats_the_sum


def test_onednn_linear_computes_what_f_linear_does() -> None:
    weights = kl.build_weights(TINY, seed=1)
    assert weights.shape == (3, 512, 64) and weights.dtype == torch.float32
    assert torch.equal(weights, kl.build_weights(TINY, seed=1))  # seeded
    layers, note = kl.onednn_linears(weights)
    if layers is None:
        pytest.skip(f"no oneDNN here: {note}")
    x = torch.randn(1, 64)
    with torch.no_grad():
        for layer, w in zip(layers, weights, strict=True):
            got = layer(x)
            got = got.to_dense() if got.is_mkldnn else got
            torch.testing.assert_close(got, F.linear(x, w), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------- floors
def _run(rates: dict[tuple[str, int], float], threads: int = 2) -> kl.KernelRun:
    points = tuple(kl.ReadPoint(k, n, 10**9, 10**9 / r) for (k, n), r in rates.items())
    return kl.KernelRun(points, threads)


def test_the_floor_is_weight_bytes_over_the_rate() -> None:
    run = _run({(kl.SUM, 1): 15e9, (kl.SUM, 2): 30e9, (kl.GEMV, 1): 15e9, (kl.GEMV, 2): 14e9})
    assert run.best_read.threads == 2 and run.best_read.bytes_per_s == pytest.approx(30e9)
    assert run.fastest_gemv.threads == 1
    rows = kl.floor_rows(run, {"a 1 GB model": 1e9, "a 3 GB model": 3e9})
    assert [r[0] for r in rows] == [p.label for p in run.points]
    label, gbs, floors = rows[1]
    assert label == f"{kl.SUM}, 2 threads" and gbs == pytest.approx(30.0)
    assert floors == pytest.approx([1e3 / 30, 3e3 / 30])  # ms per token
    assert rows[0][0].endswith("1 thread")


def test_smollm2_reads_what_the_benchmark_measured_per_step() -> None:
    # benchmarks/RESULTS.md §5 and §6: 538.1 MB read per fp32 decode step of SmolLM2-135M
    assert kl.FLOOR_MODELS["SmolLM2-135M, fp32"] == pytest.approx(538.06e6, rel=1e-4)
    assert kl.FLOOR_MODELS["Llama-3.1-8B, bf16"] == pytest.approx(16.06e9, rel=1e-3)


# ------------------------------------------------------------------------------------------- this machine
def test_blas_line_names_the_libraries() -> None:
    mkl = ("  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for ...\n"
           "  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa7)\n  - CPU capability usage: AVX512\n"
           "  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, ...")
    line = kl.blas_line(mkl)
    assert line.startswith("BLAS_INFO=mkl")
    assert "Math Kernel Library Version 2024.2" in line and "MKL-DNN v3.12.0" in line and "AVX512" in line
    assert kl.blas_line("  - Build settings: BLAS_INFO=open, ...\n  - OpenBLAS 0.3.27\n").startswith(
        "BLAS_INFO=open; OpenBLAS 0.3.27")
    assert kl.blas_line("nothing") == "BLAS_INFO not reported"
    assert "BLAS_INFO" in kl.blas_line()  # this torch's own configuration


def test_cpu_name_tells_generations_behind_one_marketing_name_apart() -> None:
    # a VM's bare "AMD EPYC": Zen 4 (family 25) and Zen 5 (family 26) differ 2x in matmul peak
    zen5 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
            "model name\t: AMD EPYC\n"
            "\nprocessor\t: 1\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n")
    assert kl.cpu_name(zen5) == "AMD EPYC (family 26, model 2)"  # the first processor's block
    assert kl.cpu_name("model name\t: Some CPU\n") == "Some CPU"  # no family given: the name alone
    assert kl.cpu_name("processor : 0\nFeatures : fp asimd\n")  # no model name (arm64): platform's


def test_machine_line_names_cpu_and_torch() -> None:
    assert kl.cpu_name()
    line = kl.machine_line()
    assert torch.__version__ in line and "logical CPU" in line


def test_plot_has_a_bar_per_point_and_the_best_read_line() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = _run({(kl.SUM, 1): 15e9, (kl.SUM, 2): 30e9, (kl.GEMV, 1): 15e9, (kl.GEMV, 2): 14e9})
    fig, ax = plt.subplots()
    kl.plot_kernels(ax, run)
    assert len(ax.patches) == 4
    ticks = {t.get_text(): y for t, y in zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)}
    assert set(ticks) == {p.label for p in run.points}
    assert ticks[run.points[0].label] == max(ticks.values())  # first point on top
    texts = [t.get_text() for t in ax.texts]
    assert any("30.0 GB/s" in t and f"{1e3 * kl.FLOOR_MODELS['SmolLM2-135M, fp32'] / 30e9:.1f} ms" in t
               for t in texts)
    assert ax.lines and ax.lines[0].get_xdata()[0] == pytest.approx(30.0)
    plt.close(fig)
