"""Start a learner's streaming server (lab 3) in a subprocess, so real clients can grade it, and
always stop it.

Why a subprocess: a server is graded from the outside, as a client sees it (the OpenAI SDK, raw SSE,
disconnects); a broken one (an import error, a loop at import time, a hang) must cost only its own
points, never the kernel; and a process group can always be killed, so no server or port outlives the
grading. The learner's file defines ``build_app(llm, model_name)``; this module's runner builds the
``AsyncLLM`` itself and passes it in, which lets the grader

* slow every engine step down on request (``set_delay``: a seam around ``LLMEngine.step``, so a test can
  see whether tokens stream out as they are made or all at the end),
* read the engine's own state and records (unfinished requests, KV blocks in use, per-request token
  times) through ``/__grader__/*`` routes it puts in front of the learner's app,
* see which modules the learner's code imported: the reference server (``minengine.server``), the CLI,
  the bench client or the course's grading code are not an answer.

The reference server is started by the same runner (``reference=True``), so both sides run the same
engine on the same machine. Kernel side (``launch``, ``server``, ``stop_all``) imports no torch.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TINY, SMOL = "tinystories-4m", "smollm2-135m"
STARTUP_LIMIT_S = 45.0  # from launch: python + torch + the models, on a busy 2-core machine
LIFETIME_S = 900.0  # a runner never outlives this, even if nobody stops it
# What an answer may not use: the reference server and what wraps it, and the course's grading code.
FORBIDDEN = ("minengine.server", "minengine.cli", "minengine.bench", "minengine.course")
ALLOWED = ("minengine.course", "minengine.course.server_grader")  # the runner itself


class ServerProblem(AssertionError):
    """The learner's server cannot be graded (it did not start, hung, or uses the reference)."""


def forbidden_imports(source: str) -> list[str]:
    """Modules an answer's source imports (or names in strings) that are not allowed; [] when clean."""
    found: set[str] = set()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # the runner reports the syntax error itself
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [w for w in node.value.replace("/", ".").split() if w.startswith("minengine.")]
        elif isinstance(node, ast.Name) and node.id in ("__import__", "importlib", "import_module"):
            found.add(node.id)
        found.update(n for n in names if n.startswith(FORBIDDEN) and n not in ALLOWED)
    return sorted(found)


