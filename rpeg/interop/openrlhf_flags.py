"""OpenRLHF's `train_ppo_ray` flags before 0.10.2, read as the dotted flags that replaced them.

Until 0.10.1 the flags were flat underscore names (`--pretrain`, `--actor_num_gpus_per_node`,
`--micro_train_batch_size`); 0.10.2 renamed every one to a dotted name (`--actor.model_name_or_path`,
`--actor.num_gpus_per_node`, `--train.micro_batch_size`; commit ed62d0e2, "dotted config
hierarchy"). The table below pairs them: the two parsers (openrlhf/cli/train_ppo_ray.py at v0.10.1 and
v0.10.2) declare the same arguments in the same order, each with the same type and default, so a
flag's meaning carries over. Older releases differ from 0.10.1 in a few flags, read here too:
`--prompt_max_len` / `--generate_max_len` (until 0.8.x: the sequence is their sum, the response the
second), `--use_kl_estimator_k3` (0.6.x), `--colocate_all_models`, `--ref_reward_offload`.

Two defaults changed with the rename: the per-GPU micro-batches (`--micro_train_batch_size` 4 and
`--micro_rollout_batch_size` 8 before; 1 and 1 after), so an old script that leaves them out gets
the old values written in.
"""

from __future__ import annotations

import re

