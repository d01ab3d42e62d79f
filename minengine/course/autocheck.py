"""Checks that the graded notebooks' test cells call (labs/ and quizzes/, graded with nbgrader).

Why the checks live here and not in the notebooks:

* nbgrader shows hidden tests in the feedback it returns to learners, so a hidden test should be a short
  call, with the reference numbers computed here from ``minengine.kvcalc``, not pasted into the cell;
* nbgrader scores a test cell 0 when it writes anything to stderr, so every check runs under
  :func:`quiet`, which swallows warnings and stderr (a torch ``UserWarning`` raised inside a learner's
  correct function must not cost marks);
* quiz answers are compared as salted SHA-256 digests, so a student version (the release) holds no
  answer a learner could read off.

Instructors writing a question get its digest with
``python -m minengine.course.autocheck choice quiz1.q1 B`` or ``... number quiz1.q5 295 --step 10``.
This module must stay light (no torch): every test cell imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import math
import os
import re
import sys
import warnings
from collections.abc import Iterator
from numbers import Real
from typing import Any

SALT = "minengine-course/v1"


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
def _normalise_choice(answer: Any) -> str:
    """'b', ' B ', '(b)' -> 'B'; 'c, a' -> 'AC' (multi-select answers are sets of letters)."""
    return "".join(sorted(set(re.sub(r"[^A-Za-z]", "", str(answer)).upper())))


def choice_digest(question: str, answer: str) -> str:
    return hashlib.sha256(f"{SALT}|{question}|{_normalise_choice(answer)}".encode()).hexdigest()[:20]


def number_digest(question: str, value: float, step: float) -> str:
    """Digest of the value rounded to a multiple of ``step`` (the grid makes a tolerance possible)."""
    return hashlib.sha256(f"{SALT}|{question}|{round(value / step)}".encode()).hexdigest()[:20]


def _unanswered(short: str, kind: str) -> AssertionError:
    return AssertionError(f"{short} has no answer yet: set `{short} = {kind}` in the cell above and run it")


def check_choice(question: str, answer: Any, digest: str, options: str = "ABCD") -> None:
    """Grade a multiple-choice answer given as letters ('B', or 'AC' for pick-all-that-apply)."""
    short = question.split(".")[-1]
    if answer is None or answer is Ellipsis:
        raise _unanswered(short, f"'{options[0]}'")
    letters = _normalise_choice(answer)
    if not isinstance(answer, str) or not letters or set(letters) - set(options):
        raise AssertionError(f"{short}: answer with letter(s) among {', '.join(options)} as a string, "
                             f"e.g. '{options[0]}'; got {answer!r}")
    if choice_digest(question, letters) != digest:
        raise AssertionError(f"{short}: {answer!r} is not the answer; reread the question and try again")


def check_number(question: str, answer: Any, digest: str, step: float, tolerance_steps: int = 1) -> None:
    """Grade a numeric answer: accepted within about ``step`` (``tolerance_steps`` grid steps) of the key."""
    short = question.split(".")[-1]
    if answer is None or answer is Ellipsis:
        raise _unanswered(short, "a number")
    if not _is_number(answer):
        raise AssertionError(f"{short}: answer with a number (int or float), got {answer!r}")
    k = round(float(answer) / step)
    for d in range(-tolerance_steps, tolerance_steps + 1):
        if hashlib.sha256(f"{SALT}|{question}|{k + d}".encode()).hexdigest()[:20] == digest:
            return
    raise AssertionError(f"{short}: {answer!r} is not within tolerance of the answer; check the units "
                         "asked for and your arithmetic")


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


# ---------------------------------------------------------------------------------------------- the CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minengine.course.autocheck",
                                     description="Print the digest a quiz test cell compares against.")
    sub = parser.add_subparsers(dest="kind", required=True)
    p_choice = sub.add_parser("choice", help="a multiple-choice key, e.g. quiz1.q1 B")
    p_choice.add_argument("question")
    p_choice.add_argument("answer")
    p_num = sub.add_parser("number", help="a numeric key, e.g. quiz1.q5 295 --step 10")
    p_num.add_argument("question")
    p_num.add_argument("value", type=float)
    p_num.add_argument("--step", type=float, required=True)
    args = parser.parse_args(argv)
    if args.kind == "choice":
        print(choice_digest(args.question, args.answer))
    else:
        print(number_digest(args.question, args.value, args.step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
