"""Reading a verl job: a launch script's Hydra overrides or a YAML of verl's keys, read into a PlanView.

`read` is the entry (rpeg/interop/verl.py re-exports it; its docstring says the mapping key by key):
`_overrides` finds the keys the job sets, `_from_config` reads them over verl's defaults into the
algorithm, the job, the models, the devices and each stage's layout.
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
    Imported, Notes, PlanView, config_tuple, episode_of, lora_of, model_preset, response_of, script_command,
    stage_names,
)
from rpeg.interop.shell import is_unknown
from rpeg.interop.verl_keys import (
    _OLDER_FSDP, ENTRIES, ESTIMATORS, KL_TYPES, LOSS_AGG, RECIPES, ROLLOUT_IS, SYSTEM, _ENTRY, _OFFLOAD_KEYS, _Config,
    _note_rest,
)


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
    response = response_of(max_response, response_mean, notes)
    job_data = {"prompts": prompts, "samples_per_prompt": samples, "prompt_len": prompt_len, "response": response,
                "ppo_epochs": c.num(A + "ppo_epochs"), "mini_batches": mini_batches}
    episode = _multi_turn(c, prompt_len + max_response, response, notes)
    if episode is not None:
        job_data["episode"] = episode
    job = from_data(Job, job_data, source)
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
        # verl's FSDP reward model is FULL_SHARD (RewardModelWorker in workers/fsdp_workers.py, before #5194,
        # with CPUOffload(offload_params=True) besides): its weights sharded, zero = 3 (the host offload, which
        # keeps even less on the devices between its passes, is not modelled); Megatron's replicates them
        layouts["reward"] = ParallelLayout(dp=rgpus // rtp, tp=rtp, zero=0 if strategy == "megatron" else 3)
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
    train_logits, forward_logits = _logits(c, A, strategy, options["entropy_coef"])
    for stage in ("actor_update", "actor_logprobs", "ref_logprobs"):
        if stage in layouts:
            layouts[stage] = layouts[stage].replace(logits=train_logits if stage == "actor_update" else forward_logits)
    ref_host = uses_ref and strategy != "megatron" and c.flag("actor_rollout_ref.ref.fsdp_config.param_offload")
    for stage in ("actor_update", "critic_update"):
        if stage in layouts:
            st = strategy if stage == "actor_update" else (c.get("critic.strategy") or strategy)
            layouts[stage] = layouts[stage].replace(**_offload_of(c, stage, st, notes))

    M = "actor_rollout_ref.model."
    lora = lora_of(c.num(M + "lora_rank", minimum=0), c.num(M + "lora_alpha", whole=False, minimum=None),
                   c.get(M + "target_modules"), None, M + "lora_rank", notes)
    view = PlanView(
        lora=lora,
        algorithm=algorithm, actor=actor, job=job, gpus=gpus, critic=critic, reward=reward,
        config=config_tuple(algorithm, options), cluster=cluster, async_bound=async_bound, partial=partial,
        groups=groups, assign=assign, layouts=tuple((s, layouts[s]) for s in names if s in layouts),
        refit_gather="shard" if strategy == "megatron" else "full", reference_on_host=ref_host)
    if cluster is None:
        notes.assume("the devices: a verl config does not name them; --cluster sets them (default dgx-h100)")
    _note_rest(cfg, c.used, notes, uses_ref=uses_ref, has_critic=has_critic)
    return Imported(system=SYSTEM, mode=mode, view=view, unmapped=tuple(notes.unmapped), assumed=tuple(notes.assumed),
                    source=source)


def _multi_turn(c: _Config, max_length: int, response: dict, notes) -> dict | None:
    """verl's multi-turn rollout (rollout.multi_turn, the AgentLoop): its caps as Job.episode, or None."""
    M = "actor_rollout_ref.rollout.multi_turn."
    if not c.has(M + "enable") or not c.flag(M + "enable"):
        return None
    turns = c.get(M + "max_assistant_turns")
    # verl's default: no limit, which its rollout reads as max_length // 3 (rollout.yaml)
    cap = max_length // 3 if turns is None else c.num(M + "max_assistant_turns")
    obs = c.num(M + "max_tool_response_length") if c.has(M + "max_tool_response_length") else 256
    for key, why in (("max_user_turns", "replies of a simulated user: counted as observations"),
                     ("max_parallel_calls", "tool calls per reply: their latency overlaps, as one call's"),
                     ("tool_config_path", "the tools themselves: their latency is job.episode.tool_latency_s"),
                     ("function_tool_path", "the tools themselves: their latency is job.episode.tool_latency_s"),
                     ("format", "the chat format: its tokens count in the response"),
                     ("tool_response_truncate_side", "which side of a long tool response is cut: not a cost")):
        if c.has(M + key):
            c.skip(notes, M + key, why)
    return episode_of(cap, obs, response, notes, M + "max_assistant_turns")


