"""verl's keys as RPEG reads them: its entry points, the tables that map its values, the defaults of the
keys the importer reads (`DEFAULTS`, verl 0.9.1), the job's keys over those defaults (`_Config`), and the
keys that change nothing of the plan, each with the reason the import says (`_note_rest`).

rpeg/interop/verl.py says the mapping key by key; verl_read.py reads with these tables, verl_write.py writes.
"""

from __future__ import annotations

import re
from typing import Any

from rpeg.errors import RpegError
from rpeg.interop.common import Notes
from rpeg.search.baselines.verl import VERL_MAX_NUM_SEQS


SYSTEM = "verl"
SUFFIX = ".sh"

ENTRIES = {
    "verl.trainer.main_ppo": "sync",
    "verl.experimental.one_step_off_policy.main_ppo": "one-step-off",
    "verl.experimental.fully_async_policy.fully_async_main": "fully-async",
}
# (FSDP, Megatron) config of each entry, in the entry's own Hydra config folder
CONFIG_NAMES = {
    "sync": ("ppo_trainer", "ppo_megatron_trainer"),
    "one-step-off": ("one_step_off_ppo_trainer", "one_step_off_ppo_megatron_trainer"),
    "fully-async": ("fully_async_ppo_trainer", "fully_async_ppo_megatron_trainer"),
}
# recipe entry points that extend main_ppo's trainer and read its keys plus a few of their own
# (recipe/<name>/config/*.yaml at verl v0.7.0: `defaults: [ppo_trainer, _self_]` and the keys below);
# the asynchronous trainers' older homes (recipe/ before verl.experimental, v0.5-v0.7)
RECIPES = {
    "recipe.dapo.main_dapo": "sync",  # dapo_trainer.yaml: algorithm.filter_groups.*, reward_model.overlong_buffer.*
    "recipe.entropy.main_entropy": "sync",  # entropy_trainer.yaml: DAPO's keys, and the clip-cov / kl-cov losses
    "recipe.one_step_off_policy.main_ppo": "one-step-off",
    "recipe.fully_async_policy.fully_async_main": "fully-async",
}
_ENTRY = re.compile(r"^(" + "|".join(re.escape(e) for e in (*ENTRIES, *RECIPES)) + r")$")

ESTIMATORS = {"gae": "ppo", "grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_pp",
              "reinforce_plus_plus_baseline": "reinforce_pp_baseline", "remax": "remax"}
KL_TYPES = {"kl": "k1", "k1": "k1", "low_var_kl": "k3", "k3": "k3"}
LOSS_AGG = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
ROLLOUT_IS = {"token": "tis", "sequence": "tis-seq"}

