"""The package's shape, checked on its source (AST, nothing imported): layers, one step loop, no circles.

Each rule is a function that returns its violations, and each is also run on a planted bad source, so
a rule that silently stopped finding anything would fail here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minengine"

# Which of minengine's top-level packages/modules each one may import (besides itself). Data flows
# request -> scheduler -> executor -> model -> outputs -> metrics; front ends (server, bench, cli,
# course) sit on top. Anything not listed is a back-edge.
ALLOWED: dict[str, set[str]] = {
    "_lazy": set(),
    "config": set(),
    "core": {"config"},
    "perf": set(),
    "models": {"config", "perf"},  # perf.model_spec: torch-free facts read from HF configs
    "kvcalc": {"perf"},
    "metrics": {"core"},
    "engine": {"_lazy", "config", "core", "models", "perf", "kvcalc", "metrics"},
    "sim": {"_lazy", "config", "core", "perf", "kvcalc", "metrics"},
    "server": {"_lazy", "config", "core", "engine", "models", "perf", "kvcalc", "metrics", "(root)"},
    "bench": {"_lazy", "core", "metrics", "models", "sim", "(root)"},
    "cli": {"_lazy", "config", "core", "engine", "models", "perf", "kvcalc", "metrics", "sim", "server",
            "bench", "(root)"},
    "course": {"_lazy", "config", "core", "engine", "models", "perf", "kvcalc", "metrics", "sim", "server",
               "bench", "(root)"},
    "__main__": {"cli"},
    "(root)": {"_lazy"},
    "utils": set(),
}
# Leaf helpers (``cdiv``) that any layer may import: they import nothing of the package.
SHARED = {"utils"}
# Single modules that may reach further than their package: calibration runs the real engine.
EXTRA: dict[str, set[str]] = {"sim/calibrate.py": {"engine", "models"}}
# Packages that must start without torch (``minengine kv``, the simulator, the bench client).
TORCH_FREE = {"_lazy", "utils", "config", "core", "kvcalc", "metrics", "sim", "bench", "perf", "(root)"}
TORCH_ALLOWED_FILES = {"sim/calibrate.py", "perf/measure.py"}
HEAVY = {"torch", "transformers", "safetensors", "tokenizers"}

# Scheduler state that only core/scheduler.py may change (core/request.py sets the initial values).
SCHEDULER_STATE = {"running", "waiting", "status", "num_computed_tokens"}
MUTATORS = {"append", "appendleft", "remove", "pop", "popleft", "insert", "extend", "clear", "sort"}
STATE_OWNERS = {"core/scheduler.py", "core/request.py"}
# The step loop (schedule -> execute -> update) is written once, in EngineCore.
STEP_LOOP_OWNER = "core/engine_core.py"


def _layer(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    if parts == ["__init__"]:
        return "(root)"
    return parts[0]


def _imported_layers(tree: ast.AST, rel: str) -> list[tuple[int, str]]:
    """(line, what) for every import: a minengine layer name, or '<torch>'-style third-party heavies."""
    here = rel.removesuffix(".py").split("/")
    out = []
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = ["minengine", *here[: len(here) - node.level]]
                modules = [".".join(base + ([node.module] if node.module else []))]
            elif node.module == "minengine":
                modules = [f"minengine.{a.name}" for a in node.names]
            elif node.module:
                modules = [node.module]
        for m in modules:
            parts = m.split(".")
            if parts[0] == "minengine":
                name = parts[1] if len(parts) > 1 else "(root)"
                if (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file():
                    out.append((node.lineno, name))
                else:  # `from minengine import LLM`: a name from the root package's lazy exports
                    out.append((node.lineno, "(root)"))
            elif parts[0] in HEAVY:
                out.append((node.lineno, f"<{parts[0]}>"))
    return out


def layer_violations(rel: str, source: str) -> list[str]:
    """Back-edges and torch imports where the layer rules forbid them."""
    layer, tree = _layer(rel), ast.parse(source)
    allowed = ALLOWED.get(layer)
    if allowed is None:
        return [f"{rel}: package {layer!r} has no layer rule in tests/test_architecture.py"]
    allowed = allowed | EXTRA.get(rel, set()) | SHARED | {layer}
    bad = []
    for line, what in _imported_layers(tree, rel):
        if what.startswith("<"):
            if layer in TORCH_FREE and rel not in TORCH_ALLOWED_FILES:
                bad.append(f"{rel}:{line}: imports {what[1:-1]}, but {layer!r} must stay torch-free")
        elif what not in allowed:
            bad.append(f"{rel}:{line}: {layer!r} imports {what!r} (allowed: {', '.join(sorted(allowed))})")
    return bad


def state_violations(rel: str, source: str) -> list[str]:
    """Writes to scheduler state, and step-loop calls, outside the files that own them."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if (isinstance(sub, ast.Attribute) and sub.attr in SCHEDULER_STATE
                        and isinstance(sub.ctx, ast.Store)):
                    if rel not in STATE_OWNERS:
                        bad.append(f"{rel}:{node.lineno}: writes .{sub.attr} (only core/scheduler.py may)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, method = node.func.value, node.func.attr
            if (method in MUTATORS and isinstance(owner, ast.Attribute)
                    and owner.attr in ("running", "waiting") and rel not in STATE_OWNERS):
                bad.append(f"{rel}:{node.lineno}: changes .{owner.attr} (only core/scheduler.py may)")
            if (method in ("schedule", "update_from_output") and rel != STEP_LOOP_OWNER
                    and rel not in STATE_OWNERS):
                bad.append(f"{rel}:{node.lineno}: calls .{method}(): a second step loop (use EngineCore)")
    return bad


def _sources(root: Path, base: Path) -> list[tuple[str, str]]:
    # benchmarks/out/ holds git-ignored downloads and builds (llama.cpp's sources), not project code
    return [(p.relative_to(base).as_posix(), p.read_text()) for p in sorted(root.rglob("*.py"))
            if "out" not in p.relative_to(base).parts[:1]]


def test_no_back_edges_and_torch_only_where_allowed() -> None:
    bad = [v for rel, src in _sources(PACKAGE, PACKAGE) for v in layer_violations(rel, src)]
    assert not bad, "import rules broken:\n" + "\n".join(bad)


def test_only_the_scheduler_writes_its_state_and_only_engine_core_steps() -> None:
    sources = _sources(PACKAGE, PACKAGE)
    sources += [(f"../benchmarks/{rel}", src)
                for rel, src in _sources(ROOT / "benchmarks", ROOT / "benchmarks")]
    bad = [v for rel, src in sources for v in state_violations(rel, src)]
    assert not bad, "\n".join(bad)


def test_tests_drive_the_scheduler_through_engine_core() -> None:
    """Tests may set up state by hand (the block-manager tests do), but none writes its own step loop."""
    sources = [(f"../tests/{rel}", src) for rel, src in _sources(ROOT / "tests", ROOT / "tests")
               if rel != "test_architecture.py"]
    bad = [v for rel, src in sources for v in state_violations(rel, src) if "step loop" in v]
    assert not bad, "\n".join(bad)


def _module_name(rel: str) -> str:
    name = "minengine." + rel.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def _imported_modules(rel: str, source: str, modules: set[str]) -> set[str]:
    """The package's modules that ``rel`` imports (anywhere in the file, deferred imports included):
    ``from minengine.models import llama`` names the submodule, not the package's ``__init__``."""
    package = _module_name(rel) if rel.endswith("__init__.py") else _module_name(rel).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            subs = {f"{base}.{a.name}" for a in node.names} & modules
            found |= subs or ({base} & modules)
    return found - {_module_name(rel)}


def import_cycles(sources: list[tuple[str, str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or round a longer circle (Tarjan's strongly
    connected components). A circle means two concepts that can't be read, tested or loaded alone."""
    modules = {_module_name(rel) for rel, _ in sources}
    edges = {_module_name(rel): _imported_modules(rel, src, modules) for rel, src in sources}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return cycles


def test_no_two_modules_import_each_other() -> None:
    cycles = import_cycles(_sources(PACKAGE, PACKAGE))
    assert not cycles, "import circles (move the shared part into a module both import):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_a_planted_import_circle_is_caught() -> None:
    planted = [("models/a.py", "from minengine.models import b\n"),
               ("models/b.py", "def f():\n    from minengine.models.a import x\n"),
               ("models/c.py", "from minengine.models import a\n")]
    assert import_cycles(planted) == [["minengine.models.a", "minengine.models.b"]]
    assert import_cycles(planted[:1] + planted[2:]) == []


@pytest.mark.parametrize(("rel", "source", "expected"), [
    ("core/planted.py", "import torch\n", "must stay torch-free"),
    ("core/planted.py", "from minengine.engine.llm_engine import LLMEngine\n", "'core' imports 'engine'"),
    ("models/planted.py", "from minengine.core.scheduler import Scheduler\n", "'models' imports 'core'"),
    ("perf/planted.py", "from minengine.kvcalc import estimate\n", "'perf' imports 'kvcalc'"),
    ("engine/planted.py", "from minengine.server.app import create_app\n", "'engine' imports 'server'"),
    ("sim/planted.py", "from minengine.engine import LLM\n", "'sim' imports 'engine'"),
    ("core/planted.py", "from ..engine import llm\n", "'core' imports 'engine'"),
    ("newpkg/planted.py", "x = 1\n", "no layer rule"),
])
def test_a_planted_back_edge_is_caught(rel: str, source: str, expected: str) -> None:
    assert any(expected in v for v in layer_violations(rel, source))


@pytest.mark.parametrize(("source", "expected"), [
    ("def f(sched):\n    sched.running.append(1)\n", "changes .running"),
    ("def f(req):\n    req.num_computed_tokens = 3\n", "writes .num_computed_tokens"),
    ("def f(req, s):\n    req.status = s\n", "writes .status"),
    ("def f(sched, out):\n    out = sched.schedule()\n    sched.update_from_output(out, {})\n", "step loop"),
])
def test_a_planted_state_write_or_second_step_loop_is_caught(source: str, expected: str) -> None:
    assert any(expected in v for v in state_violations("sim/planted.py", source))
    assert not state_violations("core/scheduler.py", source)
