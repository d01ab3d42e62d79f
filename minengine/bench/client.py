"""Load-test any OpenAI-compatible server (minengine, vLLM, SGLang) the way ``vllm bench serve`` does.

Open loop: requests are *sent on a schedule* (Poisson arrivals, or Gamma with ``burstiness``), whether
or not earlier ones have finished, as real users do; a closed loop (the next request after the previous
answer) hides queueing, the very thing a load test is for. ``max_concurrency`` caps requests in flight.
Gaps are Gamma(shape = burstiness, scale = 1 / (rate * burstiness)): mean 1/rate for any burstiness,
burstiness 1 is Poisson, < 1 burstier, > 1 more regular; rate inf sends everything at once.

Each request streams (SSE) and is written down as a ``RequestRecord``: ``arrival_time`` = when it was
sent, ``token_times`` = when each chunk *with content* arrived (the chat role and the usage chunk carry
no token), ``num_output_tokens`` / ``num_prompt_tokens`` from the server's usage chunk. So the summary is
``minengine.metrics.summarize`` -- TTFT, TPOT, ITL, E2E exactly as for the engine's own records, measured
from the client side of the wire.

    summary = await run_benchmark("http://127.0.0.1:8000", num_prompts=50, request_rate=4)  # notebooks
    summary = benchmark("http://127.0.0.1:8000", num_prompts=50, request_rate=4)            # scripts
    print(summary.format_table())
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from minengine.bench.datasets import SampleRequest, random_requests
from minengine.core.records import RequestRecord
from minengine.metrics.stats import RunSummary, parse_slo, summarize
from minengine.sim.workload import arrival_times

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class BenchmarkSummary(RunSummary):
    """A ``RunSummary`` plus what only a client knows: failed requests and the run's settings."""

    errors: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how the client adapted to this server (read them)

    def rows(self) -> list[tuple[str, str]]:
        rows = super().rows()
        rows.insert(1, ("Failed requests:", str(len(self.errors))))
        return rows


@dataclass
class StreamResult:
    record: RequestRecord
    text: str = ""
    error: str | None = None
    saw_done: bool = False  # the stream ended with ``data: [DONE]`` (some servers just close it)


# ---- one request ----
async def iter_sse_json(response: httpx.Response) -> AsyncIterator[tuple[float, dict[str, Any] | None]]:
    """(arrival time, parsed ``data:`` JSON) per event; ``None`` for ``[DONE]``. Comments (``:``) and other
    fields are skipped, as the SSE spec says."""
    async for line in response.aiter_lines():
        now = time.perf_counter()
        if not line.startswith("data:"):
            continue  # blank separators, ": ping" comments, event:/id:/retry: fields
        data = line[5:].strip()
        if data == "[DONE]":
            yield now, None
            return
        yield now, json.loads(data)


def chunk_text(chunk: dict[str, Any]) -> str:
    """The new text in a completions chunk (``text``) or chat chunk (``delta.content``)."""
    parts = []
    for choice in chunk.get("choices") or []:
        if "text" in choice:
            parts.append(choice.get("text") or "")
        else:
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


async def stream_request(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    request_id: str = "",
    num_prompt_tokens: int = 0,
    on_text: Callable[[str], None] | None = None,
) -> StreamResult:
    """POST a streaming request and time every content chunk; never raises for server or network errors."""
    record = RequestRecord(
        request_id=request_id, arrival_time=time.perf_counter(), num_prompt_tokens=num_prompt_tokens
    )
    result = StreamResult(record)
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {_error_message(await response.aread())}"
                return result
            async for now, chunk in iter_sse_json(response):
                if chunk is None:
                    result.saw_done = True
                    break
                if "error" in chunk:
                    result.error = f"error event: {_error_message(json.dumps(chunk).encode())}"
                    return result
                record.request_id = record.request_id or str(chunk.get("id", ""))
                text = chunk_text(chunk)
                if text:
                    record.token_times.append(now)
                    result.text += text
                    if on_text is not None:
                        on_text(text)
                for choice in chunk.get("choices") or []:
                    record.finish_reason = choice.get("finish_reason") or record.finish_reason
                if chunk.get("usage"):
                    record.num_prompt_tokens = chunk["usage"].get("prompt_tokens", record.num_prompt_tokens)
                    record.num_output_tokens = chunk["usage"].get("completion_tokens", 0)
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    finally:
        record.finish_time = time.perf_counter()
    # A stream that closes after a finish_reason is complete even without [DONE] (transformers serve
    # ends its streams so); one that closes with neither was cut off.
    if not result.saw_done and not record.finish_reason:
        result.error = "the stream ended without a finish_reason or data: [DONE]"
    else:
        record.finish_reason = record.finish_reason or "stop"
        record.num_output_tokens = record.num_output_tokens or len(record.token_times)
    return result


