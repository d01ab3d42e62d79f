"""Lesson 08's chat through the official ``openai`` SDK: ``serving_lesson.read_chat_stream`` on chunks with
known times, its per-token ITL against the server's own histogram, and ``ServerProcess.startup_s``.

The per-token ITL is the point: a chunk can carry no text (the end-of-text token) or several tokens,
so an ITL counted per chunk disagrees with the server's ``inter_token_latency_seconds``; counted per
token (the usage chunk's count, the last token at the chunk with ``finish_reason``) it agrees.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from minengine.course import serving_lesson as sl
from minengine.course.server_process import ServerProcess


def chunk(content: str | None = None, finish: str | None = None, role: str | None = None,
          usage: dict | None = None) -> ChatCompletionChunk:
    choices = [] if usage else [{"index": 0, "delta": {"role": role, "content": content},
                                 "finish_reason": finish}]
    return ChatCompletionChunk.model_validate({"id": "c", "object": "chat.completion.chunk", "created": 0,
                                               "model": "m", "choices": choices, "usage": usage})


def timed(chunks: list[ChatCompletionChunk], gap: float) -> Iterator[ChatCompletionChunk]:
    for c in chunks:
        time.sleep(gap)
        yield c


def test_read_chat_stream_counts_tokens_not_chunks(capsys: pytest.CaptureFixture[str]) -> None:
    # 5 tokens: "Hel", "lo" and " wörld" (two tokens, one chunk: a character split across them), then an
    # end-of-text token with no text; the usage chunk says 5
    chunks = [chunk("", role="assistant"), chunk("Hel"), chunk("lo"), chunk(" wörld"),
              chunk("", finish="stop"),
              chunk(usage={"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8})]
    start = time.perf_counter()
    out = sl.read_chat_stream(timed(chunks, 0.02), start, echo=True)
    assert out.text == "Hello wörld" and capsys.readouterr().out == "Hello wörld\n"
    assert len(out.content_times) == 3 and out.content_times == sorted(out.content_times)
    assert (out.finish_reason == "stop" and out.finished_at is not None
            and out.finished_at > out.content_times[-1])
    assert out.usage["completion_tokens"] == 5 and out.num_tokens == 5
    assert out.mean_itl == pytest.approx((out.finished_at - out.ttft) / 4)
    assert len(out.lines) == len(chunks) and out.e2e >= out.finished_at
    assert 0.02 <= out.ttft < out.e2e  # stamped against start, when each chunk arrived


def test_without_usage_tokens_are_the_text_chunks() -> None:
    out = sl.read_chat_stream(iter([chunk("a"), chunk("b"), chunk("c", finish="length")]),
                              time.perf_counter())
    assert out.num_tokens == 3 and out.usage is None and out.text == "abc"
    one = sl.read_chat_stream(iter([chunk("a", finish="length")]), time.perf_counter())
    assert math.isnan(one.mean_itl)  # one token: no gap to average


@pytest.fixture(scope="module")
def tiny_server() -> Iterator[ServerProcess]:
    with ServerProcess("tinystories-4m", args=["--num-blocks", "128"]) as server:
        yield server


def test_server_process_says_how_long_it_took_to_start(tiny_server: ServerProcess) -> None:
    assert tiny_server.startup_s is not None and 0 < tiny_server.startup_s < tiny_server.startup_timeout
    assert ServerProcess().startup_s is None  # not started


def test_sdk_chat_agrees_with_the_servers_metrics(tiny_server: ServerProcess) -> None:
    bot = openai.OpenAI(base_url=tiny_server.base_url, api_key="none", max_retries=0, timeout=60)
    before = sl.scrape(tiny_server.url)
    start = time.perf_counter()
    reply = bot.chat.completions.create(
        model="tinystories-4m", max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "system", "content": "You tell stories."},
                  {"role": "user", "content": "A story?"}],
        extra_body={"ignore_eos": True})
    out = sl.read_chat_stream(reply, start)
    after = sl.scrape(tiny_server.url)
    n_ttft, server_ttft = sl.histogram_mean(before, after, "minengine:time_to_first_token_seconds")
    n_itl, server_itl = sl.histogram_mean(before, after, "minengine:inter_token_latency_seconds")
    assert out.finish_reason == "length" and out.num_tokens == 24 and out.text
    assert n_ttft == 1 and out.ttft > server_ttft  # the client's clock starts before the server's
    assert n_itl == out.num_tokens - 1
    assert out.mean_itl == pytest.approx(server_itl, rel=0.25, abs=0.003)
    # the same greedy text as a non-streamed request: streaming changes when text arrives, not what
    whole = bot.chat.completions.create(
        model="tinystories-4m", max_tokens=24, temperature=0, extra_body={"ignore_eos": True},
        messages=[{"role": "system", "content": "You tell stories."},
                  {"role": "user", "content": "A story?"}])
    assert whole.choices[0].message.content == out.text
