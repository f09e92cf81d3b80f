"""OpenRLHF's flags as RPEG reads them: the entry point, the tables that map its values (estimators, the
rollout corrections read and written back), the parser's defaults of the flags the importer reads (`DEFAULTS`,
OpenRLHF 0.11.2), the flags that take no value (`FLAGS`) or two (`FLOAT2`), and the flags that change nothing
of the plan, each with the reason the import says (`_NOT_PLAN`).

rpeg/interop/openrlhf.py says the mapping flag by flag; openrlhf_read.py reads with these tables,
openrlhf_write.py writes.
"""

from __future__ import annotations

import re
from typing import Any

SYSTEM = "openrlhf"
SUFFIX = ".sh"
ENTRY = "openrlhf.cli.train_ppo_ray"
_ENTRY = re.compile(r"^openrlhf\.cli\.train_ppo_ray$")

ESTIMATORS = {"gae": "ppo", "group_norm": "grpo", "rloo": "rloo", "reinforce": "reinforce_pp",
              "reinforce_baseline": "reinforce_pp_baseline", "dr_grpo": "dr_grpo"}
# --algo.advantage.is_correction_level / _mode (gating on the ratio) -> RPEG's off_policy (module docstring).
# OpenRLHF's token mask is IcePop, not RPEG's mask-token (token rejection: kept tokens weigh 1, rejected ones
# leave the denominator); its seq mask keeps rho on the kept tokens, which mask-seq does not.
CORRECTIONS = {("token", "clip"): "tis", ("token", "mask"): "decoupled", ("seq", "mask"): "mask-seq"}
# the corrections written back, which OpenRLHF computes exactly with the threshold `0 is_cap`
EXPORTS = {"tis": ("token", "clip"), "decoupled": ("token", "mask")}
# Actor.forward's log-probs (openrlhf/models/actor.py): the logits copied to fp32, then flash-attn's cross-entropy
# (rpeg/perf/logits.py "fp32-ce"); the same code for the policy's update, its log-prob pass and the reference.
# No flag changes it: read into those stages' layouts and written back as is
LOGITS = "fp32-ce"
LOGITS_STAGES = ("actor_update", "actor_logprobs", "ref_logprobs")

# the parser's defaults for the flags read here (train_ppo_ray.py, 0.11.2); None: no default
DEFAULTS: dict[str, Any] = {
    "train.agent_func_path": None, "algo.dynamic_filtering_range": [0.0, 1.0],
    "actor.num_nodes": 1, "actor.num_gpus_per_node": 8, "ref.num_nodes": 1, "ref.num_gpus_per_node": 8,
    "critic.num_nodes": 1, "critic.num_gpus_per_node": 8, "reward.num_nodes": 1, "reward.num_gpus_per_node": 8,
    "vllm.num_engines": None, "vllm.tensor_parallel_size": 1, "train.colocate_all": False,
    "train.colocate_actor_ref": False, "train.colocate_critic_reward": False, "ds.zero_stage": 2,
    "ds.tensor_parallel_size": 1, "ds.ring_attn_size": 1, "ds.packing_samples": False,
    "actor.gradient_checkpointing_enable": False, "train.micro_batch_size": 1, "rollout.micro_batch_size": 1,
    "train.batch_size": 128, "rollout.batch_size": 1024, "rollout.n_samples_per_prompt": 1, "train.max_epochs": 1,
    "data.max_len": 2048, "rollout.max_new_tokens": None, "train.dynamic_batch_enable": False,
    "train.max_tokens_per_gpu": 16192, "rollout.max_tokens_per_gpu": None,
    "algo.advantage.estimator": "gae", "algo.kl.init_coef": 0.01, "algo.kl.use_loss": False,
    "algo.kl.estimator": "k1", "actor.eps_clip": 0.2, "actor.eps_clip_low_high": None, "actor.dual_clip": None,
    "actor.loss_agg_mode": "token-mean", "actor.policy_loss_type": "ppo", "actor.entropy_coef": None,
    "algo.advantage.gamma": 1.0, "algo.advantage.lambd": 1.0, "algo.advantage.no_std_norm": False,
    "critic.value_clip": 0.5, "algo.advantage.is_correction_level": "off",
    "algo.advantage.is_correction_mode": "mask", "algo.advantage.is_correction_gating": "ratio",
    "algo.advantage.is_correction_threshold": [0.5, 5.0], "algo.dynamic_filtering_enable": False,
    "train.async_enable": False, "train.async_queue_size": 1, "train.partial_rollout_enable": False,
    "actor.model_name_or_path": None, "critic.model_name_or_path": None, "reward.model_name_or_path": None,
    "reward.remote_url": None, "ref.offload": False,
    # LoRA (train_ppo_ray.py): off at rank 0; alpha 16; every linear layer; no dropout
    "ds.lora.rank": 0, "ds.lora.alpha": 16, "ds.lora.target_modules": "all-linear", "ds.lora.dropout": 0,
}
FLAGS = {k for k, v in DEFAULTS.items() if isinstance(v, bool)} | {"vllm.enable_sleep", "ds.enable_sleep",
                                                                    "ds.adam_offload", "adam_offload"}