def build_payload(
    endpoint: str,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    ignore_eos: bool = False,
    temperature: float | None = 0.0,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A streaming request with usage; ``ignore_eos`` (a vLLM extension) only when asked."""
    payload: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    if temperature is not None:
        payload["temperature"] = temperature
    if ignore_eos:
        payload["ignore_eos"] = True
    payload.update(extra_body or {})
    return payload


# ---- a whole run ----
def arrival_offsets(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send times (s after the start): first at 0, then Gamma gaps of mean 1/rate (all 0 for rate inf).

    The same arrival process as the simulator's workloads, so a bench run and a simulation of it match.
    """
    return arrival_times(request_rate, n, burstiness, rng=seed)


async def run_benchmark(
    base_url: str = "http://127.0.0.1:8000",
    *,
    endpoint: str = "completions",
    model: str | None = None,
    requests: list[SampleRequest] | None = None,
    num_prompts: int = 100,
    input_len: int = 128,
    output_len: int = 64,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    tokenizer: Any = None,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    seed: int = 0,
    slo: dict[str, float] | str | None = None,
    ignore_eos: bool = False,
    temperature: float | None = 0.0,
    extra_body: dict[str, Any] | None = None,
    api_key: str | None = None,
    timeout: float = 600.0,
    warmup: bool = True,
    disable_tqdm: bool = False,
) -> BenchmarkSummary:
    """Run one benchmark and summarize it. ``requests`` default: the random dataset built from
    ``num_prompts`` / ``input_len`` / ``output_len`` / ``range_ratio`` / ``prefix_len`` with ``tokenizer``
    (default: the model's). ``slo``: {"ttft": ms, "tpot": ms, "e2e": ms} or "ttft:200,tpot:50"."""
    from tqdm.auto import tqdm

    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    arrival_offsets(0, request_rate, burstiness)  # check rate and burstiness before any network traffic
    slo = parse_slo(slo) if isinstance(slo, str) else slo
    base_url = normalize_base_url(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        if model is None:
            model = await first_model(client, base_url, headers)
        if requests is None:
            tok = tokenizer
            if tok is None or isinstance(tok, str):
                tok = _load_tokenizer(tok or model)
            requests = random_requests(tok, num_prompts, input_len, output_len, range_ratio, prefix_len, seed)
        url = base_url + ENDPOINTS[endpoint]

        def payload(r: SampleRequest, max_tokens: int | None = None) -> dict[str, Any]:
            return build_payload(
                endpoint,
                model,
                r.prompt,
                max_tokens or r.expected_output_len,
                ignore_eos=ignore_eos,
                temperature=temperature,
                extra_body=extra_body,
            )

        notes: list[str] = []
        if warmup and requests:  # fail fast on a wrong URL, model or key, before the clock starts
            first = await stream_request(client, url, payload(requests[0], 2), headers=headers)
            if first.error and ignore_eos and first.error.startswith("HTTP 4"):
                # ignore_eos is a vLLM extension: OpenAI and transformers serve reject unknown fields.
                ignore_eos = False
                first = await stream_request(client, url, payload(requests[0], 2), headers=headers)
                if not first.error:
                    notes.append(
                        "the server rejects ignore_eos, so requests were sent without it: outputs may stop "
                        "at an end-of-sequence token before their requested length"
                    )
            if first.error:
                raise RuntimeError(f"the test request to {url} failed: {first.error}")

        semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="requests", dynamic_ncols=True)

        async def one(r: SampleRequest) -> StreamResult:
            if semaphore is None:
                result = await stream_request(
                    client, url, payload(r), headers=headers, num_prompt_tokens=r.prompt_len
                )
            else:
                async with semaphore:  # the send time is stamped after the wait, as in vLLM
                    result = await stream_request(
                        client, url, payload(r), headers=headers, num_prompt_tokens=r.prompt_len
                    )
            bar.update(1)
            return result

        offsets = arrival_offsets(len(requests), request_rate, burstiness, seed)
        tasks: list[asyncio.Task[StreamResult]] = []
        start = time.perf_counter()
        try:
            for r, offset in zip(requests, offsets, strict=True):
                delay = start + float(offset) - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(r)))
            results = await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            bar.close()
        duration = time.perf_counter() - start

    records = [res.record for res in results]
    no_done = sum(1 for res in results if not res.error and not res.saw_done)
    if no_done:
        notes.append(f"{no_done} streams closed without data: [DONE]; counted complete (each had a "
                     "finish_reason)")
    base = summarize(records, duration=duration, slo=slo)
    config = {
        "base_url": base_url,
        "endpoint": endpoint,
        "model": model,
        "num_prompts": len(requests),
        "request_rate": request_rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "ignore_eos": ignore_eos,
        "temperature": temperature,
        "seed": seed,
    }
    errors = [res.error for res in results if res.error]
    return BenchmarkSummary(
        **{k: getattr(base, k) for k in base.__dataclass_fields__}, errors=errors, config=config, notes=notes
    )


