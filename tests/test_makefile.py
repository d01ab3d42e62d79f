"""Every Makefile target works from a fresh clone (README: "make course" and "make test" are all you need).

Read from make's own database (``make -p``), so variables are expanded as make expands them. Each target:

- dry-runs (``make -n``) as on a fresh clone, with no environment set up yet, so the set-up recipe is in it;
- names only files and folders a fresh clone has (git's tracked files), and only ``minengine`` modules and
  pyproject extras that exist: ``make test-hub`` once named a test file that had moved away, and nothing
  noticed until someone ran it;
- is listed by ``make help``.

The cheap ones then run for real against the environment running these tests (``help``, ``lint``,
``browser``, ``clean-venv`` on a throw-away folder, and ``kernels`` / ``models`` where they are already
built, as ``make test`` leaves them). The rest start JupyterLab, install packages, grade a class or run
the suite itself, so their dry run is what is checked here; ``make test-hub`` runs as itself.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="no make on PATH (README: the project needs make)")

# Folders a recipe may name that a fresh clone does not have: make and the course tools create them.
GENERATED = {".venv", "build", "workspace"}
SPECIAL_TARGETS = {".PHONY", ".SUFFIXES", ".DEFAULT", ".PRECIOUS", ".INTERMEDIATE", ".SECONDARY",
                   ".DELETE_ON_ERROR", ".NOTPARALLEL", ".ONESHELL", ".POSIX", ".SILENT", ".IGNORE",
                   ".EXPORT_ALL_VARIABLES", ".LOW_RESOLUTION_TIME", ".SECONDEXPANSION", "Makefile"}
PATH_TOKEN = re.compile(r"^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.*-]*)+$")  # relative, at least one slash
EXTRAS_TOKEN = re.compile(r"^\.\[([A-Za-z0-9_,-]+)\]$")  # pip install -e ".[course,dev]"
# Every target (the .PHONY list; a test keeps the two equal), so each one's dry run is a test of its own.
TARGETS = ["course", "test", "test-browser", "test-hub", "setup", "kernels", "models", "browser", "sandbox",
           "hub-proxy", "lint", "help", "release", "autograde", "feedback", "export", "validate", "grade",
           "book", "clean-venv"]


# ------------------------------------------------------------------------------------- make, read
@cache
def clean_environment() -> dict[str, str]:
    """This process's environment without what an outer make passes down (``make test BROWSER_INSTALL=0``
    exports the override, and MAKEFLAGS carries it and the job server), so each check sees the defaults."""
    settable = set(re.findall(r"^(\w+)\s*\?=", (ROOT / "Makefile").read_text(), flags=re.M))
    dropped = settable | {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "GNUMAKEFLAGS"}
    return {k: v for k, v in os.environ.items() if k not in dropped}


def make(*args: str, venv: Path | None = None, timeout_s: float = 120, **env: str
         ) -> subprocess.CompletedProcess:
    """``make -C ROOT args`` (with ``VENV=venv`` when given), its output as text."""
    cmd = [MAKE, "--no-print-directory", "-C", str(ROOT), *args]
    if venv is not None:
        cmd.append(f"VENV={venv}")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                          env={**clean_environment(), **env})


@cache
def fresh_venv() -> Path:
    """A VENV that does not exist, as on a fresh clone before the first make."""
    return Path("/nonexistent-minengine-venv") / f"fresh-{os.getpid()}"


@cache
def rules() -> dict[str, list[str]]:
    """target -> prerequisites, from make's database (variables expanded, as on a fresh clone)."""
    done = make("-pRrn", "help", venv=fresh_venv())
    assert done.returncode == 0, done.stderr
    text = done.stdout
    start, end = text.index("\n# Files\n"), text.index("\n# Finished Make data base")
    found: dict[str, list[str]] = {}
    previous = ""
    for line in text[start:end].splitlines():
        match = re.match(r"^([^\s#=:][^=:]*?):(?!=)\s*(.*)$", line)
        if match and previous != "# Not a target:":
            name = match.group(1).strip()
            if name not in SPECIAL_TARGETS:
                found[name] = match.group(2).split()
        previous = line
    return found


