"""Checks that the graded notebooks' test cells call (labs/ and quizzes/, graded with nbgrader).

Why the checks live here and not in the notebooks:

* nbgrader shows hidden tests in the feedback it returns to learners, which is fine: their cases and
  expected numbers are rendered per course from the instructor's ``params.py`` and never live here;
* nbgrader scores a test cell 0 when it writes anything to stderr, so every check runs under
  :func:`quiet`, which swallows warnings and stderr (a torch ``UserWarning`` raised inside a learner's
  correct function must not cost marks);
* nothing here knows an answer: visible checks test an answer's form, hidden tests pass the key in
  (rendered per course by ``minengine.course.templating``), and ``require_own_code`` fails an answer
  that calls the package's reference instead of computing.

This module must stay light (no torch): every test cell imports it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import os
import re
import warnings
from collections.abc import Iterator
from numbers import Real
from typing import Any

from minengine.course.grader_side_tests import KernelFunction
from minengine.course.own_code import REFERENCE_NAMES
from minengine.utils import cdiv


# ------------------------------------------------------------------------------------------- quietness
@contextlib.contextmanager
def _fd_to_devnull(fd: int) -> Iterator[None]:
    """Point an OS file descriptor at /dev/null: ipykernel forwards C-level writes to fd 2 as stderr."""
    try:
        saved = os.dup(fd)
    except OSError:  # no such descriptor (embedded interpreters): nothing to silence
        yield
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence warnings and stderr (Python and C level) inside a test cell; exceptions still propagate."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stderr(io.StringIO()):
            with _fd_to_devnull(2):
                yield


# --------------------------------------------------------------------------------------- plain asserts
def _is_number(x: Any) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(float(x))


def expect_close(got: Any, want: float, what: str, hint: str = "", rel: float = 1e-9) -> None:
    """Assert ``got`` is a number equal to ``want`` (to ``rel``), with a message that teaches."""
    if got is None or got is Ellipsis:
        raise AssertionError(f"{what}: your function returned {got!r}; did you forget `return`?")
    if not _is_number(got):
        raise AssertionError(f"{what}: expected a number, got {type(got).__name__} {got!r}")
    if not math.isclose(float(got), float(want), rel_tol=rel, abs_tol=1e-9):
        extra = f" Hint: {hint}" if hint else ""
        raise AssertionError(f"{what}: expected {want:,}, got {got:,}.{extra}")


# ------------------------------------------------------------------------------------------ quiz answers
# The hidden tests report each answer for the grader to judge outside the kernel
# (minengine/course/trusted_verdicts.py), then check it here for the learner's message.
REPORT_MARKER = "minengine-answer: "


def report_answer(name: str, answer: Any) -> None:
    """Print the answer as one line the grader can read: a string, a finite or infinite float, or what
    kind of object it was (which the grader then fails with that reason)."""
    if isinstance(answer, str):
        value: Any = str(answer)
    elif isinstance(answer, bool) or answer is None:
        value = answer
    elif isinstance(answer, int | float):
        value = float(answer) if isinstance(answer, float) else int(answer)
    else:
        try:
            value = float(answer) if hasattr(answer, "__float__") and not isinstance(answer, str) else None
        except Exception:  # noqa: BLE001 - anything a student's object raises: it is not a number
            value = None
        if value is None:
            print(REPORT_MARKER + json.dumps({"name": name, "unreadable": type(answer).__name__}), flush=True)
            return
    print(REPORT_MARKER + json.dumps({"name": name, "value": value}), flush=True)


# Visible checks look only at an answer's *form*; whether it is right is decided by the hidden tests,
# which carry the key (rendered per course from the instructor's source, never shipped to students).
def _normalise_choice(answer: Any) -> str:
    """'b', ' B ', '(b)' -> 'B'; 'c, a' -> 'AC' (multi-select answers are sets of letters)."""
    return "".join(sorted(set(re.sub(r"[^A-Za-z]", "", str(answer)).upper())))


def _unanswered(name: str, kind: str) -> AssertionError:
    return AssertionError(f"{name} has no answer yet: set `{name} = {kind}` in the cell above and run it")


def check_choice_form(name: str, answer: Any, options: str = "ABCD", multi: bool = False) -> None:
    """A well-formed letter answer ('B', or 'AC' where several may apply). Says nothing of correctness."""
    if answer is None or answer is Ellipsis:
        raise _unanswered(name, f"'{options[0]}'")
    letters = _normalise_choice(answer)
    if not isinstance(answer, str) or not letters or set(letters) - set(options):
        raise AssertionError(f"{name}: answer with letter(s) among {', '.join(options)} as a string, "
                             f"e.g. '{options[0]}'; got {answer!r}")
    if len(letters) > 1 and not multi:
        raise AssertionError(f"{name}: this question has one answer; give a single letter, got {answer!r}")


def check_number_form(name: str, answer: Any, unit: str = "", positive: bool = True) -> None:
    """A finite number (``positive``: > 0). Says nothing of correctness."""
    if answer is None or answer is Ellipsis:
        raise _unanswered(name, "a number")
    if not _is_number(answer):
        raise AssertionError(f"{name}: answer with a number (int or float){f' in {unit}' if unit else ''}, "
                             f"got {answer!r}")
    if positive and float(answer) <= 0:
        raise AssertionError(f"{name}: expected a positive number{f' in {unit}' if unit else ''}, got "
                             f"{answer!r}")


def judge_choice(name: str, answer: Any, key: str, why: str = "") -> None:
    """The answer's letters equal the key's (order and case do not matter)."""
    check_choice_form(name, answer, multi=len(key) > 1)
    if _normalise_choice(answer) != _normalise_choice(key):
        raise AssertionError(f"{name}: the answer is {key}, you gave {answer!r}. {why}".rstrip())


def judge_number(name: str, answer: Any, key: float, tolerance: float, why: str = "") -> None:
    """Within ``tolerance`` (absolute) of the key."""
    check_number_form(name, answer, positive=False)
    if abs(float(answer) - float(key)) > tolerance:
        raise AssertionError(f"{name}: the answer is {key:g} (within {tolerance:g}), you gave {answer!r}. "
                             f"{why}".rstrip())


def grade_choice(name: str, answer: Any, key: str | None = None, why: str = "") -> None:
    """Hidden test of a letter answer. It reports the answer for the grader to judge outside the kernel
    (``trusted_verdicts``). While autograding, the kernel runs the call without its key (the grader keeps
    it); run with the key (an instructor trying the source), it also judges here."""
    report_answer(name, answer)
    if key is not None:
        judge_choice(name, answer, key, why)


def grade_number(name: str, answer: Any, key: float | None = None, tolerance: float = 0.0,
                 why: str = "") -> None:
    """Hidden test of a number answer: reported, and judged here only given its key, as
    :func:`grade_choice`."""
    report_answer(name, answer)
    if key is not None:
        judge_number(name, answer, key, tolerance, why)


# ------------------------------------------------------------------------------ your own code, please
# Names that reach for minengine's implementation (or import machinery that could) inside an answer
# (grader_side_tests keeps the list: the grader reads answers' source with it, this module their code).
_REFERENCE_NAMES = REFERENCE_NAMES


def _code_objects(code: Any) -> Iterator[Any]:
    yield code
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            yield from _code_objects(const)


def reference_calls(fn: Any) -> list[str]:
    """What ``fn`` (and the notebook functions it calls) takes from the ``minengine`` package: its
    reference implementations and grading helpers are not an answer. Empty when it is the learner's own."""
    import functools
    import inspect

    found: list[str] = []
    stack, seen = [fn], set()
    while stack:
        f = stack.pop()
        if isinstance(f, functools.partial):
            stack.append(f.func)
            continue
        if isinstance(f, KernelFunction):  # in the grader: read from the answer cells' source
            found += f.grader_findings
            continue
        module = getattr(f, "__module__", None) or ""
        if module.split(".")[0] == "minengine":
            found.append(f"{getattr(f, '__qualname__', f)!s} from {module}")
            continue
        code = getattr(f, "__code__", None)
        if code is None or id(code) in seen:
            continue
        seen.add(id(code))
        namespace = dict(getattr(f, "__globals__", {}))
        for name, cell in zip(code.co_freevars, getattr(f, "__closure__", None) or (), strict=False):
            with contextlib.suppress(ValueError):  # an empty cell
                namespace[name] = cell.cell_contents
        for co in _code_objects(code):
            for name in (*co.co_names, *co.co_freevars):
                if name in _REFERENCE_NAMES:
                    found.append(f"{name!r} in {f.__name__}")
                    continue
                obj = namespace.get(name)
                if inspect.ismodule(obj) and obj.__name__.split(".")[0] == "minengine":
                    found.append(f"module {obj.__name__} in {f.__name__}")
                elif callable(obj) and (getattr(obj, "__module__", None) or "").split(".")[0] == "minengine":
                    found.append(f"{name} (from {obj.__module__}) in {f.__name__}")
                elif inspect.isfunction(obj) and obj.__module__ == getattr(f, "__module__", None):
                    stack.append(obj)  # a helper the learner wrote: look inside it too
            found += [f"the string {c!r} in {f.__name__}" for c in co.co_consts
                      if isinstance(c, str) and "minengine" in c]
    return sorted(set(found))


