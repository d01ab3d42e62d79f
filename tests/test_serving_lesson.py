"""Lesson 08's client helpers against a real server (in a thread), Prometheus parsing by hand, the
detokenizer's held-back bytes, and the goodput widget on records with known latencies."""

from __future__ import annotations

import threading
import time

import pytest

import minengine
from minengine.core.records import RequestRecord
from minengine.course import serving_lesson as sl
from minengine.course.widgets.goodput_widget import GoodputWidget
from minengine.metrics.stats import summarize

METRICS = """\
# HELP x:ttft_seconds TTFT
# TYPE x:ttft_seconds histogram
x:ttft_seconds_bucket{le="0.1",model_name="m"} 2.0
x:ttft_seconds_bucket{le="+Inf",model_name="m"} 3.0
x:ttft_seconds_count{model_name="m"} 3.0
x:ttft_seconds_sum{model_name="m"} 0.6
# HELP x:success_total done
# TYPE x:success_total counter
x:success_total{finished_reason="stop",model_name="m"} 4.0
x:success_total{finished_reason="abort",model_name="m"} 1.0
"""


def test_parse_metrics_and_histogram_mean():
    before = sl.parse_metrics(METRICS)
    assert sl.metric(before, "x:success_total") == 5
    assert sl.metric(before, "x:success_total", finished_reason="abort") == 1
    assert sl.metric(before, "x:nothing") == 0
    after = sl.parse_metrics(METRICS.replace("_count{model_name=\"m\"} 3.0", "_count{model_name=\"m\"} 5.0")
                             .replace("_sum{model_name=\"m\"} 0.6", "_sum{model_name=\"m\"} 1.0"))
    count, mean = sl.histogram_mean(before, after, "x:ttft_seconds")
    assert count == 2 and mean == pytest.approx(0.2)


@pytest.fixture(scope="module")
def server(torch_one_thread):
    from minengine.server import ServerThread, create_app

    with ServerThread(create_app(model="tinystories-4m", num_blocks=128)) as s:
        yield s


def test_stream_stamps_chunks_and_reads_usage(server):
    body = {"model": "tinystories-4m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
            "temperature": 0, "stream_options": {"include_usage": True}}
    out = sl.stream(server.url, body, endpoint="/v1/chat/completions")
    assert out.lines[-1][1] == "data: [DONE]" and out.finish_reason == "length"
    assert out.usage["completion_tokens"] == 5 and out.text
    assert 0 < out.ttft <= out.e2e and out.content_times == sorted(out.content_times)
    with pytest.raises(RuntimeError, match="400"):
        sl.stream(server.url, {"model": "tinystories-4m", "prompt": "x", "max_tokens": -1})


def test_closing_the_stream_aborts_and_frees(server):
    before = sl.scrape(server.url)
    body = {"model": "tinystories-4m", "prompt": "Once", "max_tokens": 1500, "ignore_eos": True}
    holder = {}
    thread = threading.Thread(target=lambda: holder.update(s=sl.stream(server.url, body, stop_after=3,
                                                                          hold_s=0.2)))
    thread.start()
    sl.wait_until(lambda: sl.metric(sl.scrape(server.url), "minengine:num_requests_running") == 1)
    thread.join()
    assert len(holder["s"].content_times) == 3 and holder["s"].closed_at is not None
    sl.wait_until(lambda: sl.metric(sl.scrape(server.url), "minengine:kv_cache_usage_perc") == 0, timeout=5)
    after = sl.scrape(server.url)
    name = "minengine:request_success_total"
    assert (sl.metric(after, name, finished_reason="abort")
            - sl.metric(before, name, finished_reason="abort")) == 1
    assert sl.metric(after, "minengine:generation_tokens_total") - sl.metric(
        before, "minengine:generation_tokens_total") < 1500


def test_wait_until_times_out():
    start = time.perf_counter()
    with pytest.raises(TimeoutError):
        sl.wait_until(lambda: False, timeout=0.1)
    assert time.perf_counter() - start < 2


def test_detokenizer_holds_back_incomplete_characters():
    tok = minengine.load_tokenizer()
    steps = sl.detokenize_steps(tok, " é🙂", context="Hi")
    assert "".join(s.emitted for s in steps) == " é🙂"
    assert all("\ufffd" not in s.emitted for s in steps)
    assert sum(1 for s in steps if s.emitted == "") >= 3  # 2 bytes of é and 4 of 🙂 span several tokens


def records(ttft: float, tpot: float, n: int = 10) -> list[RequestRecord]:
    return [RequestRecord(str(i), 0.0, token_times=[ttft + tpot * k for k in range(5)],
                          finish_time=ttft + 4 * tpot, num_output_tokens=5, finish_reason="length")
            for i in range(n)]


def test_goodput_widget_reads_the_sweep_against_the_slos():
    rates = [1.0, 2.0, 4.0]
    sums = [summarize(records(0.05, 0.01)), summarize(records(0.15, 0.01)), summarize(records(0.5, 0.05))]
    w = GoodputWidget(rates, sums, ttft_ms=100, tpot_ms=20)
    assert w.attainment == [1.0, 0.0, 0.0] and w.goodput is not None and 1.0 <= w.goodput < 2.0
    assert "goodput" in w.text and w.plot.value
    w.ttft.value = 200
    assert w.attainment == [1.0, 1.0, 0.0] and 2.0 <= w.goodput < 4.0
    w.tpot.value = 100
    w.ttft.value = 1000
    assert w.goodput == 4.0 and "every rate tested" in w.text
    w.ttft.value = 1
    assert w.goodput is None and "not even the lowest" in w.text
    w.ttft.value = -5
    assert w.error and "positive" in w.error and w.plot.layout.display == "none"
    w.ttft.value = 1000
    assert w.error is None and w.plot.layout.display is None
    with pytest.raises(ValueError):
        GoodputWidget([1.0], [])
