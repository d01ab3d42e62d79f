"""Grading on several cores: how the class is shared out. The grading invariants themselves are checked
on the parallel path by tests/test_grading.py and test_grading_keys.py's second seed, and on the
one-at-a-time path by ``make grade`` (test_grading_keys.py) and the JupyterHub class (test_hub.py)."""

from __future__ import annotations

from collections import Counter

from minengine.course import tooling as course
from minengine.course.autograde_pool import default_workers, split


def test_every_pair_is_graded_once_and_each_worker_gets_a_mix():
    pairs = [(s, a) for a in ("lab1", "lab2", "quiz1") for s in ("ann", "bob", "cy", "dee")]
    shares = split(pairs, 2)
    flat = [p for share in shares for p in share]
    assert sorted(flat) == sorted(pairs)  # nothing lost, nothing twice
    for share in shares:  # both workers grade some of every assignment: no worker holds all the labs
        assert set(Counter(a for _, a in share)) == {"lab1", "lab2", "quiz1"}
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_more_workers_than_pairs_leaves_no_empty_worker():
    assert split([("ann", "lab1")], 4) == [[("ann", "lab1")]]


def test_default_workers_is_bounded():
    assert 1 <= default_workers() <= 4


def test_zero_workers_is_refused_with_a_message(tmp_path, capsys):
    code = course.main(["autograde", "--course-dir", str(tmp_path), "--workers", "0"])
    assert code == 2
    assert "--workers must be 1 or more" in capsys.readouterr().err