def require_own_code(*functions: Any, part: str = "this part") -> None:
    """Fail (so the cell scores 0) when an answer calls minengine's reference instead of computing."""
    for fn in functions:
        found = reference_calls(fn)
        if found:
            raise AssertionError(f"{part}: {getattr(fn, '__name__', fn)} uses minengine's own code "
                                 f"({'; '.join(found[:3])}). The point is to write it yourself: "
                                 "remove the import and compute the answer.")


# ------------------------------------------------------------------------------------------------ lab 1
# No answers here: lab 1's hidden cases and their expected numbers are rendered per course into the
# instructor's copy of the notebook (labs/lab1_kv_calculator/params.py). What follows is generic: errors
# carried forward from a learner's own earlier function, a plot's form, and a run of the real engine.
def carried(fn: Any) -> Any:
    """What ``fn()`` gives (a learner's own earlier function, quietly), or None when it fails."""
    try:
        with quiet():
            return fn()
    except Exception:
        return None


def expect_close_or_carried(got: Any, want: float, mine: Any, what: str, hint: str = "",
                            rel: float = 1e-9) -> None:
    """Like ``expect_close``, but also accept the value that follows from the learner's own earlier
    answer (``mine``: that number, or a function giving it): a mistake in part 1 is marked in part 1,
    not again in every later part that builds on it (errors carried forward)."""
    carried_value = carried(mine) if callable(mine) else mine
    if (_is_number(got) and _is_number(carried_value) and float(carried_value) > 0
            and math.isclose(float(got), float(carried_value), rel_tol=rel, abs_tol=1e-9)):
        return
    expect_close(got, want, what, hint, rel)


