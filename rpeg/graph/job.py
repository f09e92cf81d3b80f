"""Job: what one RL step processes — prompts, samples per prompt, lengths, epochs, mini-batches.

Response lengths of reasoning models are long-tailed, and the tail (not the mean) sets how long
a generation batch runs, so a job gives a distribution, not a single number.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import cache
from typing import Literal

from rpeg.errors import RpegError
from rpeg.graph.episode import Episode
from rpeg.graph.bounds import (MAX_EPOCHS, MAX_MINI_BATCHES, MAX_POINTS, MAX_PROMPTS, MAX_SAMPLES, MAX_SIGMA,
                               MAX_TOKENS, MIN_SIGMA, problem, problems)

DistKind = Literal["fixed", "uniform", "lognormal", "empirical"]

# Responses that never emit an end token run to the length cap. Every RL framework counts them
# (verl's `response_length/clip_ratio`, TRL's `completions/clipped_ratio`, slime's
# `response_length_clip_ratio`; DAPO, arXiv 2503.14476, shapes the reward of these overlong samples
# because they are common enough to matter), and they are not the tail of the log-normal body: a
# repetition loop stops at the cap whatever the body's shape. 1% of responses is the default; the
# step time depends on it only through whether a batch of N holds one (any fraction above ln 2 / N
# puts the batch's longest response at the cap: 0.03% for N = 2048), and through their share of
# E[r^2]. It is capped at half of the mean's tokens, since the cap times the fraction cannot exceed
# the mean.
RUNAWAY_FRACTION = 0.01


@dataclass(frozen=True, kw_only=True, slots=True)
class LengthDistribution:
    """Response length in tokens, truncated at `max`.

    - fixed: every response has `mean` tokens (`max` = `mean`).
    - uniform: between `min` and `max`, mean (min + max) / 2 (`mean` is derived).
    - lognormal: log-normal with the given mean and shape `sigma`, truncated at `max`
      (the generator stops at max tokens: the mass above it sits at `max`), mixed with a fraction
      `runaway` of responses that never stop and run to `max` (default RUNAWAY_FRACTION; `mean`
      is the mean of the mixture).
    - empirical: `points` are response lengths of a sample; each equally likely.
    """

    kind: DistKind = "fixed"
    mean: float = 0.0
    max: int = 0
    min: int = 1
    sigma: float = 0.8
    points: tuple[int, ...] = ()
    runaway: float | None = None  # lognormal only: the fraction that runs to `max`; None: the default

    def __post_init__(self) -> None:
        kind = self.kind
        bad = problems([problem("response length: mean", self.mean, minimum=0, maximum=MAX_TOKENS),
                        problem("response length: max", self.max, minimum=0, maximum=MAX_TOKENS),
                        problem("response length: min", self.min, maximum=MAX_TOKENS),
                        problem("response length: sigma", self.sigma, maximum=MAX_SIGMA,
                                why="measured reasoning lengths fit 0.5-1.5")])
        if len(self.points) > MAX_POINTS:
            bad.append(f"response length: {len(self.points):,} empirical points, more than {MAX_POINTS:,} (a sample "
                       "of that size gives the distribution as well as any larger one)")
        bad += [next((b for b in (problem("response length: point", p, maximum=MAX_TOKENS) for p in self.points)
                      if b), None)] if self.points else []
        bad = problems(bad)
        if bad:
            raise RpegError("; ".join(bad))
        object.__setattr__(self, "mean", float(self.mean))  # one YAML spelling, however it was given
        if kind == "fixed":
            if self.mean <= 0:
                raise RpegError(f"response length: fixed mean = {self.mean:g} must be positive")
            if self.mean < 1:  # a response of 1e-300 tokens: no step to plan
                raise RpegError(f"response length: fixed mean = {self.mean:g} must be at least 1 token")
            object.__setattr__(self, "max", max(self.max, int(math.ceil(self.mean))))
        elif kind == "uniform":
            if not 1 <= self.min <= self.max:
                raise RpegError(f"response length: uniform needs 1 <= min ({self.min}) <= max ({self.max})")
            object.__setattr__(self, "mean", (self.min + self.max) / 2)
        elif kind == "lognormal":
            if not 0 < self.mean <= self.max:
                raise RpegError(f"response length: lognormal needs 0 < mean ({self.mean:g}) <= max ({self.max})")
            if self.mean < 1:
                raise RpegError(f"response length: lognormal mean = {self.mean:g} must be at least 1 token")
            if self.sigma <= 0:
                raise RpegError(f"response length: lognormal sigma = {self.sigma} must be positive")
            if self.sigma < MIN_SIGMA:
                raise RpegError(f"response length: lognormal sigma = {self.sigma:g} must be at least {MIN_SIGMA:g} "
                                "(narrower lengths are one number: kind: fixed)")
            self._set_runaway()
        elif kind == "empirical":
            if not self.points or min(self.points) < 1:
                raise RpegError("response length: empirical needs a non-empty list of positive lengths")
            object.__setattr__(self, "points", tuple(sorted(self.points)))  # quantiles by index, no sort per call
            object.__setattr__(self, "mean", sum(self.points) / len(self.points))
            object.__setattr__(self, "max", max(self.max, max(self.points)))
        else:
            raise RpegError(f"response length: unknown kind {kind!r} (fixed, uniform, lognormal, empirical)")
        if kind != "lognormal":
            if self.runaway:
                raise RpegError(f"response length: runaway applies to a lognormal distribution, not {kind} (an "
                                "empirical sample holds its own responses at the cap)")
            object.__setattr__(self, "runaway", 0.0)

    def _set_runaway(self) -> None:
        c = self.runaway
        if c is None:
            c = min(RUNAWAY_FRACTION, 0.5 * self.mean / self.max) if self.mean < self.max else 0.0
        else:
            bad = problem("response length: runaway", c, minimum=0, maximum=1)
            if bad:
                raise RpegError(bad)
            if c > 0 and c * self.max >= self.mean:
                raise RpegError(f"response length: runaway = {c:g} of responses at max {self.max} alone give a mean "
                                f"of {c * self.max:g} tokens, not below the mean {self.mean:g}")
        object.__setattr__(self, "runaway", float(c))

    @property
    def _body_mean(self) -> float:
        """Mean of the log-normal part: the mixture's mean without the runaways at `max`."""
        c = self.runaway
        return (self.mean - c * self.max) / (1 - c)

    @classmethod
    def fixed(cls, tokens: int) -> LengthDistribution:
        return cls(kind="fixed", mean=tokens, max=tokens)

    def quantile(self, q: float) -> float:
        """Length below which a fraction q of responses fall (the truncation included)."""
        q = min(max(q, 0.0), 1.0)
        if self.kind == "fixed":
            return float(self.mean)
        if self.kind == "uniform":
            return self.min + q * (self.max - self.min)
        if self.kind == "empirical":
            pts = self.points  # sorted on construction
            return float(pts[min(int(q * len(pts)), len(pts) - 1)])
        c = self.runaway
        if q >= 1.0 - c:
            return float(self.max)
        mu = _lognormal_mu(self._body_mean, self.sigma, self.max)
        return min(float(self.max), math.exp(mu + self.sigma * _norm_ppf(q / (1 - c))))

    def expect(self, fn, points: int = 256) -> float:
        """E[fn(length)]: exact for fixed and empirical; the midpoint rule over quantiles for
        uniform; for the log-normal, the atom at `max` (truncation and runaways) exactly plus
        quantile bins that shrink geometrically toward the tail (a heavy tail holds much of the mean
        in little mass)."""
        if self.kind == "fixed":
            return fn(self.mean)
        if self.kind == "empirical":
            return sum(fn(p) for p in self.points) / len(self.points)
        if self.kind == "uniform":
            return sum(fn(self.quantile((i + 0.5) / points)) for i in range(points)) / points
        c = self.runaway
        body = sum(w * fn(x) for x, w in _lognormal_nodes(self._body_mean, self.sigma, self.max))
        return (1 - c) * body + (c * fn(float(self.max)) if c else 0.0)

    def moments(self) -> tuple[float, float]:
        """(E[r], E[r^2]): enough for any cost that is quadratic in the length (causal attention)."""
        return _moments(self)

    def expected_max(self, n: int) -> float:
        """Expected longest response among n independent ones: how long a batch of n runs."""
        if n <= 1:
            return self.mean
        # E[max] = integral of the quantile function weighted by the density of the max's rank; the
        # runaways' atom at `max` exactly (it may hold less mass than one bin)
        steps = 256
        top = 1.0 - self.runaway
        total = float(self.max) * (1.0 - top ** n)
        for i in range(steps):
            u0, u1 = top * i / steps, top * (i + 1) / steps
            total += self.quantile((u0 + u1) / 2) * (u1 ** n - u0 ** n)
        return total

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.mean:g}"
        if self.kind == "uniform":
            return f"uniform {self.min}..{self.max}"
        if self.kind == "lognormal":
            return f"lognormal mean {self.mean:g} max {self.max} sigma {self.sigma:g} runaway {self.runaway:.2%}"
        return f"empirical mean {self.mean:.0f} max {self.max} ({len(self.points)} points)"


