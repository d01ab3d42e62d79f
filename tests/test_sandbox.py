"""The autograder's sandbox (minengine/course/sandbox.py): what a student's kernel can and cannot reach.

A kernel is started exactly as autograde starts one (the sandboxed kernel manager, through nbclient, with
its working folder inside a course directory), and one cell tries what an attacking submission would:
read the gradebook and the sources, write outside its folder, reach the grader's loopback, see the
grader's processes and environment, take all the memory. The whole class graded through the sandbox is
tests/test_grading.py (its attacking students included).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import nbformat
import pytest

from minengine.course import sandbox
from minengine.course.sandbox import (
    SandboxError,
    SandboxLimits,
    bwrap_arguments,
    python_paths,
    sandbox_problem,
    sandboxed_kernel_manager_class,
)

ROOT = Path(__file__).resolve().parents[1]
needs_sandbox = pytest.mark.skipif(sandbox_problem() is not None, reason=str(sandbox_problem()))
SECRET_ENV = {"MINENGINE_COURSE_SEED": "the class's secret", "JUPYTERHUB_API_TOKEN": "instructor-token"}

PROBE = r'''
import json, os, socket, pathlib
facts = {"uid": os.getuid(), "cwd": os.getcwd()}
for name, path in PATHS.items():
    facts["sees_" + name] = os.path.exists(path)
for name, path in WRITES.items():
    try:
        pathlib.Path(path).write_text("planted")
        facts["wrote_" + name] = True
    except OSError:
        facts["wrote_" + name] = False
facts["env"] = sorted(os.environ)
try:
    socket.create_connection(("127.0.0.1", HOST_PORT), timeout=2).close()
    facts["reached_grader_loopback"] = True
except OSError:
    facts["reached_grader_loopback"] = False
inside = socket.socket()
inside.bind(("127.0.0.1", 0))
inside.listen()
socket.create_connection(inside.getsockname(), timeout=2).close()
facts["own_loopback_works"] = True
facts["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
try:
    hog = bytearray(HOG_BYTES)
    facts["memory_bounded"] = False
except MemoryError:
    facts["memory_bounded"] = True
import minengine.course.autocheck  # the grading code itself is there to import
print(json.dumps(facts))
'''


def run_probe(tmp_path: Path, limits: SandboxLimits) -> dict:
    course = tmp_path / "course"
    workdir = course / "autograded" / "alice" / "quiz1"
    workdir.mkdir(parents=True)
    (course / "gradebook.db").write_text("every grade")
    (course / "source" / "quiz1").mkdir(parents=True)
    (course / "source" / "quiz1" / "quiz1.ipynb").write_text("every key")
    (course / "submitted" / "bob" / "quiz1").mkdir(parents=True)
    paths = {"gradebook": course / "gradebook.db", "source": course / "source",
             "other_students": course / "submitted" / "bob", "repo_labs": ROOT / "labs",
             "repo_tests": ROOT / "tests", "home_ssh": Path.home() / ".ssh"}
    writes = {"course": course / "planted.txt", "repo": ROOT / "minengine" / "planted.txt",
              "own_folder": workdir / "scratch.txt"}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    code = (f"PATHS = {json.dumps({k: str(v) for k, v in paths.items()})}\n"
            f"WRITES = {json.dumps({k: str(v) for k, v in writes.items()})}\n"
            f"HOST_PORT = {listener.getsockname()[1]}\nHOG_BYTES = {2 * limits.memory_bytes}\n" + PROBE)
    manager = type("Limited", (sandboxed_kernel_manager_class(),), {"limits": limits})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    from nbclient import NotebookClient

    saved = {k: os.environ.get(k) for k in SECRET_ENV}
    os.environ.update(SECRET_ENV)
    try:
        NotebookClient(nb, timeout=60, kernel_manager_class=manager, allow_errors=False,
                       resources={"metadata": {"path": str(workdir)}}).execute()
    finally:
        listener.close()
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    (out,) = [o for o in nb.cells[0].outputs if o.get("name") == "stdout"]
    facts = json.loads(out.text.strip().splitlines()[-1])
    facts["planted_outside"] = [k for k, p in writes.items() if k != "own_folder" and p.exists()]
    for p in writes.values():
        p.unlink(missing_ok=True)
    return facts


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if sandbox_problem() is not None:
        pytest.skip(str(sandbox_problem()))
    return run_probe(tmp_path_factory.mktemp("sandbox"), SandboxLimits(memory_bytes=2**30))


@needs_sandbox
def test_the_kernel_sees_no_course_files_and_no_repository_sources(probe: dict) -> None:
    for name in ("gradebook", "source", "other_students", "repo_labs", "repo_tests", "home_ssh"):
        assert probe[f"sees_{name}"] is False, name


@needs_sandbox
def test_the_kernel_writes_only_its_own_folder(probe: dict) -> None:
    assert probe["wrote_own_folder"] is True
    assert probe["wrote_repo"] is False  # read-only
    # The course directory's path exists in the sandbox only as empty folders in its own memory, leading
    # to the submission: a file written there vanishes with the kernel.
    assert probe["planted_outside"] == []


@needs_sandbox
def test_the_kernel_has_its_own_loopback_and_no_other_network(probe: dict) -> None:
    assert probe["own_loopback_works"] is True  # lab 3's server runs on it
    assert probe["reached_grader_loopback"] is False


@needs_sandbox
def test_the_kernel_runs_as_nobody_alone_with_a_clean_environment(probe: dict) -> None:
    assert probe["uid"] == 65534
    assert probe["processes"] == [1, 2]  # bwrap's init and the kernel: no grader, no other student
    for secret in SECRET_ENV:
        assert secret not in probe["env"]
    set_by_the_sandbox = {"HOME", "USER", "LOGNAME", "PATH", "MPLCONFIGDIR", "IPYTHONDIR", "TMPDIR",
                          "PYTHONNOUSERSITE", "JPY_PARENT_PID"}
    set_by_ipykernel = {"CLICOLOR", "CLICOLOR_FORCE", "FORCE_COLOR", "GIT_PAGER", "PAGER", "TERM",
                        "MPLBACKEND", "PYDEVD_USE_FRAME_EVAL", "PWD"}
    assert set(probe["env"]) <= set(sandbox.ENV_KEEP) | set_by_the_sandbox | set_by_ipykernel


@needs_sandbox
def test_the_kernels_memory_is_bounded(probe: dict) -> None:
    assert probe["memory_bounded"] is True


# ------------------------------------------------------------------------------------ the parts alone
def test_a_readable_path_that_holds_the_course_is_refused(tmp_path: Path) -> None:
    workdir = tmp_path / "course" / "autograded" / "alice" / "quiz1"
    with pytest.raises(SandboxError, match="course directory"):
        bwrap_arguments(workdir, tmp_path / "private", {}, [tmp_path], SandboxLimits())
    args = bwrap_arguments(workdir, tmp_path / "private", {"PATH": "/x", **SECRET_ENV, "LANG": "C.UTF-8"},
                           [Path(sys.prefix)], SandboxLimits())
    env = {args[i + 1]: args[i + 2] for i, a in enumerate(args) if a == "--setenv"}
    assert "LANG" in env and not set(SECRET_ENV) & set(env)
    assert "--unshare-all" in args and "--clearenv" in args and "--die-with-parent" in args


def test_the_python_paths_leave_out_the_repository() -> None:
    paths = python_paths()
    assert ROOT / "minengine" in paths
    assert ROOT not in paths and not any(p in ROOT.parents for p in paths if p != Path("/"))
    assert Path("/") not in paths


def test_a_machine_without_bubblewrap_gets_a_clear_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.shutil, "which", lambda tool: None)
    sandbox.sandbox_problem.cache_clear()
    try:
        problem = sandbox.sandbox_problem()
        assert problem and "bwrap" in problem and "apt-get install bubblewrap" in problem
        monkeypatch.setenv(sandbox.SANDBOX_ENV, "on")
        with pytest.raises(SandboxError, match="--no-sandbox"):
            sandbox.require_sandbox()
        monkeypatch.setenv(sandbox.SANDBOX_ENV, "off")
        sandbox.require_sandbox()  # turned off on purpose: no complaint
    finally:
        sandbox.sandbox_problem.cache_clear()
