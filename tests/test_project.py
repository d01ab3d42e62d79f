"""The project's own set-up: environment.yml and pyproject.toml agree, the package imports lightly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _names(requirements: list[str]) -> set[str]:
    """Package names, leaving out pip options and requirements that only apply to old Pythons."""
    return {_name(r) for r in requirements if not r.startswith("-") and ";" not in r}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_names_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _names(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted |= _names(extra)

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = _names(pip_section)
    assert listed == wanted, (f"only in environment.yml: {listed - wanted}; only in pyproject: "
                              f"{wanted - listed}")


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make test" in ci


def test_light_import_does_not_load_torch():
    """`minengine kv` and friends must start fast: importing the package must not import torch."""
    code = "import sys, minengine; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
