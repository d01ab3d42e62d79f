"""Export a run as a Chrome trace (JSON), to open in https://ui.perfetto.dev or chrome://tracing.

Seeing requests and engine steps on one time axis shows what a table of percentiles hides: a long prefill
stalling every decode, requests waiting while the KV cache is full, a step spent mostly in Python.

Layout: process "engine" holds one track of steps (a span per step, split into schedule / prepare /
forward / sample) and counters for KV usage, batch tokens and running/waiting requests; process
"requests" holds one track per request (queue, prefill, decode spans and an instant per token).
Format: the Trace Event Format (complete "X", instant "i", counter "C" and metadata "M" events), with
times in microseconds from the earliest timestamp in the records.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minengine.core.records import RequestRecord, StepRecord

ENGINE_PID = 1
REQUESTS_PID = 2
PHASES = ("schedule", "prepare", "forward", "sample")


def to_chrome_trace(
    requests: list[RequestRecord],
    steps: list[StepRecord] | None = None,
    path: str | Path | None = None,
) -> dict[str, Any]:
    """Build the trace dict (and write it to ``path`` as JSON when given)."""
    steps = steps or []
    times = [r.arrival_time for r in requests] + [s.start for s in steps]
    t0 = min(times, default=0.0)

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 3)

    events: list[dict[str, Any]] = [
        _meta("process_name", ENGINE_PID, 0, name="engine"),
        _meta("process_sort_index", ENGINE_PID, 0, sort_index=0),
        _meta("thread_name", ENGINE_PID, 0, name="steps"),
        _meta("process_name", REQUESTS_PID, 0, name="requests"),
        _meta("process_sort_index", REQUESTS_PID, 0, sort_index=1),
    ]
    for s in steps:
        events += _step_events(s, us)
    for tid, r in enumerate(requests, start=1):
        events.append(_meta("thread_name", REQUESTS_PID, tid, name=f"request {r.request_id}"))
        events.append(_meta("thread_sort_index", REQUESTS_PID, tid, sort_index=tid))
        events += _request_events(r, tid, us)
    trace = {"traceEvents": events, "displayTimeUnit": "ms"}
    if path is not None:
        Path(path).write_text(json.dumps(trace))
    return trace


def _step_events(s: StepRecord, us: Callable[[float], float]) -> list[dict[str, Any]]:
    """One span for the step and, nested inside, back-to-back spans for its phases (clamped to fit)."""
    args = {
        "prefill_tokens": s.num_prefill_tokens,
        "decode_tokens": s.num_decode_tokens,
        "prefill_seqs": s.num_prefill_seqs,
        "decode_seqs": s.num_decode_seqs,
        "preempted": s.num_preempted,
    }
    events = [_span(f"step {s.step}", "step", us(s.start), us(s.end), ENGINE_PID, 0, args)]
    t = s.start
    for phase in PHASES:
        seconds = getattr(s, f"t_{phase}")
        if seconds <= 0:
            continue
        end = min(t + seconds, s.end)
        events.append(_span(phase, "phase", us(t), us(end), ENGINE_PID, 0))
        t = end
    ts = us(s.start)
    events += [
        _counter("KV cache usage (%)", ts, usage=round(100 * s.kv_usage, 3)),
        _counter("batch tokens", ts, prefill=s.num_prefill_tokens, decode=s.num_decode_tokens),
        _counter("requests", ts, running=s.num_running, waiting=s.num_waiting),
    ]
    return events


def _request_events(r: RequestRecord, tid: int, us: Callable[[float], float]) -> list[dict[str, Any]]:
    """Queue (arrival -> scheduled), prefill (scheduled -> first token), decode (first -> last token)."""
    end = r.token_times[-1] if r.token_times else r.finish_time
    args = {
        "request_id": r.request_id,
        "prompt_tokens": r.num_prompt_tokens,
        "output_tokens": r.num_output_tokens or len(r.token_times),
        "cached_tokens": r.num_cached_tokens,
        "preemptions": r.num_preemptions,
        "finish_reason": r.finish_reason,
    }
    events = []
    scheduled = r.first_scheduled_time
    queue_end = scheduled if scheduled is not None else end
    if queue_end is not None:
        events.append(_span("queue", "queue", us(r.arrival_time), us(queue_end), REQUESTS_PID, tid, args))
    first = r.first_token_time
    prefill_end = first if first is not None else end
    if scheduled is not None and prefill_end is not None:
        events.append(_span("prefill", "prefill", us(scheduled), us(prefill_end), REQUESTS_PID, tid))
    if first is not None and end is not None and end > first:
        events.append(_span("decode", "decode", us(first), us(end), REQUESTS_PID, tid))
    for i, t in enumerate(r.token_times):
        events.append(
            {
                "name": f"token {i}",
                "cat": "token",
                "ph": "i",
                "s": "t",
                "ts": us(t),
                "pid": REQUESTS_PID,
                "tid": tid,
            }
        )
    return events


def _span(
    name: str, cat: str, start: float, end: float, pid: int, tid: int, args: dict[str, Any] | None = None
) -> dict[str, Any]:
    event = {"name": name, "cat": cat, "ph": "X", "ts": start, "dur": max(0.0, end - start)}
    event |= {"pid": pid, "tid": tid}
    if args:
        event["args"] = args
    return event


def _counter(name: str, ts: float, **values: float) -> dict[str, Any]:
    return {"name": name, "ph": "C", "ts": ts, "pid": ENGINE_PID, "tid": 0, "args": values}


def _meta(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}
