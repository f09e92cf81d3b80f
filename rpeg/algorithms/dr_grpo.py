"""Dr. GRPO: GRPO without its length and difficulty biases.

Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"
(arXiv 2503.20783): advantages are not divided by the group's reward std, and the loss sums
token terms and divides by a constant (the max response length) instead of each sequence's
length. No KL term.

Models: actor (trained), reward model or rule reward.
Stages: generate -> reward, actor_logprobs -> advantages (score - group mean) -> actor_update;
actor_sync.
Fields: prompt_ids, response_ids, scores, old_logprobs, advantages.
"""

from __future__ import annotations

from rpeg.algorithms.common import Models, Recipe, assemble
from rpeg.graph import AlgoConfig, Graph, Job

DEFAULT = AlgoConfig(adv_estimator="dr_grpo", loss_agg="seq-mean-token-sum-norm", kl_coef=0.0,
                     norm_adv_by_std=False)
RECIPE = Recipe(group_baseline=True, adv_granularity="group", adv_doc="score minus the group mean")


def build(job: Job, models: Models, config: AlgoConfig = DEFAULT) -> Graph:
    return assemble("dr_grpo", job, models, config, RECIPE)
