"""ReMax: REINFORCE with the reward of a greedy response as the baseline.

Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
Aligning Large Language Models" (arXiv 2310.10505).

Models: actor (trained), reference (frozen, k1 KL in the reward), reward model or rule reward.
Stages: generate (sampled) and generate_greedy (one greedy response per prompt) -> reward and
reward_greedy, actor_logprobs, ref_logprobs -> advantages (sample reward minus its prompt's
greedy reward: per sample once the greedy score is known) -> actor_update; actor_sync.
Fields: prompt_ids, response_ids, greedy_ids, scores, greedy_scores, old_logprobs,
ref_logprobs, advantages.
"""

from __future__ import annotations

from rpeg.algorithms.common import Models, Recipe, assemble
from rpeg.graph import AlgoConfig, Graph, Job

DEFAULT = AlgoConfig(adv_estimator="remax", loss_agg="seq-mean-token-mean", kl_coef=0.01, kl_estimator="k1",
                     kl_in="reward", norm_adv_by_std=False)
RECIPE = Recipe(greedy_baseline=True, adv_granularity="sample",
                adv_doc="sample reward minus the greedy response's reward for the same prompt")


def build(job: Job, models: Models, config: AlgoConfig = DEFAULT) -> Graph:
    return assemble("remax", job, models, config, RECIPE)
