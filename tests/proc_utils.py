"""Helpers for tests that start servers in a process group of their own."""

from __future__ import annotations

import os
import signal
import subprocess


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
