"""What lab 3's grading relay adds to a client's TTFT: the same reference server, reached directly over
TCP and through the relay a student's kernel opens while autograding (a TCP port that forwards to the
server's Unix socket, ``server_grader.serve_relay``).

    .venv/bin/python benchmarks/lab3_relay.py
    .venv/bin/python benchmarks/lab3_relay.py --smoke

Why: while autograding, the student's client (parts 2 and 3) runs in their sandboxed kernel and the
reference server in the grader, so every byte between them crosses the relay, and the client checks
compare the client's TTFT with the engine's own. Reported per path: the median of (client TTFT - engine
TTFT), interleaved rounds of one streamed 16-token greedy completion on the shipped model.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from minengine.course import server_grader as sg

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/lab3_relay.py
    import common  # type: ignore[no-redef]


def client_minus_engine_ttft(url: str, ref: sg.ServerProcess) -> float:
    """One streamed completion from ``url``: the client's TTFT minus the engine's, in seconds."""
    body = {"model": sg.TINY, "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0,
            "stream": True}
    first = None
    with httpx.Client(timeout=30) as client:
        start = time.perf_counter()
        with client.stream("POST", url + "/v1/completions", json=body) as response:
            for line in response.iter_lines():
                if first is None and line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                    first = time.perf_counter() - start
    record = ref.control("records", last=1)[-1]
    assert first is not None, "no text came back"
    return first - (record["token_times"][0] - record["arrival_time"])


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="3 rounds: does it run")
    parser.add_argument("--json", default=None, help="save the results here")
    args = parser.parse_args(argv)
    rounds = 3 if args.smoke else args.rounds
    print(common.machine_line())
    folder = Path(tempfile.mkdtemp(prefix="lab3-relay-"))  # short: a Unix socket's path has <= 107 bytes
    ref = sg.ServerProcess(None, (sg.TINY,), public_dir=folder).start()  # TCP, and its bare app on a socket
    try:
        relay = sg.serve_relay(str(folder / sg.public_socket_name(sg.TINY)))
        paths = {"direct TCP": ref.url(), "through the relay": f"http://127.0.0.1:{relay}"}
        for url in paths.values():  # each path's first request pays one-time costs
            client_minus_engine_ttft(url, ref)
        timed = common.interleave({name: (lambda url=url: client_minus_engine_ttft(url, ref))
                                   for name, url in paths.items()}, rounds)
    finally:
        ref.stop()
        shutil.rmtree(folder, ignore_errors=True)
    rows = [{"path": name, "rounds": rounds, "median_extra_ms": 1e3 * timed[name].median} for name in paths]
    for row in rows:
        print(f"{row['path']:>18}: client TTFT - engine TTFT, median of {rounds}: "
              f"{row['median_extra_ms']:.2f} ms")
    common.save_json(args.json, {"rounds": rounds, "rows": rows})
    return rows


if __name__ == "__main__":
    sys.exit(main() and 0)
