"""Checks that the graded notebooks' test cells call (labs/ and quizzes/, graded with nbgrader).

Why the checks live here and not in the notebooks:

* nbgrader shows hidden tests in the feedback it returns to learners, so a hidden test should be a short
  call, with the reference numbers computed here from ``minengine.kvcalc``, not pasted into the cell;
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
import io
import math
import os
import re
import warnings
from collections.abc import Iterator
from numbers import Real
from typing import Any


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
        raise AssertionError(f"{name}: expected a positive number{f' in {unit}' if unit else ''}, got {answer!r}")


def grade_choice(name: str, answer: Any, key: str, why: str = "") -> None:
    """Hidden test: the answer's letters equal the key's (order and case do not matter)."""
    check_choice_form(name, answer, multi=len(key) > 1)
    if _normalise_choice(answer) != _normalise_choice(key):
        raise AssertionError(f"{name}: the answer is {key}, you gave {answer!r}. {why}".rstrip())


def grade_number(name: str, answer: Any, key: float, tolerance: float, why: str = "") -> None:
    """Hidden test: within ``tolerance`` (absolute) of the key."""
    check_number_form(name, answer, positive=False)
    if abs(float(answer) - float(key)) > tolerance:
        raise AssertionError(f"{name}: the answer is {key:g} (within {tolerance:g}), you gave {answer!r}. "
                             f"{why}".rstrip())


# ------------------------------------------------------------------------------ your own code, please
# Names that reach for minengine's implementation (or import machinery that could) inside an answer.
_REFERENCE_NAMES = {"minengine", "kvcalc", "autocheck", "__import__", "importlib", "import_module"}


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


# ----------------------------------------------------------------------------------- lab 1 references
def _lab1_models() -> dict[str, tuple[dict[str, Any], int | None]]:
    """Configs the learner never sees in the notebook, with their parameter counts."""
    from minengine.perf.model_presets import PRESETS

    models = {key: (dict(PRESETS[key]["config"]), PRESETS[key]["num_params"])
              for key in ("qwen2.5-72b", "mixtral-8x7b", "gemma-2-9b", "llama-3.1-70b")}
    # An MQA model (one K/V head shared by 71 query heads, like Falcon-7B), written in Llama-style keys.
    models["mqa-7b"] = ({"num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71,
                         "num_key_value_heads": 1}, 6_921_720_704)
    # An MHA config that omits num_key_value_heads altogether (older configs do): every head keeps K/V.
    old = {k: v for k, v in PRESETS["llama-2-13b"]["config"].items() if k != "num_key_value_heads"}
    models["llama-2-13b-no-kv-key"] = (old, PRESETS["llama-2-13b"]["num_params"])
    return models


_KV_DTYPE = {4: "fp32", 2: "bf16", 1: "fp8"}


def _ref_per_token(config: dict[str, Any], bytes_per_element: int) -> int:
    from minengine import kvcalc

    spec = kvcalc.load_model_spec(config)
    return kvcalc.kv_bytes_per_token(spec, kv_cache_dtype=_KV_DTYPE[bytes_per_element])


def lab1_check_per_token_mha(kv_bytes_per_token: Any) -> None:
    """MHA configs, including one without a ``num_key_value_heads`` key, in fp32."""
    config, _ = _lab1_models()["llama-2-13b-no-kv-key"]
    with quiet():
        expect_close(kv_bytes_per_token(config, 4), _ref_per_token(config, 4),
                     "an MHA config without num_key_value_heads, fp32",
                     "when the key is missing, every attention head has its own K and V")


def lab1_check_per_token_gqa(kv_bytes_per_token: Any) -> None:
    """GQA, MQA, an explicit head_dim that differs from hidden/heads, and 1- and 2-byte elements."""
    models = _lab1_models()
    cases = [("qwen2.5-72b", 2), ("mixtral-8x7b", 2), ("mqa-7b", 1), ("gemma-2-9b", 2), ("llama-3.1-70b", 1)]
    with quiet():
        for name, nbytes in cases:
            config = models[name][0]
            expect_close(kv_bytes_per_token(config, nbytes), _ref_per_token(config, nbytes),
                         f"an unseen model ({name}), {nbytes} byte(s) per element",
                         "K/V heads from num_key_value_heads; head_dim from the config when it is given")


def lab1_check_cache_bytes(kv_cache_bytes: Any) -> None:
    """Whole-batch sizes against kvcalc (no paging: token counts are exact here)."""
    from minengine import kvcalc

    models = _lab1_models()
    with quiet():
        for name, ctx, batch, nbytes in [("qwen2.5-72b", 32_768, 16, 1), ("mixtral-8x7b", 100_000, 3, 2),
                                         ("mqa-7b", 2_048, 64, 2)]:
            config = models[name][0]
            spec = kvcalc.load_model_spec(config)
            want = kvcalc.kv_bytes_per_batch(spec, ctx, batch, kv_cache_dtype=_KV_DTYPE[nbytes])
            expect_close(kv_cache_bytes(config, ctx, batch, nbytes), want,
                         f"{name}: {batch} sequences of {ctx:,} tokens, {nbytes} byte(s) per element")


def lab1_concurrency_cases() -> list[dict[str, Any]]:
    """Capacity cases with vLLM's answer (kvcalc.estimate), each with a context that is no block multiple."""
    from minengine import kvcalc

    models = _lab1_models()
    cases = []
    for name, ctx, gpu, wdtype, kvdtype, util, reserve, block in [
        ("qwen2.5-72b", 3_000, "h200", "fp8", "bf16", 0.90, 2 * kvcalc.GiB, 16),
        ("llama-3.1-70b", 1_000, "h200", "fp8", "fp8", 0.92, 3 * kvcalc.GiB, 256),
        ("mqa-7b", 777, "a100-80gb", "bf16", "bf16", 0.85, 1 * kvcalc.GiB, 32),
        ("mixtral-8x7b", 4_096, "h100", "bf16", "bf16", 0.90, 2 * kvcalc.GiB, 16),  # weights do not fit: 0
    ]:
        config, params = models[name]
        est = kvcalc.estimate(config, ctx, kv_cache_dtype=kvdtype, block_size=block, gpu=gpu,
                              gpu_memory_utilization=util, weight_dtype=wdtype, num_params=params,
                              activation_reserve_bytes=reserve)
        cases.append(dict(name=name, config=config, context_len=ctx, gpu_memory_bytes=est.gpu.memory_bytes,
                          weight_bytes=est.weight_bytes, bytes_per_element=kvcalc.dtype_bytes(kvdtype),
                          gpu_memory_utilization=util, reserve_bytes=reserve, block_size=block,
                          want=est.max_num_seqs))
    return cases