@cache
def phony() -> list[str]:
    done = make("-pRrn", "help", venv=fresh_venv())
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith(".PHONY:")]
    return line.split(":", 1)[1].split()


def dry_run(target: str, venv: Path | None = None) -> list[str]:
    """The commands ``make -n target`` would run, one per logical line (continuations joined)."""
    done = make("-n", target, venv=venv or fresh_venv())
    assert done.returncode == 0, f"make -n {target} fails on a fresh clone:\n{done.stdout}\n{done.stderr}"
    return done.stdout.replace("\\\n", " ").splitlines()


@cache
def tracked() -> frozenset[str]:
    """What a fresh clone holds: git's tracked files and every folder above them, relative to ROOT."""
    done = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout, so what a fresh clone holds is unknown: {done.stderr.strip()}")
    names: set[str] = set()
    for line in done.stdout.splitlines():
        parts = line.split("/")
        names.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(names)


def extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def missing_references(commands: list[str], have: frozenset[str], extras_defined: set[str]) -> list[str]:
    """What these commands name that a fresh clone lacks: relative paths outside the generated folders,
    ``-m minengine...`` modules, pip extras. Comments (make -n prints a recipe's ``@#`` lines) are skipped."""
    problems = []
    for command in commands:
        try:
            words = shlex.split(command, comments=True)
        except ValueError as e:
            problems.append(f"cannot split {command!r}: {e}")
            continue
        for i, word in enumerate(words):
            if i and words[i - 1] == "-m" and word.split(".")[0] == "minengine":
                module = word.replace(".", "/")
                if not {f"{module}.py", f"{module}/__init__.py"} & have:
                    problems.append(f"module {word}: no {module}.py")
            if match := EXTRAS_TOKEN.match(word):
                problems += [f"pip extra [{e}]: not in pyproject.toml"
                             for e in match.group(1).split(",") if e not in extras_defined]
            for piece in word.split("="):  # VAR=path, --option=path
                path = piece.rstrip("/")
                if PATH_TOKEN.match(piece) and path.split("/")[0] not in GENERATED and path not in have:
                    problems.append(f"{piece}: not in a fresh clone")
    return problems


# ------------------------------------------------------------------------------------- the checks
def test_the_checker_finds_what_a_broken_recipe_names():
    """The check below can fail: the test-hub recipe as it was, a module and an extra that do not exist."""
    have, defined = tracked(), extras()
    broken = ["MINENGINE_HUB_LOAD=1 .venv/bin/python -m pytest tests/test_hub.py "
              "tests/browser/test_browser_hub.py -v",
              "python -m minengine.course.nowhere release --course-dir build/course",
              'python -m pip install -q -e ".[course,nosuchextra]"',
              "sh scripts/install_browser.sh  # scripts/not_there.sh is only a comment"]
    assert missing_references(broken, have, defined) == [
        "tests/browser/test_browser_hub.py: not in a fresh clone",
        "module minengine.course.nowhere: no minengine/course/nowhere.py",
        "pip extra [nosuchextra]: not in pyproject.toml"]


def test_every_target_is_phony_or_a_file_rule_and_every_phony_target_has_a_rule():
    targets, declared = set(rules()), set(phony())
    assert declared - targets == set(), "declared .PHONY without a rule"
    files = {t for t in targets - declared if "/" in t}  # the set-up stamp in the venv
    assert targets - declared - files == set(), "a rule that is neither .PHONY nor a file: make skips it " \
        "whenever a file of that name exists"
    assert [Path(f).name for f in files] == [".minengine-installed"]


def test_prerequisites_are_targets_or_files_of_a_fresh_clone():
    targets, have = set(rules()), tracked()
    for target, prerequisites in rules().items():
        for p in prerequisites:
            assert p in targets or p in have, f"{target} needs {p}, which a fresh clone does not have"


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_dry_runs_on_a_fresh_clone_naming_only_what_it_has(target: str):
    assert target in phony(), f"{target} is no longer a target: update this list"
    commands = dry_run(target)
    assert commands, f"make -n {target} would do nothing"
    if any(p == str(fresh_venv() / ".minengine-installed") for p in rules()[target]):
        assert any("pip install" in c for c in commands), f"{target} must set up {fresh_venv()} first"
    assert missing_references(commands, tracked(), extras()) == []


