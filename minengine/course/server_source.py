"""What a lab 3 answer file may not do, read from its source before its server is graded.

The grader checks a learner's server from the outside (a client's view) and from the engine's own state:
how many requests are unfinished, how many KV blocks are in use, how each request ended. That state lives
in the process that runs the learner's file, so two rules keep the answer from answering for the grader:

* **no reference**: the answer may not import minengine's own server, CLI, bench client or course code
  (:func:`forbidden_imports`); the lab is to write the endpoints over ``AsyncLLM``;
* **no rewriting the engine** (:func:`engine_tampering`): the answer gets ``llm`` to *call* (``generate``,
  ``abort``, the tokenizer, the config), never to change. Storing an attribute on anything reached from
  ``llm`` or from a minengine import (``engine.get_num_unfinished_requests = lambda: 0``, a class's
  property replaced through ``type(...)``), mutating the engine's containers, or the tools that reach
  objects one was not given (``setattr``, ``vars``, ``gc``, frames, ``sys.modules``, ``eval``) is refused.

The runner also reads the engine through functions and objects it took before the answer was imported
(``server_grader.EngineProbes``), so a rewrite that slips past this reading still changes what the
engine does, not what the grader sees. A static reading is not a proof (a name built at run time can
hide a call); with the probes, fooling the grader means changing the engine's own data, which is the
work the checks ask for.
"""

from __future__ import annotations

import ast

from minengine.course.own_code import FRAME_NAMES, KERNEL_REACHING_MODULES, REFLECTION_NAMES

# An answer may import none of these (the runner's own process imports minengine.course, which the
# runtime check of loaded modules allows; the answer's source may not name it).
FORBIDDEN = ("minengine.server", "minengine.cli", "minengine.bench", "minengine.course")
# Names a server has no use for, by which code reaches and rewrites objects it was not given: the lab
# notebooks' reflection and frame vocabulary (own_code), plus the dunders and lookups that lead from the
# engine's objects to others.
REACHING_NAMES = frozenset(REFLECTION_NAMES | FRAME_NAMES | {
    "__import__", "__setattr__", "__delattr__", "__dict__", "__code__", "__closure__", "cell_contents",
    "__globals__", "all_tasks", "get_referrers", "get_referents", "get_objects",
})
REACHING_MODULES = frozenset(KERNEL_REACHING_MODULES | {"inspect"})
# Methods that change a container in place: called on the engine's own lists, dicts and deques.
MUTATORS = frozenset({"append", "appendleft", "extend", "extendleft", "insert", "remove", "pop", "popleft",
                      "popitem", "clear", "update", "setdefault", "add", "discard", "rotate",
                      "__setitem__", "__delitem__"})


def forbidden_imports(source: str) -> list[str]:
    """Modules an answer's source imports (or names in strings) that are not allowed; [] when clean."""
    found: set[str] = set()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # the runner reports the syntax error itself
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [w for w in node.value.replace("/", ".").split() if w.startswith("minengine.")]
        elif isinstance(node, ast.Name) and node.id in ("__import__", "importlib", "import_module"):
            found.add(node.id)
        found.update(n for n in names if n.startswith(FORBIDDEN))
    return sorted(found)


def _root(node: ast.AST) -> ast.AST:
    """The innermost object of ``a.b[c].d``: the Name ``a`` (or whatever expression it starts from)."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _engine_names(tree: ast.Module) -> set[str]:
    """Names that hold the engine side: ``build_app``'s first parameter, names imported from minengine,
    and names bound to an attribute chain of those (``engine = llm.engine``, ``bm = engine.scheduler``).
    Not the result of a call (``params = SamplingParams(...)`` is the learner's own object)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "build_app":
            names.update(a.arg for a in node.args.args[:1])
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names
                         if a.name.startswith("minengine"))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minengine"):
            names.update(a.asname or a.name for a in node.names)
    aliases = [(t.id, n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign)
               and n.value is not None and isinstance(n.value, ast.Name | ast.Attribute | ast.Subscript)
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)]
    aliases += [(n.target.id, n.value) for n in ast.walk(tree) if isinstance(n, ast.NamedExpr)
                and isinstance(n.value, ast.Name | ast.Attribute | ast.Subscript)]
    grew = True
    while grew:  # until no alias adds a name
        grew = False
        for target, value in aliases:
            root = _root(value)
            if target not in names and isinstance(root, ast.Name) and root.id in names:
                names.add(target)
                grew = True
    return names


def engine_tampering(source: str) -> list[str]:
    """What in an answer's source rewrites the engine or reaches objects it was not given, one short
    description each (with its line); [] when clean."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # the runner reports the syntax error itself
    engine = _engine_names(tree)
    found: list[tuple[int, str]] = []

    def flag(node: ast.AST, what: str) -> None:
        found.append((getattr(node, "lineno", 0), what))

    def stored(target: ast.AST) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for t in target.elts:
                stored(t)
        elif isinstance(target, ast.Attribute | ast.Subscript) and _mentions(target.value, engine):
            flag(target, f"changes {ast.unparse(target)}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.Delete):
            for t in node.targets:
                stored(t)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For | ast.AsyncFor):
            stored(node.target)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            stored(node.optional_vars)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in MUTATORS and _mentions(node.func.value, engine)):
            flag(node, f"changes {ast.unparse(node.func.value)} in place ({node.func.attr})")
        elif isinstance(node, ast.Name) and node.id in REACHING_NAMES:
            flag(node, f"uses {node.id}")
        elif isinstance(node, ast.Attribute) and (
                node.attr in REACHING_NAMES
                or (node.attr == "modules" and isinstance(node.value, ast.Name) and node.value.id == "sys")):
            flag(node, f"uses {ast.unparse(node)}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for m in modules:
                if m.split(".")[0] in REACHING_MODULES:
                    flag(node, f"imports {m}")
    return [f"line {line}: {what}" for line, what in sorted(set(found))]  # once each, in source order
