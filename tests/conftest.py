"""Shared fixtures: tiny random HF models saved once per test session (no downloads)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


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
