"""REINFORCE++: REINFORCE with PPO's clipping and batch-wide advantage normalization.

Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models"
(arXiv 2501.03262).

Two variants:
- `reinforce_pp`: no baseline; token-level KL (k1) folded into the reward; the return of each
  token is normalized over the whole batch.
- `reinforce_pp_baseline`: subtract each prompt's group mean first (needs >= 2 samples), then
  normalize over the batch; KL in the loss (k3).

Models: actor (trained), reference (frozen), reward model or rule reward.
Stages: generate -> reward, actor_logprobs, ref_logprobs -> advantages (needs the whole batch:
nothing can stream into it) -> actor_update; actor_sync.
Fields: prompt_ids, response_ids, scores, old_logprobs, ref_logprobs, advantages.
"""

from __future__ import annotations

from rpeg.algorithms.common import Models, Recipe, assemble
from rpeg.graph import AlgoConfig, Graph, Job

DEFAULT = AlgoConfig(adv_estimator="reinforce_pp", loss_agg="token-mean", kl_coef=0.01, kl_estimator="k1",
                     kl_in="reward")
DEFAULT_BASELINE = AlgoConfig(adv_estimator="reinforce_pp_baseline", loss_agg="token-mean", kl_coef=0.01,
                              kl_estimator="k3", kl_in="loss")
RECIPE = Recipe(adv_granularity="batch", adv_doc="discounted token returns normalized over the batch")
RECIPE_BASELINE = Recipe(group_baseline=True, adv_granularity="batch",
                         adv_doc="reward minus group mean, then normalized over the batch")


def build(job: Job, models: Models, config: AlgoConfig = DEFAULT) -> Graph:
    return assemble("reinforce_pp", job, models, config, RECIPE)


def build_baseline(job: Job, models: Models, config: AlgoConfig = DEFAULT_BASELINE) -> Graph:
    return assemble("reinforce_pp_baseline", job, models, config, RECIPE_BASELINE)
