"""Whether a lab answer is the learner's own code, read from the source of the student's cells.

Why: ``autocheck.require_own_code`` inspects live functions in the kernel, but while autograding a lab the
checks run in the grader (``grader_side_tests``) and the student's functions live in another process, so
the grader reads the student's code instead. :func:`reference_findings` says, for every name the
student's cells bind, what it reaches that is not the learner's own: minengine or the grading helpers,
import machinery, a module the student wrote to disk, or a way round the reading (``exec``, ``getattr``,
``globals``, dunder attributes, unreadable IPython magics). It reads every code cell the student controls
(:func:`student_code`: cells they added too) and IPython's magics as the code they run.

A static reading raises the bar; it is not a proof that no path exists (``labs/README.md`` says so).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterable
from typing import Any

# Names that reach for minengine's implementation (or import machinery that could) inside an answer.
REFERENCE_NAMES = {"minengine", "kvcalc", "autocheck", "__import__", "importlib", "import_module"}
# The reflection vocabulary both source readers share (this one for lab notebooks, server_source for lab 3's
# server): extend these and both catch the new route.
# Built-ins that run a string as code or read and rebind names and attributes given as strings.
REFLECTION_NAMES = {"exec", "eval", "compile", "setattr", "delattr", "globals", "locals", "vars",
                    "__builtins__"}
# Attributes that lead from an object to a frame's variables: a caller's, a generator's, a coroutine's, a
# traceback's.
FRAME_NAMES = {"_getframe", "f_globals", "f_back", "f_locals", "gi_frame", "cr_frame", "ag_frame", "tb_frame"}
# Modules that reach into the kernel's own objects: its namespace, built-ins, loaded modules, every object.
KERNEL_REACHING_MODULES = {"__main__", "builtins", "importlib", "gc", "ctypes"}

# Names an answer may not reach, besides autocheck._REFERENCE_NAMES: ways to run code the grader cannot
# read, or to reach modules the answer did not import.
DYNAMIC_NAMES = REFLECTION_NAMES | FRAME_NAMES | {
    "getattr", "get_ipython", "breakpoint",
    # attributes that lead to loaded modules, or run a program
    "modules", "system", "popen", "execv", "execvp", "execl", "execlp", "spawnv", "spawnl", "posix_spawn"}
# At a cell's top level these can bind any name, so they count against every function.
BINDING_NAMES = {"exec", "eval", "compile", "globals", "locals", "vars", "setattr", "__builtins__",
                 "get_ipython"}
# These bind the kernel's global names from inside a function too (once something calls it), so they
# count against every function wherever they appear.
GLOBAL_BINDERS = (BINDING_NAMES - {"locals"}) | {"modules", "f_globals", "__globals__"}
# (inspect is not one: reaching a frame's globals through it names f_globals, which is.)
GLOBAL_BINDER_MODULES = KERNEL_REACHING_MODULES | {"pickle"}
# Modules an answer may not import: minengine itself, ways to find its objects in the kernel, and ways
# to run it in another process.
FLAGGED_IMPORTS = {"minengine", "importlib", "gc", "inspect", "ctypes", "pickle", "marshal", "types",
                   "builtins", "runpy", "subprocess", "multiprocessing", "pty", "__main__"}


# IPython magics an answer cell may use. Those that run Python in the kernel (%time, %%capture ...) are read
# as the code they run; the others here cannot bind a name in the kernel (shell lines run in another
# process, %%writefile only writes a file, which an import of it then answers for). Any other magic (%run,
# %load_ext, %rerun, %store ...) can run code this reading cannot see, so it counts as dynamic.
CODE_MAGICS = {"time", "timeit", "prun", "capture"}
HARMLESS_MAGICS = {"matplotlib", "config", "env", "pip", "conda", "precision", "pprint", "who", "whos",
                   "who_ls", "lsmagic", "magic", "history", "pwd", "ls", "autoreload", "writefile", "html",
                   "markdown", "latex", "svg", "javascript", "js", "bash", "sh", "script", "python",
                   "python3", "system", "sx", "getoutput"}
MAGIC_NAME = "_ipython_magic_"  # a magic that runs unseen code is read as this name + its name


def _python_of(code: str) -> list[ast.stmt]:
    """The statements a code magic runs: its text, less any options before the code (``-n 10``)."""
    words = code.split()
    for i in range(len(words) + 1):
        try:
            return ast.parse(" ".join(words[i:])).body
        except SyntaxError:
            continue
    return []


class _ReadMagics(ast.NodeTransformer):
    """Turn IPython's translation of a cell (``get_ipython().run_line_magic(name, line)`` and the like)
    back into what the kernel runs: a code magic's statements, nothing for a harmless one, and
    :data:`MAGIC_NAME` + its name for any other."""

    @staticmethod
    def _magic(node: ast.AST) -> tuple[str, list[str]] | None:
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
                and node.func.value.func.id == "get_ipython"
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)):
            args = [a.value for a in node.args]
            if node.func.attr in ("run_line_magic", "run_cell_magic") and args:
                return args[0], args[1:]
            if node.func.attr in ("system", "getoutput"):  # a shell line: another process
                return "system", args
        return None

    def _statements(self, node: ast.stmt, value: ast.AST) -> Any:
        magic = self._magic(value)
        if magic is None or magic[0] not in CODE_MAGICS:
            return self.generic_visit(node)
        run: list[ast.stmt] = []
        for code in magic[1]:  # a line magic's line; a cell magic's line (%%timeit's setup) and body
            for stmt in _python_of(code):
                read = self.visit(stmt)
                run += read if isinstance(read, list) else [read] if read is not None else []
        if isinstance(node, ast.Expr):
            return run or ast.Pass()
        node.value = ast.Constant(None)
        return [*run, node]

    def visit_Expr(self, node: ast.Expr) -> Any:
        return self._statements(node, node.value)

    def visit_Assign(self, node: ast.Assign) -> Any:
        return self._statements(node, node.value)

    def visit_Call(self, node: ast.Call) -> Any:
        magic = self._magic(node)
        if magic is None:
            return self.generic_visit(node)
        if magic[0] in HARMLESS_MAGICS or (magic[0] == "load_ext" and magic[1][:1] == ["autoreload"]):
            return ast.Constant(None)
        return ast.Name(MAGIC_NAME + magic[0], ast.Load())


def _student_tree(source: str) -> ast.Module | None:
    """A cell as the Python its kernel runs (IPython's syntax translated, magics read by
    :class:`_ReadMagics`), or None when it is not valid IPython either (then it ran nothing)."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        tree = ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return None
    try:
        return ast.fix_missing_locations(_ReadMagics().visit(tree))
    except Exception:  # noqa: BLE001 - a cell this reading cannot follow counts as hidden code
        return ast.Module([ast.Expr(ast.Name(MAGIC_NAME + "unreadable_cell", ast.Load()))], [])


