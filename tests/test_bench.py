"""The bench client: arrivals, datasets, SSE parsing, and runs against a live server.

The key check: the client's TTFT (sent -> first content chunk) agrees with the server's own TTFT
(engine arrival -> first token), per request and against the /metrics histogram. The client's number
must be the larger (it includes the server's work before the engine sees the request) and exceed the
server's by only the cost of HTTP parsing, tokenization and one SSE hop on loopback.
"""

from __future__ import annotations

import asyncio
import json
import math
import re

import httpx
import numpy as np
import pytest

from minengine.bench import (
    BenchmarkSummary,
    arrival_offsets,
    benchmark,
    jsonl_requests,
    random_requests,
    run_benchmark,
    stream_request,
)
from minengine.metrics import RunSummary
from minengine.server import ServerThread, create_app

pytestmark = pytest.mark.usefixtures("torch_one_thread")

MODEL = "tinystories-4m"


@pytest.fixture(scope="module")
def tokenizer():
    from minengine.models.loader import load_tokenizer

    return load_tokenizer(MODEL)


@pytest.fixture(scope="module")
def server(torch_one_thread):
    with ServerThread(create_app(model=MODEL, max_model_len=1024)) as srv:
        yield srv


# ---- arrivals ----
@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_arrivals_have_the_requested_rate_and_burstiness(burstiness):
    offsets = arrival_offsets(4000, request_rate=8.0, burstiness=burstiness, seed=1)
    gaps = np.diff(offsets)
    assert offsets[0] == 0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(1 / 8, rel=0.06)
    # Gamma(k, theta): coefficient of variation 1/sqrt(k); 1 is Poisson
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)
    assert np.array_equal(offsets, arrival_offsets(4000, 8.0, burstiness, seed=1))  # seeded


def test_infinite_rate_sends_everything_at_once():
    assert not arrival_offsets(10, math.inf).any()
    with pytest.raises(ValueError):
        arrival_offsets(10, 0)
    with pytest.raises(ValueError):
        arrival_offsets(10, 1.0, burstiness=0)


# ---- datasets ----
def test_random_prompts_have_the_requested_token_counts(tokenizer):
    reqs = random_requests(tokenizer, 20, input_len=50, output_len=10, seed=3)
    lengths = [len(tokenizer.encode(r.prompt, add_special_tokens=False)) for r in reqs]
    assert lengths == [r.prompt_len for r in reqs]
    assert sum(n == 50 for n in lengths) >= 18  # re-tokenization may miss by a token now and then
    assert all(r.expected_output_len == 10 for r in reqs)
    again = random_requests(tokenizer, 20, input_len=50, output_len=10, seed=3)
    assert [r.prompt for r in again] == [r.prompt for r in reqs]


def test_range_ratio_and_shared_prefix(tokenizer):
    reqs = random_requests(tokenizer, 40, input_len=40, output_len=20, range_ratio=0.5, prefix_len=32, seed=0)
    outs = [r.expected_output_len for r in reqs]
    assert min(outs) >= 10 and max(outs) <= 30 and len(set(outs)) > 5
    prefix = reqs[0].prompt[:60]
    assert all(r.prompt.startswith(prefix) for r in reqs)
    assert all(72 - 22 <= r.prompt_len <= 32 + 60 + 2 for r in reqs)
    with pytest.raises(ValueError):
        random_requests(tokenizer, 1, 10, 10, range_ratio=1.0)


def test_jsonl_dataset(tmp_path, tokenizer):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "Once upon a time", "output_len": 5}\n\n{"prompt": "The cat"}\n')
    reqs = jsonl_requests(path, num_prompts=5, tokenizer=tokenizer, default_output_len=7)
    assert [r.expected_output_len for r in reqs] == [5, 7, 5, 7, 5]
    assert reqs[0].prompt_len == len(tokenizer.encode("Once upon a time", add_special_tokens=False))
    path.write_text('{"prompt": "x", "output_len": -1}\n')
    with pytest.raises(ValueError, match="output_len"):
        jsonl_requests(path)
    path.write_text("not json\n")
    with pytest.raises(ValueError, match="not JSON"):
        jsonl_requests(path)


