"""Lab 3's black-box checks: real clients against a learner's server, compared with the reference server.

Each check is one idea (one graded cell) and raises ``AssertionError`` with a message that says what a
client saw. Nothing here knows an answer: expected texts come from the reference server
(``minengine.server``, started beside the learner's by ``server_grader``) on the same machine, for
prompts the test cell passes in; timings come from the engine's own records. Servers are
``server_grader.ServerProcess`` objects; every request has a short timeout, so a hanging server fails a
check instead of stalling the grading.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from minengine.course.server_grader import SMOL, TINY, ServerProcess

TIMEOUT = httpx.Timeout(20.0, connect=5.0)
RECORDS_SEEN = 200  # the engine's most recent finished requests a timing check compares before and after


@dataclass
class Stream:
    """One SSE response as a client read it: events (data payloads) and when each one arrived."""

    status: int
    content_type: str
    events: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds after the request was sent
    body: bytes = b""

    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.events if e != "[DONE]"]


def read_sse(srv: ServerProcess, model: str, path: str, body: dict[str, Any],
             timeout: httpx.Timeout = TIMEOUT) -> Stream:
    """POST ``body`` to ``path`` and read the reply as server-sent events, strictly: UTF-8, ``data:``
    lines, blank lines."""
    client = srv.http(model, timeout=timeout)
    start = time.perf_counter()
    with client, client.stream("POST", path, json=body) as r:
        s = Stream(r.status_code, r.headers.get("content-type", ""))
        buffer = b""
        for piece in r.iter_raw():
            now = time.perf_counter() - start
            s.body += piece
            buffer += piece.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                data = _event_data(block)
                if data is not None:
                    s.events.append(data)
                    s.times.append(now)
        if r.status_code == 200 and buffer.strip():
            raise AssertionError("the stream ended in the middle of an event (no blank line after it): "
                                 f"{buffer[:80]!r}")
    return s


def _event_data(block: bytes) -> str | None:
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AssertionError(f"an SSE event is not valid UTF-8 ({e}): {block[:80]!r}") from None
    lines = [ln for ln in text.split("\n") if ln and not ln.startswith(":")]  # ':' starts a comment (ping)
    if not lines:
        return None
    if not all(ln.startswith("data:") for ln in lines):
        raise AssertionError("every SSE event line should start with 'data: ' (then a blank line): "
                             f"{text[:120]!r}")
    return "\n".join(ln[5:].removeprefix(" ") for ln in lines)


def _sdk(what: str, create: Callable[..., Any], kw: dict[str, Any], stream: bool = False) -> Any:
    """One openai SDK call; whatever goes wrong (an HTTP error, a timeout, a body that is not what the SDK
    expects) becomes an AssertionError that says what a client saw."""
    try:
        out = create(**kw, stream=True) if stream else create(**kw)
        if stream:
            out = list(out)
    except Exception as e:  # openai.APIStatusError, APITimeoutError, a JSON error, ...
        raise AssertionError(f"{what}: the openai SDK failed: {type(e).__name__}: {str(e)[:200]}") from None
    if not stream and not hasattr(out, "choices"):
        raise AssertionError(f"{what}: the SDK got {type(out).__name__} {str(out)[:80]!r}, not a completion: "
                             "without stream, the answer is one JSON body")
    return out


def _short(text: str, n: int = 70) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def _same_text(what: str, got: str, want: str) -> None:
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                  min(len(got), len(want)))
        raise AssertionError(f"{what}: your server's text differs from the reference's at character {at}: "
                             f"yours {_short(got[max(0, at - 20):])}, the reference "
                             f"{_short(want[max(0, at - 20):])}")


def _messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


# ----------------------------------------------------------------------------------------- the SDK
def check_completions(srv: ServerProcess, ref: ServerProcess, prompts: list[str],
                      max_tokens: int = 24) -> None:
    """The official openai SDK on /v1/completions, streaming and not: the reference's greedy text."""
    mine, theirs = srv.openai(TINY), ref.openai(TINY)
    for prompt in prompts:
        kw = {"model": TINY, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        what = f"completions.create(prompt={_short(prompt, 40)})"
        want = theirs.completions.create(**kw)
        got = _sdk(what, mine.completions.create, kw)
        _same_text(what, got.choices[0].text, want.choices[0].text)
        assert got.choices[0].finish_reason == want.choices[0].finish_reason, \
            (f"{what}: finish_reason {got.choices[0].finish_reason!r}, the reference says "
             f"{want.choices[0].finish_reason!r}")
        assert got.usage is not None and (got.usage.prompt_tokens, got.usage.completion_tokens) == \
            (want.usage.prompt_tokens, want.usage.completion_tokens), \
            f"{what}: usage {got.usage}, expected {want.usage}"
        chunks = _sdk(f"{what} with stream=True", mine.completions.create, kw, stream=True)
        _same_text(f"{what} with stream=True", "".join(c.choices[0].text for c in chunks if c.choices),
                   want.choices[0].text)
        assert len(chunks) > 1, (f"{what} with stream=True: one chunk only; send each new piece of text as "
                                 "it comes")
        ends = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert ends == [want.choices[0].finish_reason], f"{what} with stream=True: finish_reasons {ends}"


def check_chat(srv: ServerProcess, ref: ServerProcess, prompts: list[str], max_tokens: int = 24,
               model: str = TINY) -> None:
    """The official openai SDK on /v1/chat/completions, streaming and not: the reference's greedy text."""
    mine, theirs = srv.openai(model), ref.openai(model)
    for prompt in prompts:
        kw = {"model": model, "messages": _messages(prompt), "max_tokens": max_tokens, "temperature": 0}
        what = f"chat.completions.create(user: {_short(prompt, 40)})"
        want = theirs.chat.completions.create(**kw).choices[0]
        got = _sdk(what, mine.chat.completions.create, kw).choices[0]
        assert got.message.role == "assistant", f"{what}: the message's role is {got.message.role!r}"
        _same_text(what, got.message.content or "", want.message.content or "")
        assert got.finish_reason == want.finish_reason, f"{what}: finish_reason {got.finish_reason!r}"
        chunks = _sdk(f"{what} with stream=True", mine.chat.completions.create, kw, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        _same_text(f"{what} with stream=True", text, want.message.content or "")
        assert len(chunks) > 1, (f"{what} with stream=True: one chunk only; send each new piece of text as "
                                 "it comes")


# ---------------------------------------------------------------------------------------- the wire
def check_sse_framing(srv: ServerProcess, prompt: str, max_tokens: int = 16) -> None:
    """Raw SSE, read byte by byte: data: events, the role first, deltas, one finish_reason, usage, [DONE]."""
    for path, chat in (("/v1/chat/completions", True), ("/v1/completions", False)):
        body: dict[str, Any] = {"model": TINY, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                                "stream_options": {"include_usage": True}}
        body.update({"messages": _messages(prompt)} if chat else {"prompt": prompt})
        s = read_sse(srv, TINY, path, body)
        what = f"POST {path} with stream true"
        assert s.status == 200, f"{what}: HTTP {s.status}: {s.body[:200]!r}"
        assert s.content_type.startswith("text/event-stream"), f"{what}: Content-Type {s.content_type!r}, " \
            "expected text/event-stream"
        assert s.events and s.events[-1] == "[DONE]", f"{what}: the stream must end with 'data: [DONE]'; " \
            f"its last event was {_short(s.events[-1] if s.events else '(none)')}"
        assert s.events.count("[DONE]") == 1, f"{what}: [DONE] more than once"
        try:
            chunks = s.chunks()
        except ValueError as e:
            raise AssertionError(f"{what}: an event's data is not JSON ({e})") from None
        *content, last = chunks
        assert last.get("choices") == [] and isinstance(last.get("usage"), dict), \
            f"{what}: with stream_options.include_usage the last chunk before [DONE] has choices [] and " \
            f"usage; got {_short(json.dumps(last), 120)}"
        kind = "chat.completion.chunk" if chat else "text_completion"
        assert all(c.get("object") == kind and len(c.get("choices", [])) == 1 for c in content), \
            f"{what}: every chunk has object {kind!r} and one choice"
        assert len(content) >= 2, f"{what}: {len(content)} content chunk(s); a stream sends text as it comes"
        ends = [c["choices"][0].get("finish_reason") for c in content]
        assert ends[-1] in ("stop", "length") and not any(ends[:-1]), \
            f"{what}: finish_reason must be null until the last choice chunk, then 'stop' or 'length': {ends}"
        if chat:
            deltas = [c["choices"][0].get("delta", {}) for c in content]
            assert deltas[0].get("role") == "assistant", f"{what}: the first delta carries role 'assistant'"
            assert not any("role" in d for d in deltas[1:]), f"{what}: only the first delta carries the role"
            pieces = [d.get("content") or "" for d in deltas]
        else:
            pieces = [c["choices"][0].get("text", "") for c in content]
        usage = last["usage"]
        assert usage.get("completion_tokens", 0) >= sum(1 for p in pieces if p), \
            f"{what}: usage.completion_tokens {usage.get('completion_tokens')} for {len(pieces)} pieces"
        assert usage.get("total_tokens") == (usage.get("prompt_tokens", 0)
                                             + usage.get("completion_tokens", 0)), \
            f"{what}: usage.total_tokens is prompt_tokens + completion_tokens"
        assert len({c.get("id") for c in chunks}) == 1, f"{what}: every chunk of one stream has the same id"


def check_utf8(srv: ServerProcess, ref: ServerProcess, prompts: list[str], max_tokens: int = 8) -> None:
    """SmolLM2 (byte-level BPE): characters whose bytes span several tokens arrive whole, streamed and not."""
    mine, theirs = srv.openai(SMOL), ref.openai(SMOL)
    for prompt in prompts:
        kw = {"model": SMOL, "messages": _messages(prompt), "max_tokens": max_tokens, "temperature": 0}
        want = theirs.chat.completions.create(**kw).choices[0].message.content or ""
        what = f"SmolLM2, user: {_short(prompt, 40)}"
        _same_text(what, _sdk(what, mine.chat.completions.create, kw).choices[0].message.content or "", want)
        s = read_sse(srv, SMOL, "/v1/chat/completions", {**kw, "stream": True})  # strict UTF-8 per event
        assert s.status == 200, f"{what}, streamed: HTTP {s.status}"
        text = "".join((c["choices"][0].get("delta") or {}).get("content") or ""
                       for c in s.chunks() if c.get("choices"))
        if text.count("\ufffd") > want.count("\ufffd"):
            raise AssertionError(f"{what}, streamed: {_short(text)} holds U+FFFD replacement characters "
                                 f"where the reference has {_short(want)}: a character was sent before all "
                                 "its bytes had been generated. Send the engine's delta_text, which holds "
                                 "them back")
        _same_text(f"{what}, streamed", text, want)


# ------------------------------------------------------------------------------------------ timing
def check_no_buffering(srv: ServerProcess, prompt: str, max_tokens: int = 24, delay: float = 0.05) -> None:
    """With every engine step slowed by ``delay``, text arrives as it is made, not all at the end."""
    srv.control("delay", seconds=delay)
    try:
        s = read_sse(srv, TINY, "/v1/completions",
                     {"model": TINY, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                      "stream": True})
    finally:
        srv.control("delay", seconds=0)
    times = [t for t, c in zip(s.times, s.events, strict=True) if c != "[DONE]" and _has_text(c)]
    assert len(times) >= 8, f"only {len(times)} chunks with text came for {max_tokens} tokens"
    first, last = times[0], times[-1]
    assert first < 0.5 * last and last - first >= 0.5 * delay * (len(times) - 1), \
        (f"the first text arrived {first:.2f} s after the request and the last at {last:.2f} s, with the "
         f"engine spending {delay * 1000:.0f} ms per token: the response is held back (buffered) instead of "
         "streamed")


def _has_text(event: str) -> bool:
    try:
        choice = (json.loads(event).get("choices") or [{}])[0]
    except ValueError:
        return False
    return bool(choice.get("text") or (choice.get("delta") or {}).get("content"))


def check_concurrency(srv: ServerProcess, ref: ServerProcess, prompts: list[str],
                      max_tokens: int = 16) -> None:
    """Many streams at once all complete, each with its own greedy text."""
    async def one(client: httpx.AsyncClient, prompt: str, stream: bool) -> str:
        body = {"model": TINY, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        if not stream:
            return (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        text = ""
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    text += json.loads(line[5:])["choices"][0].get("text", "")
        return text

    async def run(proc: ServerProcess, stream: bool) -> list[str | BaseException]:
        limits = httpx.Limits(max_connections=len(prompts) + 4)
        async with proc.async_http(TINY, httpx.Timeout(60.0, connect=10.0), limits) as client:
            return await asyncio.gather(*(one(client, p, stream) for p in prompts), return_exceptions=True)

    want = _in_thread(run(ref, False))
    got = _in_thread(run(srv, True))
    failed = [(p, g) for p, g in zip(prompts, got, strict=True) if isinstance(g, BaseException)]
    assert not failed, f"{len(failed)} of {len(prompts)} concurrent streams failed, e.g. {failed[0][1]!r}"
    for p, g, w in zip(prompts, got, want, strict=True):
        _same_text(f"one of {len(prompts)} concurrent streams ({_short(p, 30)})", g, w)  # type: ignore[arg-type]


def _in_thread(coro: Any) -> Any:
    """asyncio.run on a thread of its own: a Jupyter kernel's main thread already runs an event loop."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def check_disconnect(srv: ServerProcess, prompt: str, max_tokens: int = 400, delay: float = 0.05,
                     within: float = 1.0) -> None:
    """A client that leaves mid-stream: within ``within`` s the engine has aborted it and freed its blocks."""
    deadline = time.monotonic() + 10  # requests an earlier check left behind finish first
    while srv.control("state")["unfinished"] and time.monotonic() < deadline:
        time.sleep(0.05)
    srv.control("delay", seconds=delay)
    try:
        body = {"model": TINY, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        with srv.http(TINY, timeout=TIMEOUT) as client:
            with client.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200, f"HTTP {r.status_code}"
                deadline = time.monotonic() + 10
                while srv.control("state")["unfinished"] == 0:  # the request reached the engine
                    assert time.monotonic() < deadline, "the request never reached the engine (AsyncLLM)"
                    time.sleep(0.02)
                time.sleep(0.2)
            left = time.monotonic()  # the with-block closed the connection: the client is gone
        while True:
            state = srv.control("state")
            if state["unfinished"] == 0 and state["used_blocks"] == 0:
                break
            if time.monotonic() - left > within:
                raise AssertionError(f"{within:g} s after the client disconnected the engine still runs "
                                     f"{state['unfinished']} request(s) holding {state['used_blocks']} KV "
                                     "block(s): a disconnect must abort the request")
            time.sleep(0.02)
    finally:
        srv.control("delay", seconds=0)
    last = srv.control("records", last=1)[-1]
    assert last["finish_reason"] == "abort", \
        (f"the request ended with {last['finish_reason']!r} after {last['num_output_tokens']} tokens, not "
         "aborted")


# -------------------------------------------------------------------------------------------- errors
def check_bad_input(srv: ServerProcess, cases: list[dict[str, Any]]) -> None:
    """Each case ({"path", "body" or "raw", "why"}) gets a 4xx OpenAI error body quickly, never a 500."""
    with srv.http(TINY, timeout=httpx.Timeout(8.0, connect=5.0)) as client:
        for case in cases:
            what = f"POST {case['path']} with {case['why']}"
            try:
                if "raw" in case:
                    r = client.post(case["path"], content=case["raw"].encode(),
                                    headers={"content-type": "application/json"})
                else:
                    r = client.post(case["path"], json=case["body"])
            except httpx.TimeoutException:
                raise AssertionError(f"{what}: no answer within 8 s; a bad request must be refused "
                                     "at once") from None
            assert 400 <= r.status_code < 500, (f"{what}: HTTP {r.status_code}, expected a 4xx error: "
                                                f"{r.text[:150]}")
            try:
                error = r.json()["error"]
                assert (isinstance(error["message"], str) and error["message"]
                        and isinstance(error["type"], str))
                assert "param" in error and "code" in error
            except Exception:
                raise AssertionError(f"{what}: HTTP {r.status_code}, but the body is not an OpenAI error "
                                     '{"error": {"message", "type", "param", "code"}}: '
                                     f"{r.text[:150]}") from None


# ------------------------------------------------------------------------------------- the KV budget
def check_kv_budget(srv: ServerProcess, ref: ServerProcess, prompt: str, blocks: int) -> None:
    """The class's KV budget per request, on both endpoints: a request whose prompt and ``max_tokens``
    fill exactly ``blocks`` KV blocks is served; one token more is refused at once, a 400 naming
    ``max_tokens``. Prompt lengths and the block size come from the reference (the same engine)."""
    block_size = int(ref.control("state")["block_size"])
    for path, chat in (("/v1/completions", False), ("/v1/chat/completions", True)):
        body: dict[str, Any] = {"model": TINY, "temperature": 0}
        body.update({"messages": _messages(prompt)} if chat else {"prompt": prompt})
        with ref.http(TINY, timeout=TIMEOUT) as client:
            prompt_tokens = client.post(path, json={**body, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
        fits = blocks * block_size - prompt_tokens
        what = (f"POST {path} ({prompt_tokens} prompt tokens, a budget of {blocks} blocks of {block_size} "
                "tokens)")
        with srv.http(TINY, timeout=httpx.Timeout(8.0, connect=5.0)) as client:
            try:
                over = client.post(path, json={**body, "max_tokens": fits + 1})
            except httpx.TimeoutException:
                raise AssertionError(f"{what} with max_tokens {fits + 1}: no answer within 8 s; a request "
                                     "over the budget is refused before it reaches the engine") from None
            assert over.status_code == 400, \
                (f"{what} with max_tokens {fits + 1}: HTTP {over.status_code}, expected 400: the request "
                 f"needs {blocks + 1} blocks at its longest, one more than this class's budget")
            try:
                param = over.json()["error"]["param"]
            except Exception:
                raise AssertionError(f"{what}: the 400 has no OpenAI error body: {over.text[:150]}") from None
            assert param == "max_tokens", f"{what}: the error's param is {param!r}, expected 'max_tokens'"
            with client.stream("POST", path, json={**body, "max_tokens": fits, "stream": True}) as r:
                if r.status_code != 200:
                    r.read()
                    raise AssertionError(f"{what} with max_tokens {fits}: HTTP {r.status_code}, expected "
                                         f"the stream: it fills exactly {blocks} blocks, which the budget "
                                         f"allows: {r.text[:150]}")
                next(r.iter_raw(), None)  # the stream started; leaving now aborts the request


# -------------------------------------------------------------------------------------- the client
def _finished_ids(ref: ServerProcess) -> set[str]:
    """The requests the engine has finished so far, after one small request that warms the server up: a
    server's first request pays one-time costs (FastAPI's and the tokenizer's first calls) before the
    engine sees it, which the learner's client would count and the engine's records would not."""
    with ref.http(TINY, timeout=TIMEOUT) as client:
        client.post("/v1/completions", json={"model": TINY, "prompt": "Once", "max_tokens": 2,
                                             "temperature": 0}).raise_for_status()
    return {r["request_id"] for r in ref.control("records", last=RECORDS_SEEN)}


def _new_records(ref: ServerProcess, before: set[str], expected: int, name: str) -> list[dict[str, Any]]:
    """The engine's records of the requests the learner's client sent (those that finished since
    ``before``): exactly ``expected`` of them, or the client did not measure what it was asked to."""
    deadline = time.monotonic() + 2.0  # a stream's last bytes can reach the client before the record
    while True:
        new = [r for r in ref.control("records", last=RECORDS_SEEN) if r["request_id"] not in before]
        if len(new) >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(new) == expected, \
        (f"{len(new)} request(s) reached the server's engine while your {name} ran, where it was asked for "
         f"{expected}: each measured stream is one request to the URL it is given (base_url)")
    return new


def check_client(measure: Callable[..., Any], ref: ServerProcess, prompt: str, max_tokens: int = 16,
                 delay: float = 0.05, ttft_tolerance: float = 0.25, itl_tolerance: float = 0.2) -> None:
    """The learner's client against the reference server (steps slowed by ``delay``): its TTFT and ITLs
    agree with the engine's own records (TTFT within ``ttft_tolerance`` s, mean ITL within
    ``itl_tolerance`` relative + 5 ms, as many gaps as the engine's, give or take one)."""
    url, before = ref.client_url(TINY), _finished_ids(ref)
    ref.control("delay", seconds=delay)
    try:
        got = measure(url, TINY, prompt, max_tokens)
    finally:
        ref.control("delay", seconds=0)
    assert isinstance(got, dict) and "ttft_s" in got and "itl_s" in got, \
        f"measure_stream should return a dict with 'ttft_s' and 'itl_s', got {got!r:.100}"
    ttft, itl = got["ttft_s"], list(got["itl_s"])
    (rec,) = _new_records(ref, before, 1, "measure_stream")
    times = rec["token_times"]
    server_ttft = times[0] - rec["arrival_time"]
    server_itl = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert isinstance(ttft, (int, float)) and server_ttft - 0.005 <= ttft <= server_ttft + ttft_tolerance, \
        (f"your TTFT is {ttft!r} s, the engine's {server_ttft:.3f} s (the client's can only be a little "
         f"longer: it includes the trip to the server). Time the first chunk with text, not the whole answer")
    assert abs(len(itl) - len(server_itl)) <= 1, \
        (f"{len(itl)} inter-token gaps, but the engine made {len(server_itl) + 1} tokens ({len(server_itl)} "
         "gaps)")
    mean, server_mean = sum(itl) / max(1, len(itl)), sum(server_itl) / max(1, len(server_itl))
    assert abs(mean - server_mean) <= itl_tolerance * server_mean + 0.005, \
        f"your mean ITL is {mean * 1000:.1f} ms, the engine's {server_mean * 1000:.1f} ms"


def mean_itl_disagrees(client_ttfts: list[float], server_ttfts: list[float], gaps: list[float],
                       server_gaps: list[float], itl_tolerance: float) -> str | None:
    """Why a load client's mean inter-token gap does not match the engine's records, or None when it does:
    within ``itl_tolerance`` relative + 5 ms. A first token that reaches a busy client late shortens the
    span its later gaps add up to, so the client's mean may also sit lower by the streams' total
    first-token lateness spread over all the gaps (seen on a loaded 2-core grader: TTFTs late, a mean ITL
    of 46 ms against the engine's 66 ms)."""
    mean, server_mean = sum(gaps) / max(1, len(gaps)), sum(server_gaps) / max(1, len(server_gaps))
    late = max(0.0, sum(client_ttfts) - sum(server_ttfts)) / max(1, len(gaps))
    slack = itl_tolerance * server_mean + 0.005
    if -(slack + late) <= mean - server_mean <= slack:
        return None
    return f"your mean ITL is {mean * 1000:.1f} ms, the engine's {server_mean * 1000:.1f} ms"


def check_load(measure_load: Callable[..., Any], ref: ServerProcess, prompts: list[str], max_tokens: int = 12,
               delay: float = 0.05, ttft_tolerance: float = 0.5, itl_tolerance: float = 0.2) -> None:
    """The learner's load client against the reference server (steps slowed by ``delay``): one result per
    prompt, in order; the requests really ran at the same time (every one reached the engine before the
    first finished); and, taken together, the TTFTs and ITLs agree with the engine's records of those
    requests (sorted TTFTs pairwise within ``ttft_tolerance`` s and never more than 5 ms early, mean ITL
    within ``itl_tolerance`` relative + 5 ms)."""
    url, before = ref.client_url(TINY), _finished_ids(ref)
    ref.control("delay", seconds=delay)
    try:
        got = measure_load(url, TINY, list(prompts), max_tokens)
    finally:
        ref.control("delay", seconds=0)
    assert isinstance(got, list) and len(got) == len(prompts), \
        f"measure_load should return one result per prompt ({len(prompts)}), got {got!r:.100}"
    for i, one in enumerate(got):
        assert isinstance(one, dict) and "ttft_s" in one and "itl_s" in one, \
            f"result {i} should be measure_stream's dict with 'ttft_s' and 'itl_s', got {one!r:.100}"
    records = _new_records(ref, before, len(prompts), "measure_load")
    arrivals = sorted(r["arrival_time"] for r in records)
    first_finish = min(r["token_times"][-1] for r in records)
    assert arrivals[-1] < first_finish, \
        (f"the engine received the last of the {len(prompts)} requests {arrivals[-1] - arrivals[0]:.2f} s "
         "after the first, when the first had already finished: they ran one after another, not at the same "
         "time. Start every stream before waiting for any of them (threads, or asyncio)")
    server_ttfts = sorted(r["token_times"][0] - r["arrival_time"] for r in records)
    client_ttfts = sorted(float(one["ttft_s"]) for one in got)
    for mine, engine in zip(client_ttfts, server_ttfts, strict=True):
        assert engine - 0.005 <= mine <= engine + ttft_tolerance, \
            (f"sorted, your TTFTs are {[round(t, 3) for t in client_ttfts]} s and the engine's "
             f"{[round(t, 3) for t in server_ttfts]} s: each of yours may be longer (the trip to the "
             f"server, a busy client) by at most {ttft_tolerance} s, never shorter")
    server_gaps = [later - earlier for r in records
                   for earlier, later in zip(r["token_times"], r["token_times"][1:], strict=False)]
    gaps = [float(g) for one in got for g in one["itl_s"]]
    assert abs(len(gaps) - len(server_gaps)) <= len(prompts), \
        f"{len(gaps)} inter-token gaps in all, but the engine's records have {len(server_gaps)}"
    problem = mean_itl_disagrees(client_ttfts, server_ttfts, gaps, server_gaps, itl_tolerance)
    assert problem is None, problem
