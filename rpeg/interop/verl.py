"""verl: its PPO trainer's Hydra config, read into RPEG and written from RPEG's plans.

What is read (verl 0.9.1; sources are the package's own files): a launch script that runs
`python3 -m verl.trainer.main_ppo` (synchronous, every role on one pool: the hybrid engine),
`verl.experimental.one_step_off_policy.main_ppo` (a rollout pool of `rollout.nnodes x
rollout.n_gpus_per_node`, generation one step ahead) or `verl.experimental.fully_async_policy.
fully_async_main` (the same pools; `async_training.*`), with Hydra overrides `key=value`,
`+key=value`, `++key=value` and `--config-name`; or a YAML file of the same keys (a recipe's config
with `defaults:`). Only the keys the user set are read; verl's defaults fill the rest
(trainer/config/_generated_ppo_trainer.yaml and _generated_ppo_megatron_trainer.yaml).

The mapping, key by key:
- algorithm.adv_estimator: gae -> ppo (with a critic), grpo -> grpo (dapo when
  algorithm.filter_groups.enable: DAPO's dynamic sampling), rloo, reinforce_plus_plus(_baseline),
  remax. The KL: actor.use_kl_loss (kl_in loss, kl_loss_coef, kl_loss_type) or
  algorithm.use_kl_in_reward (kl_in reward, kl_ctrl.kl_coef, kl_penalty); neither: no reference.
  clip_ratio(_low/_high), clip_ratio_c (dual clip), loss_agg_mode, entropy_coeff, gamma, lam,
  norm_adv_by_std_in_grpo, critic.cliprange_value, policy_loss.loss_mode (vanilla, gspo),
  algorithm.rollout_correction.rollout_is (token: tis, sequence: tis-seq; threshold: is_cap).
- The job: data.train_batch_size prompts of actor_rollout_ref.rollout.n samples, mini-batches of
  actor.ppo_mini_batch_size prompts, actor.ppo_epochs, data.max_prompt_length, the response cap
  data.max_response_length (its distribution is not in the config: see common.response_of). For
  DAPO, data.gen_batch_size / train_batch_size is the oversampling. fully-async: a step is one
  parameter sync, trigger_parameter_sync_step x require_batches mini-batches of
  ppo_mini_batch_size prompts (docs/advance/fully_async.md).
- The plan. sync: one group `all` of trainer.nnodes x n_gpus_per_node GPUs holding every stage.
  one-step-off / fully-async: group `rollout` (rollout.nnodes x rollout.n_gpus_per_node, the first
  devices) runs generation; group `train` (trainer.*) runs the rest; k = 1, and for fully-async
  k = ceil(staleness_threshold) (RPEG's bound counts whole steps: 0.1 reads as 1) with
  async_training.partial_rollout. Layouts: actor.strategy fsdp / fsdp2 -> ZeRO-3 with Ulysses as
  cp; megatron -> tp, pp (virtual stages as pp_interleave), cp, ep, sequence parallel, ZeRO-1
  with the distributed optimizer. The actor's old-logprob pass and the reference run on the
  actor's workers in its shape (verl's ActorRolloutRefWorker); micro-batches from
  ppo_micro_batch_size_per_gpu, rollout.log_prob_micro_batch_size_per_gpu,
  ref.log_prob_micro_batch_size_per_gpu, critic.ppo_micro_batch_size_per_gpu and
  forward_micro_batch_size_per_gpu, or with use_dynamic_bsz the token budget
  ppo_max_token_len_per_gpu over the longest sequence; model.use_remove_padding is packing;
  model.enable_gradient_checkpointing is full recomputation; ref.fsdp_config.param_offload keeps
  the reference on the host. The logits path of the actor's and the reference's passes
  (rpeg/perf/logits.py): model.use_fused_kernels (or actor.use_fused_kernels) is fused-linear, and
  is written back; without it Megatron's is fused-ce and FSDP's bf16-ce (bf16-ce-entropy for the
  update when actor.calculate_entropy or entropy_coeff != 0). Offload of the actor's and the
  critic's state (_offload_of, what each key does: rpeg/perf/offload.py): fsdp_config.param_offload
  / optimizer_offload and megatron.param_offload / grad_offload / optimizer_offload false keep that
  part resident through generation (verl's defaults: all resident), fsdp_config.offload_policy
  (FSDP2) is offload_params, optim.override_optimizer_config.optimizer_cpu_offload with
  optimizer_offload_fraction is offload_optimizer. Generation: rollout.tensor_model_parallel_size
  (and pipeline_model_parallel_size) over the group. The weight sync: FSDP gathers every tensor in
  full, Megatron its shard (the 3D-HybridEngine), as rpeg/search/baselines/verl.py models it.

What verl cannot express (`project`): critic sharing (verl trains its own critic), fusion,
streaming, asynchrony on one pool, device groups other than the above, training layouts that mix
FSDP with tensor or pipeline parallelism, forward passes laid out apart from the actor's workers,
selective recomputation under FSDP, off-policy corrections other than TIS.

The code: verl_keys.py holds the entry points, the value tables, the defaults and the keys that change
nothing; verl_read.py reads (`read`); verl_write.py projects and writes (`project`, `overrides`, `write`).
This module is their public surface: what `rpeg.interop.system("verl")` gives.
"""

from __future__ import annotations

from rpeg.interop.common import HF_NAMES, colocate_all, defaults_of, hf_name, resize  # noqa: F401 (HF_NAMES: the tests)
from rpeg.interop.verl_keys import (  # noqa: F401 (the tables: the tests and tests/interop/peer_code.py)
    CONFIG_NAMES, DEFAULTS, ENTRIES, ESTIMATORS, KL_TYPES, LOSS_AGG, RECIPES, ROLLOUT_IS, SUFFIX, SYSTEM, _ENTRY,
)
from rpeg.interop.verl_read import _value, read  # noqa: F401 (_value: the tests)
from rpeg.interop.verl_write import overrides, project, write  # noqa: F401