# ---- SSE parsing (no server: a canned stream) ----
def test_stream_request_skips_comments_and_times_only_content():
    body = (
        ": ping - keep-alive\n\n"
        'data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
        'data: {"id":"x","choices":[{"index":0,"delta":{"content":"Hello"}}]}\n\n'
        "event: message\n: another comment\n"
        'data: {"id":"x","choices":[{"index":0,"delta":{"content":" world"},"finish_reason":"stop"}]}\n\n'
        'data: {"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}'
        "\n\n"
        "data: [DONE]\n\n"
    )

    async def main():
        transport = httpx.MockTransport(lambda request: httpx.Response(200, text=body))
        async with httpx.AsyncClient(transport=transport) as http:
            return await stream_request(http, "http://test/v1/chat/completions", {})

    result = asyncio.run(main())
    assert result.error is None and result.text == "Hello world"
    record = result.record
    assert len(record.token_times) == 2  # the role-only chunk and the usage chunk are not tokens
    assert record.num_output_tokens == 3 and record.num_prompt_tokens == 7
    assert record.finish_reason == "stop" and record.request_id == "x"


@pytest.mark.parametrize(
    "status,body,expected",
    [
        (
            400,
            '{"error": {"message": "bad max_tokens", "type": "BadRequestError", "param": null, "code": 400}}',
            "HTTP 400: bad max_tokens",
        ),
        (200, 'data: {"error": {"message": "boom", "code": 500}}\n\ndata: [DONE]\n\n', "error event: boom"),
        (200, 'data: {"choices": [{"text": "a"}]}\n\n', "without a finish_reason or data: [DONE]"),
    ],
)
def test_stream_request_reports_failures(status, body, expected):
    async def main():
        transport = httpx.MockTransport(lambda request: httpx.Response(status, text=body))
        async with httpx.AsyncClient(transport=transport) as http:
            return await stream_request(http, "http://test/v1/completions", {})

    result = asyncio.run(main())
    assert expected in result.error and result.record.finish_reason is None


def test_a_stream_closed_after_its_finish_reason_is_complete():
    """transformers serve ends its streams without data: [DONE]; the finish_reason says they are done."""
    body = ('data: {"choices": [{"text": "a"}]}\n\n'
            'data: {"choices": [{"text": "", "finish_reason": "length"}]}\n\n')

    async def main():
        transport = httpx.MockTransport(lambda request: httpx.Response(200, text=body))
        async with httpx.AsyncClient(transport=transport) as http:
            return await stream_request(http, "http://test/v1/completions", {})

    result = asyncio.run(main())
    assert result.error is None and not result.saw_done
    assert (result.text == "a" and result.record.finish_reason == "length"
            and result.record.num_output_tokens == 1)


# ---- against the live server ----
def test_benchmark_run_returns_a_run_summary(server, tmp_path):
    summary = benchmark(
        server.url,
        num_prompts=24,
        input_len=32,
        output_len=8,
        ignore_eos=True,
        request_rate=40,
        max_concurrency=8,
        slo="ttft:5000,tpot:5000",
        seed=1,
        disable_tqdm=True,
    )
    assert isinstance(summary, RunSummary) and isinstance(summary, BenchmarkSummary)
    assert summary.completed == 24 and not summary.errors
    assert summary.total_output_tokens == 24 * 8
    assert summary.ttft.count == 24 and summary.tpot.count == 24
    # ITL is per chunk: a token whose text the detokenizer holds back (half a character) rides with the next
    assert 24 * 5 <= summary.itl.count <= 24 * 7
    assert summary.request_goodput == pytest.approx(summary.request_throughput)
    assert summary.total_input_tokens >= 24 * 32  # the server's usage count (the prompt re-tokenized)
    table = summary.format_table()
    assert "Failed requests:" in table and "Mean TTFT (ms):" in table and "P99 ITL (ms):" in table


def test_chat_endpoint_and_notebook_style_await(server):
    async def main():  # inside a running loop, as in Jupyter
        return await run_benchmark(
            server.url + "/v1",
            endpoint="chat",
            num_prompts=6,
            input_len=16,
            output_len=6,
            ignore_eos=True,
            disable_tqdm=True,
        )

    summary = asyncio.run(main())
    assert summary.completed == 6 and summary.total_output_tokens == 36 and not summary.errors