def _logits(c: _Config, A: str, strategy: str, entropy_coef: float) -> tuple[str, str]:
    """(the update's, the log-prob passes') logits path (rpeg/perf/logits.py). model.use_fused_kernels (or the
    actor's own key): the head fused with the log-softmax in 512-token chunks (FusedLinearForPPO; verl's
    Megatron forward_fused alike); otherwise Megatron's vocab-parallel cross-entropy, or under FSDP the model's
    bf16 logits with flash-attn's in-place cross-entropy, whose update holds the entropy's gradient too when
    actor.calculate_entropy or entropy_coeff != 0 (verl then turns inplace_backward off)."""
    fused = c.flag("actor_rollout_ref.model.use_fused_kernels")
    if c.has(A + "use_fused_kernels"):
        fused = c.flag(A + "use_fused_kernels")
    if fused:
        return "fused-linear", "fused-linear"
    if strategy == "megatron":
        return "fused-ce", "fused-ce"
    entropy = c.flag(A + "calculate_entropy") or entropy_coef != 0
    return ("bf16-ce-entropy" if entropy else "bf16-ce"), "bf16-ce"


def _rollout_layout(c: _Config, gpus: int, source: str) -> ParallelLayout:
    """Generation's layout: one engine replica is tp x dp x pp GPUs (verl/workers/rollout/replica.py),
    its data-parallel ranks attention replicas over experts sharded expert_parallel_size ways, which
    verl requires to be tp x dp (workers/config/rollout.py); the replicas fill the rollout's GPUs. Each
    engine runs at most max_num_seqs sequences at once (verl passes it to vLLM)."""
    R = "actor_rollout_ref.rollout."
    tp, pp, dp, ep, seqs = (c.num(R + k) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                   "data_parallel_size", "expert_parallel_size", "max_num_seqs"))
    replica = tp * dp * pp
    if gpus % replica:
        raise RpegError(f"{source}: {R}tensor_model_parallel_size x data_parallel_size x pipeline_model_parallel_size"
                        f" = {tp} x {dp} x {pp} (one engine) does not divide the rollout's {gpus} GPUs")
    if ep > 1 and ep != tp * dp:
        raise RpegError(f"{source}: {R}expert_parallel_size = {ep}: verl requires tensor_model_parallel_size x "
                        f"data_parallel_size = {tp * dp} (workers/config/rollout.py)")
    return ParallelLayout(dp=gpus // (tp * pp), tp=tp, pp=pp, ep=ep, max_seqs=seqs)


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
    shards and the optimizer step on the host throughout. Megatron: param_offload / optimizer_offload
    between phases; in verl 0.9 param_offload also releases the gradient buffers
    (verl/workers/config/engine.py McoreEngineConfig), and the grad_offload key of earlier releases,
    which the peers' older scripts still set, releases them alone; Megatron-Core's
    optimizer_cpu_offload with optimizer_offload_fraction runs that fraction of the optimizer on the
    host. Host copies (rpeg/perf/offload.py, "Pinned or pageable"): FSDP1 pinned both ways; FSDP2's
    weights through pageable memory (model.cpu() / model.to(device)); Megatron's weights out through
    pageable memory (.cpu().pin_memory()), back pinned."""
    fsdp, meg, opt = _OFFLOAD_KEYS[stage]
    if strategy == "megatron":
        weights_out = c.flag(meg + "param_offload")
        grads_out = c.flag(meg + "grad_offload") or weights_out
        resident = tuple(part for part, out in (("weights", weights_out), ("gradients", grads_out),
                                                ("optimizer", c.flag(meg + "optimizer_offload"))) if not out)
        host = c.num(opt + "optimizer_offload_fraction", whole=False, minimum=0) \
            if c.flag(opt + "optimizer_cpu_offload") else 0.0
        if host > 1:
            raise RpegError(f"{c.source}: {opt}optimizer_offload_fraction = {host}: a fraction from 0 to 1")
        return {"resident": resident, "offload_optimizer": float(host),
                "pageable": ("weights-out",) if weights_out else ()}
    older = _OLDER_FSDP.get(stage)
    if older and any(c.has(older + k) for k in ("param_offload", "optimizer_offload", "offload_policy")) \
            and not any(c.has(fsdp + k) for k in ("param_offload", "optimizer_offload", "offload_policy")):
        fsdp = older  # a script for verl before 0.9 (critic.model.fsdp_config)
    if c.flag(fsdp + "offload_policy"):
        if strategy != "fsdp2":
            c.skip(notes, fsdp + "offload_policy", "offload_policy is FSDP2's (strategy fsdp2): FSDP1 ignores it")
        else:
            for k in ("param_offload", "optimizer_offload"):  # verl turns them off under offload_policy
                c.get(fsdp + k)
            return {"offload_optimizer": 1.0, "offload_params": True}
    resident = tuple(part for part, k in (("weights", "param_offload"), ("optimizer", "optimizer_offload"))
                     if not c.flag(fsdp + k))
    return {"resident": resident, "pageable": ("weights",) if strategy == "fsdp2" and "weights" not in resident else ()}
