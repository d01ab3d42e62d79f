"""Autograde runs each student's kernel in a bubblewrap sandbox: the submission cannot see the keys.

Why: nbgrader runs a submission's code in a kernel started by the grader, with the grader's rights. Left
there, a student's cell could read ``source/`` (every key), ``gradebook.db`` (every grade and the hidden
tests), other students' work, the instructor's home and environment (a JupyterHub API token), and the
network. nbgrader's docs ask for autograding in a sandbox; this module is that sandbox.

Each kernel starts under Debian's ``bwrap`` (bubblewrap, the sandbox Flatpak uses), as ``prlimit -- bwrap
... -- python -m ipykernel_launcher``. Inside, the kernel

* sees, read-only, only what grading needs: the system's programs and libraries, this Python and its
  packages, minengine's own code and its built CPU kernels. Not the course directory, not the repository's
  sources, not the home folder;
* has one folder it may write: its own copy of the submission (nbgrader's ``autograded/<student>/<id>/``,
  where a lab writes its server file), plus an empty ``/tmp`` of bounded size;
* is in its own network namespace, where 127.0.0.1 works (lab 3's server) and nothing else does;
* is in its own PID namespace as user ``nobody`` with no capabilities, so it cannot see or signal the
  grader, and dies with it;
* has bounded memory (``RLIMIT_DATA``), CPU time and file size, on top of nbgrader's per-cell timeout;
* gets a cleared environment with only the variables a kernel needs (never the course seed or a token).

The kernel talks to nbgrader over Unix sockets in a private folder (ZeroMQ's ``ipc`` transport), since
its network namespace has no path to the grader's loopback, and is interrupted by a message on its
control channel (a signal to ``bwrap`` would not reach it).

:func:`sandbox_problem` says why a machine cannot sandbox (no ``bwrap``, no user namespaces); autograde
then refuses to grade a class rather than quietly run students' code unconfined (``--no-sandbox`` is the
explicit way to grade trusted notebooks there).
"""

from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Set to "off" (grading.autograde(sandbox=False), `--no-sandbox`) to run kernels unconfined.
SANDBOX_ENV = "MINENGINE_GRADING_SANDBOX"
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; `make setup` does "
                "it when run as root)")
# Environment a kernel keeps; everything else is cleared (bwrap_arguments sets HOME, PATH and a few more).
ENV_KEEP = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "TQDM_DISABLE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PYTHONHASHSEED",
            "PYDEVD_DISABLE_FILE_VALIDATION", "MINENGINE_CPU_KERNELS", "MINENGINE_KERNELS_DIR",
            "MINENGINE_GGUF_DIR", "MINENGINE_LESSON_MODEL", "MINENGINE_HEADLESS", "TRITON_INTERPRET",
            "XDG_CACHE_HOME", "NBGRADER_EXECUTION")
# System paths a Python kernel needs, read-only, where they exist.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/sys")
ETC_FILES = ("/etc/passwd", "/etc/group", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ld.so.cache",
             "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/mime.types", "/etc/fonts")


class SandboxError(RuntimeError):
    """The sandbox cannot start a kernel here; the message says why and what to install."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-kernel bounds. Memory is the kernel's data segment (heap and private mappings, where torch's
    tensors live); CPU time counts every thread (a lab's two servers included)."""

    memory_bytes: int = 8 * 2**30
    cpu_seconds: int = 1800
    file_bytes: int = 2**30
    tmp_bytes: int = 2**30


def limits_from_env() -> SandboxLimits:
    """The default limits, with memory from ``MINENGINE_SANDBOX_MEMORY_GB`` when set (a bigger lab)."""
    gigabytes = os.environ.get("MINENGINE_SANDBOX_MEMORY_GB", "").strip()
    if not gigabytes:
        return SandboxLimits()
    try:
        return SandboxLimits(memory_bytes=int(float(gigabytes) * 2**30))
    except ValueError:
        raise SandboxError(f"MINENGINE_SANDBOX_MEMORY_GB={gigabytes!r} is not a number of GiB") from None


def sandbox_enabled() -> bool:
    return os.environ.get(SANDBOX_ENV, "on").strip().lower() not in ("off", "0", "no", "false")


