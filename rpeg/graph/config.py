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
# The policy losses (rpeg/runtime/losses.py POLICY_LOSSES) and off-policy corrections (OFF_POLICY), kept in
# step by the same test.
POLICY_LOSSES = ("ppo", "gspo")
OFF_POLICY = ("none", "tis", "tis-seq", "mask-token", "mask-seq", "decoupled")


# What each option of a job's `config:` section does (`rpeg algorithms` lists them with their choices).
OPTIONS = {
    "adv_estimator": "advantage estimator (rpeg/runtime/advantages.py)",
    "loss_agg": "how per-token losses become one: token-mean (DAPO), seq-mean-token-mean (GRPO), "
                "seq-mean-token-sum-norm (Dr. GRPO)",
    "clip_low": "PPO ratio clip below: 1 - clip_low",
    "clip_high": "PPO ratio clip above: 1 + clip_high (DAPO's clip-higher: > clip_low)",
    "kl_coef": "reference KL coefficient (0: no reference model)",
    "kl_estimator": "k1 or k3 (Schulman 2020); k3's log-ratio is guarded at +-20",
    "kl_in": "the KL penalty in the reward or in the loss",
    "norm_adv_by_std": "GRPO: divide by the group's std",
    "gamma": "discount",
    "lam": "GAE lambda",
    "value_clip": "PPO value clipping range (0: none)",
    "oversample": "sequences generated per sequence trained (DAPO dynamic sampling)",
    "entropy_coef": "entropy bonus",
    "policy_loss": "ppo: a ratio per token; gspo: one per sequence (Zheng 2025); log-ratios guarded at +-20",
    "dual_clip": "dual-clip PPO bound c for A < 0 (Ye 2020; verl's default 3; 0: none)",
    "off_policy": "correction for samples the engine drew: truncated IS (tis, tis-seq), rejection of tokens or "
                  "sequences (mask-token, mask-seq), AReaL's decoupled objective",
    "is_cap": "importance weights' cap (tis, tis-seq, decoupled) and rejection's upper bound (mask-token, mask-seq)",
    "is_low": "rejection's lower bound (mask-token, mask-seq)",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class AlgoConfig:
    """adv_estimator: registered advantage estimator (gae, grpo, rloo, reinforce_pp, ...).
    loss_agg: token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum-norm (Dr. GRPO).
    clip_low / clip_high: PPO ratio clip range [1 - low, 1 + high]; DAPO's clip-higher sets high > low.
    kl_coef / kl_estimator / kl_in: reference KL penalty, k1 or k3 (Schulman 2020), in the reward
    or in the loss; kl_coef 0 means no reference model at all.
    oversample: sequences generated per sequence trained (DAPO's dynamic sampling; 1 = none).
    policy_loss: ppo (a ratio per token) or gspo (one ratio per sequence, Zheng 2025).
    dual_clip: dual-clip PPO's c > 1 (Ye 2020): a negative-advantage token's loss is at most -A c;
    0 turns it off. 3 is verl's default.
    off_policy / is_cap / is_low: the correction for samples drawn by the engine's policy rather than
    the trainer's (none, tis, tis-seq, mask-token, mask-seq, decoupled; rpeg/runtime/losses.py
    OFF_POLICY): the importance weights' cap, and the token and sequence rejections' lower bound.
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
    policy_loss: Literal["ppo", "gspo"] = "ppo"
    dual_clip: float = 3.0
    off_policy: Literal["none", "tis", "tis-seq", "mask-token", "mask-seq", "decoupled"] = "none"
    is_cap: float = 2.0
    is_low: float = 0.5

    def __post_init__(self) -> None:
        problems = bounded([problem(f, getattr(self, f), minimum=0, maximum=MAX_COEF)
                            for f in ("clip_low", "clip_high", "kl_coef", "value_clip", "entropy_coef", "gamma", "lam",
                                      "dual_clip", "is_cap", "is_low")]
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
        if self.policy_loss not in POLICY_LOSSES:
            problems.append(f"policy_loss = {self.policy_loss!r} is not one of {', '.join(POLICY_LOSSES)}")
        if self.off_policy not in OFF_POLICY:
            problems.append(f"off_policy = {self.off_policy!r} is not one of {', '.join(OFF_POLICY)}")
        if self.dual_clip and self.dual_clip <= 1:
            problems.append(f"dual_clip = {self.dual_clip} must be > 1 (the bound is -A c for A < 0), or 0 for none")
        if not self.is_low < 1 < self.is_cap:
            problems.append(f"is_low = {self.is_low} and is_cap = {self.is_cap}: the importance weights' bounds must "
                            "hold 1 between them (is_low < 1 < is_cap)")
        if problems:
            raise RpegError("algorithm config: " + "; ".join(problems))

    def loss_notes(self) -> list[str]:
        """The loss options that differ from the defaults, in words (`rpeg show`'s config line)."""
        out = [f"{self.policy_loss} ratio"] if self.policy_loss != "ppo" else []
        if self.dual_clip != 3.0:
            out.append(f"dual-clip {self.dual_clip:g}" if self.dual_clip else "no dual-clip")
        if self.corrects_off_policy:
            masks = self.off_policy.startswith("mask")
            out.append(f"off-policy {self.off_policy} " + (f"[{self.is_low:g}, {self.is_cap:g}]" if masks
                                                            else f"cap {self.is_cap:g}"))
        return out

    def replace(self, **changes) -> AlgoConfig:
        return dataclasses.replace(self, **changes)

    @property
    def corrects_off_policy(self) -> bool:
        """Whether the loss weighs or masks tokens by the trainer's and the engine's logprobs of them."""
        return self.off_policy != "none"

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0
