"""Metrics on a hand-built run whose every number is worked out below (vLLM's `bench serve` conventions).

The run (times in seconds, SLO = ttft 500 ms, tpot 350 ms, e2e 1200 ms):

    id  arrival sched  token times                   prompt  TTFT  E2E  queue  ITL gaps          TPOT
    a   0.0     0.1    0.3 0.4 0.6 0.7               10      0.3   0.7  0.1    .1 .2 .1          .4/3 = .1333
    b   0.2     0.2    0.5 0.9                       20      0.3   0.7  0.0    .4                .4/1 = .4
    c   0.4     0.6    1.4                           5       1.0   1.0  0.2    -                 - (1 token)
    e   0.5     0.5    0.7 0.9 1.2 1.5 2.0           15      0.2   1.5  0.0    .2 .3 .3 .5       1.3/4 = .325
    d   0.5     0.7    0.9, then aborted at 1.0      8       (aborted: only in counts and attainment)

SLOs: a meets all; b fails only TPOT (400 > 350); c fails only TTFT (1000 > 500; its TPOT counts as 0);
e fails only E2E (1500 > 1200); d is aborted. Goodput = 1 request / 2.0 s = 0.5 req/s; attainment 1/5.
"""

from __future__ import annotations

import json
import math

import matplotlib
import pytest

matplotlib.use("Agg")

from minengine.metrics import (  # noqa: E402
    Distribution,
    RequestRecord,
    StepRecord,
    max_rate_meeting_slo,
    parse_slo,
    slo_attainment,
    summarize,
    to_chrome_trace,
)
from minengine.metrics.plots import (  # noqa: E402
    plot_kv_usage,
    plot_latency_cdf,
    plot_request_timeline,
    plot_step_gantt,
)

SLO = {"ttft": 500, "tpot": 350, "e2e": 1200}


def req(rid, arrival, sched, tokens, prompt, reason="stop", finish=None):
    return RequestRecord(
        request_id=rid,
        arrival_time=arrival,
        num_prompt_tokens=prompt,
        first_scheduled_time=sched,
        token_times=list(tokens),
        finish_time=tokens[-1] if finish is None else finish,
        num_output_tokens=len(tokens),
        finish_reason=reason,
    )


@pytest.fixture
def requests():
    return [
        req("a", 0.0, 0.1, [0.3, 0.4, 0.6, 0.7], 10),
        req("b", 0.2, 0.2, [0.5, 0.9], 20),
        req("c", 0.4, 0.6, [1.4], 5),
        req("e", 0.5, 0.5, [0.7, 0.9, 1.2, 1.5, 2.0], 15),
        req("d", 0.5, 0.7, [0.9], 8, reason="abort", finish=1.0),
    ]


@pytest.fixture
def steps():
    # step: (start, end, prefill, decode, kv used of 10, schedule/prepare/forward/sample, queries, hits,
    # preempted)
    rows = [
        (0.0, 0.1, 10, 0, 2, (0.01, 0.02, 0.05, 0.01), 10, 0, 0),
        (0.1, 0.3, 20, 1, 5, (0.01, 0.02, 0.15, 0.01), 20, 16, 1),
        (0.3, 0.35, 0, 2, 4, (0.005, 0.01, 0.03, 0.005), 0, 0, 0),
    ]
    return [
        StepRecord(step=i, start=s, end=e, num_prefill_tokens=p, num_decode_tokens=d, num_decode_seqs=d,
                   kv_blocks_used=kv, kv_blocks_total=10, t_schedule=ts[0], t_prepare=ts[1], t_forward=ts[2],
                   t_sample=ts[3], prefix_cache_queries=q, prefix_cache_hits=h, num_preempted=pre)
        for i, (s, e, p, d, kv, ts, q, h, pre) in enumerate(rows)
    ]  # fmt: skip


def approx(x):
    return pytest.approx(x, abs=1e-9)


