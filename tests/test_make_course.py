"""`make course` really serves JupyterLab: start it headless, fetch /lab, stop it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest
from proc_utils import free_port, stop_process_group

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(180)
def test_make_course_serves_jupyterlab(tmp_path):
    port = free_port()
    args = (f"--workspace {tmp_path / 'ws'} --no-browser --ip=127.0.0.1 --port={port} "
            "--ServerApp.token=test-token --ServerApp.port_retries=0")
    log = (tmp_path / "lab.log").open("w")
    proc = subprocess.Popen(["make", "--no-print-directory", "course", f"ARGS={args}"], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        status = None
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/lab?token=test-token", timeout=5)
                status = r.status_code
                if status == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        output = (tmp_path / "lab.log").read_text()
        assert status == 200, f"JupyterLab did not answer 200 (last status {status}); log:\n{output[-3000:]}"
        assert "JupyterLab" in r.text
        # lessons were copied into the workspace, never edited in place
        assert sorted(p.name for p in (tmp_path / "ws" / "lessons").glob("*.ipynb")) == sorted(
            p.name for p in (ROOT / "lessons").glob("*.ipynb"))
        _check_student_versions(tmp_path / "ws")
        # the Validate button reads this from the server's cwd: every failing check, not just the first
        assert "c.Validator.validate_all = True" in (tmp_path / "ws" / "nbgrader_config.py").read_text()
        assert "not a subdirectory of the notebook server root" not in output
    finally:
        stop_process_group(proc)
        log.close()


def _check_student_versions(ws: Path) -> None:
    """Every lab and quiz sits in the workspace as its nbgrader student version, never as the source."""
    for kind in ("labs", "quizzes"):
        sources = sorted(p.relative_to(ROOT / kind) for p in (ROOT / kind).glob("*/*.ipynb"))
        assert sorted(p.relative_to(ws / kind) for p in (ws / kind).glob("*/*.ipynb")) == sources
        for rel in sources:
            text = (ws / kind / rel).read_text()
            for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
                assert marker not in text, f"{kind}/{rel} in the workspace contains {marker!r}"
            assert "NotImplementedError" in text  # the answers are stubs for the learner to fill in
            for data in (ROOT / kind / rel.parent).iterdir():  # data files come along; the key maker does not
                if data.name.startswith(".") or data.name == "__pycache__":
                    continue
                assert (ws / kind / rel.parent / data.name).exists() == (data.name != "params.py"), data.name