def expect_capacity(max_concurrent_sequences: Any, kv_bytes_per_token: Any, case: dict[str, Any], what: str,
                    hint: str = "") -> None:
    """One GPU-capacity case (``case``: the function's arguments and ``want``), with errors carried
    forward from the learner's own ``kv_bytes_per_token``: vLLM's budget over whole blocks of it."""
    names = ("gpu_memory_bytes", "weight_bytes", "bytes_per_element", "gpu_memory_utilization",
             "reserve_bytes", "block_size")
    kwargs = {k: case[k] for k in names if k in case}
    got = max_concurrent_sequences(case["config"], case["context_len"], **kwargs)
    util, reserve = case.get("gpu_memory_utilization", 0.9), case.get("reserve_bytes", 2 * 2**30)
    block = case.get("block_size", 16)
    budget = int(case["gpu_memory_bytes"] * util) - case["weight_bytes"] - reserve
    slots = cdiv(case["context_len"], block) * block

    def mine() -> float:
        return max(0, budget) // (slots * kv_bytes_per_token(case["config"],
                                                             case.get("bytes_per_element", 2)))

    expect_close_or_carried(got, case["want"], mine, what, hint)


@functools.lru_cache(maxsize=1)
def _tiny_model() -> tuple[Any, Any]:
    from minengine import load_model, load_tokenizer

    return load_model("tinystories-4m", device="cpu"), load_tokenizer("tinystories-4m")


def engine_run(prompt_lens: list[int], output_lens: list[int], num_blocks: int, block_size: int,
               seed: int = 0) -> dict[str, Any]:
    """Run the real engine (tinystories-4m on CPU) on random prompts of these lengths, every request
    generating exactly its output length, with a KV cache of ``num_blocks`` blocks of ``block_size``
    tokens (``max_num_seqs`` large, prefix caching off). Returns what its step records say: requests
    running after step 1 (``admitted``), the first step (1-based) with a preemption or None
    (``first_preemption_step``), and the records. A measurement, not an answer: a learner runs the same."""
    import random

    from minengine import LLM, SamplingParams
    from minengine.engine.threads import torch_threads

    model, tokenizer = _tiny_model()
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    prompts = [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(n)]} for n in prompt_lens]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in output_lens]
    with quiet(), torch_threads(1):  # a 4M-parameter model: one thread is fastest, and shares the CPU best
        llm = LLM(model, tokenizer=tokenizer, num_blocks=num_blocks, block_size=block_size, max_num_seqs=1024,
                  enable_prefix_caching=False)
        llm.generate(prompts, params, use_tqdm=False)
    records = llm.step_records
    first = records[0].step
    preempted = next((r.step - first + 1 for r in records if r.num_preempted), None)
    return {"admitted": records[0].num_running, "first_preemption_step": preempted, "records": records}