def test_latency_distributions(requests):
    s = summarize(requests)
    # TTFT over completed requests: [0.3, 0.3, 1.0, 0.2] -> sorted [0.2, 0.3, 0.3, 1.0]
    # np.percentile (linear): p90 at index 0.9*3 = 2.7 -> 0.3 + 0.7*0.7; p99 at 2.97 -> 0.3 + 0.97*0.7
    assert s.ttft.count == 4
    assert (s.ttft.mean, s.ttft.median) == (approx(1.8 / 4), approx(0.3))
    assert (s.ttft.p90, s.ttft.p99) == (approx(0.79), approx(0.979))
    assert (s.ttft.min, s.ttft.max) == (approx(0.2), approx(1.0))
    # ITL pools all 8 gaps (token-weighted): sorted [.1 .1 .2 .2 .3 .3 .4 .5], sum 2.1
    # median = (.2 + .3) / 2; p90 at 6.3 -> .4 + .3*.1; p99 at 6.93 -> .4 + .93*.1
    assert s.itl.count == 8
    assert (s.itl.mean, s.itl.median) == (approx(2.1 / 8), approx(0.25))
    assert (s.itl.p90, s.itl.p99) == (approx(0.43), approx(0.493))
    # (the request-weighted mean of per-request ITL means would be (.4/3 + .4 + .325) / 3 = .2861)
    assert s.itl.mean != pytest.approx((0.4 / 3 + 0.4 + 0.325) / 3, abs=1e-3)
    # TPOT, one value per request with >= 2 tokens: [.1333, .4, .325]; c (1 token) is left out
    assert s.tpot.count == 3
    assert (s.tpot.mean, s.tpot.median) == (approx((0.4 / 3 + 0.4 + 0.325) / 3), approx(0.325))
    assert s.tpot.p99 == approx(0.325 + 0.98 * 0.075)  # sorted [.1333, .325, .4], index 1.98
    # E2E: [.7, .7, 1.0, 1.5]; p99 at 2.97 -> 1.0 + .97*.5
    assert (s.e2e.mean, s.e2e.median, s.e2e.p99) == (approx(3.9 / 4), approx(0.85), approx(1.485))
    # queue: [.1, 0, .2, 0]
    assert (s.queue.mean, s.queue.median, s.queue.max) == (approx(0.075), approx(0.05), approx(0.2))


def test_counts_throughput_goodput(requests):
    s = summarize(requests, slo=SLO)
    assert (s.num_requests, s.completed, s.aborted) == (5, 4, 1)
    # completed requests only: input 10+20+5+15, output 4+2+1+5; duration first arrival 0 -> last token 2.0
    assert (s.total_input_tokens, s.total_output_tokens) == (50, 12)
    assert s.duration == approx(2.0)
    assert s.request_throughput == approx(4 / 2.0)
    assert s.output_throughput == approx(12 / 2.0)
    assert s.total_token_throughput == approx(62 / 2.0)
    # only a meets every SLO (b fails TPOT, c TTFT, e E2E, d aborted)
    assert s.request_goodput == approx(1 / 2.0)
    assert s.slo_attainment == approx(1 / 5)
    assert summarize(requests, slo={"tpot": 350}).request_goodput == approx(3 / 2.0)  # a, c (TPOT 0), e
    assert summarize(requests, slo={"ttft": 500}).request_goodput == approx(3 / 2.0)  # a, b, e
    assert summarize(requests, slo={"e2e": 1200}).request_goodput == approx(3 / 2.0)  # a, b, c
    assert summarize(requests, duration=4.0).request_throughput == approx(1.0)  # an explicit duration wins
    assert s.num_steps is None and s.time_split is None


def test_step_stats(requests, steps):
    s = summarize(requests, steps)
    assert s.num_steps == 3
    assert s.mean_batch_tokens == approx((10 + 21 + 2) / 3)
    assert s.max_kv_cache_usage == approx(0.5)
    assert s.num_preemptions == 1
    assert s.prefix_cache_hit_rate == approx(16 / 30)
    expected = {"schedule": 0.025, "prepare": 0.05, "forward": 0.23, "sample": 0.025, "other": 0.02}
    assert s.time_split == {k: approx(v) for k, v in expected.items()}


