"""Command-line number types: each flag's value is checked where it is parsed, so a bad one is one
line naming the flag and its range (`--gpus: 0 must be in [1, 1,000,000]`), never a traceback
deeper in, and never a silent fall-back to a default."""

from __future__ import annotations

import argparse
import math

MAX_STEPS = 10_000  # steps unrolled or simulated: the steady state shows within a few (k + 2)
MAX_STALENESS = 64  # async bound: published systems use 1-8; the planner tries every k up to it


def count(lo: int, hi: int):
    """An integer in [lo, hi]."""
    return _ranged(int, "an integer", lo, hi)


def real(lo: float, hi: float):
    """A finite number in [lo, hi]."""
    return _ranged(float, "a number", lo, hi)


def _ranged(convert, what: str, lo: float, hi: float):
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} must be a finite number")
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{_num(value)} must be in [{_num(lo)}, {_num(hi)}]")
        return value

    parse.__name__ = convert.__name__
    return parse


def _num(x: float) -> str:
    if float(x).is_integer() and abs(x) < 1e18:
        return f"{int(x):,}"
    return f"{x:.6g}"