def test_bench_fails_fast_on_a_wrong_model(server):
    with pytest.raises(RuntimeError, match="does not exist"):
        benchmark(server.url, model="gpt-9", num_prompts=2, tokenizer=MODEL, disable_tqdm=True)


def ttft_histogram(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics").text

    def get(kind: str) -> float:
        pattern = rf'^minengine:time_to_first_token_seconds_{kind}\{{model_name="{MODEL}"\}} (\S+)$'
        return float(re.search(pattern, text, re.M)[1])

    return get("sum"), get("count")


def test_client_ttft_agrees_with_server_ttft(server):
    """Low load (one request at a time) so the difference is the fixed overhead, not queueing noise.

    The client's TTFT must be the larger for every request (its clock starts before the engine's and
    stops after it) and exceed the engine's by under 15 ms in the median and 25 ms on average (under
    100 ms for every request). Measured
    here: ~5 ms on average, of which ~4 ms pass between the client's send and the handler (HTTP parsing
    and pydantic validation, on a shared 2-core machine with a load average near 3), ~1.5 ms in
    tokenizing, checks and the hop to the engine thread, and ~1 ms from the first token to the client
    (one SSE write on loopback). Under heavier load the median grew to ~9 ms; the margin covers such
    stalls when other jobs hold the CPUs (client, server and engine threads also share one GIL here).
    Client and server share one process and one clock (perf_counter), so requests are compared exactly,
    matched by the response id; the means are also checked against the /metrics histogram's sum / count.
    """
    engine = server.app.state.llm.engine
    sum0, count0 = ttft_histogram(server.url)
    summary = benchmark(
        server.url,
        num_prompts=20,
        input_len=64,
        output_len=4,
        ignore_eos=True,
        max_concurrency=1,
        warmup=False,
        disable_tqdm=True,
    )
    sum1, count1 = ttft_histogram(server.url)
    assert summary.completed == 20 and count1 - count0 == 20

    server_ttft = {r.request_id: r.ttft for r in engine.request_records}
    diffs = [r.ttft - server_ttft[r.request_id] for r in summary.requests]
    assert all(d >= 0 for d in diffs), diffs  # the client's clock starts first and stops last
    assert max(diffs) < 0.100 and np.median(diffs) < 0.015, diffs
    server_mean = (sum1 - sum0) / (count1 - count0)
    assert summary.ttft.mean - server_mean == pytest.approx(np.mean(diffs), abs=1e-6)
    assert 0 <= summary.ttft.mean - server_mean < 0.025
    print(
        f"\nTTFT client mean {1000 * summary.ttft.mean:.2f} ms, "
        f"server histogram mean {1000 * server_mean:.2f} ms, "
        f"overhead median {1000 * np.median(diffs):.2f} ms, max {1000 * max(diffs):.2f} ms"
    )


def test_bench_cli(server, tmp_path, capsys):
    from minengine.cli.main import main

    out = tmp_path / "result.json"
    code = main(
        [
            "bench",
            "--base-url",
            server.url,
            "--num-prompts",
            "8",
            "--input-len",
            "16",
            "--output-len",
            "4",
            "--ignore-eos",
            "--request-rate",
            "50",
            "--slo",
            "ttft:1000",
            "--save-result",
            str(out),
            "--disable-tqdm",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Serving Benchmark Result" in captured.out and "Request goodput (req/s):" in captured.out
    saved = json.loads(out.read_text())
    assert saved["completed"] == 8 and len(saved["ttfts"]) == 8 and "p99_ttft_ms" in saved
    assert saved["output_lens"] == [4] * 8


@pytest.mark.parametrize(
    "args",
    [
        ["--range-ratio", "1.5"],
        ["--dataset", "jsonl"],
        ["--num-prompts", "0"],
        ["--slo", "latency:5"],
        ["--request-rate", "-1"],
    ],
)
def test_bench_cli_bad_input_is_one_line(args, capsys):
    from minengine.cli.main import main

    assert main(["bench", "--base-url", "http://127.0.0.1:9", "--disable-tqdm", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "error" in err and "\n" not in err and "Traceback" not in err