# verl's defaults for the keys read here (trainer/config/_generated_ppo_trainer.yaml, legacy_data.yaml)
# where each trained model's offload keys live: (FSDP's fsdp_config, Megatron's, Megatron-Core's optimizer overrides)
_OFFLOAD_KEYS = {
    "actor_update": ("actor_rollout_ref.actor.fsdp_config.", "actor_rollout_ref.actor.megatron.",
                     "actor_rollout_ref.actor.optim.override_optimizer_config."),
    "critic_update": ("critic.fsdp.", "critic.megatron.", "critic.optim.override_optimizer_config."),
}
# the critic's FSDP keys before verl 0.9 (its example scripts still set them): read, never written
_OLDER_FSDP = {"critic_update": "critic.model.fsdp_config."}
DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 1024, "data.max_prompt_length": 512, "data.max_response_length": 512,
    "data.gen_batch_size": None,
    "actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": 1,
    "actor_rollout_ref.rollout.data_parallel_size": 1, "actor_rollout_ref.rollout.expert_parallel_size": 1,
    # rollout/rollout.yaml: verl passes it to each vLLM engine it starts (the verl baselines' engines)
    "actor_rollout_ref.rollout.max_num_seqs": VERL_MAX_NUM_SEQS,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256, "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": None, "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
    "actor_rollout_ref.actor.use_kl_loss": False, "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl", "actor_rollout_ref.actor.clip_ratio": 0.2,
    "actor_rollout_ref.actor.clip_ratio_low": None, "actor_rollout_ref.actor.clip_ratio_high": None,
    "actor_rollout_ref.actor.clip_ratio_c": 3.0, "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.entropy_coeff": 0.0, "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 1,
    # model/hf_model.yaml: use_remove_padding and enable_gradient_checkpointing are on by default
    "actor_rollout_ref.model.use_remove_padding": True, "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    # the logits path (verl_read._logits): model/hf_model.yaml's use_fused_kernels, actor.yaml's calculate_entropy
    "actor_rollout_ref.model.use_fused_kernels": False, "actor_rollout_ref.actor.calculate_entropy": False,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.ref.fsdp_config.param_offload": False,
    # offload of the trained models' state (_offload_of): verl's defaults keep it all on the GPUs
    **{f"{fsdp}{k}": False for fsdp in [f for f, _, _ in _OFFLOAD_KEYS.values()] + list(_OLDER_FSDP.values())
       for k in ("param_offload", "optimizer_offload", "offload_policy")},
    **{f"{meg}{k}": False for _, meg, _ in _OFFLOAD_KEYS.values()
       for k in ("param_offload", "grad_offload", "optimizer_offload")},
    **{f"{opt}optimizer_cpu_offload": False for _, _, opt in _OFFLOAD_KEYS.values()},
    **{f"{opt}optimizer_offload_fraction": 1.0 for _, _, opt in _OFFLOAD_KEYS.values()},
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": 1,
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": 1,
    "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size": None,
    "actor_rollout_ref.actor.megatron.context_parallel_size": 1,
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size": 1,
    "actor_rollout_ref.actor.megatron.sequence_parallel": True,
    "actor_rollout_ref.actor.megatron.use_distributed_optimizer": True,
    "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity": None,
    **{f"critic.megatron.{k}": v for k, v in (
        ("tensor_model_parallel_size", 1), ("pipeline_model_parallel_size", 1),
        ("virtual_pipeline_model_parallel_size", None), ("context_parallel_size", 1),
        ("expert_model_parallel_size", 1), ("sequence_parallel", True), ("use_distributed_optimizer", True),
        ("override_transformer_config.recompute_granularity", None))},
    "algorithm.adv_estimator": "gae", "algorithm.use_kl_in_reward": False, "algorithm.kl_penalty": "kl",
    "algorithm.kl_ctrl.kl_coef": 0.001, "algorithm.gamma": 1.0, "algorithm.lam": 1.0,
    "algorithm.norm_adv_by_std_in_grpo": True, "algorithm.filter_groups.enable": False,
    "algorithm.rollout_correction.rollout_is": None, "algorithm.rollout_correction.rollout_is_threshold": 2.0,
    # model/hf_model.yaml: LoRA off (rank 0); alpha 16; every linear layer
    "actor_rollout_ref.model.lora_rank": 0, "actor_rollout_ref.model.lora_alpha": 16,
    "actor_rollout_ref.model.target_modules": "all-linear",
    "critic.enable": None, "critic.strategy": None, "critic.model.path": None,
    "critic.ppo_micro_batch_size_per_gpu": None, "critic.forward_micro_batch_size_per_gpu": None,
    "critic.cliprange_value": 0.5, "critic.ulysses_sequence_parallel_size": 1,
    "critic.model.use_remove_padding": True, "critic.model.enable_gradient_checkpointing": True,
    "critic.ppo_max_token_len_per_gpu": 32768, "critic.forward_max_token_len_per_gpu": None,
    "trainer.nnodes": 1, "trainer.n_gpus_per_node": 8,
    "rollout.nnodes": 1, "rollout.n_gpus_per_node": 8,
    "async_training.staleness_threshold": 0.1, "async_training.trigger_parameter_sync_step": 4,
    "async_training.require_batches": 1, "async_training.partial_rollout": True,
    "reward.reward_model.enable": False, "reward.reward_model.model_path": None,
    "reward.reward_model.enable_resource_pool": False, "reward.reward_model.nnodes": 0,
    "reward.reward_model.n_gpus_per_node": 8, "reward.reward_model.rollout.tensor_model_parallel_size": 2,
}

# keys the user may set that carry nothing of the plan, by prefix -> why (one line each in `unmapped`)
_NOT_PLAN = (
    ("reward_model.overlong_buffer.", "DAPO's overlong penalty shapes the rule reward; not part of the plan"),
    ("algorithm.filter_groups.metric", "which groups dynamic sampling keeps: the oversampling is data.gen_batch_size "
     "over data.train_batch_size"),
    ("algorithm.filter_groups.max_num_gen_batches", "a cap on dynamic sampling's extra generation rounds: the "
     "oversampling is data.gen_batch_size over data.train_batch_size"),
    ("data.", "data loading and prompt handling are not part of the plan"),
    ("trainer.", "run bookkeeping (logging, saving, testing) is not part of the plan"),
    ("actor_rollout_ref.actor.optim.", "optimizer settings do not change a step's cost in RPEG's model"),
    ("critic.optim.", "optimizer settings do not change a step's cost in RPEG's model"),
    ("actor_rollout_ref.rollout.val_kwargs.", "validation sampling is not part of a training step"),
    ("reward.custom_reward_function.", "a rule reward's code is not part of the plan"),
    ("reward_model.reward_manager", "a rule reward's code is not part of the plan"),
    ("reward.reward_manager.", "a rule reward's code is not part of the plan"),
    ("+reward_model.reward_kwargs.", "a rule reward's settings are not part of the plan"),
    ("reward_model.reward_kwargs.", "a rule reward's settings are not part of the plan"),
    ("custom_reward_function.", "a rule reward's code is not part of the plan"),
)
_SAMPLING = ("temperature", "top_p", "top_k", "do_sample", "ignore_eos")


