"""PPO with a learned critic and GAE.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv 1707.06347); GAE from
Schulman et al. 2016 (arXiv 1506.02438); the RLHF form (reward minus a reference-KL penalty)
from Ouyang et al. 2022, InstructGPT (arXiv 2203.02155).

Models: actor (trained), critic (trained, value head), reference (frozen; only when
kl_coef > 0), reward model (frozen) or a rule reward.
Stages: generate -> reward, actor_logprobs, ref_logprobs, critic_values -> advantages (GAE,
per sample) -> actor_update, critic_update; actor_sync moves the new actor to generation.
Fields: prompt_ids, response_ids, scores, old_logprobs, ref_logprobs, values, advantages, returns.
"""

from __future__ import annotations

from rpeg.algorithms.common import Models, Recipe, assemble
from rpeg.graph import AlgoConfig, Graph, Job

DEFAULT = AlgoConfig(adv_estimator="gae", loss_agg="token-mean", kl_coef=0.001, kl_estimator="k1",
                     kl_in="reward", gamma=1.0, lam=0.95, value_clip=0.2)
# GAE runs per sequence, but its advantages are then whitened over the batch's response tokens
# (verl's compute_gae_advantage_return, masked_whiten; ours in runtime/advantages.py): the stage
# needs the whole batch before it can finish
RECIPE = Recipe(critic=True, adv_granularity="batch",
                adv_doc="GAE over each sequence's tokens, KL penalty folded into the reward, whitened over the batch")


def build(job: Job, models: Models, config: AlgoConfig = DEFAULT) -> Graph:
    return assemble("ppo", job, models, config, RECIPE)