@functools.cache
def sandbox_problem() -> str | None:
    """None when a trial sandbox starts here; else a sentence that says why not and what to do."""
    for tool in ("bwrap", "prlimit"):
        if shutil.which(tool) is None:
            why = INSTALL_HINT if tool == "bwrap" else "install util-linux's prlimit"
            return f"autograde runs each submission in a sandbox, and `{tool}` is not on this machine: {why}"
    trial = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/",
             "--proc", "/proc", "--dev", "/dev", "--", "true"]
    try:
        done = subprocess.run(trial, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap could not start a trial sandbox ({e})"
    if done.returncode != 0:
        return (f"bubblewrap is installed but cannot make a sandbox here ({done.stderr.strip() or 'exit '}"
                f"{done.returncode}): this kernel or container forbids unprivileged user namespaces "
                "(on Debian/Ubuntu: `sysctl kernel.unprivileged_userns_clone=1`; in Docker: run with "
                "`--security-opt seccomp=unconfined` or grade on the host)")
    return None


def require_sandbox() -> None:
    """Raise :class:`SandboxError` unless kernels can be sandboxed here (or the sandbox is turned off)."""
    if sandbox_enabled():
        problem = sandbox_problem()
        if problem:
            raise SandboxError(f"{problem}. To grade without a sandbox anyway (only notebooks you trust: "
                               "your own, or a demo), pass --no-sandbox (make autograde NO_SANDBOX=1).")


def _real(path: str | Path) -> Path | None:
    p = Path(path)
    return p.resolve() if p.exists() else None


def python_paths() -> list[Path]:
    """What this Python and its packages are made of: the interpreter's prefix, the environment, every
    site-packages folder, and minengine's own package folder (an editable install lives in the repository,
    whose other folders stay hidden)."""
    import minengine

    found = [sys.base_prefix, sys.prefix, sys.exec_prefix, Path(sys.executable).parent,
             Path(sys.executable).resolve().parent, *site.getsitepackages(),
             Path(minengine.__file__).parent]
    from minengine.models import data_dirs

    for kind, env_var in (("kernels", "MINENGINE_KERNELS_DIR"), ("gguf", "MINENGINE_GGUF_DIR")):
        found.extend(data_dirs.roots(kind, env_var))
    found.append(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minengine")
    return sorted({r for p in found if (r := _real(p)) is not None})


def _is_inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def bwrap_arguments(workdir: Path, private: Path, env: Mapping[str, str], readable: Iterable[Path],
                    limits: SandboxLimits, hidden: Iterable[Path] = ()) -> list[str]:
    """The ``bwrap`` options for one kernel. ``workdir`` (the submission's copy) and ``private`` (the
    kernel's sockets and home) are the only writable folders besides ``/tmp``. A readable path that would
    show ``workdir``'s parent (the course directory) is refused: the whole point is that it stays hidden.
    Each ``hidden`` folder inside a readable one shows up empty (lab 3's answer does not see
    ``minengine.server``)."""
    workdir, private = workdir.resolve(), private.resolve()
    args = ["bwrap", "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    for path in SYSTEM_PATHS + ETC_FILES:
        args += ["--ro-bind-try", path, path]
    for path in readable:
        if _is_inside(workdir.parent, path):
            raise SandboxError(f"the sandbox would show {path}, which holds the course directory "
                               f"({workdir.parent}): install Python or the course elsewhere")
        args += ["--ro-bind", str(path), str(path)]
    for folder in hidden:
        args += ["--tmpfs", str(Path(folder).resolve()), "--remount-ro", str(Path(folder).resolve())]
    args += ["--bind", str(private), str(private), "--bind", str(workdir), str(workdir),
             "--chdir", str(workdir)]
    kept = {k: v for k, v in env.items() if k in ENV_KEEP}
    # HOME stays where it was, so ~/.cache/minengine (bound read-only above) is where the code looks; only
    # what was bound exists there.
    kept |= {"HOME": str(Path.home()), "USER": "nobody", "LOGNAME": "nobody",
             "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin",
                                      "/bin"]),
             "MPLCONFIGDIR": str(private / "matplotlib"), "IPYTHONDIR": str(private / "ipython"),
             "TMPDIR": "/tmp", "PYTHONNOUSERSITE": "1",
             # The grader's PID means nothing in the kernel's PID namespace; 1 turns ipykernel's parent
             # poller off (--die-with-parent does its job) and keeps its connection banner quiet.
             "JPY_PARENT_PID": "1"}
    for key, value in sorted(kept.items()):
        args += ["--setenv", key, value]
    return args


def sandboxed_command(kernel_cmd: list[str], workdir: Path, private: Path, env: Mapping[str, str],
                      limits: SandboxLimits | None = None, hidden: Iterable[Path] = ()) -> list[str]:
    """``kernel_cmd`` under ``prlimit`` and ``bwrap``. Matplotlib's font list is copied into the kernel's
    private folder, so its first plot does not rebuild it (which logs to stderr: a zero in a test cell)."""
    limits = limits or SandboxLimits()
    fonts = private / "matplotlib"
    fonts.mkdir(exist_ok=True)
    for cache in (Path(os.environ.get("MPLCONFIGDIR", "/nonexistent")),
                  Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "matplotlib"):
        for font_list in cache.glob("fontlist-*.json") if cache.is_dir() else []:
            shutil.copy2(font_list, fonts / font_list.name)
    # python_paths() covers this interpreter; a kernel spec naming another one is bound too.
    interpreter = [p for p in (_real(kernel_cmd[0]),) if p is not None and p.is_file()]
    readable = python_paths() + [p.parent for p in interpreter]
    readable = sorted({p for p in readable if not any(_is_inside(p, q) for q in readable if q != p)})
    limit = ["prlimit", f"--data={limits.memory_bytes}", f"--cpu={limits.cpu_seconds}",
             f"--fsize={limits.file_bytes}", "--core=0", "--"]
    return limit + bwrap_arguments(workdir, private, env, readable, limits, hidden) + ["--", *kernel_cmd]


# --------------------------------------------------------------------------------- nbgrader's side
@functools.cache
def sandboxed_kernel_manager_class() -> type:
    """jupyter_client's kernel manager, launching its kernel in the sandbox (built on first use)."""
    from jupyter_client.manager import AsyncKernelManager

    class SandboxedKernelManager(AsyncKernelManager):
        """A kernel in the sandbox, on Unix sockets in a private folder, interrupted by message."""

        limits: SandboxLimits | None = None  # None: limits_from_env()

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.private_dir = Path(tempfile.mkdtemp(prefix="minengine-kernel-"))
            self.transport = "ipc"
            self.connection_file = str(self.private_dir / "kernel.json")
            self.ip = str(self.private_dir / "ipc")

        async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
            require_sandbox()
            assert self.kernel_spec is not None
            self.kernel_spec.interrupt_mode = "message"  # SIGINT to bwrap would not reach the kernel
            workdir = Path(kw.get("cwd") or os.getcwd())
            kernel_cmd = sandboxed_command(kernel_cmd, workdir, self.private_dir, kw.get("env") or os.environ,
                                           self.limits or limits_from_env())
            await super()._async_launch_kernel(kernel_cmd, **kw)

        async def _async_cleanup_resources(self, restart: bool = False) -> None:
            await super()._async_cleanup_resources(restart=restart)
            if not restart:
                shutil.rmtree(self.private_dir, ignore_errors=True)

        cleanup_resources = _async_cleanup_resources  # AsyncKernelManager names the base's method

    return SandboxedKernelManager


@functools.cache
def sandboxed_execute_preprocessor() -> type:
    """nbgrader's ``Execute`` step with its kernels in the sandbox (unless the sandbox is turned off), and
    the lab test cells marked for it run in the grader (``minengine.course.grader_side_tests``)."""
    from nbgrader import utils
    from nbgrader.preprocessors import Execute

    from minengine.course.grader_side_tests import grader_side_cell, is_grader_side

    class SandboxedExecute(Execute):
        """``Execute``, configured as ``c.Execute`` is, with :class:`SandboxedKernelManager` kernels."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if sandbox_enabled():
                require_sandbox()
                kwargs.setdefault("kernel_manager_class", sandboxed_kernel_manager_class())
            super().__init__(*args, **kwargs)

        def preprocess(self, nb: Any, resources: Any = None, km: Any = None) -> tuple[Any, dict]:
            try:
                return super().preprocess(nb, resources, km)
            finally:  # the kernel is shut down: lab 2's results file holds only what the grader recorded
                from minengine.course import server_grader

                server_grader.end_grading()  # lab 3's servers for this notebook
                folder = (resources or {}).get("metadata", {}).get("path")
                if folder:
                    from minengine.course.policy_scoring import rewrite_results

                    rewrite_results(folder)

        def preprocess_cell(self, cell: Any, resources: dict, index: int) -> tuple[Any, dict]:
            if cell.cell_type == "code" and utils.is_grade(cell) and is_grader_side(cell):
                self._check_assign_resources(resources)
                # lab 3's student server: sandboxed like the kernel
                confine = (functools.partial(sandboxed_command, limits=limits_from_env())
                           if sandbox_enabled() else None)
                return grader_side_cell(self, cell, confine), self.resources
            return super().preprocess_cell(cell, resources, index)

    return SandboxedExecute