def test_zero_and_one_token_requests():
    zero = RequestRecord(
        "z", arrival_time=0.0, first_scheduled_time=0.1, finish_time=0.5, finish_reason="stop"
    )
    one = req("o", 0.0, 0.1, [0.2], 3)
    s = summarize([zero, one], slo={"e2e": 1000})
    assert s.completed == 2 and s.total_output_tokens == 1
    assert s.ttft.count == 1 and s.itl.count == 0 and s.tpot.count == 0
    assert sorted(s.e2e.values) == [approx(0.2), approx(0.5)]  # a 0-token request's E2E ends at finish
    assert s.request_goodput == approx(2 / 0.5)
    assert slo_attainment([zero, one], {"ttft": 1000}) == 0.5  # no first token: misses a TTFT SLO
    assert str(s.itl) == "no samples" and s.itl.to_dict()["mean"] is None
    json.dumps(s.to_dict(), allow_nan=False)
    assert "n/a" in s.format_table()
    # a streamed chunk can carry several tokens: TPOT and totals use num_output_tokens, ITL the chunk gaps
    chunked = RequestRecord(
        "k", 0.0, 4, 0.0, [0.1, 0.3, 0.5], 0.5, num_output_tokens=5, finish_reason="length"
    )
    s = summarize([chunked])
    assert s.tpot.mean == approx(0.4 / 4) and s.itl.count == 2 and s.total_output_tokens == 5
    empty = summarize([], slo=SLO)
    assert empty.completed == 0 and math.isnan(empty.request_throughput)


def test_report_formats(requests, steps, tmp_path):
    s = summarize(requests, steps, slo=SLO)
    table = s.format_table()
    for line in [
        "Successful requests:                     4",
        "Aborted requests:                        1",
        "Benchmark duration (s):                  2.00",
        "Request goodput (req/s):                 0.50",
        "Output token throughput (tok/s):         6.00",
        "Mean TTFT (ms):                          450.00",
        "P99 ITL (ms):                            493.00",
        "Median TPOT (ms):                        325.00",
        "P99 E2EL (ms):                           1485.00",
        "Prefix cache hit rate (%):               53.33",
        "---------------Time to First Token----------------",
    ]:
        assert line in table.splitlines(), line
    d = s.to_dict()  # vLLM's saved-result keys
    assert d["mean_ttft_ms"] == approx(450) and d["p99_e2el_ms"] == approx(1485) and d["count_itl"] == 8
    assert d["request_goodput"] == 0.5 and "requests" not in d
    s.to_json(tmp_path / "s.json")
    assert json.loads((tmp_path / "s.json").read_text())["completed"] == 4
    assert "<table>" in s._repr_html_() and "Mean TTFT (ms)" in s._repr_html_()
    assert str(s.ttft).startswith("mean 450.00 ms, median 300.00")
    assert Distribution.from_values([1.0]).p99 == 1.0


