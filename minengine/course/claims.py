"""Claim checks for the lessons: hold what the prose says against this run's numbers.

A lesson teaches predict -> measure -> explain (COURSE.md). After an experiment a *claim check* cell calls
:func:`check_claim` with the claim the text makes, a boolean computed from this run's data, and a plain
explanation for the case where this machine differs. It prints one line a learner can read:

    as expected: the mean TTFT (41 ms) is 3.2x the median (13 ms)
    this machine differs: ... why, and what would change it

Claims that must hold on any machine the course supports (a statistical fact, a large-margin effect)
are ``must_hold=True``: when one fails the line starts with :data:`FAILED_MARKER`, which
``tests/test_lessons.py`` looks for in the executed notebook, so CI catches a lesson whose text no longer
matches what the engine does. Machine-dependent claims pass ``must_hold=False``: their failure is an
explanation, not an error. Nothing here raises, so a learner's notebook never stops at a check.

:func:`compare_prediction` prints the learner's guess (a variable they set before the experiment)
next to the measured value, and :func:`check_exercise` tries a function the learner wrote in a lesson on a
few cases, printing what is wrong instead of raising.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

FAILED_MARKER = "CLAIM FAILED (must hold)"
HELD_PREFIX = "as expected: "
DIFFERS_PREFIX = "this machine differs: "


@dataclass(frozen=True)
class ClaimResult:
    """One checked claim: its name, whether it held, the claim, the explanation, and how strict it was."""

    name: str
    holds: bool
    claim: str
    otherwise: str
    must_hold: bool

    @property
    def failed(self) -> bool:
        """A must-hold claim that did not hold: the lesson's text is wrong for this run."""
        return self.must_hold and not self.holds

    def line(self) -> str:
        if self.holds:
            return f"{HELD_PREFIX}{self.claim}"
        if self.must_hold:
            return f"{FAILED_MARKER} [{self.name}]: {self.claim}\n    {self.otherwise}"
        return f"{DIFFERS_PREFIX}{self.otherwise}"


_RESULTS: list[ClaimResult] = []


def check_claim(name: str, holds: bool, claim: str, otherwise: str, must_hold: bool = True,
                *, quiet: bool = False) -> ClaimResult:
    """Print (unless ``quiet``) and record whether ``claim`` held on this run.

    ``holds`` is any truthy value (a numpy bool works; NaN counts as not holding). ``claim`` is the
    sentence the prose makes, with this run's numbers in it; ``otherwise`` says in plain words why the
    run may differ (and whether that is a problem). Returns the recorded :class:`ClaimResult`.
    """
    if not name or not claim or not otherwise:
        raise ValueError("check_claim needs a name, the claim and what to say when it does not hold")
    ok = _truth(holds)
    result = ClaimResult(name, ok, claim, otherwise, bool(must_hold))
    _RESULTS[:] = [r for r in _RESULTS if r.name != name] + [result]  # a rerun cell replaces its entry
    if not quiet:
        print(result.line())
    return result


def results() -> list[ClaimResult]:
    """Every claim checked in this kernel so far (the latest result per name), in order."""
    return list(_RESULTS)


def failed() -> list[ClaimResult]:
    """The must-hold claims that did not hold."""
    return [r for r in _RESULTS if r.failed]


def reset() -> None:
    _RESULTS.clear()


def summary() -> str:
    """One line for the end of a lesson: how many claims held, how many differ here, which failed."""
    held = sum(r.holds for r in _RESULTS)
    differ = [r.name for r in _RESULTS if not r.holds and not r.must_hold]
    bad = [r.name for r in _RESULTS if r.failed]
    text = f"{held} of {len(_RESULTS)} claims held on this run"
    if differ:
        text += f"; machine-dependent ones that differ here: {', '.join(differ)}"
    if bad:
        text += f"; {FAILED_MARKER}: {', '.join(bad)}"
    return text


def compare_prediction(predicted: float | None, measured: float, what: str, unit: str = "") -> str:
    """Print the learner's prediction next to the measurement (or a nudge when none was written)."""
    suffix = f" {unit}" if unit else ""
    if predicted is None:
        text = (f"measured {what}: {measured:.3g}{suffix} (no prediction written: set it in the cell "
                "before the experiment next time; a guess written down first is what makes the result stick)")
    else:
        try:
            guess = float(predicted)
        except (TypeError, ValueError):
            text = f"measured {what}: {measured:.3g}{suffix}; your prediction {predicted!r} is not a number"
        else:
            ratio = measured / guess if guess else math.inf
            verdict = ("close (within a factor 1.5)" if 1 / 1.5 <= ratio <= 1.5
                       else f"off by a factor {max(ratio, 1 / ratio):.1f}"
                       if ratio > 0 and math.isfinite(ratio)
                       else "on the other side of zero")
            text = (f"you predicted {what} = {guess:.3g}{suffix}; this run measured {measured:.3g}{suffix}: "
                    f"{verdict}")
    print(text)
    return text


def check_exercise(name: str, fn: Callable[..., Any], cases: Sequence[tuple[tuple[Any, ...], float]],
                   rel_tol: float = 1e-3) -> bool | None:
    """Try a learner's function from a lesson's exercise on ``cases`` ((arguments, expected) pairs) and
    print what happened: not written yet (it returned None), an error in it (the exception in one line,
    never a traceback), the first case it gets wrong, or right on all of them. Returns None, False or
    True accordingly. Lessons are not graded: the cases show the answers, and the model answer is folded
    below the exercise."""
    for args, expected in cases:
        call = f"{getattr(fn, '__name__', 'your function')}{tuple(args)!r}"
        try:
            got = fn(*args)
        except Exception as e:  # the learner's code: say what went wrong, keep the notebook going
            print(f"exercise {name}: {call} raised {type(e).__name__}: {e}")
            return False
        if got is None:
            print(f"exercise {name}: not written yet (it returns None). Write it, run this cell again, or "
                  "open the model answer below.")
            return None
        try:
            ok = math.isclose(float(got), expected, rel_tol=rel_tol)
        except (TypeError, ValueError):
            print(f"exercise {name}: {call} returned {got!r}, not a number")
            return False
        if not ok:
            print(f"exercise {name}: {call} returned {float(got):.6g}, expected {expected:.6g}")
            return False
    print(f"exercise {name}: right on all {len(cases)} cases")
    return True


def _truth(value: object) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return False
    try:
        return bool(value)
    except (TypeError, ValueError):  # e.g. a numpy array with several elements
        return False
