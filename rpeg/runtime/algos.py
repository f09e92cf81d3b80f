"""The algorithm math of every RPEG algorithm: one import for trainers.

Advantage estimators live in `advantages.py`, KL estimators, loss aggregations and the actor
and critic losses in `losses.py`; this module re-exports them. A trainer looks everything up
by the AlgoConfig's strings through the registries and never branches on them:

    adv, returns = compute_advantages(config.adv_estimator, scores=..., mask=..., config=config, ...)
    loss, metrics = policy_loss(logprobs, old_logprobs, adv, mask, config, ref_logprobs=...,
                                behaviour_logprobs=...)  # the engine's: off-policy correction
    vloss, vmetrics = value_loss(values, old_values, returns, mask, config)

Tests: `.venv/bin/python -m pytest -q tests/runtime/test_runtime_algos.py`.
"""

from rpeg.runtime.advantages import (
    ADVANTAGES,
    compute_advantages,
    discounted_returns,
    gae_advantages,
    group_mean_std,
    kl_reward,
    sequence_rewards,
    token_rewards,
)
from rpeg.runtime.losses import (
    KL,
    LOSS_AGG,
    OFF_POLICY,
    POLICY_LOSSES,
    aggregate,
    correction,
    masked_mean,
    masked_sum,
    masked_whiten,
    policy_loss,
    value_loss,
)

__all__ = [
    "ADVANTAGES", "KL", "LOSS_AGG", "OFF_POLICY", "POLICY_LOSSES", "aggregate", "compute_advantages", "correction",
    "discounted_returns",
    "gae_advantages", "group_mean_std", "kl_reward", "masked_mean", "masked_sum", "masked_whiten",
    "policy_loss", "sequence_rewards", "token_rewards", "value_loss",
]
