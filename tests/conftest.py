"""Shared fixtures: tiny random HF models saved once per test session (no downloads)."""

from __future__ import annotations

import os
from collections.abc import Callable
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
    tests runs every lesson headless, and ``make book`` runs any lesson the tests left unexecuted."""
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
