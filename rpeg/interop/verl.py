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
  the reference on the host. Offload of the actor's and the critic's state (_offload_of, what each
  key does: rpeg/perf/offload.py): fsdp_config.param_offload / optimizer_offload and
  megatron.param_offload / grad_offload / optimizer_offload false keep that part resident through
  generation (verl's defaults: all resident), fsdp_config.offload_policy (FSDP2) is offload_params,
  optim.override_optimizer_config.optimizer_cpu_offload with optimizer_offload_fraction is
  offload_optimizer. Generation: rollout.tensor_model_parallel_size (and
  pipeline_model_parallel_size) over the group. The weight sync: FSDP gathers every tensor in
  full, Megatron its shard (the 3D-HybridEngine), as rpeg/search/baselines/verl.py models it.

What verl cannot express (`project`): critic sharing (verl trains its own critic), fusion,
streaming, asynchrony on one pool, device groups other than the above, training layouts that mix
FSDP with tensor or pipeline parallelism, forward passes laid out apart from the actor's workers,
selective recomputation under FSDP, off-policy corrections other than TIS.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

from rpeg.errors import RpegError
from rpeg.graph import Job, ParallelLayout
from rpeg.graph import get_model
from rpeg.graph.serde import from_data, parse_yaml
from rpeg.interop.common import (
    Exported, Imported, Notes, PlanView, config_tuple, model_preset, response_of, script_command, stage_names,
    one_pass_each,
)
from rpeg.interop.shell import is_unknown
from rpeg.interop.common import HF_NAMES, colocate_all, defaults_of, hf_name, resize  # noqa: F401 (HF_NAMES: the tests)


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
    "critic_update": ("critic.model.fsdp_config.", "critic.megatron.", "critic.optim.override_optimizer_config."),
}
DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 1024, "data.max_prompt_length": 512, "data.max_response_length": 512,
    "data.gen_batch_size": None,
    "actor_rollout_ref.rollout.n": 1, "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": 1,
    "actor_rollout_ref.rollout.data_parallel_size": 1, "actor_rollout_ref.rollout.expert_parallel_size": 1,
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
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.ref.fsdp_config.param_offload": False,
    # offload of the trained models' state (_offload_of): verl's defaults keep it all on the GPUs
    **{f"{fsdp}{k}": False for fsdp, _, _ in _OFFLOAD_KEYS.values()
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


# ---- reading --------------------------------------------------------------------------------------

def read(text: str, source: str, *, model: str | None = None, response_mean: float | None = None,
         cluster: str | None = None) -> Imported:
    """A verl job (launch script or YAML) as an RPEG view; see the module docstring."""
    cfg, mode, megatron = _overrides(text, source)
    return _from_config(cfg, mode, megatron, source, model=model, response_mean=response_mean, cluster=cluster)


def _overrides(text: str, source: str) -> tuple[dict[str, Any], str, bool]:
    """(the keys the job sets, dotted; the trainer mode; whether the megatron config is the base)."""
    data = None
    if "python" not in text or not re.search(r"verl\.(trainer|experimental)\.|recipe\.", text):
        try:
            data = parse_yaml(text, source)
        except RpegError:
            data = None
    if isinstance(data, dict):
        if not {"actor_rollout_ref", "data", "algorithm", "trainer"} & set(data):
            raise RpegError(f"{source}: not a verl config: none of actor_rollout_ref, data, algorithm, trainer is set "
                            "(a verl job is a launch script running verl.trainer.main_ppo or a YAML of its keys)")
        defaults = data.get("defaults") or []
        names = " ".join(str(d) if not isinstance(d, dict) else " ".join(map(str, d.values())) for d in defaults)
        flat = _flatten({k: v for k, v in data.items() if k not in ("defaults", "hydra")})
        mode = ("fully-async" if "fully_async" in names or any(k.startswith("async_training.") for k in flat)
                else "one-step-off" if "one_step_off" in names else "sync")
        return flat, mode, "megatron" in names
    words, entry = script_command(text, _ENTRY, source)
    mode = ENTRIES[entry] if entry in ENTRIES else RECIPES[entry]
    cfg: dict[str, Any] = {}
    megatron = False
    i = 0
    while i < len(words):
        w = words[i]
        if w == "":  # "$@": the script's own arguments, none here
            i += 1
            continue
        if w in ("--config-name", "--config-path", "-cn", "-cp") and i + 1 < len(words):
            megatron |= w in ("--config-name", "-cn") and "megatron" in words[i + 1]
            i += 2
            continue
        if w.startswith("--config-name=") or w.startswith("-cn="):
            megatron |= "megatron" in w
        elif w.startswith("--"):
            pass  # --config-path=..., Hydra's own flags: where the config lives, not what it says
        elif w.startswith("~"):
            raise RpegError(f"{source}: {w}: deleting a key (~) is not read; set the key instead")
        elif "=" in w:
            key, value = w.split("=", 1)
            cfg[key.lstrip("+")] = _value(value)
        elif w in ("&&", ";", "|", "&"):
            break
        else:
            raise RpegError(f"{source}: {w!r} after {entry} is not a Hydra override (key=value)")
        i += 1
    return cfg, mode, megatron


def _value(text: str) -> Any:
    if is_unknown(text):  # a value the launch script does not fix (rpeg/interop/shell.py): kept as said
        return text
    try:
        return yaml.safe_load(text) if text != "" else None
    except yaml.YAMLError:
        return text


def _flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


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


def _from_config(cfg: dict[str, Any], mode: str, megatron: bool, source: str, *, model: str | None,
                 response_mean: float | None, cluster: str | None) -> Imported:
    c = _Config(cfg, megatron, source)
    notes = Notes()
    A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."

    # the algorithm and its options
    est = c.get("algorithm.adv_estimator")
    if est not in ESTIMATORS:
        raise RpegError(f"{source}: algorithm.adv_estimator = {est!r}: RPEG has no such estimator "
                        f"(it reads {', '.join(ESTIMATORS)})")
    algorithm = ESTIMATORS[est]
    if c.flag("algorithm.filter_groups.enable"):
        if algorithm != "grpo":
            raise RpegError(f"{source}: algorithm.filter_groups.enable with adv_estimator {est}: RPEG's dynamic "
                            "sampling (dapo) is GRPO's")
        algorithm = "dapo"
    critic_on = c.get("critic.enable")
    has_critic = bool(critic_on) if critic_on is not None else est == "gae"
    if has_critic and algorithm != "ppo":
        raise RpegError(f"{source}: critic.enable with adv_estimator {est}: RPEG trains a critic only with GAE (ppo)")
    if algorithm == "ppo" and not has_critic:
        raise RpegError(f"{source}: adv_estimator gae with critic.enable = False: GAE needs a critic")
    options: dict[str, Any] = {}
    kl_loss, kl_reward = c.flag(A + "use_kl_loss"), c.flag("algorithm.use_kl_in_reward")
    if kl_loss and kl_reward:
        raise RpegError(f"{source}: both {A}use_kl_loss and algorithm.use_kl_in_reward: RPEG applies one KL "
                        "penalty, in the loss or in the reward")
    if kl_loss or kl_reward:
        kind_key = A + "kl_loss_type" if kl_loss else "algorithm.kl_penalty"
        kind = c.get(kind_key)
        if kind not in KL_TYPES:
            raise RpegError(f"{source}: {kind_key} = {kind!r}: RPEG's estimators are k1 (kl) and k3 (low_var_kl)")
        coef_key = A + "kl_loss_coef" if kl_loss else "algorithm.kl_ctrl.kl_coef"
        options.update(kl_coef=float(c.num(coef_key, whole=False, minimum=0)), kl_in="loss" if kl_loss else "reward",
                       kl_estimator=KL_TYPES[kind])
        if algorithm == "dapo" and options["kl_coef"] > 0:
            raise RpegError(f"{source}: {coef_key} > 0 with dynamic sampling: RPEG's dapo runs no reference")
    else:
        for key in (A + "kl_loss_coef", A + "kl_loss_type", "algorithm.kl_ctrl.kl_coef", "algorithm.kl_penalty"):
            if c.has(key):
                c.skip(notes, key, "no KL penalty is on (use_kl_loss and use_kl_in_reward are False)")
        options["kl_coef"] = 0.0
    if options["kl_coef"] == 0.0:
        options.pop("kl_in", None)
        options.pop("kl_estimator", None)
    low = c.get(A + "clip_ratio_low")
    high = c.get(A + "clip_ratio_high")
    base = c.num(A + "clip_ratio", whole=False, minimum=0)
    options["clip_low"] = float(base if low is None else low)
    options["clip_high"] = float(base if high is None else high)
    options["dual_clip"] = float(c.num(A + "clip_ratio_c", whole=False, minimum=0))
    agg = c.get(A + "loss_agg_mode")
    if agg not in LOSS_AGG:
        raise RpegError(f"{source}: {A}loss_agg_mode = {agg!r}: RPEG aggregates by {', '.join(LOSS_AGG)}")
    options["loss_agg"] = agg
    options["entropy_coef"] = float(c.num(A + "entropy_coeff", whole=False, minimum=0))
    mode_loss = c.get(A + "policy_loss.loss_mode")
    if mode_loss not in ("vanilla", "gspo"):
        raise RpegError(f"{source}: {A}policy_loss.loss_mode = {mode_loss!r}: RPEG's policy losses are vanilla "
                        "(ppo) and gspo")
    options["policy_loss"] = "ppo" if mode_loss == "vanilla" else "gspo"
    options["gamma"] = float(c.num("algorithm.gamma", whole=False, minimum=0))
    options["lam"] = float(c.num("algorithm.lam", whole=False, minimum=0))
    if algorithm in ("grpo", "dapo"):
        options["norm_adv_by_std"] = c.flag("algorithm.norm_adv_by_std_in_grpo")
    elif c.has("algorithm.norm_adv_by_std_in_grpo"):
        c.skip(notes, "algorithm.norm_adv_by_std_in_grpo", f"read by GRPO only; the estimator is {est}")
    if has_critic:
        options["value_clip"] = float(c.num("critic.cliprange_value", whole=False, minimum=0))
    ris = c.get("algorithm.rollout_correction.rollout_is")
    if ris is not None:
        if ris not in ROLLOUT_IS:
            raise RpegError(f"{source}: algorithm.rollout_correction.rollout_is = {ris!r}: RPEG reads token and "
                            "sequence")
        options["off_policy"] = ROLLOUT_IS[ris]
        options["is_cap"] = float(c.num("algorithm.rollout_correction.rollout_is_threshold", whole=False))

    # the job
    prompts_key = "data.train_batch_size"
    samples = c.num(R + "n")
    mini = c.num(A + "ppo_mini_batch_size")
    if mode == "fully-async":
        sync_steps = c.num("async_training.trigger_parameter_sync_step")
        require = c.num("async_training.require_batches")
        prompts, mini_batches = mini * require * sync_steps, require * sync_steps
        if c.get(prompts_key) not in (0, None) or c.get("data.gen_batch_size") not in (1, None):
            c.skip(notes, prompts_key, "fully-async: a step is one parameter sync, "
                   "trigger_parameter_sync_step x require_batches x ppo_mini_batch_size prompts")
            if c.has("data.gen_batch_size"):
                c.skip(notes, "data.gen_batch_size", "fully-async streams prompts one by one")
    else:
        prompts = c.num(prompts_key)
        if prompts % mini:
            raise RpegError(f"{source}: {prompts_key} = {prompts} is not a multiple of {A}ppo_mini_batch_size = {mini}")
        mini_batches = prompts // mini
        gen = c.get("data.gen_batch_size")
        if algorithm == "dapo" and gen is not None:
            options["oversample"] = float(c.num("data.gen_batch_size")) / prompts
        elif gen is not None:
            c.skip(notes, "data.gen_batch_size", "generation batches larger than the training batch are read for "
                       "dynamic sampling (algorithm.filter_groups) only")
    prompt_len = c.num("data.max_prompt_length")
    max_response = c.num("data.max_response_length")
    job = from_data(Job, {"prompts": prompts, "samples_per_prompt": samples, "prompt_len": prompt_len,
                          "response": response_of(max_response, response_mean, notes),
                          "ppo_epochs": c.num(A + "ppo_epochs"), "mini_batches": mini_batches}, source)
    seq = prompt_len + max_response

    # the models
    actor = model_preset(c.get("actor_rollout_ref.model.path"), "actor_rollout_ref.model.path", model,
                         notes=notes)
    critic = None
    if has_critic:
        path = c.get("critic.model.path")
        critic = actor if path is None or path == c.get("actor_rollout_ref.model.path") or model \
            else model_preset(path, "critic.model.path", notes=notes)
    rm_key = "reward.reward_model." if c.has("reward.reward_model.enable") else "reward_model."
    reward = None
    if c.get(rm_key + "enable") if rm_key == "reward_model." else c.flag(rm_key + "enable"):
        path_key = rm_key + ("model_path" if rm_key.startswith("reward.") else "model.path")
        reward = model_preset(c.get(path_key), path_key, notes=notes)
    uses_ref = options["kl_coef"] > 0

    # the devices
    train_gpus = c.num("trainer.nnodes") * c.num("trainer.n_gpus_per_node")
    if mode == "sync":
        for key in ("rollout.nnodes", "rollout.n_gpus_per_node"):
            if c.has(key):
                c.skip(notes, key, "the synchronous trainer runs the rollout on the training pool")
        groups = (("all", 0, train_gpus),)
        gen_group, train_group, rollout_gpus = "all", "all", train_gpus
    else:
        rollout_gpus = c.num("rollout.nnodes") * c.num("rollout.n_gpus_per_node")
        groups = (("rollout", 0, rollout_gpus), ("train", rollout_gpus, train_gpus))
        gen_group, train_group = "rollout", "train"
    gpus = max(first + count for _, first, count in groups)
    if c.has("actor_rollout_ref.hybrid_engine"):
        hybrid = c.flag("actor_rollout_ref.hybrid_engine")
        if hybrid != (mode == "sync"):
            c.skip(notes, "actor_rollout_ref.hybrid_engine", f"the {mode} trainer decides where the rollout runs")

    # the layouts
    strategy = c.get(A + "strategy")
    if strategy not in ("fsdp", "fsdp2", "megatron"):
        raise RpegError(f"{source}: {A}strategy = {strategy!r}: RPEG reads fsdp, fsdp2 and megatron")
    packing = c.flag("actor_rollout_ref.model.use_remove_padding")
    dyn = c.flag(A + "use_dynamic_bsz")
    shape = _shape(c, A, strategy, train_gpus, source)
    recompute = _recompute(c, A, strategy)

    def micro(key: str, tokens_key: str) -> int:
        if dyn:  # the forward passes' token budget defaults to the actor's (verl's oc.select)
            tokens = c.num(tokens_key) if c.get(tokens_key) is not None else c.num(A + "ppo_max_token_len_per_gpu")
            return max(1, int(tokens) // seq)
        v = c.get(key)
        if v is None:
            raise RpegError(f"{source}: {key} is not set (verl requires it without use_dynamic_bsz)")
        return c.num(key)

    if dyn:
        c.get(R + "log_prob_use_dynamic_bsz")
        c.get("actor_rollout_ref.ref.log_prob_use_dynamic_bsz")
    _check_pipeline(shape, actor, f"{A}megatron.", source)
    layouts: dict[str, ParallelLayout] = {}
    layouts["actor_update"] = shape.replace(recompute=recompute, micro_batch=micro(
        A + "ppo_micro_batch_size_per_gpu", A + "ppo_max_token_len_per_gpu"), packing=packing or dyn)
    # forward passes hold no optimizer state: FSDP shards their weights (ZeRO-3), Megatron replicates them over dp
    fwd = shape.replace(recompute="none", packing=packing or dyn, zero=0 if strategy == "megatron" else 3)
    layouts["actor_logprobs"] = fwd.replace(micro_batch=micro(R + "log_prob_micro_batch_size_per_gpu",
                                                               R + "log_prob_max_token_len_per_gpu"))
    if uses_ref:
        ref = "actor_rollout_ref.ref."
        layouts["ref_logprobs"] = fwd.replace(micro_batch=micro(ref + "log_prob_micro_batch_size_per_gpu",
                                                                 ref + "log_prob_max_token_len_per_gpu"))
    if c.get(R + "name") not in ("vllm", "sglang", None):
        c.skip(notes, R + "name", "RPEG models vLLM- and SGLang-style engines; this one is read as those")
    layouts["generate"] = _rollout_layout(c, rollout_gpus, source)
    if algorithm == "remax":
        layouts["generate_greedy"] = layouts["generate"]
    if has_critic:
        cstrategy = c.get("critic.strategy") or strategy
        if (cstrategy == "megatron") != (strategy == "megatron"):
            raise RpegError(f"{source}: critic.strategy = {cstrategy!r} with the actor's {strategy!r}: RPEG reads "
                            "verl's critic on the actor's backend (its config file sets both)")
        cpack = c.flag("critic.model.use_remove_padding")
        cshape = _shape(c, "critic.", cstrategy, train_gpus, source).replace(packing=cpack or dyn)
        _check_pipeline(cshape, critic, "critic.megatron.", source)
        cmicro = c.get("critic.ppo_micro_batch_size_per_gpu")
        if dyn:
            cm = max(1, int(c.num("critic.ppo_max_token_len_per_gpu")) // seq)
            fm_tokens = c.get("critic.forward_max_token_len_per_gpu")
            cf = cm if fm_tokens is None else max(1, int(c.num("critic.forward_max_token_len_per_gpu")) // seq)
        else:
            if cmicro is None:
                raise RpegError(f"{source}: critic.ppo_micro_batch_size_per_gpu is not set (verl requires it without "
                                "use_dynamic_bsz)")
            cm = c.num("critic.ppo_micro_batch_size_per_gpu")
            fwd_m = None if cstrategy == "megatron" else c.get("critic.forward_micro_batch_size_per_gpu")
            cf = cm if fwd_m is None else c.num("critic.forward_micro_batch_size_per_gpu")
        layouts["critic_update"] = cshape.replace(recompute=_recompute(c, "critic.", cstrategy), micro_batch=cm)
        layouts["critic_values"] = cshape.replace(micro_batch=cf, zero=0 if cstrategy == "megatron" else 3)
    reward_group = None
    if reward is not None:
        rtp = c.num(rm_key + "rollout.tensor_model_parallel_size") if c.get(
            rm_key + "rollout.tensor_model_parallel_size") is not None else 2
        if rm_key.startswith("reward.") and c.flag(rm_key + "enable_resource_pool"):
            rgpus = c.num(rm_key + "nnodes") * c.num(rm_key + "n_gpus_per_node")
            groups = groups + (("reward", gpus, rgpus),)
            gpus += rgpus
            reward_group = "reward"
        else:
            rgpus = train_gpus
        if rgpus % rtp:
            raise RpegError(f"{source}: {rm_key}rollout.tensor_model_parallel_size = {rtp} does not divide its "
                            f"{rgpus} GPUs")
        layouts["reward"] = ParallelLayout(dp=rgpus // rtp, tp=rtp)
        c.get(rm_key + "rollout.name")

    names = stage_names(algorithm, critic=has_critic, reference=uses_ref, reward_model=reward is not None, share=False)
    assign = tuple((s, gen_group if s.startswith("generate") else reward_group if s == "reward" and reward_group
                    else train_group) for s in names)
    async_bound, partial = 0, False
    if mode == "one-step-off":
        async_bound = 1
    elif mode == "fully-async":
        threshold = c.num("async_training.staleness_threshold", whole=False, minimum=0)
        async_bound = max(1, math.ceil(threshold))
        if threshold != async_bound:
            notes.assume(f"async_training.staleness_threshold = {threshold:g} read as k = {async_bound} (RPEG's "
                         "bound counts whole steps; verl's fraction caps the stale samples per sync)")
        partial = c.flag("async_training.partial_rollout")
    ref_host = uses_ref and strategy != "megatron" and c.flag("actor_rollout_ref.ref.fsdp_config.param_offload")
    for stage in ("actor_update", "critic_update"):
        if stage in layouts:
            st = strategy if stage == "actor_update" else (c.get("critic.strategy") or strategy)
            layouts[stage] = layouts[stage].replace(**_offload_of(c, stage, st, notes))

    view = PlanView(
        algorithm=algorithm, actor=actor, job=job, gpus=gpus, critic=critic, reward=reward,
        config=config_tuple(algorithm, options), cluster=cluster, async_bound=async_bound, partial=partial,
        groups=groups, assign=assign, layouts=tuple((s, layouts[s]) for s in names if s in layouts),
        refit_gather="shard" if strategy == "megatron" else "full", reference_on_host=ref_host)
    if cluster is None:
        notes.assume("the devices: a verl config does not name them; --cluster sets them (default dgx-h100)")
    _note_rest(cfg, c.used, notes, uses_ref=uses_ref, has_critic=has_critic)
    return Imported(system=SYSTEM, mode=mode, view=view, unmapped=tuple(notes.unmapped), assumed=tuple(notes.assumed),
                    source=source)


def _rollout_layout(c: _Config, gpus: int, source: str) -> ParallelLayout:
    """Generation's layout: one engine replica is tp x dp x pp GPUs (verl/workers/rollout/replica.py),
    its data-parallel ranks attention replicas over experts sharded expert_parallel_size ways, which
    verl requires to be tp x dp (workers/config/rollout.py); the replicas fill the rollout's GPUs."""
    R = "actor_rollout_ref.rollout."
    tp, pp, dp, ep = (c.num(R + k) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                             "data_parallel_size", "expert_parallel_size"))
    replica = tp * dp * pp
    if gpus % replica:
        raise RpegError(f"{source}: {R}tensor_model_parallel_size x data_parallel_size x pipeline_model_parallel_size"
                        f" = {tp} x {dp} x {pp} (one engine) does not divide the rollout's {gpus} GPUs")
    if ep > 1 and ep != tp * dp:
        raise RpegError(f"{source}: {R}expert_parallel_size = {ep}: verl requires tensor_model_parallel_size x "
                        f"data_parallel_size = {tp * dp} (workers/config/rollout.py)")
    return ParallelLayout(dp=gpus // (tp * pp), tp=tp, pp=pp, ep=ep)


def _uneven(c: _Config, prefix: str, pp: int) -> bool:
    """Whether Megatron splits the pipeline unevenly: first / last stage layer counts, or the embedding or
    the loss counted as a layer (megatron.core TransformerConfig's num_layers_in_first/last_pipeline_stage,
    account_for_embedding/loss_in_pipeline_split), set through override_transformer_config."""
    over = prefix + "megatron.override_transformer_config."
    keys = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
            "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
    return pp > 1 and any(c.get(over + k) not in (None, False, "False", "false", "null") for k in keys)


def _check_pipeline(lay: ParallelLayout, model: str, prefix: str, source: str) -> None:
    layers = get_model(model).layers
    if lay.pp > 1 and layers % (lay.pp * lay.pp_interleave) and not lay.pp_uneven:
        stages = f"{lay.pp} x {lay.pp_interleave} virtual" if lay.pp_interleave > 1 else str(lay.pp)
        raise RpegError(f"{source}: {prefix}pipeline_model_parallel_size = {stages} stages do not divide the {layers} "
                        f"layers of {model}, and no uneven split is set (Megatron's override_transformer_config."
                        "num_layers_in_first/last_pipeline_stage or account_for_embedding/loss_in_pipeline_split)")


def _shape(c: _Config, prefix: str, strategy: str, gpus: int, source: str) -> ParallelLayout:
    """The training layout of the role at `prefix` (the actor's or the critic's workers)."""
    if strategy == "megatron":
        M = prefix + "megatron."
        tp, pp, cp, ep = (c.num(M + k) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                  "context_parallel_size", "expert_model_parallel_size"))
        vpp = c.get(M + "virtual_pipeline_model_parallel_size")
        if gpus % (tp * pp * cp):
            raise RpegError(f"{source}: {M}tp x pp x cp = {tp} x {pp} x {cp} does not divide the {gpus} training GPUs")
        sp = c.flag(M + "sequence_parallel") and tp > 1
        zero = 1 if c.flag(M + "use_distributed_optimizer") else 0
        if prefix.startswith("actor_rollout_ref."):  # verl lays the reference out as the actor unless told otherwise
            for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
                key = f"actor_rollout_ref.ref.megatron.{k}"
                if c.has(key) and c.get(key) != c.get(M + k):
                    raise RpegError(f"{source}: {key} = {c.get(key)} differs from the actor's {c.get(M + k)}: RPEG "
                                    "lays the reference out as the actor's workers")
                c.used.add(key)
        return ParallelLayout(dp=gpus // (tp * pp * cp), tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, sequence_parallel=sp,
                              pp_interleave=int(vpp) if vpp else 1, pp_uneven=_uneven(c, prefix, pp))
    key = prefix + "ulysses_sequence_parallel_size"
    cp = c.num(key)
    if gpus % cp:
        raise RpegError(f"{source}: {key} = {cp} does not divide {gpus} training GPUs")
    if prefix.startswith("actor_rollout_ref."):
        c.used.add("actor_rollout_ref.ref.ulysses_sequence_parallel_size")
    return ParallelLayout(dp=gpus // cp, cp=cp, zero=3)


def _recompute(c: _Config, prefix: str, strategy: str) -> str:
    model = "actor_rollout_ref.model." if prefix.startswith("actor_rollout_ref.") else "critic.model."
    ckpt = c.flag(model + "enable_gradient_checkpointing")
    if strategy == "megatron":
        # Megatron recomputes as override_transformer_config says; enable_gradient_checkpointing is the HF models'
        gran = c.get(prefix + "megatron.override_transformer_config.recompute_granularity")
        c.get(prefix + "megatron.override_transformer_config.recompute_method")  # which layers: RPEG recomputes all
        c.get(prefix + "megatron.override_transformer_config.recompute_num_layers")
        return gran if gran in ("full", "selective") else "none"
    return "full" if ckpt else "none"


def _offload_of(c: _Config, stage: str, strategy: str, notes: Notes) -> dict[str, Any]:
    """The layout fields of a trained model's offload keys (rpeg/perf/offload.py says what each does).
    FSDP: param_offload / optimizer_offload move the weights / optimizer state to the host between
    phases (false: resident; the gradients are freed either way); FSDP2's offload_policy keeps the
    shards and the optimizer step on the host throughout. Megatron: param_offload / grad_offload /
    optimizer_offload between phases; Megatron-Core's optimizer_cpu_offload with
    optimizer_offload_fraction runs that fraction of the optimizer on the host."""
    fsdp, meg, opt = _OFFLOAD_KEYS[stage]
    if strategy == "megatron":
        resident = tuple(part for part, k in (("weights", "param_offload"), ("gradients", "grad_offload"),
                                              ("optimizer", "optimizer_offload")) if not c.flag(meg + k))
        host = c.num(opt + "optimizer_offload_fraction", whole=False, minimum=0) \
            if c.flag(opt + "optimizer_cpu_offload") else 0.0
        if host > 1:
            raise RpegError(f"{c.source}: {opt}optimizer_offload_fraction = {host}: a fraction from 0 to 1")
        return {"resident": resident, "offload_optimizer": float(host)}
    if c.flag(fsdp + "offload_policy"):
        if strategy != "fsdp2":
            c.skip(notes, fsdp + "offload_policy", "offload_policy is FSDP2's (strategy fsdp2): FSDP1 ignores it")
        else:
            for k in ("param_offload", "optimizer_offload"):  # verl turns them off under offload_policy
                c.get(fsdp + k)
            return {"offload_optimizer": 1.0, "offload_params": True}
    return {"resident": tuple(part for part, k in (("weights", "param_offload"), ("optimizer", "optimizer_offload"))
                              if not c.flag(fsdp + k))}


def _offload_project(stage: str, lay: ParallelLayout, megatron: bool, lines: list[str]) -> ParallelLayout:
    """What verl's backend can say of a layout's offload (see _offload_of)."""
    want = lay
    if megatron and lay.offload_params:
        want = lay.replace(offload_params=False)
        lines.append(f"{stage} parameters on the host: verl's Megatron backend keeps them on the GPUs while it trains "
                     "(param_offload moves them between phases only)")
    elif not megatron and (lay.offload_optimizer or lay.offload_params):
        want = lay.replace(offload_optimizer=1.0, offload_params=True, resident=())
        if want != lay:
            lines.append(f"{stage} {lay.describe()}: verl's FSDP backend keeps the optimizer on the host only with the "
                         "parameters (fsdp_config.offload_policy, FSDP2's CPUOffloadPolicy)")
    elif not megatron and "gradients" in lay.resident:
        want = lay.replace(resident=tuple(p for p in lay.resident if p != "gradients"))
        lines.append(f"{stage} gradients resident through generation: verl's FSDP backend frees them after each update")
    return want


def _offload_keys(stage: str, lay: ParallelLayout, megatron: bool) -> list[str]:
    """verl's offload keys of a trained model's layout (after _offload_project)."""
    fsdp, meg, opt = _OFFLOAD_KEYS[stage]
    if megatron:
        out = [f"{meg}{k}={_fmt(part not in lay.resident)}" for part, k in (
            ("weights", "param_offload"), ("gradients", "grad_offload"), ("optimizer", "optimizer_offload"))]
        if lay.offload_optimizer:
            out += [f"+{opt}optimizer_cpu_offload=True", f"+{opt}optimizer_offload_fraction={lay.offload_optimizer!r}"]
        return out
    if lay.offload_params:
        return [f"{fsdp}offload_policy=True"]  # with strategy fsdp2 (the caller writes it)
    return [f"{fsdp}param_offload={_fmt('weights' not in lay.resident)}",
            f"{fsdp}optimizer_offload={_fmt('optimizer' not in lay.resident)}"]


_KEY_WHY = {
    "grad_clip": "gradient clipping does not change a step's cost in RPEG's model",
    "fsdp_size": "hybrid sharding (FSDP inside groups of this size, replicated across them) is not modelled: read as "
                 "ZeRO-3 over every data-parallel rank",
    "use_fused_kernels": "fused kernels: RPEG's efficiency factors are per device and operation size, not per kernel",
    "enable_chunked_prefill": "the engine's scheduling: RPEG models vLLM-style continuous batching alike",
    "max_num_batched_tokens": "the engine's scheduling: RPEG models vLLM-style continuous batching alike",
    "use_reward_loop": "how the reward model is served: RPEG models it as a forward pass of its layout",
    "num_workers": "worker counts of the reward loop are not part of the plan",
    "critic_warmup": "steps that train only the critic are not part of a step's plan",
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


# ---- what verl can run --------------------------------------------------------------------------

def project(view: PlanView) -> tuple[PlanView, list[str]]:
    """The plan as verl can run it, and one line for each thing changed to get there."""
    v, lines = one_pass_each(view, "verl")
    # placement: one pool (synchronous), or rollout pool + training pool (asynchronous)
    gen = [s for s, _ in v.assign if s.startswith("generate")]
    gen_groups = {dict(v.assign)[s] for s in gen}
    one_pool = len(v.groups) == 1
    if v.async_bound and one_pool:
        lines.append(f"async k={v.async_bound} on one pool: verl's asynchronous trainers need a rollout pool of "
                     "its own; run synchronously")
        v = v.replace(async_bound=0, partial=False)
    if v.async_bound == 0 and not one_pool:
        lines.append("device groups (" + ", ".join(f"{n} {c}" for n, _, c in v.groups) + "): verl's synchronous "
                     "trainer runs every role on one pool")
        v = colocate_all(v)
    elif v.async_bound:
        rest = {g for s, g in v.assign if not s.startswith("generate") and s != "reward"}
        if len(gen_groups) != 1 or len(rest) != 1 or gen_groups & rest:
            lines.append("device groups other than a rollout pool and a training pool: verl places the roles on "
                         "those two")
            v = colocate_all(v)
            v = v.replace(async_bound=0, partial=False)
        else:
            v = _two_pools(v, gen_groups.pop(), rest.pop())
            if v.async_bound > 1 and not v.partial:
                lines.append(f"async k={v.async_bound} without partial rollout: verl's one-step-off trainer runs "
                             "k = 1")
                v = v.replace(async_bound=1)
    # layouts: what verl's workers can hold
    lay = dict(v.layouts)
    a = lay["actor_update"]
    megatron = a.tp > 1 or a.pp > 1 or a.zero in (0, 1) or a.ep > 1
    if megatron:
        if a.zero not in (0, 1):
            lines.append(f"actor_update ZeRO-{a.zero} with tp {a.tp} x pp {a.pp}: verl's Megatron backend shards the "
                         "optimizer (ZeRO-1)")
            a = a.replace(zero=1)
    else:
        if a.tp > 1 or a.pp > 1 or a.ep > 1:
            a = a.replace(tp=1, pp=1, ep=1)
        if a.zero != 3:
            lines.append(f"actor_update ZeRO-{a.zero}: verl's FSDP backend shards everything (ZeRO-3)")
            a = a.replace(zero=3)
        if a.recompute == "selective":
            lines.append("selective recomputation: verl's FSDP backend checkpoints whole layers (full)")
            a = a.replace(recompute="full")
        if a.sequence_parallel:
            a = a.replace(sequence_parallel=False)
    if not megatron:
        a = a.replace(pp_interleave=1, pp_uneven=False)
    elif a.pp_uneven:
        lines.append("uneven pipeline stages: not set by this export (verl's Megatron layer split options)")
        a = a.replace(pp_uneven=False)
    lay["actor_update"] = a = _offload_project("actor_update", a, megatron, lines)
    shape = dict(dp=a.dp, tp=a.tp, pp=a.pp, cp=a.cp, ep=a.ep, zero=a.zero, sequence_parallel=a.sequence_parallel,
                 pp_interleave=a.pp_interleave, packing=a.packing)
    for s in ("actor_logprobs", "ref_logprobs"):
        if s in lay:
            want = lay[s].replace(recompute="none", **{**shape, "zero": 0 if megatron else 3})
            if want != lay[s]:
                lines.append(f"{s} laid out as {lay[s].describe()}: verl runs it on the actor's workers "
                             f"({want.describe()})")
            lay[s] = want
    if "critic_update" in lay:  # verl's critic runs on the actor's backend (one config file sets both)
        cu = lay["critic_update"]
        if megatron:
            want = cu.replace(zero=cu.zero if cu.zero in (0, 1) else 1, pp_uneven=False)
        else:
            want = ParallelLayout(dp=cu.devices // cu.cp, cp=cu.cp, zero=3, packing=cu.packing,
                                  micro_batch=cu.micro_batch, recompute="full" if cu.recompute != "none" else "none",
                                  offload_optimizer=cu.offload_optimizer, offload_params=cu.offload_params,
                                  resident=cu.resident)
        want = _offload_project("critic_update", want, megatron, lines)
        if want != cu:
            lines.append(f"critic_update laid out as {cu.describe()}: verl's {'Megatron' if megatron else 'FSDP'} "
                         f"critic takes {want.describe()}")
        lay["critic_update"] = want
        cv = lay["critic_values"]
        # Megatron's critic has no forward micro-batch of its own: its ppo_micro_batch_size_per_gpu
        want_v = want.replace(recompute="none", micro_batch=want.micro_batch if megatron else cv.micro_batch,
                              zero=0 if megatron else 3, offload_optimizer=0.0, offload_params=False, resident=())
        if want_v != cv:
            lines.append(f"critic_values laid out as {cv.describe()}: verl runs it on the critic's workers")
        lay["critic_values"] = want_v
    g = lay["generate"]
    if g.cp > 1 or g.ep > 1 or g.zero or g.sequence_parallel or g.recompute != "none" or g.micro_batch != 1 \
            or not g.packing or g.pp_interleave > 1:
        lines.append(f"generate laid out as {g.describe()}: verl's rollout takes tensor and pipeline parallelism")
    lay["generate"] = ParallelLayout(dp=g.dp, tp=g.tp, pp=g.pp)
    if "generate_greedy" in lay:
        lay["generate_greedy"] = lay["generate"]
    if "reward" in lay:
        r = lay["reward"]
        lay["reward"] = ParallelLayout(dp=r.devices // r.tp, tp=r.tp)
    v = v.replace(layouts=tuple((s, lay[s]) for s, _ in v.layouts))
    gather = "shard" if megatron else "full"
    if v.refit_gather != gather:
        lines.append(f"weight sync gathering {v.refit_gather}: verl's {'Megatron' if megatron else 'FSDP'} backend "
                     f"gathers {'its shard' if megatron else 'every tensor in full'}")
        v = v.replace(refit_gather=gather)
    if v.reference_on_host and megatron:
        lines.append("reference on the host: this export sets it for the FSDP backend only")
        v = v.replace(reference_on_host=False)
    opts = dict(v.config)
    if opts.get("off_policy") not in (None, "none", "tis", "tis-seq"):
        lines.append(f"off_policy {opts['off_policy']}: verl's rollout correction is written for tis and tis-seq only")
        opts.pop("off_policy")
        opts.pop("is_low", None)
    if v.algorithm not in ESTIMATORS.values() and v.algorithm != "dapo":
        raise RpegError(f"verl has no {v.algorithm} estimator to export to (it runs "
                        f"{', '.join(sorted(set(ESTIMATORS.values()) | {'dapo'}))})")
    v = v.replace(config=config_tuple(v.algorithm, opts))
    return v, lines


def _two_pools(v: PlanView, gen: str, rest: str) -> PlanView:
    g = dict((n, (f, c)) for n, f, c in v.groups)
    gc, tc = g[gen][1], g[rest][1]
    reward_pool = next(((n, f, c) for n, f, c in v.groups if n not in (gen, rest)), None)
    groups = (("rollout", 0, gc), ("train", gc, tc)) + ((("reward", gc + tc, reward_pool[2]),) if reward_pool else ())
    names = {gen: "rollout", rest: "train"}
    if reward_pool:
        names[reward_pool[0]] = "reward"
    return v.replace(groups=groups, assign=tuple((s, names.get(grp, "train")) for s, grp in v.assign),
                     gpus=gc + tc + (reward_pool[2] if reward_pool else 0))


# ---- writing ---------------------------------------------------------------------------------------

def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if v is None:
        return "null"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def overrides(view: PlanView) -> tuple[str, list[str], str]:
    """(the entry module, the Hydra overrides, the mode) that run `view` (already projected) in verl."""
    v = view
    lay = dict(v.layouts)
    opts = {**defaults_of(v.algorithm), **dict(v.config)}
    A, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
    a = lay["actor_update"]
    megatron = v.refit_gather == "shard"
    groups = {n: (f, c) for n, f, c in v.groups}
    mode = "sync" if v.async_bound == 0 else "fully-async" if v.partial else "one-step-off"
    entry = {m: e for e, m in ENTRIES.items()}[mode]
    out: list[str] = []
    est = {b: a_ for a_, b in ESTIMATORS.items()}.get("grpo" if v.algorithm == "dapo" else v.algorithm)
    out.append(f"algorithm.adv_estimator={est}")
    job = v.job
    if mode == "fully-async":
        mb = job.mini_batches
        if job.prompts % mb:
            raise RpegError(f"fully-async export: {job.prompts} prompts do not split into {mb} mini-batches")
        out += ["data.train_batch_size=0", "data.gen_batch_size=1",
                f"{A}ppo_mini_batch_size={job.prompts // mb}", "async_training.require_batches=1",
                f"async_training.trigger_parameter_sync_step={mb}",
                f"async_training.staleness_threshold={float(v.async_bound)!r}",
                f"async_training.partial_rollout={_fmt(v.partial)}"]
    else:
        if job.prompts % job.mini_batches:
            raise RpegError(f"export: {job.prompts} prompts do not split into {job.mini_batches} mini-batches")
        out += [f"data.train_batch_size={job.prompts}", f"{A}ppo_mini_batch_size={job.prompts // job.mini_batches}"]
        if v.algorithm == "dapo":
            out.append("algorithm.filter_groups.enable=True")
            if opts.get("oversample", 1.0) != 1.0:
                gen = job.prompts * opts["oversample"]
                if abs(gen - round(gen)) > 1e-9:
                    raise RpegError(f"dapo oversample {opts['oversample']} x {job.prompts} prompts is not a whole "
                                    "generation batch")
                out.append(f"data.gen_batch_size={round(gen)}")
    out += [f"data.max_prompt_length={job.prompt_len}", f"data.max_response_length={job.response.max}",
            f"{R}n={job.samples_per_prompt}", f"{A}ppo_epochs={job.ppo_epochs}",
            f"actor_rollout_ref.model.path={hf_name(v.actor)}"]
    kl = opts.get("kl_coef", 0.0)
    if kl > 0:
        if opts.get("kl_in", "reward") == "loss":
            out += [f"{A}use_kl_loss=True", f"{A}kl_loss_coef={kl!r}",
                    f"{A}kl_loss_type={'low_var_kl' if opts.get('kl_estimator') == 'k3' else 'kl'}",
                    "algorithm.use_kl_in_reward=False"]
        else:
            out += [f"{A}use_kl_loss=False", "algorithm.use_kl_in_reward=True", f"algorithm.kl_ctrl.kl_coef={kl!r}",
                    f"algorithm.kl_penalty={'low_var_kl' if opts.get('kl_estimator') == 'k3' else 'kl'}"]
    else:
        out += [f"{A}use_kl_loss=False", "algorithm.use_kl_in_reward=False"]
    out += [f"{A}clip_ratio_low={opts['clip_low']!r}", f"{A}clip_ratio_high={opts['clip_high']!r}",
            f"{A}clip_ratio_c={opts['dual_clip']!r}", f"{A}loss_agg_mode={opts['loss_agg']}",
            f"{A}entropy_coeff={opts['entropy_coef']!r}",
            f"{A}policy_loss.loss_mode={'vanilla' if opts['policy_loss'] == 'ppo' else 'gspo'}",
            f"algorithm.gamma={opts['gamma']!r}", f"algorithm.lam={opts['lam']!r}"]
    if v.algorithm in ("grpo", "dapo"):
        out.append(f"algorithm.norm_adv_by_std_in_grpo={_fmt(opts['norm_adv_by_std'])}")
    if opts.get("off_policy") in ROLLOUT_IS.values():
        out += [f"algorithm.rollout_correction.rollout_is={'token' if opts['off_policy'] == 'tis' else 'sequence'}",
                f"algorithm.rollout_correction.rollout_is_threshold={opts['is_cap']!r}"]
    # devices
    train = groups["all"] if mode == "sync" else groups["train"]
    node = _node_size(train[1])
    out += [f"trainer.nnodes={train[1] // node}", f"trainer.n_gpus_per_node={node}"]
    if mode != "sync":
        rc = groups["rollout"][1]
        rnode = _node_size(rc)
        out += [f"rollout.nnodes={rc // rnode}", f"rollout.n_gpus_per_node={rnode}",
                "actor_rollout_ref.hybrid_engine=False"]
    # layouts
    seq = job.prompt_len + job.response.max
    out.append(f"actor_rollout_ref.model.use_remove_padding={_fmt(a.packing)}")
    out.append(f"{A}use_dynamic_bsz=False")
    if megatron:
        M = A + "megatron."
        out += [f"{A}strategy=megatron", f"{M}tensor_model_parallel_size={a.tp}",
                f"{M}pipeline_model_parallel_size={a.pp}", f"{M}context_parallel_size={a.cp}",
                f"{M}expert_model_parallel_size={a.ep}", f"{M}sequence_parallel={_fmt(a.sequence_parallel)}",
                f"{M}use_distributed_optimizer={_fmt(a.zero == 1)}"]
        if a.pp_interleave > 1:
            out.append(f"{M}virtual_pipeline_model_parallel_size={a.pp_interleave}")
        out += _megatron_recompute(M, a.recompute)
        out += _offload_keys("actor_update", a, megatron)
        out += [f"actor_rollout_ref.ref.megatron.tensor_model_parallel_size={a.tp}",
                f"actor_rollout_ref.ref.megatron.pipeline_model_parallel_size={a.pp}"]
    else:
        out += [f"{A}strategy={'fsdp2' if a.offload_params else 'fsdp'}", f"{A}ulysses_sequence_parallel_size={a.cp}",
                f"actor_rollout_ref.model.enable_gradient_checkpointing={_fmt(a.recompute == 'full')}"]
        out += _offload_keys("actor_update", a, megatron)
        if "ref_logprobs" in lay:
            out.append(f"actor_rollout_ref.ref.fsdp_config.param_offload={_fmt(v.reference_on_host)}")
    out.append(f"{A}ppo_micro_batch_size_per_gpu={a.micro_batch}")
    out.append(f"{R}log_prob_micro_batch_size_per_gpu={lay['actor_logprobs'].micro_batch}")
    if "ref_logprobs" in lay:
        out.append(f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={lay['ref_logprobs'].micro_batch}")
    g = lay["generate"]
    out += [f"{R}name=vllm", f"{R}tensor_model_parallel_size={g.tp}", f"{R}pipeline_model_parallel_size={g.pp}"]
    if "critic_update" in lay:
        cu, cv = lay["critic_update"], lay["critic_values"]
        out += ["critic.enable=True", f"critic.model.path={hf_name(v.critic or v.actor)}",
                f"critic.model.use_remove_padding={_fmt(cu.packing)}"]
        if megatron:
            M = "critic.megatron."
            out += ["critic.strategy=megatron", f"{M}tensor_model_parallel_size={cu.tp}",
                    f"{M}pipeline_model_parallel_size={cu.pp}", f"{M}context_parallel_size={cu.cp}",
                    f"{M}expert_model_parallel_size={cu.ep}", f"{M}sequence_parallel={_fmt(cu.sequence_parallel)}",
                    f"{M}use_distributed_optimizer={_fmt(cu.zero == 1)}"]
            if cu.pp_interleave > 1:
                out.append(f"{M}virtual_pipeline_model_parallel_size={cu.pp_interleave}")
            out += _megatron_recompute(M, cu.recompute)
        else:
            out += [f"critic.strategy={'fsdp2' if cu.offload_params else 'fsdp'}",
                    f"critic.ulysses_sequence_parallel_size={cu.cp}",
                    f"critic.model.enable_gradient_checkpointing={_fmt(cu.recompute == 'full')}"]
        out += _offload_keys("critic_update", cu, megatron)
        out.append(f"critic.ppo_micro_batch_size_per_gpu={cu.micro_batch}")
        if not megatron:
            out.append(f"critic.forward_micro_batch_size_per_gpu={cv.micro_batch}")
        out.append(f"critic.cliprange_value={opts['value_clip']!r}")
    if "reward" in lay:
        r = lay["reward"]
        out += ["reward.reward_model.enable=True", f"reward.reward_model.model_path={hf_name(v.reward)}",
                f"reward.reward_model.rollout.tensor_model_parallel_size={r.tp}",
                "reward.reward_model.rollout.name=vllm"]
        if "reward" in groups:
            rc = groups["reward"][1]
            rnode = _node_size(rc)
            out += ["reward.reward_model.enable_resource_pool=True", f"reward.reward_model.nnodes={rc // rnode}",
                    f"reward.reward_model.n_gpus_per_node={rnode}"]
    del seq
    return entry, out, mode


def _megatron_recompute(prefix: str, recompute: str) -> list[str]:
    if recompute == "none":
        return []
    out = [f"{prefix}override_transformer_config.recompute_granularity={recompute}"]
    if recompute == "full":  # every layer, one at a time (Megatron's uniform method)
        out += [f"{prefix}override_transformer_config.recompute_method=uniform",
                f"{prefix}override_transformer_config.recompute_num_layers=1"]
    return out


def _node_size(n: int) -> int:
    """GPUs per node for a pool of n: 8 when n is a multiple of 8 (verl's default node), else n on one node."""
    return 8 if n % 8 == 0 else n


def write(view: PlanView) -> Exported:
    """`view` as a verl launch script (see `project` for what is left out)."""
    v, lines = project(view)
    entry, args, mode = overrides(v)
    head = ["#!/usr/bin/env bash", "# written by rpeg export for verl 0.9.1 "
            f"({'synchronous, hybrid engine' if mode == 'sync' else mode} trainer)"]
    if lines:
        head.append("# verl cannot express, so this config leaves out:")
        head += [f"#   - {line}" for line in lines]
    head.append("# data, reward function, optimizer and logging: add your own overrides below")
    if v.refit_gather == "shard":  # the Megatron backend's defaults: the entry's megatron config
        args = [f"--config-name={CONFIG_NAMES[mode][1]}"] + args
    body = [f"python3 -m {entry} \\"] + [f"    {a} \\" for a in args[:-1]] + [f"    {args[-1]} \"$@\""]
    return Exported(system=SYSTEM, text="\n".join(head + ["set -euo pipefail", ""] + body) + "\n", view=v,
                    left_out=tuple(lines), filename=f"verl-{mode}{SUFFIX}")