def test_parse_slo():
    assert parse_slo("ttft:200,tpot:50") == {"ttft": 200.0, "tpot": 50.0}
    assert parse_slo(" ttft:200 tpot:50 e2el:1000 ") == {"ttft": 200.0, "tpot": 50.0, "e2e": 1000.0}
    for bad, msg in [
        ("", "empty"),
        ("ttft", "bad SLO item"),
        ("ttft:abc", "bad SLO value"),
        ("itl:5", "unknown SLO metric"),
        ("ttft:-1", "positive"),
        ("ttft:1,ttft:2", "twice"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_slo(bad)


def run_with(good, total=20):
    """A run where ``good`` of ``total`` requests meet ttft 500 / tpot 50 (the rest have a 1 s TTFT)."""
    firsts = [0.1 if i < good else 1.0 for i in range(total)]
    return [req(str(i), 0.0, 0.0, [t, t + 0.01], 1) for i, t in enumerate(firsts)]


def test_max_rate_meeting_slo():
    rates = [8, 1, 4, 2]  # any order; attainment 0.5, 1.0, 0.8, 0.95
    runs = [run_with(10), run_with(20), run_with(16), run_with(19)]
    # crossing of 0.9 between (2, .95) and (4, .8): 2 + (.95 - .9) / (.95 - .8) * (4 - 2)
    assert max_rate_meeting_slo(rates, runs, 500, 50) == approx(2 + 0.05 / 0.15 * 2)
    assert max_rate_meeting_slo(rates, runs, 500, 50, interpolate=False) == 2
    summaries = [summarize(r) for r in runs]  # summaries keep their records
    assert max_rate_meeting_slo(rates, summaries, 500, 50) == approx(2 + 0.05 / 0.15 * 2)
    assert max_rate_meeting_slo([1, 2], [run_with(20), run_with(19)], 500, 50) == 2  # all meet: highest
    assert max_rate_meeting_slo([1, 2], [run_with(17), run_with(20)], 500, 50) is None  # lowest misses
    # non-monotone: stops at the first miss (1 -> 2), ignoring the recovery at 3
    assert max_rate_meeting_slo([1, 2, 3], [run_with(20), run_with(10), run_with(19)], 500, 50) == approx(1.2)


def test_chrome_trace(requests, steps, tmp_path):
    trace = to_chrome_trace(requests, steps, path=tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == trace
    events = trace["traceEvents"]
    by_ph = {ph: [e for e in events if e["ph"] == ph] for ph in "XiCM"}
    assert len(events) == sum(map(len, by_ph.values()))
    # requests: a 3 spans, b 3 (zero-length queue), c 2 (no decode after its only token), e 3, d 2;
    # steps: a span + 4 phases each
    assert len(by_ph["X"]) == 13 + 3 * 5
    assert len(by_ph["i"]) == 4 + 2 + 1 + 5 + 1  # one instant per token
    assert len(by_ph["C"]) == 3 * 3  # KV usage, batch tokens, requests per step
    assert len(by_ph["M"]) == 5 + 2 * 5
    names = {e["args"]["name"] for e in by_ph["M"] if e["name"] == "thread_name"}
    assert {"steps", "request a", "request d"} <= names
    prefill_a = next(e for e in by_ph["X"] if e["name"] == "prefill" and e["tid"] == 1)
    assert (prefill_a["ts"], prefill_a["dur"]) == (approx(1e5), approx(2e5))  # 0.1 s -> 0.3 s, in µs
    step1 = next(e for e in by_ph["X"] if e["name"] == "step 1")
    phases = [
        e for e in by_ph["X"] if e["cat"] == "phase" and step1["ts"] <= e["ts"] < step1["ts"] + step1["dur"]
    ]
    assert [e["name"] for e in phases] == ["schedule", "prepare", "forward", "sample"]
    assert phases[-1]["ts"] + phases[-1]["dur"] <= step1["ts"] + step1["dur"] + 1e-6
    kv = [e["args"]["usage"] for e in by_ph["C"] if e["name"] == "KV cache usage (%)"]
    assert kv == [approx(20), approx(50), approx(40)]


def test_plots(requests, steps):
    from matplotlib.figure import Figure

    fig = plot_request_timeline(requests)
    ax = fig.axes[0]
    # bars: a 3, b 2 (no queue), c 2 (no decode), e 2 (no queue), d 2 (no decode)
    assert isinstance(fig, Figure) and len(ax.patches) == 11
    assert len(ax.collections[0].get_offsets()) == 13  # token ticks
    assert len(plot_request_timeline(requests, max_requests=2).axes[0].patches) == 3 + 2

    fig = plot_step_gantt(steps)
    ax_time, ax_tok = fig.axes
    assert len(ax_time.patches) == 5 * 3 and len(ax_tok.patches) == 2 * 3
    assert sum(p.get_height() for p in ax_time.patches[:3]) == approx(1000 * 0.025)  # schedule, ms

    ax = plot_kv_usage(steps).axes[0]
    assert len(ax.lines) == 1 and len(ax.collections) == 1  # usage line, one preemption marker

    fig = plot_latency_cdf({"engine": requests, "again": summarize(requests)}, "itl", slo_ms=400)
    ax = fig.axes[0]
    assert len(ax.lines) == 3  # two CDFs + the SLO line
    assert ax.lines[0].get_ydata()[-1] == 1.0 and len(ax.lines[0].get_xdata()) == 1 + 8
    assert len(plot_latency_cdf([summarize(requests)] * 2, "tpot").axes[0].lines) == 2
    with pytest.raises(ValueError):
        plot_latency_cdf(requests, "bogus")
