"""The ranges numbers of a job, an algorithm config and the command line must lie in.

Lower bounds are what the quantity means (a count is positive, a coefficient not negative); upper
bounds sit far above any RL job run today and keep the planner's memory and time bounded, so a
typo (`prompts: 1000000000000`) is refused in one line instead of exhausting the machine. Each
bound gives its reason in the message.
"""

from __future__ import annotations

import math

MAX_PROMPTS = 10_000_000  # prompts per step; published RL steps use up to ~10^4 (DeepSeek-R1: 512 x 16)
MAX_SAMPLES = 65_536  # samples per prompt
MAX_TOKENS = 16_777_216  # tokens per prompt or response: 16 Mi, above the longest contexts shipped (10 Mi)
MAX_EPOCHS = 10_000  # PPO epochs per step
MAX_POINTS = 100_000  # empirical response-length points: the distribution is summarised, not replayed
MAX_GPUS = 1_000_000  # devices a job uses: above the largest clusters built (~10^5 GPUs)
MAX_COEF = 1e6  # loss and KL coefficients, clip ranges, oversampling
MAX_SECONDS = 10_000_000  # a measured step or stage time: 115 days (published RL steps take seconds to hours)
MAX_COUNT = 10**15  # any other count in a validation file (batches, layout degrees): far above any run
MAX_MINI_BATCHES = 1_048_576  # optimizer steps per epoch: published jobs take 1-64
MAX_MICROBATCHES = 65_536  # parts a stream splits a batch into: per-sample streaming of the largest published
# batches (~10^4 sequences) stays below; the simulator tracks each part of each step
MAX_STALENESS = 64  # async bound k: published systems use 1-8; the planner tries every k up to it
MIN_SIGMA, MAX_SIGMA = 0.01, 10.0  # a log-normal length's shape: measured reasoning lengths fit 0.5-1.5; below
# 0.01 the lengths are one number (kind: fixed), and from about 25 the length model's exp() overflows a float


def problem(name: str, value, *, positive: bool = False, minimum: float | None = None,
            maximum: float | None = None, why: str = "") -> str | None:
    """What is wrong with `value` for the field `name`, or None when it is in range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} = {value!r} must be a number"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name} = {value} must be a finite number"
    if positive and value <= 0:
        return f"{name} = {value:g} must be positive"
    if minimum is not None and value < minimum:
        return f"{name} = {value:g} must be >= {minimum:g}"
    if maximum is not None and value > maximum:
        return f"{name} = {show(value)} exceeds {maximum:,}" + (f" ({why})" if why else "")
    return None


def show(value: int | float) -> str:
    """A number for a message: grouped digits, or scientific notation when huge (an int past a
    float's range, 10**400, is shown from its digits: float() of it would overflow)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) < 10**18:
            return f"{value:,}"
        digits = str(abs(value))
        return f"{'-' if value < 0 else ''}{digits[0]}.{digits[1:3]}e+{len(digits) - 1}"
    return f"{value:.3g}"


def problems(checks: list[str | None]) -> list[str]:
    return [c for c in checks if c]