# flags that take every word up to the next flag (argparse nargs="*"): module names
LISTS = {"ds.lora.target_modules", "target_modules"}
FLOAT2 = {"actor.eps_clip_low_high", "algo.advantage.is_correction_threshold", "algo.dynamic_filtering_range",
          "reward.clip_range", "actor.adam.betas", "critic.adam.betas"}

_NOT_PLAN = (
    ("data.", "data loading and prompt handling are not part of the plan"),
    ("ckpt.", "checkpointing is not part of the plan"), ("logger.", "logging is not part of the plan"),
    ("eval.", "evaluation is not part of a training step"),
    ("actor.adam.", "optimizer settings do not change a step's cost in RPEG's model"),
    ("critic.adam.", "optimizer settings do not change a step's cost in RPEG's model"),
    ("actor.lr", "optimizer settings do not change a step's cost in RPEG's model"),
    ("critic.lr", "optimizer settings do not change a step's cost in RPEG's model"),
    ("rollout.temperature", "sampling settings are not part of the plan (the response lengths stand for them)"),
    ("rollout.top_", "sampling settings are not part of the plan (the response lengths stand for them)"),
    ("vllm.gpu_memory_utilization", "the engine's memory share: RPEG sizes the KV cache from the layout"),
    ("vllm.enable_sleep", "the engines' sleep mode (vLLM's level 1: weights backed up in pinned host memory, KV "
                          "cache dropped) is RPEG's context switch on colocated plans; the engines have GPUs of their "
                          "own here"),
    ("ds.enable_sleep", "DeepSpeed's sleep mode (offload_states) moves the trainers' state only when they share GPUs "
                        "with the engines (--train.colocate_all, synchronous), which they do not here"),
    ("ds.param_dtype", "RPEG costs bf16 weights"), ("ds.attn_implementation", "the attention kernel is not modelled"),
    ("train.num_episodes", "episodes over the data are not part of a step"),
    ("vllm.sync_backend", "the weight sync's transport: RPEG costs it on the cluster's links"),
    ("vllm.enforce_eager", "CUDA graphs: RPEG's efficiency factors are per device and operation size"),
    ("ds.ring_attn_head_stride", "how ring attention walks the heads: RPEG costs cp's traffic, not its schedule"),
    ("reward.", "a reward's shaping is not part of the plan"),
    ("ds.bf16", "RPEG costs bf16 weights"), ("ds.flash_attn", "the attention kernel is not modelled"),
    ("actor.max_norm", "gradient clipping does not change a step's cost in RPEG's model"),
    ("actor.ptx_coef", "a pretraining loss mixed in (with --pretrain_data) is not modelled"),
)
