"""Grading on several cores: how the class is shared out. The grading invariants themselves are checked
on the parallel path by tests/test_grading.py and test_grading_keys.py's second seed, and on the
one-at-a-time path by ``make grade`` (test_grading_keys.py) and the JupyterHub class (test_hub.py)."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import pytest

from minengine.course import tooling as course
from minengine.course.autograde_pool import default_workers, run_in_parallel
from minengine.course.grading import queue_order


def _grade(folder: str, quick: int, share: list[tuple[str, str]]) -> dict[str, int]:
    """A stand-in grader (module level: the spawned workers import it). A quick pair leaves a file; the
    pair of student "slow" waits until ``quick`` files are there, which happens only if another worker
    takes the quick pairs meanwhile; student "boom" raises."""
    ((student, _),) = share
    if student == "boom":
        raise ValueError("a grader that broke on one notebook")
    if student == "slow":
        deadline = time.monotonic() + 60
        while len(list(Path(folder).iterdir())) < quick:
            if time.monotonic() > deadline:
                raise TimeoutError("the quick pairs waited behind the slow one")
            time.sleep(0.05)
    else:
        Path(folder, student).write_text(str(os.getpid()))
    return {student: os.getpid()}


def test_a_free_worker_takes_the_next_pair_while_another_is_busy(tmp_path: Path) -> None:
    """Workers take pairs from one queue: while one worker holds the slow pair, the other grades every
    quick one (with a fixed share per worker, some quick pairs would wait behind the slow one for good)."""
    quick = [(f"q{i}", "quiz1") for i in range(5)]
    grade = functools.partial(_grade, str(tmp_path), len(quick))
    results = run_in_parallel(grade, [("slow", "lab3"), *quick], 2)
    assert [next(iter(r)) for r in results] == ["slow", *(s for s, _ in quick)]  # one result a pair, in order
    slow_pid = results[0]["slow"]
    assert all(r[s] != slow_pid for r, (s, _) in zip(results[1:], quick, strict=True))


def test_an_error_is_raised_once_the_other_pairs_are_graded(tmp_path: Path) -> None:
    pairs = [("boom", "lab1"), *((f"q{i}", "quiz1") for i in range(3))]
    with pytest.raises(ValueError, match="broke on one notebook"):
        run_in_parallel(functools.partial(_grade, str(tmp_path), 0), pairs, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q0", "q1", "q2"]


def test_labs_are_taken_first_and_the_assignments_in_turn():
    pairs = [(s, a) for a in ("quiz1", "lab2", "quiz2", "lab1") for s in ("bob", "ann", "cy")]
    order = queue_order(pairs)
    assert sorted(order) == sorted(pairs)  # nothing lost, nothing twice
    assert [a for _, a in order] == ["lab1", "lab2"] * 3 + ["quiz1", "quiz2"] * 3
    assert [s for s, a in order if a == "lab1"] == ["ann", "bob", "cy"]
    assert queue_order([("ann", "quiz1"), ("bob", "quiz1")]) == [("ann", "quiz1"), ("bob", "quiz1")]


def test_default_workers_is_bounded():
    assert 1 <= default_workers() <= 4


def test_zero_workers_is_refused_with_a_message(tmp_path, capsys):
    code = course.main(["autograde", "--course-dir", str(tmp_path), "--workers", "0"])
    assert code == 2
    assert "--workers must be 1 or more" in capsys.readouterr().err
