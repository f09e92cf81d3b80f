"""RLOO: REINFORCE with a leave-one-out baseline.

Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
from Human Feedback in LLMs" (arXiv 2402.14740); the estimator from Kool et al. 2019.

Models: actor (trained), reference (frozen, k1 KL folded into the reward), reward model or rule.
Stages: generate (k samples per prompt) -> reward, actor_logprobs, ref_logprobs -> advantages
(each sample's reward minus the mean of the other k - 1: needs the whole group) ->
actor_update; actor_sync.
Fields: prompt_ids, response_ids, scores, old_logprobs, ref_logprobs, advantages.
"""

from __future__ import annotations

from rpeg.algorithms.common import Models, Recipe, assemble
from rpeg.graph import AlgoConfig, Graph, Job

DEFAULT = AlgoConfig(adv_estimator="rloo", loss_agg="seq-mean-token-mean", kl_coef=0.05, kl_estimator="k1",
                     kl_in="reward", norm_adv_by_std=False)
RECIPE = Recipe(group_baseline=True, adv_granularity="group",
                adv_doc="reward minus the mean reward of the prompt's other samples")


def build(job: Job, models: Models, config: AlgoConfig = DEFAULT) -> Graph:
    return assemble("rloo", job, models, config, RECIPE)
