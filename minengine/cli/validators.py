"""argparse ``type=`` validators shared by the subcommands: a bad value becomes one readable line."""

from __future__ import annotations

import argparse
import math


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    """A number > 0; ``inf`` is allowed (e.g. an unbounded request rate), NaN is not."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def port(text: str) -> int:
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {value}")
    return value