def lab1_check_concurrency(max_concurrent_sequences: Any) -> None:
    with quiet():
        for case in lab1_concurrency_cases():
            kwargs = {k: v for k, v in case.items() if k not in ("name", "config", "context_len", "want")}
            got = max_concurrent_sequences(case["config"], case["context_len"], **kwargs)
            expect_close(got, case["want"], f"{case['name']} at {case['context_len']:,} tokens, block "
                         f"{case['block_size']}", "round each sequence up to whole blocks; never below 0")


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


def check_kv_plot(result: Any, expected_gib: dict[str, list[float]], rel: float = 0.05) -> None:
    """Loose checks: one labelled line per model, axes labelled, y in GiB (each line matches a model)."""
    import matplotlib.pyplot as plt

    ax = axes_of(result)
    try:
        lines = ax.get_lines()
        if len(lines) != len(expected_gib):
            raise AssertionError(f"expected {len(expected_gib)} lines (one per model), found {len(lines)}")
        if not ax.get_xlabel().strip() or not ax.get_ylabel().strip():
            raise AssertionError("label both axes (ax.set_xlabel / ax.set_ylabel), with units")
        unmatched = dict(expected_gib)
        for line in lines:
            ys = [float(y) for y in line.get_ydata()]
            match = next((k for k, want in unmatched.items() if len(want) == len(ys) and all(
                math.isclose(y, w, rel_tol=rel) for y, w in zip(ys, want, strict=True))), None)
            if match is None:
                raise AssertionError(f"line {line.get_label()!r} does not match any model's KV size in GiB "
                                     f"(y values {ys[:3]}...); plot GiB = bytes / 2**30 at each context")
            del unmatched[match]
    finally:
        plt.close(ax.figure)


def lab1_check_plot(plot_kv_vs_context: Any) -> None:
    """Two unseen models at contexts of the grader's choosing."""
    from minengine import kvcalc

    models = _lab1_models()
    picked = {"Qwen2.5-72B": models["qwen2.5-72b"][0], "MQA-7B": models["mqa-7b"][0]}
    contexts = [1_000, 10_000, 50_000, 100_000]
    expected = {name: [kvcalc.kv_bytes_per_batch(kvcalc.load_model_spec(cfg), n, 1) / kvcalc.GiB
                       for n in contexts] for name, cfg in picked.items()}
    with quiet():
        check_kv_plot(plot_kv_vs_context(picked, contexts), expected)
