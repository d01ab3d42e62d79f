"""Where a client's TTFT goes beyond the server's: ``minengine bench`` vs the server's own histogram.

    .venv/bin/python benchmarks/client_offset.py               # 60 sequential streams, keep-alive
    .venv/bin/python benchmarks/client_offset.py --smoke

Why: bench's client-side TTFT was seen ~10 ms above the server's own at light load (guidellm's ~5 ms).
The server stamps TTFT from *engine arrival* (after HTTP parsing, validation and tokenization) to the
first token, like vLLM; the client's clock runs from the send to the first content line it reads. This
splits the difference into its stages, on one machine, all on the system-wide monotonic clock
(``time.perf_counter`` is CLOCK_MONOTONIC on Linux, so the server process and the client agree):

- ``send -> handler``: connect (or reuse), send the request, uvicorn parses it (a middleware stamp);
- ``handler -> arrival``: FastAPI + pydantic validation, tokenizing, the engine's input processing;
- ``arrival -> first token``: what the server reports as TTFT (queue + prefill + sample);
- ``first token -> loop``: the engine thread hands the output to the asyncio loop (``observe`` runs);
- ``loop -> client``: SSE encoding, the socket, httpx reading and parsing the line.

The server runs in a subprocess (a launcher that adds the stamps; nothing in the package changes).
Requests are sent one at a time (light load), each with ``max_tokens`` 2, through bench's own
``stream_request``; with ``--new-connection`` every request opens a new TCP connection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

try:
    from benchmarks import common
except ImportError:  # run as a script
    import common  # type: ignore[no-redef]

from minengine.bench.client import build_payload, stream_request

LAUNCHER = textwrap.dedent('''
    import json, sys, time
    import uvicorn
    from minengine.server import create_app
    from minengine.server.metrics import ServerMetrics

    stages = {}
    original = ServerMetrics.observe

    def observe(self, out, stats):
        if stats.num_seen == 0 and out.record.token_times:
            r = out.record
            stages[out.request_id] = {"arrival": r.arrival_time, "first_token": r.token_times[0],
                                      "loop": time.perf_counter()}
        return original(self, out, stats)

    ServerMetrics.observe = observe
    app = create_app(model="tinystories-4m")
    handler_times = []

    @app.middleware("http")
    async def stamp(request, call_next):
        if request.url.path.startswith("/v1/completions"):
            handler_times.append(time.perf_counter())
        return await call_next(request)

    @app.get("/debug/stages")
    async def dump():
        return {"stages": stages, "handler": handler_times}

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _client(url: str, n: int, new_connection: bool) -> list[dict[str, float]]:
    out = []
    payload = build_payload("completions", "tinystories-4m", "Once upon a time", 2)
    shared = httpx.AsyncClient(timeout=30)
    try:
        for i in range(n + 3):  # 3 warm-ups, dropped
            client = httpx.AsyncClient(timeout=30) if new_connection else shared
            try:
                res = await stream_request(client, url + "/v1/completions", payload)
            finally:
                if new_connection:
                    await client.aclose()
            if res.error:
                raise RuntimeError(res.error)
            r = res.record
            if i >= 3:
                out.append({"id": r.request_id, "send": r.arrival_time, "client_first": r.token_times[0]})
            await asyncio.sleep(0.05)  # light load: the server is idle when each request arrives
    finally:
        await shared.aclose()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-requests", type=int, default=60)
    ap.add_argument("--new-connection", action="store_true", help="a new TCP connection per request")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    n = 5 if args.smoke else args.num_requests
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(LAUNCHER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, f.name, str(port)], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        client = asyncio.run(_client(url, n, args.new_connection))
        server = httpx.get(url + "/debug/stages").json()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(20)
        Path(f.name).unlink()
    handler = sorted(server["handler"])
    rows = []
    for c in client:
        s = server["stages"][c["id"]]
        # The handler stamp of this request: the last one at or before its engine arrival.
        h = max(t for t in handler if t <= s["arrival"])
        rows.append({
            "send -> handler": h - c["send"],
            "handler -> arrival": s["arrival"] - h,
            "arrival -> first token (server TTFT)": s["first_token"] - s["arrival"],
            "first token -> loop": s["loop"] - s["first_token"],
            "loop -> client": c["client_first"] - s["loop"],
            "client TTFT": c["client_first"] - c["send"],
        })
    medians = {k: float(np.median([r[k] for r in rows])) * 1e3 for k in rows[0]}
    offset = medians["client TTFT"] - medians["arrival -> first token (server TTFT)"]
    print(common.machine_line())
    print(f"{len(rows)} sequential streams, "
          f"{'new connection each' if args.new_connection else 'keep-alive'}; medians in ms")
    for k, v in medians.items():
        print(f"  {k:40s} {v:7.2f}")
    print(f"  {'client TTFT - server TTFT':40s} {offset:7.2f}")
    result = {"medians_ms": medians, "offset_ms": offset, "n": len(rows),
              "new_connection": args.new_connection}
    print(json.dumps(result))
    result["rows_ms"] = [{k: v * 1e3 for k, v in r.items()} for r in rows]  # per request, for the tests
    return result


if __name__ == "__main__":
    main()
