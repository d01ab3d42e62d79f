"""Per-course assignments: each class gets its own numbers and its own answer order, from a course seed.

Why: the sources of every lab and quiz are public (this repository), so answers written into them are no
secret. At release time each source notebook is *rendered* for one course seed, and only the rendered
copy (instructor-only, in ``build/course/source/``) holds the keys; the student version nbgrader makes
from it holds none. The default seed serves self-paced learners, who grade themselves locally anyway.

What a source notebook may contain:

* ``@@name@@`` anywhere: replaced by ``params[name]``, where ``params`` comes from the assignment's
  ``params.py`` (``def params(seed: int) -> dict``). A str is inserted as it is, anything else as its
  ``repr`` (so a number or a dict drops straight into code).
* a choice list in a markdown cell: a line ``<!-- choices q3 -->`` followed by bullets ``* [x] text``
  (a right option) or ``* [ ] text`` (a distractor). It is rendered as ``* **A.** text`` ... in a seeded
  order, and ``@@q3@@`` elsewhere (the solution cell, the hidden test) becomes the key letters. Across a
  notebook, single-answer questions get their right option at each position equally often.
* an option whose rightness the seed decides: ``* [@@name@@] text``, where ``params[name]`` is ``"x"``
  (right) or ``" "`` (a distractor). Then *which* option is right follows from the seeded scenario (a
  rule the student applies to their own numbers), so an answer sheet from another course, copied by its
  options' text, is no key.

Anything left unreplaced is an error: a release never goes out with a placeholder in it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import re
import string
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_COURSE_SEED = 2026
# A class's seed must not be guessable from the public sources: anyone can render every seed below
# 2**40 on a laptop (~1e12 renders is days), so a class seed needs more than that, with margin.
MIN_CLASS_SEED_BITS = 64
SEED_FILE = "course.json"  # {"seed": N}: what a class's release was rendered with (instructor-only)
PLACEHOLDER = re.compile(r"@@([A-Za-z_][A-Za-z0-9_]*)@@")
CHOICES_MARK = re.compile(r"^<!-- choices (\w+) -->[ \t]*$", re.M)
OPTION = re.compile(r"^\* \[([ xX])\] (.*(?:\n(?!\* \[|\n).*)*)", re.M)  # an item and its wrapped lines
SEEDED_MARK = re.compile(r"^\* \[@@([A-Za-z_][A-Za-z0-9_]*)@@\]", re.M)  # * [@@name@@]: the seed decides
LETTERS = "ABCDEFGH"
PARAMS_FILE = "params.py"


def seed_number(seed: int | str) -> int:
    """The number a course seed renders with: a whole number as it is, any other text hashed (SHA-256,
    first 62 bits), so an instructor may pick a passphrase."""
    text = str(seed).strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if not text:
        raise ValueError("a course seed can't be empty")
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 2


def seed_strength_bits(seed: int | str) -> float:
    """A rough upper bound on the seed's entropy, in bits: log2 of a whole number, or the text's length
    times log2 of the alphabet its character classes span. A number that was chosen at random is as
    strong as this says; a word or a date is weaker, which is why the release's advice is a random one."""
    text = str(seed).strip()
    if re.fullmatch(r"-?\d+", text):
        return math.log2(abs(int(text)) + 1)
    classes = (string.ascii_lowercase, string.ascii_uppercase, string.digits)
    alphabet = sum(len(c) for c in classes if any(ch in c for ch in text))
    alphabet += 32 if any(not ch.isalnum() for ch in text) else 0
    return len(text) * math.log2(max(alphabet, 2))


class TemplateError(ValueError):
    """A source notebook that cannot be rendered; the message names the cell and the placeholder."""


@dataclass
class ChoiceList:
    qid: str
    options: list[tuple[bool, str]]  # (is right, text) in source order
    cell: int
    span: tuple[int, int]  # where the marker + bullets sit in the cell's source

    @property
    def multi(self) -> bool:
        return sum(right for right, _ in self.options) != 1


@dataclass
class Rendered:
    """A rendered notebook and what was decided for it (keys per question, for tests and instructors)."""

    notebook: dict[str, Any]
    keys: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)


