"""The notebook's managed server: starts on a free local port, always stops (with-block, error, stop()
twice, dropped object), and a server that cannot start says why."""

from __future__ import annotations

import gc
import os
import sys

import httpx
import pytest

from minengine.course.server_process import ServerProcess, ServerStartError, free_port, port_is_free


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie that was not reaped yet still answers kill(0); read its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


def test_free_port_is_free_and_a_listening_port_is_not():
    import socket

    port = free_port()
    assert port_is_free(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not port_is_free(port)


def test_serves_and_stops_with_the_block_even_on_error():
    with pytest.raises(RuntimeError, match="boom"), ServerProcess(args=["--num-blocks", "64"]) as server:
        assert server.running and server.url.startswith("http://127.0.0.1:")
        models = httpx.get(server.base_url + "/models", timeout=10).json()
        assert models["data"][0]["id"] == "tinystories-4m"
        pid, port = server.pid, server.port
        raise RuntimeError("boom")
    assert not server.running and gone(pid) and port_is_free(port)
    server.stop()  # twice is fine
    assert "serving 'tinystories-4m'" in server.log_text()
    server.close()
    assert server.log_text() == ""


def test_a_port_taken_before_the_server_binds_it_is_replaced(monkeypatch):
    # Another program takes the port free_port() returned before our server binds it: start() picks a
    # fresh one and says nothing. A port the caller asked for is never swapped.
    import socket

    from minengine.course import server_process

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        picks = iter([taken, free_port()])
        monkeypatch.setattr(server_process, "free_port", lambda host: next(picks))
        with ServerProcess(args=["--num-blocks", "64"]) as server:
            assert server.port != taken
            assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        server.close()
        with pytest.raises(ServerStartError, match="(?i)address already in use"):
            ServerProcess(port=taken, args=["--num-blocks", "64"], startup_timeout=120).start()


def test_a_server_that_cannot_start_raises_with_its_log():
    server = ServerProcess(args=["--num-blocks", "not-a-number"], startup_timeout=60)
    with pytest.raises(ServerStartError, match="exited with code 2") as info:
        server.start()
    assert "num-blocks" in str(info.value)  # argparse's message, from the log
    assert not server.running


def test_a_hanging_command_times_out_and_is_killed():
    server = ServerProcess(command=[sys.executable, "-c", "import time; time.sleep(600)"],
                           startup_timeout=1.5)
    with pytest.raises(ServerStartError, match="did not answer"):
        server.start()
    assert not server.running and gone(server.pid)


def test_a_dropped_server_is_stopped_by_its_finalizer():
    server = ServerProcess(command=[sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "{port}"],
                           startup_timeout=30)
    server._wait_ready = lambda: None  # http.server has no /health; we only test the clean-up
    server.start()
    pid, log = server.pid, server._log_path
    assert server.running and log is not None and log.exists()
    del server
    gc.collect()
    assert gone(pid)
    assert not log.exists()  # the log goes with the object: a notebook that restarts servers leaves no files


def test_a_second_start_leaves_one_log_and_close_removes_it(monkeypatch):
    launched = []
    real_launch = ServerProcess._launch

    def launch(self):
        real_launch(self)
        launched.append(self._log_path)

    monkeypatch.setattr(ServerProcess, "_launch", launch)
    server = ServerProcess(args=["--num-blocks", "not-a-number"], startup_timeout=60)
    with pytest.raises(ServerStartError):
        server.start()
    # start again, as a cell run twice does
    with pytest.raises(ServerStartError):
        server.start()
    assert len(launched) == 2 and not launched[0].exists() and launched[1].exists()
    assert "num-blocks" in server.log_text()  # the failed start's log is still there to read
    server.close()
    assert not launched[1].exists()


def test_bad_arguments():
    with pytest.raises(ValueError):
        ServerProcess(startup_timeout=0)
    with pytest.raises(RuntimeError, match="not been started"):
        ServerProcess().url  # noqa: B018