# ------------------------------------------------------------------------------------------ kernel side
@dataclass
class ServerProcess:
    """One runner subprocess (its own process group) serving one app per model on ports the OS picked."""

    app_file: Path | None
    models: tuple[str, ...]
    startup_limit_s: float = STARTUP_LIMIT_S
    proc: subprocess.Popen | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="minengine-grader-")))
    started_at: float = 0.0
    digest: str = ""
    failure: str = ""  # why it cannot be graded, once known (later cells fail at once, with the same words)

    @property
    def label(self) -> str:
        return "the reference server" if self.app_file is None else f"your server ({self.app_file.name})"

    def start(self) -> ServerProcess:
        cmd = [sys.executable, "-m", "minengine.course.server_grader", "--status",
               str(self.workdir / "status.json"), "--parent", str(os.getpid())]
        cmd += ["--reference"] if self.app_file is None else ["--app", str(self.app_file)]
        for m in self.models:
            cmd += ["--model", m]
        env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("NBGRADER_EXECUTION", None)
        with open(self.workdir / "log.txt", "wb") as log:
            # never the kernel's stderr: that zeroes a test cell
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env,
                                         cwd=self.app_file.parent if self.app_file else None)
        self.started_at = time.monotonic()
        return self

    def status(self) -> dict[str, Any]:
        try:
            return json.loads((self.workdir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def log_tail(self, lines: int = 12) -> str:
        try:
            text = (self.workdir / "log.txt").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def url(self, model: str = TINY) -> str:
        """The base URL (no ``/v1``) serving ``model``, waiting for it; ServerProblem if it never comes."""
        while not self.failure:
            st = self.status()
            port = st.get("ports", {}).get(model)
            if port and self.proc is not None:
                return f"http://127.0.0.1:{port}"
            waited = time.monotonic() - self.started_at
            if st.get("error"):
                self.failure = f"{self.label} did not start: {st['error']}"
            elif self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                self.failure = f"{self.label} exited before serving (exit code {code}). Its last output:\n" \
                               f"{self.log_tail()}"
            elif waited > self.startup_limit_s:
                stage = st.get("stage", "starting python")
                hint = (" Does your file call uvicorn.run() or loop forever at import time? Define build_app "
                        "and let the grader start it." if stage == "importing the answer" else "")
                self.failure = (f"{self.label} was not serving after {waited:.0f} s (stuck while {stage}); "
                                f"it was stopped.{hint}")
            else:
                time.sleep(0.05)
        self.stop()
        raise ServerProblem(self.failure)

    def control(self, what: str, model: str = TINY, **params: Any) -> dict[str, Any]:
        """The runner's own view: ``state``, ``records``, ``delay`` (see ``GraderApp``)."""
        r = httpx.get(f"{self.url(model)}/__grader__/{what}", params=params, timeout=10)
        r.raise_for_status()
        return r.json()

    def check_own_code(self, model: str = TINY) -> None:
        """ServerProblem if the answer's source or its running process reached for the reference."""
        if self.app_file is None:
            return
        found = forbidden_imports(self.app_file.read_text())
        found += [m for m in self.control("state", model)["forbidden"] if m not in found]
        if found:
            raise ServerProblem(f"{self.label} uses minengine's reference server or grading code "
                                f"({', '.join(found[:4])}). The point of the lab is to write the endpoints "
                                "yourself over AsyncLLM: remove that import.")

    def stop(self) -> None:
        """SIGTERM the whole process group, SIGKILL it if it lingers, and reap it (frees its ports)."""
        proc, self.proc = self.proc, None
        try:
            if proc is not None:
                self._kill(proc)
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)  # its status file and log

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        for sig, wait in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # stray grandchildren of the group
            os.killpg(proc.pid, signal.SIGKILL)


_RUNNING: dict[str, ServerProcess] = {}


def launch(app_file: str | Path = "lab3_server.py", models: tuple[str, ...] = (TINY, SMOL),
           startup_limit_s: float = STARTUP_LIMIT_S) -> ServerProcess:
    """Start (without waiting) the learner's server from ``app_file``, and the reference beside it. The
    same file again reuses the running one; an edited file restarts it."""
    path = Path(app_file).resolve()
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
    current = _RUNNING.get("answer")
    if current is None or current.digest != digest or current.app_file != path:
        if current is not None:
            current.stop()
        current = ServerProcess(path, models, startup_limit_s, digest=digest)
        if digest != "missing":
            current.start()
        _RUNNING["answer"] = current
    if "reference" not in _RUNNING:
        _RUNNING["reference"] = ServerProcess(None, models, startup_limit_s).start()
    return current


def wait_all() -> None:
    """Wait until every launched server serves all its models, printing how each one is doing. Never
    raises for a broken server (the checks report it): a grading cell timing out here costs no points."""
    for key, proc in list(_RUNNING.items()):
        for model in proc.models:
            try:
                proc.url(model)
            except ServerProblem as e:
                print(f"{key}: {e}")
                break
        else:
            print(f"{proc.label} is serving {', '.join(proc.models)}")


def server(app_file: str | Path = "lab3_server.py") -> ServerProcess:
    """The learner's running server after the own-code check: the one launched from this file as it is now
    (launched now if it was not, or restarted if the file changed since)."""
    proc = launch(app_file)
    if proc.digest == "missing":
        raise ServerProblem(f"there is no {proc.app_file.name}: run the server cell above (it writes the "
                            "file)")
    proc.url()  # ServerProblem unless serving
    proc.check_own_code()
    return proc


def reference() -> ServerProcess:
    if "reference" not in _RUNNING:
        _RUNNING["reference"] = ServerProcess(None, (TINY, SMOL)).start()
    return _RUNNING["reference"]


def stop_all() -> None:
    """Stop every server this kernel started (the last cell calls it; so does the kernel's exit)."""
    while _RUNNING:
        _, proc = _RUNNING.popitem()
        proc.stop()


atexit.register(stop_all)


# ------------------------------------------------------------------------------------------ runner side
class GraderApp:
    """ASGI wrapper: ``/__grader__/{state,records,delay}`` answered here, everything else by the app."""

    def __init__(self, app: Any, llm: Any, control: dict[str, float]) -> None:
        self.app, self.llm, self.control = app, llm, control

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/__grader__/"):
            await self.app(scope, receive, send)
            return
        from urllib.parse import parse_qs

        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        engine, what = self.llm.engine, scope["path"].rsplit("/", 1)[-1]
        if what == "delay":
            self.control["delay"] = float(query.get("seconds", 0))
            body: Any = {"delay": self.control["delay"]}
        elif what == "records":
            body = [{"request_id": r.request_id, "arrival_time": r.arrival_time, "token_times": r.token_times,
                     "num_prompt_tokens": r.num_prompt_tokens, "num_output_tokens": r.num_output_tokens,
                     "finish_reason": r.finish_reason}
                    for r in list(engine.request_records)[-int(query.get("last", 50)):]]
        else:
            body = {"unfinished": engine.get_num_unfinished_requests(),
                    "used_blocks": engine.scheduler.block_manager.num_used_blocks,
                    "finished": len(engine.request_records), "delay": self.control["delay"],
                    "forbidden": sorted(m for m in sys.modules
                                        if m.startswith(FORBIDDEN) and m not in ALLOWED)}
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


def _write_status(path: Path, status: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(status))
    tmp.replace(path)


def _watch_parent(parent: int) -> None:
    """Exit when the kernel that started us is gone, or after LIFETIME_S, whatever happens to it."""
    import threading

    def watch() -> None:
        deadline = time.monotonic() + LIFETIME_S
        while time.monotonic() < deadline:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(0.5)
        os._exit(4)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _slow_down(llm: Any, control: dict[str, float]) -> None:
    """The slowed test engine: each step first sleeps ``control["delay"]`` seconds (on the engine thread)."""
    step = llm.engine.step

    def delayed_step() -> Any:
        if control["delay"] > 0:
            time.sleep(control["delay"])
        return step()

    llm.engine.step = delayed_step


def run(args: argparse.Namespace) -> None:
    import asyncio
    import traceback

    status_path = Path(args.status)
    status: dict[str, Any] = {"stage": "loading the engine", "ports": {}}
    _write_status(status_path, status)
    _watch_parent(args.parent)
    try:
        import torch
        import uvicorn

        from minengine.engine.async_llm import AsyncLLM

        torch.set_num_threads(1)  # two servers and a kernel share two cores
        first_llm = AsyncLLM(model=args.model[0])
        if args.reference:
            from minengine.server import create_app

            def build_app(llm: Any, name: str) -> Any:
                return create_app(llm, served_model_name=name)
        else:
            status["stage"] = "importing the answer"
            _write_status(status_path, status)
            import importlib.util

            path = Path(args.app)
            sys.path.insert(0, str(path.parent))
            spec = importlib.util.spec_from_file_location(path.stem, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
            build_app = getattr(module, "build_app", None)
            if not callable(build_app):
                raise ServerProblem(f"{path.name} defines no build_app(llm, model_name) function")
    except BaseException as e:  # noqa: BLE001 (anything the answer raises is reported, not crashed on)
        status["error"] = f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exc(limit=-3))
        _write_status(status_path, status)
        raise SystemExit(2) from None

    async def serve_all() -> None:
        tasks = []
        for i, name in enumerate(args.model):
            status["stage"] = f"loading {name}"
            _write_status(status_path, status)
            llm = first_llm if i == 0 else await asyncio.to_thread(AsyncLLM, model=name)
            control = {"delay": 0.0}
            _slow_down(llm, control)
            try:
                app = build_app(llm, name)
            except Exception as e:
                status["error"] = f"build_app(llm, {name!r}) raised {type(e).__name__}: {e}"
                _write_status(status_path, status)
                raise SystemExit(2) from None
            config = uvicorn.Config(GraderApp(app, llm, control), host="127.0.0.1", port=0,
                                    log_level="warning", access_log=False, lifespan="auto",
                                    timeout_graceful_shutdown=1)
            srv = uvicorn.Server(config)
            srv.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # SIGTERM just ends us
            tasks.append(asyncio.create_task(srv.serve()))
            while not srv.started:
                if tasks[-1].done():
                    status["error"] = f"uvicorn could not start the app for {name}: {tasks[-1].exception()!r}"
                    _write_status(status_path, status)
                    raise SystemExit(2)
                await asyncio.sleep(0.02)
            status["ports"][name] = srv.servers[0].sockets[0].getsockname()[1]
            status["stage"] = "serving"
            _write_status(status_path, status)
        await asyncio.gather(*tasks)

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    asyncio.run(serve_all())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="lab 3's grading runner (started by server_grader.launch)")
    p.add_argument("--app", help="the learner's file defining build_app(llm, model_name)")
    p.add_argument("--reference", action="store_true", help="serve minengine.server instead")
    p.add_argument("--model", action="append", required=True)
    p.add_argument("--status", required=True)
    p.add_argument("--parent", type=int, required=True)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
