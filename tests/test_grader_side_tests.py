"""Lab test cells run in the grader, calling the student's functions in their kernel
(minengine/course/grader_side_tests.py). The whole path, lab 1 autograded through nbgrader with a student
who replaces every check, is tests/test_grading.py (fixture lab1_kv_calculator/patched_checks.txt). Here:
the parts on their own, with a stand-in kernel that is a namespace in this process."""

from __future__ import annotations

import ast
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import nbformat
import pytest

from minengine.course import autocheck
from minengine.course.grader_side_tests import (
    CALL_MARKER,
    MARKER,
    KernelFunction,
    free_names,
    kernel_call,
    policy_findings,
    read_reply,
    rebuild,
    reference_findings,
    run_test_cell,
    student_code,
)

ROOT = Path(__file__).resolve().parents[1]
LAB1 = ROOT / "labs" / "lab1_kv_calculator" / "lab1_kv_calculator.ipynb"


def stand_in_kernel(namespace: dict[str, Any]) -> Any:
    """ask_kernel for a 'kernel' that is ``namespace``: kernel_call runs there, its line is read back."""
    import __main__

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        saved, out = dict(vars(__main__)), io.StringIO()
        vars(__main__).update(namespace)
        try:
            with contextlib.redirect_stdout(out):  # the kernel's own stdout, not the test cell's
                kernel_call(json.dumps(request))
        finally:
            for name in namespace:
                vars(__main__).pop(name, None)
            vars(__main__).update(saved)
        return read_reply(out.getvalue().splitlines())

    return ask


def test_free_names_are_what_the_cell_needs_from_the_kernel() -> None:
    source = ("from minengine.course.autocheck import expect_close\nGiB = 2**30\n"
              "cases = [{'x': 1}]\nfor h in cases:\n    expect_close(my_fn(h['x'], GiB), 3, 'w')\n"
              "got = [other(y) for y in range(3)]\ntry:\n    pass\nexcept ValueError as e:\n    print(e)\n")
    assert free_names(source) == ["my_fn", "other"]


