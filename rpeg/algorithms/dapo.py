"""DAPO: GRPO with dynamic sampling, clip-higher, token-level loss and no KL.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
(arXiv 2503.14476).

Dynamic sampling: groups whose samples all got the same reward carry no signal; DAPO samples
more prompts than it trains on and keeps groups with mixed rewards. `oversample` is the
ratio of generated to trained sequences (the paper regenerates until the batch is full; a
fixed ratio is what a planner can cost). Clip-higher: epsilon_low 0.2, epsilon_high 0.28.
Overlong reward shaping happens inside the reward stage.

Models: actor (trained), reward model or rule reward; no reference, no critic.
Stages: generate (gen_batch sequences) -> reward (all of them) -> dynamic_sampling (per group)
-> actor_logprobs -> advantages (group-normalized) -> actor_update; actor_sync.
Fields: prompt_ids, sampled_ids, sampled_scores, response_ids, scores, old_logprobs, advantages.
"""

from __future__ import annotations

from rpeg.algorithms.common import Models, Recipe, assemble
from rpeg.graph import AlgoConfig, Graph, Job

DEFAULT = AlgoConfig(adv_estimator="grpo", loss_agg="token-mean", clip_low=0.2, clip_high=0.28, kl_coef=0.0,
                     oversample=1.5)
RECIPE = Recipe(group_baseline=True, dynamic_sampling=True, adv_granularity="group",
                adv_doc="(score - group mean) / group std for each kept prompt's samples")


def build(job: Job, models: Models, config: AlgoConfig = DEFAULT) -> Graph:
    return assemble("dapo", job, models, config, RECIPE)
