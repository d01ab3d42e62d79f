"""Fixtures for the end-to-end tests: a JupyterLab server on a temp copy of the course, headless Chromium.

Learners meet the course in JupyterLab, so these tests open it there: a real server on 127.0.0.1 (a free
port, a token, its own settings and runtime folders), Debian's Chromium driven by Playwright for Python
(never ``playwright install``). Without Chromium or Playwright every test here is skipped with a reason,
so ``make test`` still passes on a machine without them. Screenshots go to ``build/browser-artifacts/``;
a failing test also leaves ``FAILED-<test>.png`` there. See /work/shared/design/BROWSER_TESTS.md.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jlab_helpers import ARTIFACTS, LabServer, new_page, shut_down_kernel
from proc_utils import free_port, stop_process_group, wait_until_answering

HERE = Path(__file__).resolve().parent
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# The flags that keep Chromium offline and quiet as root in a container (BROWSER_TESTS.md).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
SERVER_START_S = 120
_RUNNING: list[LabServer] = []  # servers up now, for the per-module kernel clean-up


def find_chromium() -> str | None:
    """Chromium's path: ``$MINENGINE_CHROMIUM`` if set, else the first Chromium-like browser on PATH."""
    explicit = os.environ.get("MINENGINE_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def skip_reason() -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (it is in the dev extra: `make setup`)"
    explicit = os.environ.get("MINENGINE_CHROMIUM")
    if explicit and find_chromium() is None:
        return f"MINENGINE_CHROMIUM={explicit} is not a file"
    if find_chromium() is None:
        return ("no Chromium found (looked for " + ", ".join(CHROMIUM_NAMES)
                + "; or set MINENGINE_CHROMIUM): as root on Debian, `make test` installs Debian's chromium "
                "with apt-get; elsewhere install it")
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` selection reads the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test in this folder ``browser`` and skip them all, with one reason, when they can't run.

    Browser tests also move to the end of the run: their server, kernels and Chromium then stop as soon
    as they finish instead of idling through the rest of the suite.
    """
    reason = skip_reason()
    ours = [item for item in items if HERE in item.path.resolve().parents]
    for item in ours:
        item.add_marker(pytest.mark.browser)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
    items[:] = [item for item in items if item not in ours] + ours


# ------------------------------------------------------------------------------------------- the server
def _copy_course(root: Path, course_dir: Path) -> None:
    """What a learner's ``workspace/`` holds: the lessons and the *student* versions of labs and quizzes."""
    from minengine.course.tooling import place_student_versions, prepare_workspace

    prepare_workspace(root)
    place_student_versions(root, course_dir=course_dir)


def _write_lab_settings(settings: Path) -> None:
    """No news toast or update check: nothing may cover the notebook in a screenshot."""
    path = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))



@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab serving a fresh copy of the course; kernels run headless-sized and offline."""
    base = tmp_path_factory.mktemp("browser-course")
    root, jupyter = base / "course", base / "jupyter"
    _copy_course(root, base / "nbgrader-course")
    _write_lab_settings(jupyter / "settings")
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update({
        "MINENGINE_HEADLESS": "1",  # lessons pick their smallest sizes, as in tests/test_lessons.py
        "HF_HUB_OFFLINE": "1",  # nothing in the course needs the network; a hub lookup would hang
        "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        "JUPYTER_CONFIG_DIR": str(jupyter / "config"),  # no user config changes what we test
        "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
        "IPYTHONDIR": str(jupyter / "ipython"),
    })
    env.pop("MPLBACKEND", None)  # kernels must use the inline backend, as for a learner
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           f"--LabApp.user_settings_dir={jupyter / 'settings'}",
           f"--LabApp.workspaces_dir={jupyter / 'workspaces'}", "--LabApp.news_url=None",
           "--LabApp.expose_app_in_browser=True",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = base / "jupyterlab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = LabServer(port, token, root, log, proc)
    try:
        _wait_ready(server)
        _RUNNING.append(server)
        yield server
    finally:
        if server in _RUNNING:
            _RUNNING.remove(server)
        stop_process_group(proc)


@pytest.fixture(scope="module", autouse=True)
def shut_kernels_down() -> Iterator[None]:
    """After each test module, shut its notebooks' kernels down (each holds a model in memory)."""
    yield
    for server in _RUNNING:
        shut_down_kernel(server)


def _wait_ready(server: LabServer) -> None:
    try:
        wait_until_answering(f"{server.base}/api/status?token={server.token}", server.process, SERVER_START_S,
                             "JupyterLab", server.log_tail)
    except RuntimeError as e:
        pytest.fail(str(e))


# ------------------------------------------------------------------------------------------ the browser
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per module (Debian's; Playwright never downloads one here). Not one per
    session: while Playwright's sync API is open, its event loop counts as running in this thread, so a
    later test's ``asyncio.run()`` on the same xdist worker would fail."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=find_chromium(), headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    page = new_page(browser)
    yield page
    page.context.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """A failing test leaves what the browser showed: ``FAILED-<test>[-<n>].png`` per open page.

    Taken here, while the test's pages are still open (fixture teardown would close them first).
    """
    report = yield
    chromium = getattr(item, "funcargs", {}).get("browser")
    if report.when == "call" and report.failed and chromium is not None:
        pages = [p for context in chromium.contexts for p in context.pages]
        name = item.name.replace("/", "_").replace("[", "-").replace("]", "")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for i, pg in enumerate(pages):
            suffix = f"-{i}" if len(pages) > 1 else ""
            try:
                pg.screenshot(path=str(ARTIFACTS / f"FAILED-{name}{suffix}.png"))
            except Exception as exc:  # a crashed page must not hide the real failure
                print(f"could not save a failure screenshot: {exc}")
    return report