def test_the_lab1_solutions_are_their_own_and_a_reference_call_is_found() -> None:
    nb = nbformat.read(LAB1, as_version=4)
    answers = [c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert answers and not any(reference_findings(answers).values())
    found = reference_findings([
        "from minengine import kvcalc\n\ndef per_token(config):\n"
        "    return kvcalc.kv_bytes_per_token(config)\n",
        "def helper(x):\n    return x * 2\n\n"
        "def cache(config, n):\n    return per_token(config) * helper(n)\n",
        "def clean(x):\n    return helper(x) + 1\n",
        "def sneaky(x):\n    return getattr(__import__('mine' + 'ngine'), 'kvcalc')\n",
        "def dunder(x):\n    return x.__class__.__bases__\n",
    ])
    assert "'kvcalc'" in found["per_token"]
    assert "'kvcalc'" in found["cache"]  # through its call of per_token
    assert found["clean"] == [] and found["helper"] == []
    assert "'getattr'" in found["sneaky"] and "'__import__'" in found["sneaky"]
    assert "'__class__'" in found["dunder"]


def test_ordinary_code_is_not_flagged_but_ways_to_find_loaded_modules_are() -> None:
    noisy = ("import math\nimport sys\n\n"
             "def noisy(x):\n    print('note', file=sys.stderr)\n    return math.ceil(x)\n")
    assert reference_findings([noisy]) == {"math": [], "sys": [], "noisy": []}
    found = reference_findings([
        noisy,
        "import gc\n\ndef hunt(x):\n    return [o for o in gc.get_objects() if callable(o)]\n",
        "import sys\n\ndef lookup(x):\n    return sys.modules['minengine.kvcalc']\n",
        "def awaiting(task):\n    return task.get_coro().cr_frame\n",
    ])
    assert "import gc" in found["gc"] and "import gc" in found["hunt"]
    assert "'modules'" in found["lookup"]
    # A coroutine's frame leads to the kernel's globals as a caller's does (the frame vocabulary lab 3's
    # server reading uses too).
    assert "'cr_frame'" in found["awaiting"]
    # Both can reach the kernel's globals and rebind any name, so they count against every function.
    assert "import gc" in found["noisy"] and "'modules'" in found["noisy"]


def test_code_run_at_a_cells_top_level_counts_against_every_function() -> None:
    found = reference_findings(["exec(SOURCE)\n", "def mine(x):\n    return x\n"])
    assert "'exec'" in found["mine"]  # exec could have defined any function, this one included


def test_every_cell_the_student_controls_is_read_and_the_restored_ones_are_not() -> None:
    nb = nbformat.read(LAB1, as_version=4)
    nb.cells.insert(3, nbformat.v4.new_code_cell("from minengine import kvcalc as calculator"))
    read = student_code(nb.cells)
    assert "from minengine import kvcalc as calculator" in read  # a cell the student added
    assert any(s.startswith("import json") for s in read)  # the release's unmarked cells are editable
    tests = [c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert tests and not set(tests) & set(read)  # nbgrader restores these from the gradebook
    # The lab's own unmarked cells (one imports minengine's engine, another its widget) leave the
    # solutions' functions their own.
    found = reference_findings(student_code(nbformat.read(LAB1, as_version=4).cells))
    functions = {stmt.name for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")
                 for stmt in ast.parse(c.source).body if isinstance(stmt, ast.FunctionDef)}
    assert {"kv_bytes_per_token", "plot_kv_vs_context", "first_preemption_step"} <= functions
    assert {name: found[name] for name in functions} == {name: [] for name in functions}
    assert "import minengine.LLM" in found["LLM"]  # the engine cell's names are not the learner's own


@pytest.mark.parametrize("cells", [
    ["if True:\n    from minengine import kvcalc as calc\n", "def f(c):\n    return calc.x(c)\n"],
    ["def setup():\n    global calc\n    from minengine import kvcalc as calc\n\nsetup()\n",
     "def f(c):\n    return calc.x(c)\n"],
    ["from minengine import kvcalc as calc\n", "if True:\n    def f(c):\n        return calc.x(c)\n"],
    ["from minengine import kvcalc as calc\n", "def f(c):\n    return calc.x(c)\n",
     "if False:\n    def f(c):\n        return 1\n"],
    ["%time from minengine import kvcalc as calc\n", "def f(c):\n    return calc.x(c)\n"],
    ["%timeit -n 1 -r 1 from minengine import kvcalc as calc\n", "def f(c):\n    return calc.x(c)\n"],
    ["%%capture out\nfrom minengine import kvcalc as calc\n", "def f(c):\n    return calc.x(c)\n"],
    ["from minengine import kvcalc as calc\n",
     "def f(c):\n    def inner():\n        calc = 1\n    return calc.x(c)\n"],
], ids=["import-under-if", "global-in-a-function", "def-under-if", "redefined-where-it-never-runs",
        "time-magic", "timeit-magic-options", "capture-cell-magic", "a-local-of-that-name-elsewhere"])
def test_a_reference_bound_out_of_the_usual_places_is_found(cells: list[str]) -> None:
    assert "import minengine.kvcalc" in reference_findings(cells)["f"]


def test_a_local_variable_is_not_the_global_of_the_same_name() -> None:
    found = reference_findings(["from minengine import LLM\nfor name in ['a']:\n    llm = LLM(name)\n",
                                "def f(names):\n    return [name.upper() for name in names]\n",
                                "def g(llm):\n    return llm\n", "def h():\n    return llm\n"])
    assert found["f"] == found["g"] == [] and "import minengine.LLM" in found["h"]


def test_modules_of_the_students_making_and_unreadable_magics_are_not_their_own() -> None:
    written = ["%%writefile helper.py\nfrom minengine.kvcalc import kv_bytes_per_token as f\n",
               "from helper import f as g\n\ndef f(c):\n    return g(c)\n"]
    assert reference_findings(written)["f"] == ["import helper.f"]  # the grader cannot read helper.py
    assert policy_findings(written)["f"] == ["import helper.f"]
    assert reference_findings(["%run helper.py\n", "def f(c):\n    return c\n"])["f"] == ["the magic %run"]
    in_a_function = ["def setup():\n    %run helper.py\n", "def f(c):\n    return c\n"]
    assert reference_findings(in_a_function)["f"] == ["the magic %run"]  # calling setup() runs it
    timeit_setup = ["%%timeit from minengine import kvcalc as calc\npass\n",
                    "def f(c):\n    return calc.x(c)\n"]
    assert "import minengine.kvcalc" in reference_findings(timeit_setup)["f"]  # %%timeit's line runs too
    harmless = ["%matplotlib inline\n%load_ext autoreload\n%autoreload 2\nimport numpy as np\nfiles = !ls\n",
                "def f(c):\n    return np.sum(c)\n", "%timeit f([1, 2])\n"]
    assert reference_findings(harmless)["f"] == []


@pytest.mark.parametrize("binder", ["globals()['calc'] = 1", "setup.__globals__['calc'] = 1",
                                    "sys.modules['__main__'].calc = 1", "gc.get_objects()"])
def test_a_function_that_can_rebind_globals_counts_against_every_function(binder: str) -> None:
    found = reference_findings(["import gc\nimport sys\n", f"def setup():\n    {binder}\n",
                                "def f(c):\n    return calc\n"])
    assert found["f"], binder


def test_a_figure_travels_as_its_lines_and_labels() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def plot(models: dict, ctxs: list) -> Any:
        fig, ax = plt.subplots()
        for name, gib in models.items():
            ax.plot(ctxs, gib, label=name)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("KV cache (GiB)")
        ax.legend()
        return fig

    ask = stand_in_kernel({"plot": plot})
    reply = ask({"call": "plot", "args": [{"A": [1, 2], "B": [3, 4]}, [10, 20]], "kwargs": {}})
    redrawn = rebuild(reply["value"])
    autocheck.check_kv_plot(redrawn, [10, 20], {"A": [1, 2], "B": [3, 4]})
    autocheck.check_kv_plot(rebuild(reply["value"]), [10, 20], {"A": [], "B": []}, check="labels")
    plt.close("all")


def test_a_cell_judged_in_the_grader_ignores_what_the_kernel_did_to_the_checks() -> None:
    """The stand-in kernel's autocheck is patched to no-ops; the grader's own checks still judge."""
    source = (f"# Test\n{MARKER}\nfrom minengine.course.autocheck import expect_close, require_own_code\n"
              "require_own_code(double, part='part 1')\nexpect_close(double(21), 42, 'double 21')\n")
    patched = {"double": lambda x: 0, "expect_close": lambda *a, **k: None}
    outputs = run_test_cell(source, stand_in_kernel(patched), {})
    assert [o["output_type"] for o in outputs] == ["error"]
    assert "expected 42" in outputs[0]["evalue"]
    assert run_test_cell(source, stand_in_kernel({"double": lambda x: 2 * x}), {}) == []
    copied = run_test_cell(source, stand_in_kernel({"double": lambda x: 2 * x}),
                           {"double": ["'kvcalc'"]})
    assert copied and "uses minengine's own code" in copied[-1]["evalue"]


def test_failures_in_the_kernel_score_zero_with_a_reason() -> None:
    def raises(x: int) -> int:
        raise NotImplementedError("replace this line with your answer")

    source = "from minengine.course.autocheck import expect_close\nexpect_close(f(1), 1, 'one')\n"
    (error,) = run_test_cell(source, stand_in_kernel({"f": raises}), {})
    assert "NotImplementedError" in error["evalue"]
    expects_value_error = ("try:\n    f(1)\nexcept ValueError as e:\n    assert 'too big' in str(e)\n"
                           "else:\n    raise AssertionError('raise ValueError')\n")

    def too_big(x: int) -> int:
        raise ValueError("too big")

    assert run_test_cell(expects_value_error, stand_in_kernel({"f": too_big}), {}) == []
    (not_raised,) = run_test_cell(expects_value_error, stand_in_kernel({"f": lambda x: x}), {})
    assert not_raised["evalue"] == "raise ValueError"
    (missing,) = run_test_cell(source, stand_in_kernel({}), {})
    assert missing["ename"] == "NameError"
    (odd,) = run_test_cell(source, stand_in_kernel({"f": lambda x: object()}), {})
    assert "cannot read" in odd["evalue"]


def test_a_reply_must_be_exactly_one_readable_line() -> None:
    assert "2 replies" in read_reply([CALL_MARKER + '{"value": 1}', CALL_MARKER + '{"value": 2}'])["error"]
    assert "0 replies" in read_reply(["hello"])["error"]
    assert "unreadable" in read_reply([CALL_MARKER + "{nope"])["error"]
    assert read_reply(["noise", CALL_MARKER + '{"value": 3}'])["value"] == 3


def test_a_kernel_function_sends_only_plain_data() -> None:
    fn = KernelFunction("f", lambda request: {"value": request["args"]}, [])
    assert fn(1, [2.5, None], {"k": "v"}) == [1, [2.5, None], {"k": "v"}]
    with pytest.raises(TypeError, match="cannot send"):
        fn(object())