def _norm_ppf(q: float) -> float:
    """Inverse standard normal CDF (Acklam's rational approximation, |error| < 1.2e-9)."""
    if q <= 0.0:
        return -math.inf
    if q >= 1.0:
        return math.inf
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549671010664070e00,
         4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)
    if q < 0.02425:
        t = math.sqrt(-2 * math.log(q))
        return (((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]) / (
            (((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1)
    if q > 1 - 0.02425:
        return -_norm_ppf(1 - q)
    t = q - 0.5
    r = t * t
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * t / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _truncated_lognormal_mean(mu: float, s: float, cap: float) -> float:
    """E[min(X, cap)] for X ~ LogNormal(mu, s)."""
    z = (math.log(cap) - mu) / s
    return math.exp(mu + s * s / 2) * _phi(z - s) + cap * (1 - _phi(z))


@cache
def _lognormal_mu(mean: float, s: float, cap: float) -> float:
    """mu such that the *truncated* mean E[min(X, cap)] equals `mean` (bisection; the truncated
    mean grows with mu)."""
    lo, hi = -20.0, math.log(cap) + 10 * s
    for _ in range(100):
        mid = (lo + hi) / 2
        if _truncated_lognormal_mean(mid, s, cap) < mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@cache
def _lognormal_nodes(mean: float, s: float, cap: float) -> tuple[tuple[float, float], ...]:
    """(length, probability) nodes of min(X, cap): the atom at cap, then 8 midpoints in each of
    40 quantile bins [1 - 2^-k, 1 - 2^-(k+1)) of the continuous part."""
    mu = _lognormal_mu(mean, s, cap)
    p_cap = 1 - _phi((math.log(cap) - mu) / s)
    body = 1 - p_cap
    nodes = [(float(cap), p_cap)] if p_cap > 0 else []
    for k in range(40):
        lo, hi = body * (1 - 2.0 ** -k), body * (1 - 2.0 ** -(k + 1))
        for j in range(8):
            u = lo + (j + 0.5) * (hi - lo) / 8
            nodes.append((min(float(cap), math.exp(mu + s * _norm_ppf(u))), (hi - lo) / 8))
    rest = body * 2.0 ** -40  # below 1e-12 of the mass: counted at the cap
    nodes.append((float(cap), rest))
    return tuple(nodes)


@cache
def _moments(dist: LengthDistribution) -> tuple[float, float]:
    return dist.mean, dist.expect(lambda r: r * r)


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """One RL step's data: `prompts` x `samples_per_prompt` sequences of `prompt_len` + response
    tokens, trained for `ppo_epochs` passes split into `mini_batches` optimizer steps each."""

    prompts: int = 64
    samples_per_prompt: int = 8
    prompt_len: int = 512
    response: LengthDistribution = field(default_factory=lambda: LengthDistribution.fixed(1024))
    ppo_epochs: int = 1
    mini_batches: int = 1
    episode: Episode | None = None  # multi-turn rollouts: how `response` splits into turns (graph/episode.py)

    def __post_init__(self) -> None:
        bad = problems([problem("prompts", self.prompts, positive=True, maximum=MAX_PROMPTS),
                        problem("samples_per_prompt", self.samples_per_prompt, positive=True, maximum=MAX_SAMPLES),
                        problem("prompt_len", self.prompt_len, positive=True, maximum=MAX_TOKENS),
                        problem("ppo_epochs", self.ppo_epochs, positive=True, maximum=MAX_EPOCHS),
                        problem("mini_batches", self.mini_batches, positive=True, maximum=MAX_MINI_BATCHES,
                                why="optimizer steps per epoch; published jobs take 1-64")])
        if not bad and self.mini_batches > self.sequences:
            bad.append(f"mini_batches = {self.mini_batches} exceeds the {self.sequences} sequences per step")
        if not bad and self.episode is not None and self.episode.observed() >= self.response.mean:
            bad.append(f"episode: {self.episode.tool_turns:g} tool turns x {self.episode.observation_tokens:g} "
                       f"observation tokens leave nothing of the {self.response.mean:g}-token response to sample")
        if bad:
            raise RpegError("job: " + "; ".join(bad))

    def replace(self, **changes) -> Job:
        return dataclasses.replace(self, **changes)

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples_per_prompt

    @property
    def mean_seq_len(self) -> float:
        return self.prompt_len + self.response.mean

    @property
    def max_seq_len(self) -> int:
        return self.prompt_len + self.response.max

    def describe(self) -> str:
        return (f"{self.prompts} prompts x {self.samples_per_prompt} samples = {self.sequences} sequences, "
                f"prompt {self.prompt_len} + response {self.response.describe()} tokens, "
                f"{self.ppo_epochs} epoch(s) x {self.mini_batches} mini-batch(es)"
                + (f"; episodes of {self.episode.describe()}" if self.episode else ""))
