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
MAX_COEF = 1e6  # loss and KL coefficients, clip ranges, oversampling


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
        shown = f"{value:,}" if isinstance(value, int) and value < 10**18 else f"{value:.3g}"
        return f"{name} = {shown} exceeds {maximum:,}" + (f" ({why})" if why else "")
    return None


def problems(checks: list[str | None]) -> list[str]:
    return [c for c in checks if c]
