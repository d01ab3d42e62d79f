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

**Two places run these servers.** In JupyterLab the learner's kernel starts both, on TCP ports of
127.0.0.1, and the test cells run there: instant feedback. While autograding, the test cells run in the
grader (``grader_side_tests``), out of the submission's reach, and so do the servers
(:func:`begin_grading`): the learner's file runs in its own bubblewrap sandbox (no network but its own
loopback, the reference server's code hidden), and both servers listen on Unix sockets in folders the
grader owns. The learner's client (parts 2 and 3) runs in their kernel, which has its own loopback: the
grader has the kernel open a port that relays to the reference's bare app (:func:`serve_relay`), so the
client is given an ``http://127.0.0.1`` URL and never the grader's control routes.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from minengine.course.server_source import FORBIDDEN, engine_tampering, forbidden_imports

TINY, SMOL = "tinystories-4m", "smollm2-135m"
STARTUP_LIMIT_S = 45.0  # from launch: python + torch + the models, on a busy 2-core machine
LIFETIME_S = 900.0  # a runner never outlives this, even if nobody stops it
# The runner's own modules, which the check of the answer's loaded modules allows (its source may not
# import them: server_source.forbidden_imports).
ALLOWED = ("minengine.course", "minengine.course.server_grader", "minengine.course.server_source",
           "minengine.course.own_code")  # server_source reads with own_code's vocabulary
# Packages of minengine that a sandboxed answer does not even see (empty folders in its sandbox).
HIDDEN_PACKAGES = ("server", "cli", "bench")


def public_socket_name(model: str) -> str:
    """The reference's bare app for ``model``, in the kernel's folder while grading."""
    return f"lab3-reference-{model}.sock"


