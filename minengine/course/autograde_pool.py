"""Autograde a class on several cores: nbgrader grades one notebook after another, in one process.

Why: every submission runs in a fresh kernel, and most of a lab's time is that kernel's Python on one
core, so a class of thirty (or the test suite's planted submissions) leaves the other cores idle.
Here the (student, assignment) pairs are split over worker processes, each running nbgrader's own
``Autograde`` on its share, one pair at a time, exactly as :func:`minengine.course.grading.autograde`
does in one process. They share the course's gradebook (SQLite), so ``grading.autograde`` creates every
student and assignment row *before* the workers start: two workers must never race to insert one.
This module knows nothing of nbgrader: it deals out work and collects failures.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

T = TypeVar("T")


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


def _run_share(task: Callable[[list[tuple[str, str]]], T], share: list[tuple[str, str]], threads: int) -> T:
    """Worker body: ``task(share)`` in this process, its kernels given ``threads`` math threads (two
    kernels each spinning a thread per core would slow each other down)."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    return task(share)


def run_in_parallel(task: Callable[[list[tuple[str, str]]], T], pairs: list[tuple[str, str]],
                    workers: int) -> list[T]:
    """Run ``task`` on ``workers`` processes, each over its share of ``pairs``, and return what each
    share's call returned; the first exception is raised once all have stopped. ``task`` must be
    picklable (a module-level function or a ``functools.partial`` of one):
    :func:`minengine.course.grading.autograde` passes its own grader."""
    # spawn, not fork: a forked child would inherit this process's open gradebook connection and threads
    context = multiprocessing.get_context("spawn")
    shares = split(pairs, workers)
    with ProcessPoolExecutor(max_workers=len(shares), mp_context=context) as pool:
        threads = max(1, usable_cores() // len(shares))
        futures = [pool.submit(_run_share, task, share, threads) for share in shares]
        errors = [f.exception() for f in futures]
    failed = [e for e in errors if e is not None]
    if failed:
        raise failed[0]
    return [f.result() for f in futures]