def test_the_parametrised_list_covers_every_target():
    assert sorted(phony()) == sorted(TARGETS)


def test_the_hub_target_runs_the_hub_module_with_the_load_test():
    (pytest_line,) = [c for c in dry_run("test-hub") if " -m pytest " in c]
    assert pytest_line.startswith("MINENGINE_HUB_LOAD=1 ")
    files = [w for w in shlex.split(pytest_line) if w.endswith(".py")]
    assert files == ["tests/test_hub.py"]
    source = (ROOT / "tests" / "test_hub.py").read_text()
    assert "def test_thirty_students_submit_at_once" in source and "@pytest.mark.browser" in source


def test_help_lists_every_target_and_only_targets():
    done = make("help")
    assert done.returncode == 0, done.stderr
    named: set[str] = set()
    for line in done.stdout.splitlines():
        if lead := re.match(r"^make ((?:[a-z][\w-]*)(?: \| [a-z][\w-]*)*)", line):
            named.update(lead.group(1).split(" | "))
        named.update(re.findall(r"\bmake ([a-z][\w-]*)", line))
    assert named - set(rules()) == set(), "help names targets that do not exist"
    assert set(phony()) - named - {"help"} == set(), "targets missing from make help"


# ------------------------------------------------------------------------------------- real runs
def this_venv() -> Path:
    """The environment running these tests, which the real runs use (never set up again here)."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("not running in a virtual environment, so no VENV for make to use")
    return Path(sys.prefix)


def run_target(target: str, timeout_s: float = 300, **env: str) -> subprocess.CompletedProcess:
    """``make target`` for real, on this environment; its set-up stamp is never remade (``-o``)."""
    venv = this_venv()
    return make("-o", str(venv / ".minengine-installed"), target, venv=venv, timeout_s=timeout_s, **env)


def test_lint_runs_and_passes():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed here (the dev extra)")
    done = run_target("lint")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All checks passed" in done.stdout


def test_browser_target_without_installing():
    assert dry_run("browser", venv=this_venv()) == ["sh scripts/install_browser.sh"]
    assert make("-n", "browser", "BROWSER_INSTALL=0").stdout.split() == ["true"]
    done = run_target("browser", BROWSER_INSTALL="0")
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


def test_browser_target_where_chromium_is_already_there():
    if not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome",
                                         "google-chrome-stable")):
        pytest.skip("no Chromium here, and installing one is not a cheap test (make test does it)")
    start = time.monotonic()
    done = run_target("browser")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "installing" not in done.stdout and time.monotonic() - start < 30


def test_sandbox_target_without_installing():
    assert dry_run("sandbox", venv=this_venv()) == ["sh scripts/install_sandbox.sh"]
    assert make("-n", "sandbox", "SANDBOX_INSTALL=0").stdout.split() == ["true"]
    done = run_target("sandbox", SANDBOX_INSTALL="0")
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


def test_sandbox_target_where_bubblewrap_is_already_there():
    if not shutil.which("bwrap"):
        pytest.skip("no bubblewrap here, and installing it is not a cheap test (make test does it)")
    done = run_target("sandbox")
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr


def test_hub_proxy_target_without_installing():
    assert dry_run("hub-proxy", venv=this_venv()) == ["sh scripts/install_hub_proxy.sh"]
    assert make("-n", "hub-proxy", "HUB_PROXY_INSTALL=0").stdout.split() == ["true"]
    done = run_target("hub-proxy", HUB_PROXY_INSTALL="0")
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
    assert "hub-proxy" in rules()["test"], "make test installs the proxy before pytest's workers start"


FAKE_NPM = r"""#!/bin/sh
# npm install --prefix DIR configurable-http-proxy@V, as slowly as a real one unpacks: the link to the
# proxy first, its dependency's code a moment later (the half-installed state a CI run once started).
while [ "$1" != "--prefix" ]; do shift; done
prefix="$2"; version="${3#*@}"
mods="$prefix/node_modules"
mkdir -p "$mods/.bin" "$mods/configurable-http-proxy/bin" "$mods/http-proxy-3/dist/lib"
printf '#!/bin/sh\ntest -f "$(dirname "$0")/../http-proxy-3/dist/lib/index.js"\n' \
    > "$mods/configurable-http-proxy/bin/configurable-http-proxy"
