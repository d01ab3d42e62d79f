"""Helpers for tests that start servers in a process group of their own."""

from __future__ import annotations

import itertools
import os
import signal
import socket
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


# Under pytest-xdist several workers start servers at once. A port the OS hands out (bind to port 0) is
# free only until it is closed again: before the server binds it, another worker's server, or any outgoing
# connection (both draw from the same ephemeral range), can take it. CI saw JupyterHub die with "Address
# already in use" that way. So each worker draws from a block of its own below Linux's ephemeral range
# (32768-60999 by default, /proc/sys/net/ipv4/ip_local_port_range), which neither the OS nor another worker
# hands out. A counter moves on after each port, so a server's successor never meets its TIME_WAIT.
PORT_BLOCKS_START, PORT_BLOCK_SIZE, PORT_BLOCKS = 20000, 500, 24
_ports_drawn = itertools.count()


def free_port() -> int:
    """A port no other test process draws, that nothing holds right now."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = PORT_BLOCKS_START + (int(worker) if worker.isdigit() else 0) % PORT_BLOCKS * PORT_BLOCK_SIZE
    for _ in range(PORT_BLOCK_SIZE):
        port = first + next(_ports_drawn) % PORT_BLOCK_SIZE
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # held (another pytest session on this machine, or a server still closing)
        return port
    raise RuntimeError(f"no free port in {first}-{first + PORT_BLOCK_SIZE - 1}")
