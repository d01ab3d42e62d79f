"""Errors raised while finding and loading a model.

They subclass the built-in error a user would expect (``FileNotFoundError``, ``ValueError``) so generic
``except`` clauses still work, and ``ModelLoadError`` lets callers catch every loading problem at once.
"""

from __future__ import annotations


class ModelLoadError(Exception):
    """Base class: anything that stops a model from loading."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """No model at that name/path/hub id, or a required file (config, weights, tokenizer) is missing."""


class UnsupportedModelError(ModelLoadError, ValueError):
    """The model exists but uses an architecture or option minengine does not implement."""


class WeightMismatchError(ModelLoadError, ValueError):
    """The checkpoint's tensor names or shapes do not match the module built from its config."""