class _Config:
    """The job's keys over verl's defaults; remembers which keys were read."""

    def __init__(self, cfg: dict[str, Any], megatron: bool, source: str):
        self.cfg, self.source, self.used = cfg, source, set()
        self.defaults = dict(DEFAULTS)
        self.defaults["actor_rollout_ref.actor.strategy"] = "megatron" if megatron else "fsdp"

    def skip(self, notes: Notes, key: str, why: str) -> None:
        self.used.add(key)
        notes.skip(key, self.cfg[key], why)

    def get(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        if key in self.cfg:
            v = self.cfg[key]
            if isinstance(v, str) and v.startswith("${"):
                return self.defaults.get(key, default)  # an interpolation: verl's default's own
            return v
        return self.defaults.get(key, default)

    def has(self, key: str) -> bool:
        return key in self.cfg

    def num(self, key: str, *, whole: bool = True, minimum: float | None = 1) -> Any:
        v = self.get(key)
        ok = isinstance(v, int) and not isinstance(v, bool) if whole else isinstance(v, int | float) \
            and not isinstance(v, bool)
        if not ok or (minimum is not None and v < minimum):
            what = "a whole number" if whole else "a number"
            raise RpegError(f"{self.source}: {key} = {v!r}: expected {what}"
                            + (f" >= {minimum:g}" if minimum is not None else ""))
        return v

    def flag(self, key: str) -> bool:
        v = self.get(key)
        if isinstance(v, str) and v.lower() in ("true", "false"):
            return v.lower() == "true"
        if not isinstance(v, bool):
            raise RpegError(f"{self.source}: {key} = {v!r}: expected True or False")
        return v


_KEY_WHY = {
    "grad_clip": "gradient clipping does not change a step's cost in RPEG's model",
    "fsdp_size": "hybrid sharding (FSDP inside groups of this size, replicated across them) is not modelled: read as "
                 "ZeRO-3 over every data-parallel rank",
    "enable_chunked_prefill": "the engine's scheduling: RPEG models vLLM-style continuous batching alike",
    "max_num_batched_tokens": "the engine's scheduling: RPEG models vLLM-style continuous batching alike",
    "use_reward_loop": "how the reward model is served: RPEG models it as a forward pass of its layout",
    "num_workers": "worker counts of the reward loop are not part of the plan",
    "critic_warmup": "steps that train only the critic are not part of a step's plan",
    "layered_summon": "how verl gathers a LoRA model's base for the engine, layer by layer: its memory is not modelled",
    "use_shm": "the model's files through shared memory: loading is not part of a step",
}


def _note_rest(cfg: dict[str, Any], used: set[str], notes: Notes, *, uses_ref: bool, has_critic: bool) -> None:
    for key, value in cfg.items():
        if key in used:
            continue
        why = next((w for p, w in _NOT_PLAN if key.startswith(p)), None)
        if why is None and not uses_ref and key.startswith("actor_rollout_ref.ref."):
            why = "the reference does not run (no KL penalty)"
        if why is None and not has_critic and key.startswith("critic."):
            why = "no critic runs (the estimator needs none)"
        if why is None:
            why = _KEY_WHY.get(key.rsplit(".", 1)[-1])
        if why is None and key.startswith("actor_rollout_ref.rollout.") and key.rsplit(".", 1)[-1] in _SAMPLING:
            why = "sampling settings are not part of the plan (the response lengths stand for their effect)"
        if why is None and key.endswith("gpu_memory_utilization"):
            why = "the engine's memory share: RPEG sizes the KV cache from the layout"
        if why is None and key.endswith(("param_offload", "optimizer_offload", "grad_offload")):
            why = "offload of a model whose state RPEG does not track there (it reads the trained models' and the " \
                  "FSDP reference's)"
        if why is None and key.endswith((".name", ".mode")) and "rollout" in key:
            why = "the engine's name and mode: RPEG models vLLM-style engines alike"
        notes.skip(key, value, why or "not read by RPEG (no part of the plan or the job it changes)")