def student_code(cells: Iterable[Any]) -> list[str]:
    """The sources of every code cell the student controls: answer cells, the release's unmarked cells (they
    are editable) and any cell the student added. Not the cells nbgrader restored from the gradebook before
    running the notebook (a test or read-only cell: it has a known ``grade_id`` and is locked)."""
    out = []
    for c in cells:
        meta = c.get("metadata", {}).get("nbgrader", {})
        if c.get("cell_type") == "code" and not (meta.get("grade_id") and meta.get("locked")):
            out.append(c.get("source", ""))
    return out


@functools.cache
def _installed_modules() -> frozenset[str]:
    """Top-level modules of the standard library and of the installed packages."""
    import importlib.metadata
    import sys

    return frozenset(sys.stdlib_module_names) | frozenset(importlib.metadata.packages_distributions())


def _own_module(module: str) -> bool:
    """A module the student made (a file written next to the notebook): the grader cannot read its code."""
    return module.split(".")[0] not in _installed_modules()


def _flagged_import(module: str) -> bool:
    return module.split(".")[0] in FLAGGED_IMPORTS or _own_module(module)


def _binds_globals(finding: str, top_level: bool) -> bool:
    """Whether a finding (:func:`reference_findings`' words) can bind any of the kernel's names: a binding
    name at a cell's top level; anywhere, a magic that runs unread code or a way to the kernel's globals
    (once a function runs)."""
    if finding.startswith("the magic %"):  # runs code unseen in the kernel's namespace, wherever it is
        return True
    if top_level and finding.strip("'") in BINDING_NAMES:
        return True
    if finding.startswith("import "):
        return finding.removeprefix("import ").split(".")[0] in GLOBAL_BINDER_MODULES
    return finding.strip("'") in GLOBAL_BINDERS


def _bound_names(stmt: ast.stmt) -> set[str]:
    """The names a top-level statement binds, however nested (an ``if`` holding an import or a ``def``)."""
    names: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _globals_read(stmt: ast.AST) -> set[str]:
    """The global names a top-level statement reads: for a ``def`` or ``class``, those its body reads when
    it runs (Python's own scoping, from ``symtable``: a parameter or local of the same name is not one) and
    those its decorators, defaults and bases read; for any other statement, every name it reads."""
    import symtable

    if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    names: set[str] = set()
    try:
        tables = [symtable.symtable(ast.unparse(ast.Module([stmt], [])), "<answer>", "exec")]
    except SyntaxError:  # Python would not run it either; read every name in it
        return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    while tables:
        table = tables.pop()
        names |= {sym.get_name() for sym in table.get_symbols()
                  if sym.is_referenced() and (table.get_type() == "module" or sym.is_global())}
        tables += table.get_children()
    return names


def _globals_set_in(node: ast.AST) -> set[str]:
    return {name for sub in ast.walk(node) if isinstance(sub, ast.Global) for name in sub.names}