def benchmark(*args: Any, **kwargs: Any) -> BenchmarkSummary:
    """``run_benchmark`` for synchronous code; inside a running event loop (Jupyter) it runs on a
    fresh loop in a worker thread, so it works there too (``await run_benchmark(...)`` is nicer)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_benchmark(*args, **kwargs))
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(run_benchmark(*args, **kwargs))).result()


def save_result(summary: BenchmarkSummary, path: str) -> None:
    """vLLM-style result JSON: the summary's keys plus per-request lists (ttfts, itls, lengths, errors)."""
    out = summary.to_dict()
    out["date"] = time.strftime("%Y%m%d-%H%M%S")
    out["input_lens"] = [r.num_prompt_tokens for r in summary.requests]
    out["output_lens"] = [r.num_output_tokens for r in summary.requests]
    out["ttfts"] = [r.ttft for r in summary.requests]
    out["itls"] = [r.itls for r in summary.requests]
    with open(path, "w") as f:
        json.dump(out, f, indent=2, default=str)
        f.write("\n")


async def first_model(client: httpx.AsyncClient, base_url: str, headers: dict[str, str]) -> str:
    """The first model id the server lists (what vLLM's client does when --model is not given)."""
    try:
        response = await client.get(base_url + "/v1/models", headers=headers)
    except httpx.HTTPError as e:
        raise RuntimeError(f"cannot reach {base_url}: {type(e).__name__}: {e}") from None
    if response.status_code != 200:
        raise RuntimeError(
            f"GET {base_url}/v1/models: HTTP {response.status_code}: {_error_message(response.content)}"
        )
    data = response.json().get("data") or []
    if not data:
        raise RuntimeError(f"{base_url}/v1/models lists no model; pass --model")
    return str(data[0]["id"])


def normalize_base_url(base_url: str) -> str:
    """Accept ``http://host:port``, ``.../`` or ``.../v1`` alike."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _load_tokenizer(name: str) -> Any:
    from minengine.models.loader import load_tokenizer

    try:
        return load_tokenizer(name)
    except Exception as e:
        raise ValueError(
            f"cannot load a tokenizer for {name!r} to build prompts ({e}); pass --tokenizer "
            "(a shipped model, HF folder or hub id)"
        ) from None


def _error_message(body: bytes) -> str:
    """The ``message`` of an OpenAI error body, else the raw text (shortened)."""
    try:
        error = json.loads(body).get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if error:
            return str(error)
    except (ValueError, AttributeError):
        pass
    return body.decode(errors="replace")[:300]
