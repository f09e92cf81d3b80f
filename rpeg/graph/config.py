"""AlgoConfig: the algorithm's knobs that shape the graph or the loss, recorded in the graph so
the runtime trains exactly what was planned."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from rpeg.errors import RpegError
from rpeg.graph.bounds import MAX_COEF, problem
from rpeg.graph.bounds import problems as bounded


# The advantage estimators the runtime registers (rpeg/runtime/advantages.py ADVANTAGES; a test keeps
# the two in step). Named here so a planner without torch refuses an unknown one.
ADV_ESTIMATORS = ("gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax")


@dataclass(frozen=True, kw_only=True, slots=True)
class AlgoConfig:
    """adv_estimator: registered advantage estimator (gae, grpo, rloo, reinforce_pp, ...).
    loss_agg: token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum-norm (Dr. GRPO).
    clip_low / clip_high: PPO ratio clip range [1 - low, 1 + high]; DAPO's clip-higher sets high > low.
    kl_coef / kl_estimator / kl_in: reference KL penalty, k1 or k3 (Schulman 2020), in the reward
    or in the loss; kl_coef 0 means no reference model at all.
    oversample: sequences generated per sequence trained (DAPO's dynamic sampling; 1 = none).
    """

    adv_estimator: str
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k3"] = "k1"
    kl_in: Literal["reward", "loss"] = "reward"
    norm_adv_by_std: bool = True
    gamma: float = 1.0
    lam: float = 1.0
    value_clip: float = 0.0
    oversample: float = 1.0
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        problems = bounded([problem(f, getattr(self, f), minimum=0, maximum=MAX_COEF)
                            for f in ("clip_low", "clip_high", "kl_coef", "value_clip", "entropy_coef", "gamma", "lam")]
                           # oversample only scales counts the model multiplies in closed form: finite is enough
                           + [problem("oversample", self.oversample, minimum=0)])
        if problems:  # NaN, inf, negative or absurd: each named once, before the rules below compare them
            raise RpegError("algorithm config: " + "; ".join(problems))
        if self.adv_estimator not in ADV_ESTIMATORS:
            problems.append(f"adv_estimator = {self.adv_estimator!r} is not one of {', '.join(ADV_ESTIMATORS)}")
        if self.clip_low < 0 or self.clip_high < 0:
            problems.append(f"clip_low = {self.clip_low} and clip_high = {self.clip_high} must be >= 0")
        if self.kl_coef < 0:
            problems.append(f"kl_coef = {self.kl_coef} must be >= 0")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            problems.append(f"gamma = {self.gamma} and lam = {self.lam} must lie in [0, 1]")
        if self.oversample < 1:
            problems.append(f"oversample = {self.oversample} must be >= 1")
        if problems:
            raise RpegError("algorithm config: " + "; ".join(problems))

    def replace(self, **changes) -> AlgoConfig:
        return dataclasses.replace(self, **changes)

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0
