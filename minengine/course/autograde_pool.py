"""Autograde a class on several cores: nbgrader grades one notebook after another, in one process.

Why: every submission runs in a fresh kernel, and most of a lab's time is that kernel's Python on one
core, so a class of thirty (or the test suite's planted submissions) leaves the other cores idle.
Here the (student, assignment) pairs are split over worker processes, each running nbgrader's own
``Autograde`` on its share, one pair at a time, exactly as :func:`minengine.course.grading.autograde`
does. They share the course's gradebook (SQLite), so every student and assignment row is created
*before* the workers start: two workers must never race to insert the same student.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def usable_cores() -> int:
    """Cores this process may run on (a container or ``taskset`` may allow fewer than the machine has)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def default_workers() -> int:
    """One worker per usable core, at most 4 (each kernel also wants memory)."""
    return min(4, usable_cores())


def split(pairs: list[tuple[str, str]], workers: int) -> list[list[tuple[str, str]]]:
    """Deal the pairs out round-robin, grouped by assignment first, so each worker gets a similar mix of
    slow labs and quick quizzes (a worker holding every lab would finish last)."""
    ordered = sorted(pairs, key=lambda p: (p[1], p[0]))
    shares = [ordered[i::workers] for i in range(workers)]
    return [s for s in shares if s]


def _grade_share(course_dir: str, share: list[tuple[str, str]], threads: int) -> int:
    """Worker body: autograde each pair of the share in this process, one at a time. Its kernels get
    ``threads`` math threads: two kernels each spinning a thread per core would slow each other down."""
    from minengine.course import grading

    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)

    for student, assignment in share:
        grading.autograde(Path(course_dir), student, assignment)
    return len(share)


def autograde_in_parallel(course_dir: Path, pairs: list[tuple[str, str]], workers: int) -> None:
    """Grade ``pairs`` with ``workers`` processes; the first failure is raised once all have stopped."""
    from minengine.course import grading

    with grading.grading_environment(), grading._gradebook(grading.load_config(course_dir)) as gb:
        for student in sorted({s for s, _ in pairs}):
            gb.update_or_create_student(student)
        for assignment in sorted({a for _, a in pairs}):
            gb.update_or_create_assignment(assignment)
    # spawn, not fork: a forked child would inherit this process's open gradebook connection and threads
    context = multiprocessing.get_context("spawn")
    shares = split(pairs, workers)
    with ProcessPoolExecutor(max_workers=len(shares), mp_context=context) as pool:
        threads = max(1, usable_cores() // len(shares))
        futures = [pool.submit(_grade_share, str(course_dir), share, threads) for share in shares]
        errors = [f.exception() for f in futures]
    failed = [e for e in errors if e is not None]
    if failed:
        raise failed[0]