# old flag -> its dotted name (v0.10.1 -> v0.10.2, in the parser's order)
RENAMED = {
    "ref_num_nodes": "ref.num_nodes", "ref_num_gpus_per_node": "ref.num_gpus_per_node",
    "reward_num_nodes": "reward.num_nodes", "reward_num_gpus_per_node": "reward.num_gpus_per_node",
    "colocate_actor_ref": "train.colocate_actor_ref", "actor_num_nodes": "actor.num_nodes",
    "actor_num_gpus_per_node": "actor.num_gpus_per_node", "critic_num_nodes": "critic.num_nodes",
    "critic_num_gpus_per_node": "critic.num_gpus_per_node", "colocate_critic_reward": "train.colocate_critic_reward",
    "colocate_all_models": "train.colocate_all", "vllm_num_engines": "vllm.num_engines",
    "vllm_tensor_parallel_size": "vllm.tensor_parallel_size", "vllm_sync_backend": "vllm.sync_backend",
    "vllm_sync_with_ray": "vllm.sync_with_ray", "enable_prefix_caching": "vllm.enable_prefix_caching",
    "enforce_eager": "vllm.enforce_eager", "vllm_enable_sleep": "vllm.enable_sleep",
    "vllm_gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "enable_vllm_is_correction": "algo.advantage.is_correction_enable",
    "vllm_is_truncated_threshold": "algo.advantage.is_correction_threshold",
    "vllm_is_correction_type": "algo.advantage.is_correction_type",
    "async_train": "train.async_enable", "async_queue_size": "train.async_queue_size",
    "partial_rollout": "train.partial_rollout_enable", "eval_steps": "eval.steps", "save_steps": "ckpt.save_steps",
    "logging_steps": "logger.logging_steps", "ckpt_path": "ckpt.path", "save_hf_ckpt": "ckpt.save_hf",
    "disable_ds_ckpt": "ckpt.disable_ds", "max_ckpt_num": "ckpt.max_num", "max_ckpt_mem": "ckpt.max_mem",
    "load_checkpoint": "ckpt.load_enable", "best_metric_key": "ckpt.best_metric_key",
    "use_ds_universal_ckpt": "ds.use_universal_ckpt", "zero_stage": "ds.zero_stage",
    "gradient_checkpointing": "actor.gradient_checkpointing_enable", "deepcompile": "ds.deepcompile",
    "param_dtype": "ds.param_dtype", "enable_ema": "train.enable_ema", "ema_beta": "train.ema_beta", "zpg": "ds.zpg",
    "adam_offload": "ds.adam_offload", "attn_implementation": "ds.attn_implementation",
    "use_liger_kernel": "ds.use_liger_kernel", "grad_accum_dtype": "ds.grad_accum_dtype",
    "overlap_comm": "ds.overlap_comm", "gradient_checkpointing_use_reentrant": "actor.gradient_checkpointing_reentrant",
    "disable_fast_tokenizer": "data.disable_fast_tokenizer", "dataloader_num_workers": "data.dataloader_num_workers",
    "deepspeed_enable_sleep": "ds.enable_sleep", "ds_tensor_parallel_size": "ds.tensor_parallel_size",
    "packing_samples": "ds.packing_samples", "use_dynamic_batch": "train.dynamic_batch_enable",
    "rollout_max_tokens_per_gpu": "rollout.max_tokens_per_gpu",
    "train_max_tokens_per_gpu": "train.max_tokens_per_gpu",
    "load_in_4bit": "ds.load_in_4bit", "lora_rank": "ds.lora.rank", "lora_alpha": "ds.lora.alpha",
    "target_modules": "ds.lora.target_modules", "lora_dropout": "ds.lora.dropout", "save_path": "ckpt.output_dir",
    "num_episodes": "train.num_episodes", "rollout_batch_size": "rollout.batch_size",
    "vllm_generate_batch_size": "rollout.vllm_generate_batch_size",
    "micro_rollout_batch_size": "rollout.micro_batch_size",
    "max_epochs": "train.max_epochs", "max_len": "data.max_len", "max_new_tokens": "rollout.max_new_tokens",
    "max_samples": "data.max_samples", "max_norm": "actor.max_norm", "l2": "actor.adam.weight_decay",
    "eps_clip": "actor.eps_clip", "eps_clip_low_high": "actor.eps_clip_low_high", "dual_clip": "actor.dual_clip",
    "value_clip": "critic.value_clip", "lambd": "algo.advantage.lambd", "gamma": "algo.advantage.gamma",
    "micro_train_batch_size": "train.micro_batch_size", "train_batch_size": "train.batch_size",
    "normalize_reward": "reward.normalize_enable", "top_p": "rollout.top_p", "temperature": "rollout.temperature",
    "seed": "train.seed", "full_determinism": "train.full_determinism_enable",
    "freezing_actor_steps": "critic.freezing_steps", "n_samples_per_prompt": "rollout.n_samples_per_prompt",
    "save_value_network": "critic.save_value_network", "actor_learning_rate": "actor.adam.lr",
    "critic_learning_rate": "critic.adam.lr", "lr_warmup_ratio": "actor.lr_warmup_ratio",
    "lr_scheduler": "actor.lr_scheduler", "kl_target": "algo.kl.target", "kl_horizon": "algo.kl.horizon",
    "init_kl_coef": "algo.kl.init_coef", "policy_loss_type": "actor.policy_loss_type",
    "kl_estimator": "algo.kl.estimator", "aux_loss_coef": "actor.aux_loss_coef",
    "entropy_loss_coef": "actor.entropy_coef", "adam_betas": "actor.adam.betas",
    "reward_clip_range": "reward.clip_range",
    "advantage_estimator": "algo.advantage.estimator", "use_kl_loss": "algo.kl.use_loss",
    "no_advantage_std_norm": "algo.advantage.no_std_norm", "overlong_buffer_len": "reward.overlong_buffer_len",
    "overlong_penalty_factor": "reward.overlong_penalty_factor",
    "stop_properly_penalty_coef": "reward.stop_properly_penalty_coef", "ring_attn_size": "ds.ring_attn_size",
    "ring_head_stride": "ds.ring_attn_head_stride", "pretrain": "actor.model_name_or_path",
    "reward_pretrain": "reward.model_name_or_path", "remote_rm_url": "reward.remote_url",
    "critic_pretrain": "critic.model_name_or_path", "value_head_prefix": "ds.value_head_prefix",
    "agent_func_path": "train.agent_func_path", "prompt_data": "data.prompt_dataset",
    "prompt_data_probs": "data.prompt_probs", "prompt_split": "data.prompt_split", "eval_dataset": "eval.dataset",
    "eval_split": "eval.split", "eval_temperature": "eval.temperature",
    "eval_n_samples_per_prompt": "eval.n_samples_per_prompt", "input_key": "data.input_key",
    "label_key": "data.label_key", "input_template": "data.input_template",
    "apply_chat_template": "data.apply_chat_template", "use_wandb": "logger.wandb.key", "wandb_org": "logger.wandb.org",
    "wandb_group": "logger.wandb.group", "wandb_project": "logger.wandb.project",
    "wandb_run_name": "logger.wandb.run_name", "dynamic_filtering": "algo.dynamic_filtering_enable",
    "dynamic_filtering_reward_range": "algo.dynamic_filtering_range", "image_key": "data.image_key",
    "max_images_per_prompt": "data.max_images_per_prompt", "freeze_visual_encoder": "actor.freeze_visual_encoder",
    "use_tensorboard": "logger.tensorboard_dir",
    # before 0.9 (v0.6.0 / v0.8.0 parsers)
    "pretrain_data": "data.pretrain_data", "pretrain_data_probs": "data.pretrain_data_probs",
    "pretrain_split": "data.pretrain_split", "ptx_coef": "actor.ptx_coef",
    "bf16": "ds.bf16", "flash_attn": "ds.flash_attn", "actor_init_on_gpu": "ds.actor_init_on_gpu",
    "disable_trace_cache": "ds.disable_trace_cache", "perf": "logger.perf",
}
# store_true flags among them (they take no value)
SWITCHES = {
    "colocate_actor_ref", "colocate_critic_reward", "colocate_all_models", "vllm_sync_with_ray",
    "enable_prefix_caching", "enforce_eager", "vllm_enable_sleep", "enable_vllm_is_correction", "async_train",
    "partial_rollout", "save_hf_ckpt", "disable_ds_ckpt", "load_checkpoint", "use_ds_universal_ckpt",
    "gradient_checkpointing", "deepcompile", "enable_ema", "adam_offload", "use_liger_kernel", "overlap_comm",
    "gradient_checkpointing_use_reentrant", "disable_fast_tokenizer", "deepspeed_enable_sleep", "packing_samples",
    "use_dynamic_batch", "load_in_4bit", "normalize_reward", "full_determinism", "save_value_network", "use_kl_loss",
    "no_advantage_std_norm", "ref_reward_offload", "apply_chat_template", "dynamic_filtering",
    "freeze_visual_encoder", "bf16", "flash_attn", "actor_init_on_gpu", "disable_trace_cache", "perf",
    "use_kl_estimator_k3",
}
# the old parser's defaults that the dotted one changed
OLD_DEFAULTS = {"micro_train_batch_size": "4", "micro_rollout_batch_size": "8"}
_OLD_ONLY = set(RENAMED) | {"prompt_max_len", "generate_max_len", "use_kl_estimator_k3", "ref_reward_offload"}