def axes_of(result: Any) -> Any:
    """The Axes of what a plotting function returned: an Axes, or a Figure with exactly one Axes."""
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    if isinstance(result, Axes):
        return result
    if isinstance(result, Figure):
        if len(result.axes) != 1:
            raise AssertionError(f"expected a figure with one plot (Axes), found {len(result.axes)}")
        return result.axes[0]
    raise AssertionError(f"return the matplotlib Figure (or Axes) you drew on, not {type(result).__name__}")


def _same(xs: list[float], want: list[float], rel: float) -> bool:
    return len(xs) == len(want) and all(math.isclose(x, w, rel_tol=rel, abs_tol=1e-12)
                                        for x, w in zip(xs, want, strict=True))


def check_kv_plot(result: Any, contexts: list[float], expected_gib: dict[str, list[float]], rel: float = 0.05,
                  carried_gib: dict[str, list[float]] | None = None, check: str = "data") -> None:
    """A KV-against-context plot: ``check="data"``: one line per model, its x data the contexts asked
    for, its y data each model's GiB (or, errors carried forward, what the learner's own size function
    gives, ``carried_gib``); ``check="labels"``: both axes labelled with what and units, a legend, and
    the lines labelled with exactly the models' names."""
    import matplotlib.pyplot as plt

    ax = axes_of(result)
    try:
        lines = list(ax.get_lines())
        if len(lines) != len(expected_gib):
            raise AssertionError(f"expected {len(expected_gib)} lines (one per model), found {len(lines)}")
        if check == "labels":
            _check_plot_labels(ax, lines, list(expected_gib))
            return
        xs_want = [float(x) for x in contexts]
        unmatched = dict(expected_gib)
        for line in lines:
            xs = [float(x) for x in line.get_xdata()]
            if not _same(xs, xs_want, 1e-9):
                raise AssertionError(f"line {line.get_label()!r}: its x values should be the context lengths "
                                     f"asked for, {xs_want}, got {xs[:5]}; plot (context, size) pairs")
            ys = [float(y) for y in line.get_ydata()]
            match = next((k for k, want in unmatched.items() if _same(ys, want, rel) or (
                carried_gib is not None and k in carried_gib and _same(ys, carried_gib[k], rel))), None)
            if match is None:
                raise AssertionError(f"line {line.get_label()!r} does not match any model's KV size in GiB "
                                     f"(y values {ys[:3]}...); plot GiB = bytes / 2**30 at each context")
            del unmatched[match]
    finally:
        plt.close(ax.figure)


def advise_kv_plot_labels(result: Any, names: list[str]) -> None:
    """Say what a KV plot's labels lack, without grading it: labels are how a reader reads a figure, not
    what the lab teaches, so they earn no points (lab 1), but the learner still hears about them."""
    import matplotlib.pyplot as plt

    ax = axes_of(result)
    try:
        _check_plot_labels(ax, list(ax.get_lines()), list(names))
        print("Labels: both axes say what and in which unit, and the legend names each model.")
    except AssertionError as problem:
        print(f"Labels (not graded, but a reader needs them): {problem}")
    finally:
        plt.close(ax.figure)


def _check_plot_labels(ax: Any, lines: list[Any], names: list[str]) -> None:
    xlabel, ylabel = ax.get_xlabel().strip(), ax.get_ylabel().strip()
    if not xlabel or not ylabel:
        raise AssertionError("label both axes (ax.set_xlabel / ax.set_ylabel), with units")
    if not re.search(r"token|context|length|ctx", xlabel, re.I):
        raise AssertionError("the x label should say what is on it (context length, in tokens); got "
                             f"{xlabel!r}")
    if not re.search(r"gib|\bgb\b|gibibyte|gigabyte", ylabel, re.I):
        raise AssertionError(f"the y label should give the unit (GiB); got {ylabel!r}")
    legend = ax.get_legend()
    if legend is None:
        raise AssertionError("add a legend (ax.legend()) so a reader can tell the models apart")
    labels = sorted(ln.get_label() for ln in lines)
    if labels != sorted(names):
        raise AssertionError(f"label each line with its model's name (plot(..., label=name)): expected "
                             f"{sorted(names)}, the lines say {labels}")
    shown = sorted(t.get_text() for t in legend.get_texts())
    if shown != sorted(names):
        raise AssertionError(f"the legend should name each model once: expected {sorted(names)}, it shows "
                             f"{shown}")
