"""Helpers for tests that start servers in a process group of their own."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (servers and kernels shut down cleanly), SIGKILL if it lingers, and wait,
    so no server outlives its test."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_until_answering(url: str, process: subprocess.Popen, timeout_s: float, name: str,
                         log_tail: Callable[[], str]) -> None:
    """Poll ``url`` until it answers 200; raise with the server's log when ``process`` exits first or
    ``timeout_s`` passes (a server that never comes up must fail a test, not hang it)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log_tail()}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{name} did not answer within {timeout_s} s:\n{log_tail()}")