def old_flags(words: list[str]) -> list[str]:
    """The old (underscore) flag names among the words of a train_ppo_ray command."""
    names = [w[2:].split("=", 1)[0] for w in words if w.startswith("--")]
    return [n for n in names if n in _OLD_ONLY and "." not in n]


def translate(words: list[str]) -> tuple[list[str], list[str]]:
    """The words with every old flag renamed (and the old defaults that changed written in), and one
    line for each thing done beyond a rename."""
    out: list[str] = []
    lines: list[str] = []
    given = set(old_flags(words))
    prompt_len = generate_len = None
    i = 0
    while i < len(words):
        w = words[i]
        name, eq, inline = w[2:].partition("=") if w.startswith("--") else ("", "", "")
        if name in ("prompt_max_len", "generate_max_len"):
            value = inline if eq else (words[i + 1] if i + 1 < len(words) else "")
            i += 1 if eq else 2
            if name == "prompt_max_len":
                prompt_len = value
            else:
                generate_len = value
            continue
        if name == "use_kl_estimator_k3":
            out += ["--algo.kl.estimator", "k3"]
        elif name == "ref_reward_offload":
            out += ["--ref.offload", "--reward.offload"]
        elif name in RENAMED:
            out.append(f"--{RENAMED[name]}" + (f"={inline}" if eq else ""))
        else:
            out.append(w)
        i += 1
    if (prompt_len is not None or generate_len is not None) and "max_len" not in given:
        p, g = _whole(prompt_len, 1024), _whole(generate_len, 1024)  # both default to 1024 (v0.6.0-v0.8.x)
        if p is not None and g is not None:
            out += ["--data.max_len", str(p + g), "--rollout.max_new_tokens", str(g)]
            lines.append(f"--prompt_max_len {p} --generate_max_len {g} (OpenRLHF before 0.9) read as --data.max_len "
                         f"{p + g} --rollout.max_new_tokens {g}")
        else:  # a value the script does not fix: passed on for the reader to name
            out += ["--data.max_len", str(prompt_len), "--rollout.max_new_tokens", str(generate_len)]
    for old, value in OLD_DEFAULTS.items():
        if old not in given and "use_dynamic_batch" not in given:  # dynamic batches: token budgets instead
            out += [f"--{RENAMED[old]}", value]
            lines.append(f"--{old} not given: OpenRLHF's default before 0.10.2 was {value} (--{RENAMED[old]})")
    return out, lines


def _whole(text: str | None, default: int) -> int | None:
    if text is None:
        return default
    return int(text) if re.fullmatch(r"\d+", text) else None
