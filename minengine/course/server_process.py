"""``minengine serve`` as a managed subprocess: started on a free local port, always stopped.

Why a subprocess and not ``minengine.server.ServerThread``: a lesson about serving should talk to a
real server over a real socket, the way ``curl`` or the ``openai`` SDK would, and a separate process
has its own engine, threads and event loop, so the client's measurements are not disturbed by a server
living in the notebook's own kernel. The price is that a process can outlive the notebook; this class
makes sure it does not:

- the server runs in a process group of its own, and ``stop`` sends SIGTERM to the whole group, then
  SIGKILL if it lingers, and waits, so no child survives;
- ``with ServerProcess(...) as server:`` stops it even when the block raises (or a cell is interrupted);
- an ``atexit`` hook and a ``weakref.finalize`` stop a server that was started without ``with`` when
  the kernel exits or the object is dropped;
- on Linux the server also gets SIGTERM if the process that started it dies without cleaning up
  (``PR_SET_PDEATHSIG``: a kernel killed with SIGKILL runs no ``atexit`` hook);
- it binds 127.0.0.1 only, on a port the OS reported free a moment before.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

LOCALHOST = "127.0.0.1"
_NANOBIND_NOISE = re.compile(r"nanobind: |\s+- (leaked |\.\.\. skipped)|See https://nanobind")
START_ATTEMPTS = 3  # fresh ports to try when the one we picked was taken before the server bound it


class ServerStartError(RuntimeError):
    """The server exited or did not answer ``/health`` in time; the message ends with its log."""


def free_port(host: str = LOCALHOST) -> int:
    """A port nobody listens on right now (the OS picks it; another program could take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = LOCALHOST) -> bool:
    """True if nothing accepts connections on ``host:port`` (used to check a server really went away)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) != 0


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM us when our parent dies (no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop_group(proc: subprocess.Popen, term_wait: float = 15.0) -> None:
    """SIGTERM the process group (uvicorn shuts down gracefully), SIGKILL if it lingers, then wait."""
    for sig, wait in ((signal.SIGTERM, term_wait), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # children left in the group (there should be none) get the same end
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(timeout=10)


class ServerProcess:
    """``minengine serve`` on ``127.0.0.1:<free port>``; ``with ServerProcess() as s: s.base_url``.

    ``model`` is what ``minengine serve --model`` takes (default: the shipped tiny model, for speed;
    None leaves the choice to ``minengine serve``, which prefers SmolLM2-135M when installed); ``args``
    are more command-line flags (e.g. ``["--num-blocks", "64", "--no-prefix-caching"]``). ``command`` replaces
    the whole command line (``{port}`` and ``{host}`` are filled in), to run another OpenAI-compatible
    server the same way.
    """

    def __init__(self, model: str | None = "tinystories-4m", *, args: Sequence[str] = (),
                 port: int | None = None, host: str = LOCALHOST, threads: int | None = 1,
                 log_level: str = "warning", startup_timeout: float = 120.0,
                 command: Sequence[str] | None = None, env: dict[str, str] | None = None) -> None:
        if startup_timeout <= 0:
            raise ValueError(f"startup_timeout must be > 0 seconds, got {startup_timeout}")
        self.model, self.args, self.host = model, list(args), host
        self.requested_port = port
        self.port: int | None = None
        self.threads, self.log_level = threads, log_level
        self.startup_timeout = startup_timeout
        self.command = list(command) if command is not None else None
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._log_path: Path | None = None
        self._finalizer: weakref.finalize | None = None
        self._log_finalizer: weakref.finalize | None = None
        self.startup_s: float | None = None  # seconds from start() to the first healthy answer

    # ---- addresses ----
    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the bench client's ``--base-url``."""
        if self.port is None:
            raise RuntimeError("the server has not been started")
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """``.../v1``: what the ``openai`` SDK's ``base_url`` wants."""
        return self.url + "/v1"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cmdline(self, port: int) -> list[str]:
        if self.command is not None:
            return [c.format(port=port, host=self.host) for c in self.command]
        cmd = [sys.executable, "-m", "minengine", "serve", "--host", self.host, "--port", str(port),
               "--log-level", self.log_level]
        if self.model is not None:
            cmd += ["--model", self.model]
        if self.threads:
            cmd += ["--threads", str(self.threads)]
        return cmd + self.args

    def log_text(self) -> str:
        """What the server printed so far (stdout and stderr together)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_text(errors="replace")

    # ---- life cycle ----
    def start(self) -> ServerProcess:
        if self.running:
            raise RuntimeError(f"already running (pid {self.pid}) at {self.url}")
        began = time.perf_counter()
        for attempt in range(1, START_ATTEMPTS + 1):
            # A port we picked ourselves can be taken between free_port() and the server's bind (another
            # program starting at the same moment): then pick again. A port the caller asked for is theirs.
            self.port = self.requested_port or free_port(self.host)
            self._launch()
            try:
                self._wait_ready()
                break
            except ServerStartError:
                taken = self.requested_port is None and "address already in use" in self.log_text().lower()
                if not taken or attempt == START_ATTEMPTS:
                    self.stop()  # the log stays for log_text()
                    raise
                self.close()
            except BaseException:
                self.stop()
                raise
        self.startup_s = time.perf_counter() - began
        return self

    def _launch(self) -> None:
        self._drop_log()  # a retry on a fresh port starts a fresh log
        fd, name = tempfile.mkstemp(prefix="minengine-serve-", suffix=".log")
        self._log_path = Path(name)
        # The log outlives stop() so log_text() can still read it, and goes with this object (or at exit):
        # a learner who restarts a server in a notebook all day leaves no files behind.
        self._log_finalizer = weakref.finalize(self, _remove_file, self._log_path)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(self.cmdline(self.port), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self._finalizer = weakref.finalize(self, _stop_group, self.proc)
        _LIVE.add(self)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        assert self.proc is not None
        while True:
            if self.proc.poll() is not None:
                raise ServerStartError(f"the server exited with code {self.proc.returncode} before it "
                                       f"answered /health; its log:\n{self._tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(f"the server did not answer {self.url}/health within "
                                       f"{self.startup_timeout:g} s; its log:\n{self._tail()}")
            time.sleep(0.1)

    def _tail(self, lines: int = 20) -> str:
        """The log's last lines, less the leak report Triton's bindings (nanobind) print when an interpreter
        exits early: it would push the real reason (a bad flag, a port in use) out of the message."""
        kept = [line for line in self.log_text().splitlines() if not _NANOBIND_NOISE.match(line)]
        return "\n".join(kept[-lines:]) or "(nothing)"

    def stop(self) -> None:
        """Stop the server and every process of its group; safe to call twice."""
        if self.proc is not None:
            _stop_group(self.proc)
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        _LIVE.discard(self)

    def close(self) -> None:
        """Stop and delete the log file now (it also goes when this object is dropped or Python exits)."""
        self.stop()
        self._drop_log()

    def _drop_log(self) -> None:
        if self._log_finalizer is not None:
            self._log_finalizer()  # deletes the file; a finalizer runs at most once
            self._log_finalizer = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {self.url} (pid {self.pid})" if self.running else "stopped"
        return f"ServerProcess({state})"


_LIVE: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


def _remove_file(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # a log we cannot delete is not worth an error at exit


@atexit.register
def stop_all() -> None:
    """Stop every server this process started and did not stop yet (runs at interpreter exit)."""
    for server in list(_LIVE):
        server.stop()