chmod +x "$mods/configurable-http-proxy/bin/configurable-http-proxy"
ln -s ../configurable-http-proxy/bin/configurable-http-proxy "$mods/.bin/configurable-http-proxy"
printf '{"version": "%s"}\n' "$version" > "$mods/configurable-http-proxy/package.json"
echo "$$" >> "$prefix/../npm-runs"
sleep 1
echo "module.exports = {}" > "$mods/http-proxy-3/dist/lib/index.js"
"""


def test_proxy_installers_running_at_once_never_leave_a_half_installed_proxy(tmp_path: Path):
    """pytest's workers each collect tests/test_hub.py, and each may install the proxy: one once started
    the hub while another's npm was still unpacking (a CI failure). Five at once, against an npm that
    writes the proxy's link a second before its dependency: each returns only once the proxy is whole,
    npm runs once where flock is there, and nothing is left behind but the proxy and its lock."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "npm").write_text(FAKE_NPM)
    (fake_bin / "npm").chmod(0o755)
    if shutil.which("node") is None:
        (fake_bin / "node").write_text("#!/bin/sh\n")
        (fake_bin / "node").chmod(0o755)
    prefix = tmp_path / "hub-node"
    env = {**clean_environment(), "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    script = ROOT / "deploy" / "jupyterhub" / "install_proxy.sh"
    runs = [subprocess.Popen(["sh", str(script), str(prefix)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env) for _ in range(5)]
    for run in runs:
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        proxy = Path(out.strip())
        assert proxy == prefix / "node_modules" / ".bin" / "configurable-http-proxy"
        assert subprocess.run([str(proxy)]).returncode == 0, "a proxy came back before its dependency"
    npm_runs = (tmp_path / "npm-runs").read_text().split()
    if shutil.which("flock"):
        assert len(npm_runs) == 1, npm_runs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "hub-node", "hub-node.lock", "npm-runs"]
    again = subprocess.run(["sh", str(script), str(prefix)], capture_output=True, text=True, env=env)
    assert again.returncode == 0 and len((tmp_path / "npm-runs").read_text().split()) == len(npm_runs)


def test_clean_venv_removes_the_named_environment_only(tmp_path: Path):
    venv, neighbour = tmp_path / "venv", tmp_path / "keep"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    neighbour.mkdir()
    done = make("clean-venv", venv=venv)
    assert done.returncode == 0, done.stderr
    assert not venv.exists() and neighbour.is_dir()


def test_kernels_target_loads_the_build_it_made():
    from minengine.models import cpu_kernels

    if not cpu_kernels.load():
        pytest.skip(f"the CPU kernels are not built for this environment ({cpu_kernels.build_error()}); "
                    "building them is make test's set-up, not a cheap test")
    done = run_target("kernels")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "decode attention: C++ paged kernel" in done.stdout
    assert str(cpu_kernels.build_folder()) in done.stdout


def test_models_target_finds_smollm2_already_converted():
    from minengine.models import gguf_cache
    from minengine.models.loader import ModelPackageMissingError, packaged_model_file

    try:
        folder = gguf_cache.cache_folder(packaged_model_file("smollm2-135m"))
    except ModelPackageMissingError as e:
        pytest.skip(str(e).splitlines()[0])
    if not (folder / "config.json").is_file():
        pytest.skip(f"SmolLM2 is not converted here yet ({folder}): converting is make test's set-up")
    done = run_target("models")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{folder} (already converted)" in done.stdout
