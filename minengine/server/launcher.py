"""Run the app with uvicorn in a background thread: for notebooks (lab 3) and tests.

    from minengine.server import ServerThread, create_app
    with ServerThread(create_app(model="tinystories-4m")) as server:
        print(server.url)          # http://127.0.0.1:<free port>
        ...                        # use the openai SDK or minengine.bench against server.url

Port 0 (the default) lets the OS pick a free port, so several servers never race for one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class ServerThread:
    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        self.app = app
        config = uvicorn.Config(
            app, host=host, port=port, log_level=log_level, access_log=False, timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(config)
        self.host = host
        self.port = port
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL without ``/v1`` (the bench client's --base-url)."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerThread:
        self._thread = threading.Thread(target=self.server.run, name="minengine-uvicorn", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the server on {self.host}:{self.port} failed to start (see the log)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not start within {timeout} s")
            time.sleep(0.02)
        sockets = [s for srv in self.server.servers for s in srv.sockets]
        if sockets:
            self.port = sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
