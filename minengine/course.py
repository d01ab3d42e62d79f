"""Course tooling: ``python -m minengine.course open`` sets up a learner's workspace and starts JupyterLab.

The learner never edits the files under version control: lessons are copied into a git-ignored
``workspace/`` once, so ``git pull`` can update the course without clobbering anyone's notes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LESSONS_DIR = REPO_ROOT / "lessons"
WORKSPACE_DIR = REPO_ROOT / "workspace"

# Flags that keep JupyterLab quiet and offline: no update checks, no news feed.
OFFLINE_LAB_FLAGS = [
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    "--LabApp.news_url=None",
]


def prepare_workspace(workspace: Path = WORKSPACE_DIR, lessons: Path = LESSONS_DIR) -> list[Path]:
    """Copy lessons that the workspace does not have yet; never overwrite a learner's copy.

    Returns the notebooks that were newly copied.
    """
    target = workspace / "lessons"
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for src in sorted(lessons.glob("*.ipynb")):
        dst = target / src.name
        if not dst.exists():
            shutil.copy2(src, dst)
            copied.append(dst)
    return copied


def open_course(lab_args: list[str], workspace: Path = WORKSPACE_DIR) -> int:
    copied = prepare_workspace(workspace)
    if copied:
        print(f"Copied {len(copied)} lesson(s) into {workspace / 'lessons'}")
    print(f"Starting JupyterLab in {workspace} (Ctrl+C to stop) ...", flush=True)
    env = dict(os.environ)
    # Offline by default: the shipped model never needs the network, and a hub lookup would hang.
    env.setdefault("HF_HUB_OFFLINE", "1")
    # The venv's bin on PATH, so notebooks' shell commands and nbgrader's alembic find their tools.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace}", *OFFLINE_LAB_FLAGS,
           *lab_args]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in lab_args:
        cmd.append("--allow-root")  # containers and CI often run as root; JupyterLab refuses otherwise
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minengine.course", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_open = sub.add_parser("open", help="prepare workspace/ and start JupyterLab (extra args go to JupyterLab)")
    p_open.add_argument("--workspace", type=Path, default=WORKSPACE_DIR)
    args, rest = parser.parse_known_args(argv)
    if args.command == "open":
        return open_course(rest, args.workspace)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
