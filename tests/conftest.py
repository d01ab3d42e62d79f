"""Shared fixtures: tiny random HF models saved once per test session (no downloads); and how the suite
shares this machine's cores when ``make test`` runs it on several pytest-xdist workers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Without a GPU, Triton kernels run in Triton's interpreter (numpy on real CPU tensors): the GPU's own
# attention kernels are then tested here on every commit. Triton reads this when a kernel is defined,
# so it is set before any test imports one; subprocesses (servers, notebook kernels) inherit it.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``hf_model_dir(family)`` -> folder of a saved random-weight HF model (built on first use)."""
    from hf_utils import build_hf_model, save_hf_model

    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            path = tmp_path_factory.mktemp(f"hf-{family}")
            cache[family] = save_hf_model(build_hf_model(family), path)
        return cache[family]

    return get


@pytest.fixture(scope="module")
def torch_one_thread():
    """Run a module's tiny-model tests on one intra-op thread.

    For models this small, a second OpenMP thread only adds synchronisation; on a busy 2-core machine it
    made each op ~1000x slower (spin-waiting on a descheduled thread). Restored afterwards.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.hookimpl(trylast=True)  # after tests/browser/conftest.py has marked what it must skip
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run each lesson once per session. Where a browser test of this session will Run All Cells of a
    lesson (Chromium present, the test selected: it carries ``runs_lesson``), that run checks everything
    the headless run does (no error or printed traceback, every must-hold claim, the same time limit)
    and more (no stderr, plots on screen), so the headless run of that lesson steps aside: two runs of
    the ten lessons were ~15 of the suite's ~40 minutes on 2 cores. A session without those browser
    tests runs every lesson headless, and ``make book`` runs any lesson the tests left unexecuted.
    Then the longest files go first (``LONGEST_FIRST``)."""
    in_browser = {marker.args[0]: item.nodeid for item in items
                  if (marker := item.get_closest_marker("runs_lesson"))
                  and not item.get_closest_marker("skip")}
    for item in items:
        if getattr(item, "originalname", "") != "test_lesson_runs_headless":
            continue
        stem = Path(item.callspec.params["path"]).stem
        if stem in in_browser:
            item.add_marker(pytest.mark.skip(reason=f"{stem} runs in the browser in this session "
                                                    f"({in_browser[stem]})"))
    longest_first(config, items)


# ------------------------------------------------------------------ several workers (pytest-xdist)
# ``make test`` runs ``pytest -n auto --dist loadfile --no-loadscope-reorder``: one worker per usable core
# (at most 4), each test file on one worker, so a module's fixtures (an engine, a graded class, a
# JupyterLab server) are still built once. Most of the suite is end-to-end runs that use one core at a
# time (a kernel, a server, Chromium waiting on it), so two workers on two cores finish in about two
# thirds of the time. Files are handed out in this order, the longest first, so no worker starts an
# hour-long file last; the rest follow in their usual order. Seconds: pytest --durations, one worker,
# 2 cores, 2026-12-05.
LONGEST_FIRST = (
    "tests/browser/test_browser_lessons.py",  # 363 s: the ten lessons in Chromium
    "tests/test_grading.py",  # 363 s: a class of 70 planted submissions autograded
    "tests/test_lessons.py",  # 234 s where Chromium is missing (the lessons run here instead); else 1 s
    "tests/test_smollm2.py",  # 96 s: HF generate() as the oracle
    "tests/test_grading_keys.py",  # 68 s: a second course seed graded
    "tests/browser/test_browser_lab_validate.py",  # 61 s
    "tests/test_server_grader.py",  # 51 s
    "tests/test_hub.py",  # 51 s
)


def worker_count(config: pytest.Config) -> int:
    """How many xdist workers this session runs (1 without xdist)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) if hasattr(config, "workerinput") else 1


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core this process may use (a container may allow fewer than the
    machine has), at most 4: each worker holds torch, and some tests start kernels and servers."""
    from minengine.course.autograde_pool import usable_cores

    return min(4, usable_cores())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "alone: timing-sensitive; under xdist no other test runs beside it")
    workers = worker_count(config)
    if workers > 1:  # each worker's own matmuls on its share of the cores: two workers each spinning
        import torch  # two OpenMP threads on two cores slow every small op by orders of magnitude

        from minengine.course.autograde_pool import usable_cores

        torch.set_num_threads(max(1, usable_cores() // workers))


def longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the files of ``LONGEST_FIRST`` first, in its order (a stable sort: every worker must collect
    the same order)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = Path(str(config.rootpath))
    items.sort(key=lambda item: rank.get(Path(str(item.path)).relative_to(root).as_posix(), len(rank)))


@pytest.fixture(autouse=True)
def _share_the_machine(request: pytest.FixtureRequest,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Under xdist, a test marked ``alone`` holds the machine to itself; every other test holds a share.

    Two lock files shared by the workers: a test takes the gate, then the room (shared, or exclusive
    when ``alone``), and an ordinary test lets the gate go once it is in. So an ``alone`` test that
    waits at the gate lets no new test in and starts when the running ones end (a plain shared lock
    could leave it waiting as long as the other worker keeps starting tests). A module's fixtures are
    built before this runs, so ``alone`` covers the test itself."""
    if worker_count(request.config) == 1:
        yield
        return
    import fcntl  # POSIX; xdist runs come from make test

    shared = tmp_path_factory.getbasetemp().parent  # the session's folder, above each worker's own
    alone = request.node.get_closest_marker("alone") is not None
    with open(shared / "machine.gate", "a") as gate, open(shared / "machine.room", "a") as room:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)
