"""GRPO: group-relative advantages, no critic.

Shao et al. 2024, "DeepSeekMath" (arXiv 2402.03300), section 4.1.

Models: actor (trained), reference (frozen, KL in the loss with the k3 estimator), reward
model or rule reward.
Stages: generate (samples_per_prompt responses per prompt) -> reward, actor_logprobs,
ref_logprobs -> advantages ((r - mean) / std within each prompt's group: needs the whole group)
-> actor_update; actor_sync.
Fields: prompt_ids, response_ids, scores, old_logprobs, ref_logprobs, advantages.
"""

from __future__ import annotations

from rpeg.algorithms.common import Models, Recipe, assemble
from rpeg.graph import AlgoConfig, Graph, Job

DEFAULT = AlgoConfig(adv_estimator="grpo", loss_agg="seq-mean-token-mean", kl_coef=0.04, kl_estimator="k3",
                     kl_in="loss", norm_adv_by_std=True)
RECIPE = Recipe(group_baseline=True, adv_granularity="group",
                adv_doc="(score - group mean) / group std for each prompt's samples")


def build(job: Job, models: Models, config: AlgoConfig = DEFAULT) -> Graph:
    return assemble("grpo", job, models, config, RECIPE)
