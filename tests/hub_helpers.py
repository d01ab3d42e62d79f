"""A real JupyterHub for tests: local Linux users, the hub and its proxy in a process group, the REST API.

tests/test_hub.py starts deploy/jupyterhub/jupyterhub_config.py exactly as a department would, with a
shared-password authenticator on 127.0.0.1 and throw-away users; :meth:`Hub.close` removes everything it
made (processes, users and their homes, temporary folders, permission changes) and checks nothing is left.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from proc_utils import free_port, wait_until_answering

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "jupyterhub"
PROXY = ROOT / "build" / "hub-node" / "node_modules" / ".bin" / "configurable-http-proxy"
VENV_BIN = Path(sys.executable).parent
COURSE_ID = "minengine"


def skip_reason() -> str | None:
    """Why a real hub cannot run here (None when it can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root: the hub's local-process spawner switches to each test user's Linux account"
    for tool in ("useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"no {tool}: the test creates its instructor and students as local users"
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        return "jupyterhub is not installed (the project's hub extra: `make setup`)"
    if not (VENV_BIN / "jupyterhub-singleuser").exists():
        return f"no {VENV_BIN / 'jupyterhub-singleuser'}"
    if not PROXY.exists():
        if shutil.which("node") is None or shutil.which("npm") is None:
            return "no node/npm for JupyterHub's proxy (configurable-http-proxy)"
        done = subprocess.run(["sh", str(DEPLOY / "install_proxy.sh")], capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0 or not PROXY.exists():
            return f"could not install configurable-http-proxy from npm: {done.stderr.strip()[-300:]}"
    return None


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def pids_of(uids: set[int]) -> list[int]:
    """Processes (by id) owned by the given users."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid in uids:
                    found.append(int(entry.name))
            except FileNotFoundError:
                continue
    return found


def blocking_dirs(path: Path) -> list[Path]:
    """Ancestors of ``path`` that other users cannot enter (e.g. a 0700 /root holding pyenv's Python)."""
    return [p for p in [path, *path.parents] if p.is_dir() and not p.stat().st_mode & stat.S_IXOTH]


@dataclass
class Hub:
    """A JupyterHub started from deploy/jupyterhub/ with throw-away users; ``close()`` undoes it all."""

    instructor: str
    students: list[str]
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="minengine-hub-")))
    password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    token: str = field(default_factory=lambda: secrets.token_hex(24))
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    created_users: list[str] = field(default_factory=list)
    opened_dirs: dict[Path, int] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)

    # ----------------------------------------------------------------------------------------- set-up
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def users(self) -> list[str]:
        return [self.instructor, *self.students]

    @property
    def exchange(self) -> Path:
        return self.base / "exchange"

    @property
    def log(self) -> Path:
        return self.base / "jupyterhub.log"

    def start(self, timeout_s: float = 180) -> None:
        self.base.chmod(0o755)  # users must reach the exchange inside it; the hub's state stays root's
        state = self.base / "state"
        state.mkdir(mode=0o700)
        self.exchange.mkdir()
        self.exchange.chmod(0o1777)  # everyone writes into it; sticky: no one removes another's files
        # The course's interpreter must be reachable by every user: a pyenv Python in a 0700 /root is not.
        for d in blocking_dirs(Path(os.path.realpath(sys.executable)).parent) + blocking_dirs(ROOT):
            self.opened_dirs[d] = d.stat().st_mode
            d.chmod(d.stat().st_mode | stat.S_IXOTH)  # traverse only, undone in close()
        for name in self.users:
            self.add_user(name)
        self.ports = {"hub": free_port(), "proxy_api": free_port()}
        env = dict(os.environ)
        env.update({
            "MINENGINE_HUB_INSTRUCTORS": self.instructor,
            "MINENGINE_HUB_STUDENTS": ",".join(self.students),
            "MINENGINE_HUB_STATE": str(state),
            "MINENGINE_HUB_EXCHANGE": str(self.exchange),
            "MINENGINE_HUB_VENV": str(VENV_BIN.parent),
            "MINENGINE_HUB_PORT": str(self.port),
            "MINENGINE_HUB_HUB_PORT": str(self.ports["hub"]),
            "MINENGINE_HUB_PROXY_API_PORT": str(self.ports["proxy_api"]),
            "MINENGINE_HUB_AUTHENTICATOR": "shared-password",
            "MINENGINE_HUB_PASSWORD": self.password,
            "MINENGINE_HUB_API_TOKEN": self.token,
            "MINENGINE_HUB_SINGLEUSER_ARGS": "--LabApp.expose_app_in_browser=True",
            "MINENGINE_HUB_SPAWN_TIMEOUT": "300",
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        })
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [str(VENV_BIN / "jupyterhub"), "-f", str(DEPLOY / "jupyterhub_config.py")], cwd=state,
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until_answering(f"{self.url}/hub/api/", self.process, timeout_s, "jupyterhub", self.log_tail)

    def add_user(self, name: str) -> None:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True,
                       capture_output=True, timeout=60)
        self.created_users.append(name)
        home = Path(pwd.getpwnam(name).pw_dir)
        home.chmod(0o700)  # an instructor's course directory (answer keys) is theirs alone
        # No news toast or update check in screenshots (tests/browser's recipe), as the user's own setting.
        settings = home / ".jupyter/lab/user-settings/@jupyterlab/apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text(
            '{"fetchNews": "false", "checkForUpdates": false}')
        subprocess.run(["chown", "-R", f"{name}:{name}", str(home / ".jupyter")], check=True, timeout=60)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    # ------------------------------------------------------------------------------------------ the API
    def api(self, method: str, path: str, token: str | None = None, **kwargs) -> httpx.Response:
        """A call to the hub's REST API (``/hub/api/...``) through the proxy, as the course-admin service."""
        headers = {"Authorization": f"token {token or self.token}"}
        return httpx.request(method, f"{self.url}/hub/api{path}", headers=headers,
                             timeout=kwargs.pop("timeout", 60), **kwargs)

    def user_token(self, name: str) -> str:
        """A token of ``name``'s own, allowed only to use their server (what their browser session can)."""
        if name not in self.tokens:
            r = self.api("POST", f"/users/{name}/tokens",
                         json={"note": "minengine test", "expires_in": 7200,
                               "scopes": [f"access:servers!user={name}"]})
            r.raise_for_status()
            self.tokens[name] = r.json()["token"]
        return self.tokens[name]

    def server(self, name: str, method: str, path: str, as_user: str | None = None, **kwargs
               ) -> httpx.Response:
        """A call to ``name``'s single-user server (``/user/<name>/...``), with ``as_user``'s token."""
        headers = {"Authorization": f"token {self.user_token(as_user or name)}"}
        return httpx.request(method, f"{self.url}/user/{name}{path}", headers=headers,
                             timeout=kwargs.pop("timeout", 120), **kwargs)

    def spawn(self, names: list[str], timeout_s: float = 300) -> float:
        """Start these users' servers at once through the hub API; seconds until all are ready."""
        start = time.monotonic()
        for name in names:
            r = self.api("POST", f"/users/{name}/server")
            assert r.status_code in (201, 202), f"spawning {name}: {r.status_code} {r.text}"
        waiting = set(names)
        deadline = start + timeout_s
        while waiting and time.monotonic() < deadline:
            for name in sorted(waiting):
                model = self.api("GET", f"/users/{name}").json()
                server = model.get("servers", {}).get("")
                if server and server.get("ready"):
                    waiting.discard(name)
                elif not server and not model.get("pending"):
                    raise RuntimeError(f"{name}'s server stopped while starting:\n{self.log_tail()}")
            time.sleep(1)
        if waiting:
            raise RuntimeError(f"servers not ready after {timeout_s} s: {sorted(waiting)}\n{self.log_tail()}")
        return time.monotonic() - start

    # ------------------------------------------------------------------------------------ as a user
    def user_env(self, name: str, role: str) -> dict[str, str]:
        """The environment the hub gives ``name``'s server (jupyterhub_config.py's Spawner.environment)."""
        home = pwd.getpwnam(name).pw_dir
        return {"HOME": home, "USER": name, "LOGNAME": name, "SHELL": "/bin/bash", "LANG": "C.UTF-8",
                "PATH": f"{VENV_BIN}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
                "JUPYTER_CONFIG_PATH": str(DEPLOY / "roles" / role), "MINENGINE_EXCHANGE": str(self.exchange),
                "HF_HUB_OFFLINE": "1"}

    def run_as(self, name: str, role: str, *cmd: str, cwd: Path | None = None, timeout_s: float = 600
               ) -> subprocess.CompletedProcess:
        """Run a command as ``name`` (their uid and groups only), as they would in their hub terminal."""
        entry = pwd.getpwnam(name)
        done = subprocess.run(list(cmd), user=entry.pw_uid, group=entry.pw_gid, extra_groups=[],
                              env=self.user_env(name, role), cwd=cwd or entry.pw_dir, capture_output=True,
                              text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} as {name} failed ({done.returncode}):\n"
                               f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def home(self, name: str) -> Path:
        return Path(pwd.getpwnam(name).pw_dir)

    # ---------------------------------------------------------------------------------------- tear-down
    def close(self) -> list[str]:
        """Stop the hub (it stops every server), kill what is left of the users' processes, remove the
        users, their homes and the folders, undo the permission changes; returns what could not be undone."""
        problems = []
        uids = set()
        for name in self.created_users:
            try:
                uids.add(pwd.getpwnam(name).pw_uid)
            except KeyError:
                pass
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)  # the hub stops servers, then its proxy
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
            except ProcessLookupError:
                pass
        if self.process is not None:
            try:  # the proxy and anything else the hub's group started
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while uids and pids_of(uids) and time.monotonic() < deadline:
            for pid in pids_of(uids):  # servers and kernels of the test users, by id
                try:
                    os.kill(pid, signal.SIGTERM if time.monotonic() < deadline - 15 else signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(1)
        if uids and pids_of(uids):
            problems.append(f"processes of the test users survived: {pids_of(uids)}")
        for name in self.created_users:
            done = subprocess.run(["userdel", "--remove", name], capture_output=True, text=True, timeout=60)
            if done.returncode not in (0, 12):  # 12: the home could not be removed (checked below)
                problems.append(f"userdel {name}: {done.stderr.strip()}")
            home = Path("/home") / name
            if home.exists():
                shutil.rmtree(home, ignore_errors=True)
        for d, mode in self.opened_dirs.items():
            d.chmod(stat.S_IMODE(mode))
        shutil.rmtree(self.base, ignore_errors=True)
        for port in [self.port, *getattr(self, "ports", {}).values()]:
            if port_open(port):
                problems.append(f"port {port} still open")
        for name in self.created_users:
            try:
                pwd.getpwnam(name)
                problems.append(f"user {name} still exists")
            except KeyError:
                pass
        return problems