def reference_findings(answer_sources: Iterable[str], flagged_names: set[str] | None = None,
                       flagged_import: Callable[[str], bool] = _flagged_import,
                       flagged_text: str = "minengine",
                       flagged_dunder: Callable[[str], bool] = lambda attr: True) -> dict[str, list[str]]:
    """For each name the student's cells bind at top level, what it reaches that is not the learner's own:
    minengine, the grading helpers, import machinery, a module of their own making, or a dynamic way round
    this reading (:data:`DYNAMIC_NAMES`). A ``def`` (or ``class``) is judged by its own body and the
    globals it reads (Python's scoping: a local of the same name is not one); any other binding by its
    statement and the names that reads; every binding of a name counts. Whatever can bind the kernel's
    names unseen (``exec`` or an unreadable magic at a cell's top level; ``globals``, ``sys.modules``,
    ``gc`` and the like anywhere) counts against every name. Empty lists: the learner's own code. The
    defaults are lab 1's rules; :func:`policy_findings` gives lab 2's."""
    if flagged_names is None:
        flagged_names = REFERENCE_NAMES | DYNAMIC_NAMES

    def findings_in(node: ast.AST) -> list[str]:
        found = []
        for sub in ast.walk(node):
            name = (sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute)
                    else None)
            if name in flagged_names:
                found.append(repr(name))
            if isinstance(sub, ast.Attribute) and sub.attr.startswith("__") and flagged_dunder(sub.attr):
                found.append(repr(sub.attr))
            if isinstance(sub, ast.Import):
                found += [f"import {a.name}" for a in sub.names if flagged_import(a.name)]
            elif isinstance(sub, ast.ImportFrom):  # `from a import b` is judged as a.b
                found += [f"import {sub.module}.{a.name}" for a in sub.names
                          if flagged_import(f"{sub.module or ''}.{a.name}")]
            if isinstance(sub, ast.Name) and sub.id.startswith(MAGIC_NAME):
                found.append(f"the magic %{sub.id.removeprefix(MAGIC_NAME)}")
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and flagged_text in sub.value:
                found.append(f"the string {sub.value!r}")
        return sorted(set(found))

    bodies: dict[str, list[ast.AST]] = {}  # what each name's value was made from, for the names it uses
    own: dict[str, list[str]] = {}
    everywhere: list[str] = []

    def bind(name: str, found: list[str], body: ast.AST | None) -> None:
        # Every binding of a name counts (the union): which one is live when the tests run is not read.
        own.setdefault(name, []).extend(found)
        if body is not None:
            bodies.setdefault(name, []).append(body)

    for source in answer_sources:
        tree = _student_tree(source)
        if tree is None:
            continue
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bind(stmt.name, findings_in(stmt), stmt)
                everywhere += [f for f in findings_in(stmt) if _binds_globals(f, top_level=False)]
                for name in _globals_set_in(stmt):  # `global K` inside: calling it binds K
                    bind(name, findings_in(stmt), stmt)
            elif isinstance(stmt, ast.Import | ast.ImportFrom):
                for alias in stmt.names:
                    bind((alias.asname or alias.name).split(".")[0], findings_in(stmt), None)
                everywhere += [f for f in findings_in(stmt) if _binds_globals(f, top_level=False)]
            else:
                for name in _bound_names(stmt):
                    bind(name, findings_in(stmt), stmt)
                everywhere += [f for f in findings_in(stmt) if _binds_globals(f, top_level=True)]

    result: dict[str, list[str]] = {}
    for name in own:
        found, stack, seen = set(everywhere), [name], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            found.update(own.get(current, []))
            for body in bodies.get(current, []):
                stack += [name for name in _globals_read(body) if name in own]
        result[name] = sorted(found)
    return result


# Lab 2: a policy may build on the scheduling interface (minengine.core: SchedulingPolicy, the built-in
# policies, which score as the baselines they are), never on the grading helpers or the simulator, nor
# search the kernel's frames or modules for them.
POLICY_NAMES = {"course", "sim", "Simulator", "policy_scoring", "policy_harness", "autocheck", "grading",
                "__import__", "importlib", "import_module"} | (DYNAMIC_NAMES - {"getattr", "setattr"})


# Dunder attributes that lead out of a policy's own objects (a class's __init__ or __name__ does not).
POLICY_DUNDERS = {"__globals__", "__builtins__", "__subclasses__", "__import__", "__code__", "__closure__",
                  "__func__", "__self__", "__dict__", "__getattribute__", "__loader__", "__spec__",
                  "__traceback__", "__frame__"}


def _flagged_policy_import(module: str) -> bool:
    if module == "minengine.core" or module.startswith("minengine.core."):
        return False
    return module.split(".")[0] in FLAGGED_IMPORTS or _own_module(module)


def policy_findings(answer_sources: Iterable[str]) -> dict[str, list[str]]:
    """:func:`reference_findings` with lab 2's rules (what ``require_own_policy`` says in the grader)."""
    return reference_findings(answer_sources, POLICY_NAMES, _flagged_policy_import, "minengine",
                              lambda attr: attr in POLICY_DUNDERS)
