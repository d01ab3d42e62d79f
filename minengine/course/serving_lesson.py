"""Lesson 08's client side: the raw SSE stream, TTFT as a client sees it, ``/metrics`` read back, a
disconnect and its clean-up, and the detokenizer holding back half a character.

Why a module: these are the few dozen lines every serving experiment repeats (stream a request and
stamp each chunk, scrape Prometheus text and subtract two scrapes, poll until the server is idle), and
they must work against any OpenAI-compatible server, not only ours: metric names take a prefix
(``minengine`` or ``vllm``), and nothing here imports the engine.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families


# ------------------------------------------------------------------------------------------ /metrics
def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text -> {(sample name, sorted labels): value} (histograms give _bucket/_sum/_count)."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return samples


def scrape(url: str, timeout: float = 10.0) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET ``url``/metrics and parse it."""
    response = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout)
    response.raise_for_status()
    return parse_metrics(response.text)


def metric(samples: dict, name: str, **labels: str) -> float:
    """Sum of every sample called ``name`` whose labels include ``labels`` (0 when there is none)."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def histogram_mean(before: dict, after: dict, name: str) -> tuple[int, float]:
    """(observations, mean) of histogram ``name`` between two scrapes: Δ_sum / Δ_count (exact, no buckets)."""
    count = metric(after, name + "_count") - metric(before, name + "_count")
    total = metric(after, name + "_sum") - metric(before, name + "_sum")
    return int(count), (total / count if count else float("nan"))


# ------------------------------------------------------------------------------------------ streams
@dataclass
class Streamed:
    """One streamed request as the client saw it; times are seconds after the request was sent."""

    lines: list[tuple[float, str]] = field(default_factory=list)  # every non-empty SSE line
    content_times: list[float] = field(default_factory=list)  # chunks that carried text
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    closed_at: float | None = None  # time.perf_counter() when the client closed the connection
    finished_at: float | None = None  # the chunk that carried finish_reason (the last token's, EOS or not)

    @property
    def ttft(self) -> float:
        return self.content_times[0] if self.content_times else float("nan")

    @property
    def e2e(self) -> float:
        return self.lines[-1][0] if self.lines else float("nan")

    @property
    def num_tokens(self) -> int:
        """Output tokens: the usage chunk's count when the server sent one, else the text chunks."""
        return int(self.usage["completion_tokens"]) if self.usage else len(self.content_times)

    @property
    def mean_itl(self) -> float:
        """Mean gap between output tokens as the client saw them: (last token - first) / (tokens - 1).

        Per token, not per chunk: a chunk may carry several tokens (a character split across tokens)
        or none (an end-of-text token), so counting chunks would disagree with the server's histogram.
        """
        last = self.finished_at if self.finished_at is not None else (self.content_times or [math.nan])[-1]
        return (last - self.ttft) / (self.num_tokens - 1) if self.num_tokens > 1 else math.nan


def _delta_text(chunk: dict[str, Any]) -> str:
    choice = (chunk.get("choices") or [{}])[0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


def stream(url: str, payload: dict[str, Any], endpoint: str = "/v1/completions",
           client: httpx.Client | None = None, stop_after: int | None = None,
           headers: dict[str, str] | None = None, hold_s: float = 0.0) -> Streamed:
    """POST ``payload`` with ``stream: true`` and stamp every SSE line as it arrives.

    ``stop_after``: close the connection after that many content chunks (a user closing the tab),
    ``hold_s`` seconds later (reading nothing meanwhile, so the server cannot know yet).
    """
    own = client is None
    client = client or httpx.Client(timeout=60.0)
    out = Streamed()
    try:
        start = time.perf_counter()
        with client.stream("POST", url.rstrip("/") + endpoint, json={**payload, "stream": True},
                           headers=headers) as response:
            if response.status_code != 200:
                response.read()
                raise RuntimeError(f"{response.status_code} from the server: {response.text[:300]}")
            for line in response.iter_lines():
                if not line:
                    continue
                now = time.perf_counter() - start
                out.lines.append((now, line))
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                text = _delta_text(chunk)
                if text:
                    out.content_times.append(now)
                    out.text += text
                choice = (chunk.get("choices") or [{}])[0]
                if choice.get("finish_reason"):
                    out.finish_reason, out.finished_at = choice["finish_reason"], now
                out.usage = chunk.get("usage") or out.usage
                if stop_after is not None and len(out.content_times) >= stop_after:
                    time.sleep(hold_s)
                    break  # leaving the with-block closes the connection mid-stream
        out.closed_at = time.perf_counter()
    finally:
        if own:
            client.close()
    return out


def read_chat_stream(chunks: Iterable[Any], start: float, echo: bool = False) -> Streamed:
    """Read a chat stream from the official ``openai`` SDK, stamping every chunk as it arrives.

    ``chunks`` is what ``client.chat.completions.create(..., stream=True)`` returns and ``start`` the
    ``time.perf_counter()`` taken just before that call (the SDK sends the request inside it, so the
    clock must start first). ``echo`` prints each piece of text the moment it arrives, so the reader
    watches the answer being written. Nothing here imports ``openai``: any object with the SDK's
    ``choices[0].delta.content`` / ``finish_reason`` / ``usage`` attributes will do.
    """
    out = Streamed()
    for chunk in chunks:
        now = time.perf_counter() - start
        dump = chunk.model_dump_json() if hasattr(chunk, "model_dump_json") else str(chunk)
        out.lines.append((now, dump))
        if getattr(chunk, "usage", None) is not None:
            usage = chunk.usage
            out.usage = usage.model_dump() if hasattr(usage, "model_dump") else dict(usage)
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        piece = choice.delta.content if choice.delta is not None else None
        if piece:
            out.content_times.append(now)
            out.text += piece
            if echo:
                print(piece, end="", flush=True)
        if choice.finish_reason:
            out.finish_reason, out.finished_at = choice.finish_reason, now
    if echo:
        print()
    return out


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> float:
    """Poll ``predicate`` until it is true; returns the seconds it took (raises TimeoutError)."""
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"the condition did not become true within {timeout:g} s")
        time.sleep(interval)
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------ UTF-8
@dataclass(frozen=True)
class DetokStep:
    token_id: int
    alone: str  # the token decoded on its own (what a naive streamer would print)
    emitted: str  # what the incremental detokenizer let out after this token


def detokenize_steps(tokenizer: Any, text: str, context: str = "") -> list[DetokStep]:
    """Feed ``text``'s tokens one by one to the engine's ``IncrementalDetokenizer`` (after ``context``
    as the prompt) and record, per token, its lone decoding next to what the detokenizer emitted."""
    from minengine.engine.detokenizer import IncrementalDetokenizer

    prompt = list(tokenizer.encode(context)) if context else []
    detok = IncrementalDetokenizer(tokenizer, prompt)
    steps = []
    ids = list(tokenizer.encode(text))
    for i, token in enumerate(ids):
        detok.update([token])
        steps.append(DetokStep(token, tokenizer.decode([token]), detok.get_delta(i == len(ids) - 1)))
    return steps
