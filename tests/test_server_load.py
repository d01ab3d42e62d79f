"""The server under load: 128 concurrent streams, and clients that hang up mid-stream.

Every stream must be well formed and end in ``data: [DONE]``; a client that disconnects must abort its
request so that its KV blocks come back (checked on the engine and on the /metrics gauge), and the
server must keep serving afterwards. All loops are bounded in count and time.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest

from minengine.server import ServerThread, create_app

pytestmark = pytest.mark.usefixtures("torch_one_thread")

MODEL = "tinystories-4m"
KV_GAUGE = re.compile(r'^minengine:kv_cache_usage_perc\{model_name="tinystories-4m"\} (\S+)$', re.M)


@pytest.fixture(scope="module")
def server(torch_one_thread):
    with ServerThread(create_app(model=MODEL, max_model_len=1024)) as srv:
        yield srv


def client(max_connections: int = 256, timeout: float = 120) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx.AsyncClient(limits=limits, timeout=timeout)


async def read_stream(
    http: httpx.AsyncClient, url: str, body: dict, hang_up_after: int | None = None
) -> dict:
    """Stream one request; return its parsed chunks and whether it ended with [DONE] (or hung up)."""
    chunks, done, raw_lines = [], False, []
    async with http.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            raw_lines.append(line)
            if not line.startswith("data: "):
                assert line == "" or line.startswith(":"), line
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                continue
            assert not done, "nothing may follow [DONE]"
            chunks.append(json.loads(data))
            if hang_up_after is not None and len(chunks) >= hang_up_after:
                break  # leaving the block closes the connection mid-stream
    return {"chunks": chunks, "done": done, "lines": raw_lines}


def wait_until_idle(engine, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.has_unfinished_requests() or engine.kv_cache_usage > 0:
        assert time.monotonic() < deadline, f"engine still busy: {list(engine.scheduler.requests)[:5]}"
        time.sleep(0.02)


def test_128_concurrent_streams(server):
    url = server.url + "/v1/completions"

    async def main():
        async with client() as http:
            bodies = [
                {
                    "prompt": f"Once upon a time, child number {i} went",
                    "max_tokens": 16,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "seed": i,
                }
                for i in range(128)
            ]
            return await asyncio.wait_for(asyncio.gather(*(read_stream(http, url, b) for b in bodies)), 120)

    start = time.perf_counter()
    results = asyncio.run(main())
    elapsed = time.perf_counter() - start
    assert len(results) == 128
    ids = set()
    for r in results:
        assert r["done"] and [line for line in r["lines"] if line][-1] == "data: [DONE]"
        *content, usage = r["chunks"]
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 16
        assert {c["id"] for c in r["chunks"]} == {content[0]["id"]}
        assert content[-1]["choices"][0]["finish_reason"] == "length"
        assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
        ids.add(content[0]["id"])
    assert len(ids) == 128
    print(f"\n128 concurrent streams x 16 tokens: {elapsed:.2f} s, {128 * 16 / elapsed:.0f} tok/s")
    wait_until_idle(server.app.state.llm.engine)


def test_disconnecting_clients_free_their_kv_blocks(server):
    """30% of clients hang up after two chunks of a 400-token answer; the rest read 16 tokens."""
    engine = server.app.state.llm.engine
    url = server.url + "/v1/completions"
    n, quitters = 60, set(range(0, 60, 10)) | set(range(3, 60, 10)) | set(range(6, 60, 10))  # 18 of 60
    finished_before = len(engine.request_records)

    async def main():
        async with client() as http:
            tasks = []
            for i in range(n):
                quits = i in quitters
                body = {
                    "prompt": f"Story {i}: once upon a time",
                    "stream": True,
                    "ignore_eos": True,
                    "max_tokens": 400 if quits else 16,
                }
                tasks.append(read_stream(http, url, body, hang_up_after=2 if quits else None))
            return await asyncio.wait_for(asyncio.gather(*tasks), 120)

    start = time.perf_counter()
    results = asyncio.run(main())
    for i, r in enumerate(results):
        if i in quitters:
            assert len(r["chunks"]) == 2 and not r["done"]
        else:
            assert r["done"] and r["chunks"][-1]["choices"][0]["finish_reason"] == "length"
    wait_until_idle(engine)
    settle = time.perf_counter() - start

    # the engine: blocks back, the quitters aborted long before their 400 tokens
    assert engine.kv_cache_usage == 0 and not engine.has_unfinished_requests()
    engine.scheduler.block_manager.check_invariants()
    records = list(engine.request_records)[finished_before:]
    aborted = [r for r in records if r.finish_reason == "abort"]
    assert len(aborted) == len(quitters)
    assert all(r.num_output_tokens < 400 for r in aborted)
    # the /metrics gauge agrees, and the aborts are counted
    text = httpx.get(server.url + "/metrics").text
    assert float(KV_GAUGE.search(text).group(1)) == 0.0
    aborts = re.search(
        r'request_success_total\{finished_reason="abort",model_name="tinystories-4m"\} (\S+)', text
    )
    assert float(aborts.group(1)) >= len(quitters)
    print(
        f"\n{n} clients, {len(quitters)} hung up: idle again {settle:.2f} s after start, "
        f"aborted after {sum(r.num_output_tokens for r in aborted) / len(aborted):.1f} tokens on average"
    )

    # and it still serves
    r = httpx.post(url, json={"prompt": "Once upon a time", "max_tokens": 8}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_non_streaming_client_that_gives_up_is_aborted(server):
    engine = server.app.state.llm.engine
    before = len(engine.request_records)
    body = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
    wait_until_idle(engine)
    (record,) = list(engine.request_records)[before:]
    assert record.finish_reason == "abort" and record.num_output_tokens < 1000