class ServerProblem(AssertionError):
    """The learner's server cannot be graded (it did not start, hung, or uses the reference)."""


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
    # While autograding (begin_grading): each model on a Unix socket in workdir/run instead of a TCP port;
    # the answer's command confined (the sandbox's); the reference also serving its bare app in public_dir.
    on_unix_sockets: bool = False
    confine: Confine | None = None
    public_dir: Path | None = None

    @property
    def label(self) -> str:
        return "the reference server" if self.app_file is None else f"your server ({self.app_file.name})"

    @property
    def run_dir(self) -> Path:
        return self.workdir / "run"  # the status file and the sockets (the sandbox may write only here)

    def start(self) -> ServerProcess:
        self.run_dir.mkdir(exist_ok=True)
        cmd = [sys.executable, "-m", "minengine.course.server_grader", "--status",
               str(self.run_dir / "status.json"), "--parent", "0" if self.confine else str(os.getpid())]
        app_file = self.app_file
        if app_file is not None and self.confine:  # the sandbox sees a copy, taken now, and nothing beside
            (self.workdir / "app").mkdir(exist_ok=True)
            app_file = Path(shutil.copy2(app_file, self.workdir / "app" / app_file.name))
        cmd += ["--reference"] if app_file is None else ["--app", str(app_file)]
        for m in self.models:
            cmd += ["--model", m]
        if self.on_unix_sockets:
            cmd += ["--uds", str(self.run_dir)]
        if self.public_dir is not None:
            cmd += ["--public", str(self.public_dir)]
        env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("NBGRADER_EXECUTION", None)
        if self.confine is not None:
            assert app_file is not None
            hidden = [Path(__file__).resolve().parents[1] / name for name in HIDDEN_PACKAGES]
            cmd = self.confine(cmd, app_file.parent, self.run_dir, env, hidden=hidden)
        with open(self.workdir / "log.txt", "wb") as log:
            # never the kernel's stderr: that zeroes a test cell
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env,
                                         cwd=app_file.parent if app_file else None)
        self.started_at = time.monotonic()
        return self

    def status(self) -> dict[str, Any]:
        try:
            return json.loads((self.run_dir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def log_tail(self, lines: int = 12) -> str:
        try:
            text = (self.workdir / "log.txt").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def url(self, model: str = TINY) -> str:
        """The base URL (no ``/v1``) serving ``model``, waiting for it; ServerProblem if it never comes.
        On Unix sockets the host names the model, and only :meth:`http` and :meth:`openai` reach it."""
        while not self.failure:
            st = self.status()
            port = st.get("ports", {}).get(model)
            if port and self.proc is not None:
                return f"http://127.0.0.1:{port}" if isinstance(port, int) else f"http://{model}.lab3"
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

    def _client_options(self, model: str, timeout: httpx.Timeout | float, limits: httpx.Limits | None,
                        transport: type) -> dict[str, Any]:
        """httpx client options for ``model``: its base URL, and on Unix sockets a ``transport`` (httpx's
        sync or async class) bound to the socket its status names."""
        url = self.url(model)  # waits until it serves
        port, limits = self.status()["ports"][model], limits or httpx.Limits()
        uds = transport(uds=port, limits=limits) if isinstance(port, str) else None
        return {"base_url": url, "transport": uds, "timeout": timeout, "limits": limits}

    def http(self, model: str = TINY, timeout: httpx.Timeout | float = 20.0,
             limits: httpx.Limits | None = None) -> httpx.Client:
        """A client for ``model``'s app, on its port or its Unix socket (paths relative to :meth:`url`)."""
        return httpx.Client(**self._client_options(model, timeout, limits, httpx.HTTPTransport))

    def async_http(self, model: str = TINY, timeout: httpx.Timeout | float = 20.0,
                   limits: httpx.Limits | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(**self._client_options(model, timeout, limits, httpx.AsyncHTTPTransport))

    def openai(self, model: str = TINY, timeout: float = 20.0) -> Any:
        """The official openai SDK pointed at ``model`` (no retries: a failure is the server's)."""
        import openai

        return openai.OpenAI(base_url=self.url(model) + "/v1", api_key="lab3", max_retries=0, timeout=timeout,
                             http_client=self.http(model, timeout=timeout))

    def client_url(self, model: str = TINY) -> str:
        """The base URL a learner's client (parts 2 and 3) is given. While grading, their client runs in
        their sandboxed kernel: the URL is a port there that relays to this server's bare app."""
        url = self.url(model)
        if self.public_dir is None or _SESSION is None:
            return url
        return f"http://127.0.0.1:{_SESSION.relay_port(self.public_dir / public_socket_name(model))}"

    def control(self, what: str, model: str = TINY, **params: Any) -> Any:
        """The runner's own view: ``state``, ``records``, ``delay`` (see ``GraderApp``)."""
        with self.http(model, timeout=10) as client:
            r = client.get(f"/__grader__/{what}", params=params)
        r.raise_for_status()
        return r.json()

    def check_own_code(self, model: str = TINY) -> None:
        """ServerProblem if the answer's source or its running process reached for the reference, or its
        source rewrites the engine whose state the checks read (``server_source``)."""
        if self.app_file is None:
            return
        source = self.app_file.read_text()
        found = forbidden_imports(source)
        found += [m for m in self.control("state", model)["forbidden"] if m not in found]
        if found:
            raise ServerProblem(f"{self.label} uses minengine's reference server or grading code "
                                f"({', '.join(found[:4])}). The point of the lab is to write the endpoints "
                                "yourself over AsyncLLM: remove that import.")
        tampering = engine_tampering(source)
        if tampering:
            raise ServerProblem(f"{self.label} changes the engine or reaches objects it was not given "
                                f"({'; '.join(tampering[:3])}). The grader reads the engine's own state to "
                                "check your server: call llm (generate, abort, its tokenizer and config), "
                                "never change it.")

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


# sandbox.sandboxed_command's shape: (command, workdir, private folder, environment, hidden=folders) ->
# the command confined. The grader passes it in (this module does not import the sandbox's).
Confine = Callable[..., list[str]]


@dataclass
class GradingSession:
    """Lab 3 while autograding one notebook, in the grader's process: the servers run here on Unix
    sockets, the answer confined by ``confine`` (None where the grader runs without a sandbox).
    ``kernel_dir`` is a folder the learner's kernel also sees (its sandbox's private folder), where the
    reference's bare app listens; ``open_relay(path)`` has the kernel open a TCP port relaying to that
    socket and returns the port (:func:`serve_relay`, run there)."""

    kernel_dir: Path
    open_relay: Callable[[str], int]
    confine: Confine | None
    remove_kernel_dir: bool = False  # a folder made for this session (no sandbox: no private folder)
    relays: dict[str, int] = field(default_factory=dict)

    def relay_port(self, path: Path) -> int:
        if str(path) not in self.relays:
            self.relays[str(path)] = self.open_relay(str(path))
        return self.relays[str(path)]


_SESSION: GradingSession | None = None


def begin_grading(session: GradingSession) -> None:
    """From now on, servers run in this (the grader's) process for ``session`` (the notebook's cells)."""
    global _SESSION
    end_grading()
    _SESSION = session


def end_grading() -> None:
    """Stop every server of the notebook being graded (its kernel is gone, or the next one begins)."""
    global _SESSION
    stop_all()
    if _SESSION is not None and _SESSION.remove_kernel_dir:
        shutil.rmtree(_SESSION.kernel_dir, ignore_errors=True)
    _SESSION = None


def _grading_in_kernel() -> bool:
    """This is a learner's kernel during autograde: the grader runs the servers, not the kernel."""
    return _SESSION is None and os.environ.get("NBGRADER_EXECUTION") == "autograde"


def launch(app_file: str | Path = "lab3_server.py", models: tuple[str, ...] = (TINY, SMOL),
           startup_limit_s: float = STARTUP_LIMIT_S) -> ServerProcess | None:
    """Start (without waiting) the learner's server from ``app_file``, and the reference beside it. The
    same file again reuses the running one; an edited file restarts it. In a kernel being autograded it
    starts nothing (None): the grader starts its own, sandboxed, from the same file."""
    if _grading_in_kernel():
        print("While autograding, the grader starts your server itself (from lab3_server.py, in a sandbox).")
        return None
    path = Path(app_file).resolve()
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
    current = _RUNNING.get("answer")
    if current is None or current.digest != digest or current.app_file != path:
        if current is not None:
            current.stop()
        current = ServerProcess(path, models, startup_limit_s, digest=digest,
                                on_unix_sockets=_SESSION is not None,
                                confine=_SESSION.confine if _SESSION is not None else None)
        if digest != "missing":
            current.start()
        _RUNNING["answer"] = current
    reference(models, startup_limit_s)
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
    if proc is None:
        raise ServerProblem("while autograding, your server runs in the grader, not in this kernel")
    if proc.digest == "missing":
        raise ServerProblem(f"there is no {proc.app_file.name}: run the server cell above (it writes the "
                            "file)")
    proc.url()  # ServerProblem unless serving
    if _SESSION is not None:
        _serving_everything(proc)  # launch() waited for the reference's
    proc.check_own_code()
    return proc


def _serving_everything(proc: ServerProcess) -> None:
    """Wait until ``proc`` serves all its models (ServerProblem if one never comes). While grading, this
    stands in for the notebook's wait_all: a runner loads its later models while it already serves the
    first, and a model loading in the background slows that process's every answer (once, 0.3 s more on a
    client's first token), which the timing checks would count against the learner."""
    for model in proc.models:
        proc.url(model)


def reference(models: tuple[str, ...] = (TINY, SMOL), startup_limit_s: float = STARTUP_LIMIT_S
              ) -> ServerProcess:
    """The reference server (``minengine.server``), started if it is not running."""
    if "reference" not in _RUNNING:
        public = _SESSION.kernel_dir if _SESSION is not None else None
        _RUNNING["reference"] = ServerProcess(None, models, startup_limit_s,
                                              on_unix_sockets=_SESSION is not None, public_dir=public).start()
    if _SESSION is not None:
        _serving_everything(_RUNNING["reference"])
    return _RUNNING["reference"]


def stop_all() -> None:
    """Stop every server this kernel started (the last cell calls it; so does the kernel's exit)."""
    while _RUNNING:
        _, proc = _RUNNING.popitem()
        proc.stop()


atexit.register(stop_all)


_RELAYS: dict[str, int] = {}


def serve_relay(socket_path: str) -> int:
    """Kernel side, while autograding: a port on this kernel's 127.0.0.1 that forwards each connection to
    the Unix socket ``socket_path`` (the reference server's bare app, which the grader runs outside the
    kernel's sandbox), so the learner's client is measured on an ordinary ``http://`` URL. Returns the
    port; one relay per socket, on daemon threads, for the kernel's life."""
    if socket_path in _RELAYS:
        return _RELAYS[socket_path]
    listener = socket.create_server(("127.0.0.1", 0))

    def pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:  # either side ending ends both: a client that leaves is gone for the server too
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def forward(client: socket.socket) -> None:
        with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
            try:
                upstream.connect(socket_path)
            except OSError:
                return  # the client sees its connection closed: the server is gone
            back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
            back.start()
            pump(client, upstream)
            back.join()

    def accept() -> None:
        while True:
            client, _ = listener.accept()
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=forward, args=(client,), daemon=True, name="lab3-relay").start()

    threading.Thread(target=accept, daemon=True, name="lab3-relay-accept").start()
    _RELAYS[socket_path] = listener.getsockname()[1]
    return _RELAYS[socket_path]


# ------------------------------------------------------------------------------------------ runner side
@dataclass(frozen=True)
class EngineProbes:
    """The functions the grader reads an engine's state with, taken before the answer is imported: an
    answer that later replaces a method or a property on its engine or on minengine's classes changes
    what its engine does, not what the grader sees (``server_source`` refuses such code as well)."""

    unfinished: Callable[[Any], int]
    used_blocks: Callable[[Any], int]

    @classmethod
    def take(cls) -> EngineProbes:
        from minengine.core.block_manager import BlockManager
        from minengine.engine.llm_engine import LLMEngine

        return cls(LLMEngine.get_num_unfinished_requests, BlockManager.num_used_blocks.fget)


class GraderApp:
    """ASGI wrapper: ``/__grader__/{state,records,delay}`` answered here, everything else by the app.
    Made before the answer's ``build_app`` runs, so it holds the engine's own objects as they were
    (``app`` is set once ``build_app`` returns)."""

    def __init__(self, llm: Any, control: dict[str, float], probes: EngineProbes) -> None:
        self.app: Any = None
        self.control, self.probes = control, probes
        self.engine = llm.engine
        self.block_manager = self.engine.scheduler.block_manager
        self.records = self.engine.request_records
        self.block_size = self.engine.config.block_size

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/__grader__/"):
            await self.app(scope, receive, send)
            return
        from urllib.parse import parse_qs

        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        what = scope["path"].rsplit("/", 1)[-1]
        if what == "delay":
            self.control["delay"] = float(query.get("seconds", 0))
            body: Any = {"delay": self.control["delay"]}
        elif what == "records":
            body = [{"request_id": r.request_id, "arrival_time": r.arrival_time, "token_times": r.token_times,
                     "num_prompt_tokens": r.num_prompt_tokens, "num_output_tokens": r.num_output_tokens,
                     "finish_reason": r.finish_reason}
                    for r in list(self.records)[-int(query.get("last", 50)):]]
        else:
            body = {"unfinished": self.probes.unfinished(self.engine),
                    "used_blocks": self.probes.used_blocks(self.block_manager),
                    "block_size": self.block_size,
                    "finished": len(self.records), "delay": self.control["delay"],
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
    """Exit when the kernel that started us is gone, or after LIFETIME_S, whatever happens to it. Parent 0:
    in a sandbox, where bubblewrap's --die-with-parent does the first part."""

    def watch() -> None:
        deadline = time.monotonic() + LIFETIME_S
        while time.monotonic() < deadline:
            if parent and os.getppid() != parent:
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
        probes = EngineProbes.take()  # before the answer's code runs
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
        for i, name in enumerate(args.model):
            status["stage"] = f"loading {name}"
            _write_status(status_path, status)
            llm = first_llm if i == 0 else await asyncio.to_thread(AsyncLLM, model=name)
            control = {"delay": 0.0}
            _slow_down(llm, control)
            grader = GraderApp(llm, control, probes)  # before build_app: it holds the engine as it is now
            try:
                app = build_app(llm, name)
            except Exception as e:
                status["error"] = f"build_app(llm, {name!r}) raised {type(e).__name__}: {e}"
                _write_status(status_path, status)
                raise SystemExit(2) from None
            if args.public:  # the bare app, for the learner's client (through the kernel's relay)
                await start_server(app, name, Path(args.public) / public_socket_name(name))
            # "ports" holds a TCP port, or on Unix sockets the socket's path
            grader.app = app
            status["ports"][name] = await start_server(grader, name,
                                                       Path(args.uds) / f"{name}.sock" if args.uds else None)
            status["stage"] = "serving"
            _write_status(status_path, status)
        await asyncio.gather(*tasks)

    async def start_server(app: Any, name: str, uds: Path | None) -> int | str:
        where: dict[str, Any] = {"uds": str(uds)} if uds else {"host": "127.0.0.1", "port": 0}
        config = uvicorn.Config(app, **where, log_level="warning", access_log=False, lifespan="auto",
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
        return str(uds) if uds else srv.servers[0].sockets[0].getsockname()[1]

    tasks: list[asyncio.Task] = []

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    asyncio.run(serve_all())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="lab 3's grading runner (started by server_grader.launch)")
    p.add_argument("--app", help="the learner's file defining build_app(llm, model_name)")
    p.add_argument("--reference", action="store_true", help="serve minengine.server instead")
    p.add_argument("--model", action="append", required=True)
    p.add_argument("--status", required=True)
    p.add_argument("--parent", type=int, required=True, help="exit when this process is gone (0: never)")
    p.add_argument("--uds", help="serve each model on a Unix socket <model>.sock here, not on a TCP port")
    p.add_argument("--public", help="also serve each bare app (no grader routes) on <model>.sock here")
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