def load_params(folder: Path, seed: int | str) -> dict[str, Any]:
    """``params(seed)`` from the assignment's params.py, or {} when it has none (``seed``: a course seed,
    number or text, as :func:`seed_number` reads it).

    The public seed's params that take seconds to compute (lab 2 simulates its families: 15-25 s) are kept on
    disk (:func:`public_params_file`), so ``make course`` and every later release reuse them. Only the
    public seed's: anyone can compute those from this repository, while a class seed's are its secret."""
    path = folder / PARAMS_FILE
    if not path.is_file():
        return {}
    number = seed_number(seed)
    kept = public_params_file(path) if number == DEFAULT_COURSE_SEED else None
    if kept is not None and kept.is_file():
        try:
            return json.loads(kept.read_text())
        except (OSError, ValueError):
            pass  # unreadable (a write cut short): compute it again
    began = time.perf_counter()
    namespace: dict[str, Any] = {"__name__": f"_minengine_params_{folder.name}", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # no __pycache__ left in the sources
    values = namespace["params"](number)
    if not isinstance(values, dict):
        raise TemplateError(f"{path}: params(seed) must return a dict, got {type(values).__name__}")
    if kept is not None and time.perf_counter() - began > KEEP_PARAMS_AFTER_S:
        _keep(kept, values)
    return values


KEEP_PARAMS_AFTER_S = 1.0  # params faster than this are recomputed: a file would save nothing


PARAMS_DIR_ENV = "MINENGINE_PARAMS_DIR"


def public_params_file(params_py: Path) -> Path:
    """Where the public seed's params of ``params_py`` are kept: the user's cache
    (``${XDG_CACHE_HOME:-~/.cache}/minengine/params/``, or ``$MINENGINE_PARAMS_DIR``), under a name that
    changes with params.py, the minengine sources it may run (lab 2's simulator) and the Python version,
    so an edit to any of them computes afresh. (Not data_dirs: it imports torch, and this module must
    not.)"""
    folder = os.environ.get(PARAMS_DIR_ENV)
    if not folder:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(cache, "minengine", "params")
    digest = hashlib.sha256(f"{sys.version}\n{DEFAULT_COURSE_SEED}\n".encode())
    digest.update(params_py.read_bytes())
    digest.update(_minengine_sources_digest())
    return Path(folder).expanduser() / f"{params_py.parent.name}-{digest.hexdigest()[:24]}.json"


@functools.cache
def _minengine_sources_digest() -> bytes:
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for source in sorted(package.rglob("*.py")):
        digest.update(str(source.relative_to(package)).encode() + b"\0" + source.read_bytes())
    return digest.digest()


def _keep(target: Path, values: dict[str, Any]) -> None:
    try:
        text = json.dumps(values)
        if json.loads(text) != values:
            return  # not plain JSON (tuples, objects): recompute it each time rather than change it
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        partial.write_text(text)
        os.replace(partial, target)  # whole or not at all, whoever else writes the same file
    except (OSError, TypeError, ValueError):
        pass  # a cache that cannot be written costs only time


def option_marks(prefix: str, kinds: tuple[str, ...], right: str) -> dict[str, str]:
    """A params.py helper: the marks of one seeded choice list, ``{prefix}_{kind}`` set to 'x' on the
    option the course's scenario makes right and ' ' on the others (see :func:`resolve_seeded_marks`)."""
    return {f"{prefix}_{k}": ("x" if k == right else " ") for k in kinds}


def resolve_seeded_marks(cells: list[dict[str, Any]], params: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells with every ``* [@@name@@]`` option mark replaced by this seed's ``[x]`` or ``[ ]``."""

    def mark(m: re.Match[str]) -> str:
        value = params.get(m.group(1))
        if value not in ("x", " "):
            raise TemplateError(f"option mark @@{m.group(1)}@@ needs params to give 'x' or ' ', got "
                                f"{value!r}")
        return f"* [{value}]"

    out = []
    for cell in cells:
        if cell.get("cell_type") == "markdown" and "* [@@" in "".join(cell["source"]):
            cell = {**cell, "source": SEEDED_MARK.sub(mark, "".join(cell["source"]))}
        out.append(cell)
    return out


def _find_choice_lists(cells: list[dict[str, Any]]) -> list[ChoiceList]:
    found = []
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "markdown":
            continue
        text = "".join(cell["source"])
        for mark in CHOICES_MARK.finditer(text):
            pos, options = mark.end() + 1, []
            while (m := OPTION.match(text, pos)) is not None:
                options.append((m.group(1) != " ", m.group(2).rstrip()))
                pos = m.end() + 1
            if len(options) < 2 or not any(right for right, _ in options):
                raise TemplateError(f"cell {i}: choice list {mark.group(1)!r} needs 2+ options and a right "
                                    "one")
            found.append(ChoiceList(mark.group(1), options, i, (mark.start(), min(pos, len(text)))))
    ids = [c.qid for c in found]
    if len(ids) != len(set(ids)):
        raise TemplateError(f"a choice list id is used twice: {sorted(ids)}")
    return found


def _orders(lists: list[ChoiceList], seed: int, name: str) -> dict[str, list[int]]:
    """Seeded option orders; single-answer questions get their right option at balanced positions."""
    rng = random.Random(f"{seed}/{name}")
    singles = [c for c in lists if not c.multi]
    slots: list[int] = []
    for c in singles:  # one position per question, cycling 0..k-1 so every position is used equally
        slots.append(len(slots) % len(c.options))
    rng.shuffle(slots)
    orders: dict[str, list[int]] = {}
    for c in lists:
        idx = list(range(len(c.options)))
        rng.shuffle(idx)
        if not c.multi:
            right = next(i for i, (ok, _) in enumerate(c.options) if ok)
            idx.remove(right)
            idx.insert(slots.pop(0) % len(c.options), right)
        orders[c.qid] = idx
    return orders


def render_notebook(nb: dict[str, Any], seed: int | str, params: dict[str, Any], name: str = "") -> Rendered:
    """The notebook for one course seed (a new dict; ``nb`` is not changed)."""
    seed = seed_number(seed)
    nb = json.loads(json.dumps(nb))
    nb["cells"] = cells = resolve_seeded_marks(nb["cells"], params)
    lists = _find_choice_lists(cells)
    orders = _orders(lists, seed, name)
    keys: dict[str, str] = {}
    for c in sorted(lists, key=lambda c: (c.cell, -c.span[0])):  # right to left: spans stay valid
        order = orders[c.qid]
        lines = [f"* **{LETTERS[k]}.** {c.options[j][1]}" for k, j in enumerate(order)]
        keys[c.qid] = "".join(LETTERS[k] for k, j in enumerate(order) if c.options[j][0])
        text = "".join(cells[c.cell]["source"])
        a, b = c.span
        cells[c.cell]["source"] = text[:a] + "\n".join(lines) + "\n" + text[b:]
    values = {**{k: v for k, v in keys.items()}, **params}
    clash = set(keys) & set(params)
    if clash:
        raise TemplateError(f"params and choice lists share names: {sorted(clash)}")
    for i, cell in enumerate(cells):
        text = "".join(cell["source"])

        def fill(m: re.Match[str], i: int = i) -> str:
            if m.group(1) not in values:
                raise TemplateError(f"cell {i}: no value for @@{m.group(1)}@@ (params.py or a choice list)")
            value = values[m.group(1)]
            return value if isinstance(value, str) else repr(value)

        cell["source"] = PLACEHOLDER.sub(fill, text)
    return Rendered(nb, keys, params)


def render_source(path: Path, seed: int | str = DEFAULT_COURSE_SEED) -> dict[str, Any]:
    """One assignment notebook as a release for ``seed`` renders it, solutions included (what a test that
    pastes the solution into a student version needs: lab 3's server holds the seed's KV budget)."""
    return render_notebook(json.loads(path.read_text()), seed, load_params(path.parent, seed),
                           f"{path.parent.name}/{path.name}").notebook


def render_folder(src: Path, dst: Path, seed: int | str) -> dict[str, Rendered]:
    """Render every notebook of an assignment folder into ``dst``; other files are copied, params.py not."""
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    params = load_params(src, seed)
    out = {}
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if (path.is_dir() or rel.name == PARAMS_FILE or "__pycache__" in rel.parts
                or ".ipynb_checkpoints" in rel.parts or rel.suffix == ".pyc"):
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".ipynb":
            rendered = render_notebook(json.loads(path.read_text()), seed, params, f"{src.name}/{rel}")
            target.write_text(json.dumps(rendered.notebook, indent=1, ensure_ascii=False) + "\n")
            out[str(rel)] = rendered
        else:
            shutil.copy2(path, target)
    return out
