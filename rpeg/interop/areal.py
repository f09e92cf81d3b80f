"""AReaL: its experiment YAML, read into RPEG and written from RPEG's plans.

What is read (AReaL 1.0.4, areal/api/cli_args.py GRPOConfig / PPOConfig, areal/api/alloc_mode.py):
an experiment YAML as its entry points load it (`--config FILE`). Placement comes from the
per-engine backend strings, `rollout.backend: sglang:d4p1t1` and `actor.backend: fsdp:d4p1t1`
(`megatron:d2p2t2`, with c and e for context and expert parallelism), and the engines' scheduling
strategies (`ref.scheduling_strategy: {type: colocation, target: actor}`); the deprecated
`allocation_mode: sglang:d4+fsdp:d4` string is read too.

The mapping:
- The plan: the rollout engines on the first devices (dp x pp x tp of `rollout.backend`), the
  actor's training engine on the next (AReaL separates them unless told to colocate); the
  reference and the critic colocated with the actor when their scheduling strategy says so, else
  on devices of their own. FSDP is ZeRO-3 (tp and cp as given), Megatron ZeRO-1 with tp, pp, cp,
  ep; the actor's and the reference's logits path chunked-logsoftmax (gather_logprobs,
  rpeg/perf/logits.py). `actor.gradient_checkpointing` is full recomputation; `mb_spec.max_tokens_per_mb` is the
  packed micro-batch's token budget (over the longest sequence). `rollout.max_head_offpolicyness`
  is the async bound k, and AReaL's rollout is interruptible: k >= 1 is a partial rollout
  (rpeg/search/baselines/areal.py models the same).
- The job: `train_dataset.batch_size` prompts of `gconfig.n_samples` samples,
  `actor.ppo_n_minibatches` mini-batches, prompts up to `train_dataset.max_length` tokens,
  responses up to `gconfig.max_new_tokens`.
- The algorithm: PPO with a critic section, else GRPO; `actor.kl_ctl` (in the reward, with
  `actor.kl_estimator`), `actor.eps_clip` / `eps_clip_higher`, `actor.c_clip` (dual clip),
  `actor.discount` / `gae_lambda`, `actor.importance_sampling_level: sequence` (GSPO),
  `actor.use_decoupled_loss` (the decoupled objective; `rejection_sampling.upper` its cap).

What AReaL cannot express (`project`): critic sharing, fusion, streaming, generation colocated
with training, layouts its backend strings cannot state (FSDP with pipeline or expert
parallelism), corrections other than the decoupled objective.
"""

from __future__ import annotations

from typing import Any

import yaml

from rpeg.errors import RpegError
from rpeg.graph import Job, ParallelLayout
from rpeg.graph import get_model
from rpeg.graph.serde import from_data, parse_yaml
from rpeg.interop.areal_alloc import Engine, parse_allocation, parse_engine
from rpeg.interop.common import (
    PEFT_MODULES, defaults_of, hf_name, one_pass_each, resize,
    Exported, Imported, Notes, PlanView, config_tuple, episode_of, lora_of, model_preset, response_of, stage_names,
)

PEFT_NAMES = {target: module for module, target in PEFT_MODULES.items()}

SYSTEM = "areal"
SUFFIX = ".yaml"
_READ = {  # keys read, by dotted name
    "rollout.backend", "actor.backend", "ref.backend", "critic.backend", "allocation_mode",
    "rollout.max_head_offpolicyness", "train_dataset.batch_size", "train_dataset.max_length", "gconfig.n_samples",
    "gconfig.max_new_tokens", "actor.ppo_n_minibatches", "actor.path", "critic.path", "ref.path",
    "actor.kl_ctl", "actor.kl_estimator", "actor.eps_clip", "actor.eps_clip_higher", "actor.c_clip",
    "actor.discount", "actor.gae_lambda", "actor.importance_sampling_level", "actor.use_decoupled_loss",
    "actor.rejection_sampling.upper", "actor.rejection_sampling.metric", "actor.gradient_checkpointing",
    "actor.mb_spec.max_tokens_per_mb", "ref.mb_spec.max_tokens_per_mb", "critic.mb_spec.max_tokens_per_mb",
    "ref.scheduling_strategy.type", "ref.scheduling_strategy.target", "critic.scheduling_strategy.type",
    "critic.scheduling_strategy.target", "cluster.n_nodes", "cluster.n_gpus_per_node", "actor.recompute_logprob",
    "critic.gradient_checkpointing", "ref.gradient_checkpointing", "critic.eps_clip",
    "actor.reward_norm.mean_level", "actor.reward_norm.std_level",
    "actor.use_lora", "actor.lora_rank", "actor.lora_alpha", "actor.target_modules", "actor.peft_type",
    "actor.reward_norm.mean_leave1out", "actor.reward_norm.group_size",
    "actor.adv_norm.mean_level", "actor.adv_norm.std_level",
}
_NOT_PLAN = (
    ("experiment_name", "naming"), ("trial_name", "naming"), ("seed", "the seed is not part of the plan"),
    ("cluster.fileroot", "paths are not part of the plan"), ("cluster.name_resolve", "service discovery"),
    ("saver", "checkpointing is not part of the plan"), ("recover", "recovery is not part of the plan"),
    ("evaluator", "evaluation is not part of a training step"), ("stats_logger", "logging"),
    ("perf_tracer", "tracing"), ("valid_dataset", "evaluation data"), ("train_dataset", "data loading"),
    ("gconfig", "sampling settings (the response lengths stand for them)"), ("sglang", "engine settings"),
    ("vllm", "engine settings"), ("scheduler", "the launcher"), ("actor.optimizer", "optimizer settings"),
    ("actor.reward_", "reward shaping"), ("actor.adv_norm", "advantage normalization does not change the cost"),
    ("rollout.", "the rollout client's settings"), ("tokenizer_path", "paths"),
    ("total_train_epochs", "the run's length"),
    ("enable_offload", "the trainer's state moved to the host between phases (torch_memory_saver) while the engines "
                       "share its GPUs: RPEG's AReaL plans give the engines GPUs of their own"),
)


def parse_backend(spec: Any, key: str) -> tuple[str, dict[str, int]]:
    """`sglang:d4p1t2` -> ("sglang", {"d": 4, "p": 1, "t": 2, "c": 1, "e": 1}), or a one-line error
    (every form of areal_alloc.parse_engine; a training engine without a backend is AReaL's choice)."""
    engine = parse_engine(spec, key)
    return engine.backend or "fsdp", engine.sizes


def _flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def read(text: str, source: str, *, model: str | None = None, response_mean: float | None = None,
         cluster: str | None = None) -> Imported:
    data = parse_yaml(text, source)
    if not isinstance(data, dict) or "actor" not in data or not ({"rollout", "allocation_mode", "gconfig"} & set(data)):
        raise RpegError(f"{source}: not an AReaL experiment config (it has no actor with rollout / allocation_mode)")
    if "gconfig" not in data and ({"ppo", "dataset"} & set(data)):
        raise RpegError(f"{source}: a ReaL (realhf) experiment config, AReaL's before 0.3 (`ppo:` and `dataset:` "
                        "sections): RPEG reads AReaL's own configs (actor, rollout or allocation_mode, gconfig, "
                        "train_dataset)")
    flat = _flatten(data)
    notes = Notes()
    read_keys: set[str] = set()  # read here beyond _READ

    def get(key: str, default: Any = None) -> Any:
        v = flat.get(key, default)
        if isinstance(v, str) and v.startswith("${"):  # an interpolation: resolved by the key it names
            ref = v[2:-1]
            return get(ref, default) if ref in flat else default
        return v

    def whole(key: str, default: Any = None, minimum: int = 1) -> int:
        v = get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise RpegError(f"{source}: {key} = {v!r}: expected a whole number >= {minimum}")
        return v

    # placement: per-engine backend strings (AReaL 1.0), else the older allocation_mode string
    engine_names = [get(k) for k in ("rollout.backend", "actor.backend")]
    if all(isinstance(b, str) and (":" in b or "." in b) for b in engine_names):
        gen_e, tr_e = parse_engine(engine_names[0], "rollout.backend"), parse_engine(engine_names[1], "actor.backend")
    elif get("allocation_mode"):
        gen_e, tr_e = parse_allocation(get("allocation_mode"), "allocation_mode")
        named = get("actor.backend")  # AReaL 0.3: `actor.backend: fsdp` names the training backend alone
        if tr_e.backend is None and named in ("fsdp", "megatron"):
            tr_e = Engine(named, tr_e.sizes, tr_e.notes)
    elif any(b is not None for b in engine_names):
        gen_e, tr_e = parse_engine(engine_names[0], "rollout.backend"), parse_engine(engine_names[1], "actor.backend")
    else:
        raise RpegError(f"{source}: no rollout.backend / actor.backend (or allocation_mode): where AReaL runs is "
                        "unknown")
    for line in gen_e.notes + tr_e.notes:
        notes.assume(line)
    gen_backend, gen, train_backend, tr = gen_e.backend, gen_e.sizes, tr_e.backend or "fsdp", tr_e.sizes
    if gen_backend not in ("sglang", "vllm") or train_backend not in ("fsdp", "megatron"):
        raise RpegError(f"{source}: backends {gen_backend} + {train_backend}: RPEG reads sglang/vllm rollout and "
                        "fsdp/megatron training")
    gen_n = gen["d"] * gen["p"] * gen["t"]
    train_n = tr["d"] * tr["p"] * tr["t"] * tr["c"]
    if train_backend == "fsdp" and (tr["p"] > 1 or tr["e"] > 1):
        raise RpegError(f"{source}: actor.backend fsdp with pipeline or expert parallelism (AReaL's own check)")
    groups = [("rollout", 0, gen_n), ("actor", gen_n, train_n)]
    nxt = gen_n + train_n

    # algorithm and options
    has_critic = isinstance(data.get("critic"), dict)
    # RLOO: rewards less the mean of the group's others (reward_norm.mean_leave1out, examples/math/gsm8k_rloo.yaml)
    algorithm = "ppo" if has_critic else "rloo" if get("actor.reward_norm.mean_leave1out") is True else "grpo"
    kl = float(get("actor.kl_ctl", 0.1))
    uses_ref = kl > 0 and isinstance(data.get("ref"), dict)
    if kl > 0 and not uses_ref:
        raise RpegError(f"{source}: actor.kl_ctl = {kl:g} without a ref section: AReaL needs the reference to run")
    options: dict[str, Any] = {"kl_coef": kl if uses_ref else 0.0}
    if uses_ref:
        est = get("actor.kl_estimator", "k1")
        if est not in ("k1", "k3"):
            notes.assume(f"actor.kl_estimator {est} read as k1 (the plan's cost is the same)")
            est = "k1"
        options.update(kl_in="reward", kl_estimator=est)
    eps = float(get("actor.eps_clip", 0.2))
    high = get("actor.eps_clip_higher")
    options["clip_low"], options["clip_high"] = eps, float(high) if high is not None else eps
    c = get("actor.c_clip")
    options["dual_clip"] = float(c) if c is not None else 0.0
    options["gamma"] = float(get("actor.discount", 1.0))
    options["lam"] = float(get("actor.gae_lambda", 1.0))
    if has_critic:
        options["value_clip"] = float(get("critic.eps_clip", 0.5))  # the critic's clip is its value clip
    if get("actor.importance_sampling_level", "token") == "sequence":
        options["policy_loss"] = "gspo"
    if get("actor.use_decoupled_loss", False):
        options["off_policy"] = "decoupled"
        if get("actor.rejection_sampling.upper") is not None:
            options["is_cap"] = float(get("actor.rejection_sampling.upper"))

    # the job
    prompts = whole("train_dataset.batch_size")
    samples = whole("gconfig.n_samples", 1)
    mini = whole("actor.ppo_n_minibatches", 4)
    max_new = whole("gconfig.max_new_tokens", 16384)
    prompt_len = get("train_dataset.max_length")
    if prompt_len is None:
        prompt_len = 1024
        notes.assume("prompts: train_dataset.max_length is not set; assumed prompts of up to 1024 tokens")
    response = response_of(max_new, response_mean, notes)
    job_data = {"prompts": prompts, "samples_per_prompt": samples, "prompt_len": int(prompt_len),
                "response": response, "mini_batches": mini}
    # an agent workflow's cap on turns (`max_turns`, top level or in its section: AReaL's multi-turn and
    # search-agent examples): multi-turn episodes
    turn_keys = sorted(k for k in flat if k.rsplit(".", 1)[-1] == "max_turns")
    if turn_keys:
        cap = whole(turn_keys[0])
        read_keys.update(turn_keys)
        job_data["episode"] = episode_of(cap, None, response, notes, turn_keys[0])
    job = from_data(Job, job_data, source)
    seq = int(prompt_len) + max_new

    actor = model_preset(get("actor.path"), "actor.path", model, notes=notes)
    critic = None
    if has_critic:
        path = get("critic.path", get("actor.path"))
        critic = actor if path == get("actor.path") else model_preset(path, "critic.path", notes=notes)

    # layouts
    def shape(sizes: dict[str, int], backend: str) -> ParallelLayout:
        if backend == "megatron":
            # AReaL balances Megatron's pipeline stages by parameters itself, unequal layer counts allowed
            # (areal/engine/megatron_utils/pipeline_parallel.py, configure_pipeline_layer_splits)
            return ParallelLayout(dp=sizes["d"], tp=sizes["t"], pp=sizes["p"], cp=sizes["c"], ep=sizes["e"], zero=1,
                                  sequence_parallel=sizes["t"] > 1,
                                  pp_uneven=sizes["p"] > 1 and get_model(actor).layers % sizes["p"] != 0)
        return ParallelLayout(dp=sizes["d"], tp=sizes["t"], cp=sizes["c"], zero=3)

    def micro(role: str) -> int:
        tokens = get(f"{role}.mb_spec.max_tokens_per_mb")
        return max(1, int(tokens) // seq) if tokens else 1

    a = shape(tr, train_backend)
    fz = 0 if train_backend == "megatron" else 3
    rec = "full" if get("actor.gradient_checkpointing", False) else "none"
    layouts = {"generate": ParallelLayout(dp=gen["d"], tp=gen["t"], pp=gen["p"]),
               "actor_logprobs": a.replace(zero=fz, micro_batch=micro("actor")),
               "actor_update": a.replace(recompute=rec, micro_batch=micro("actor"))}
    assign = {"generate": "rollout"}
    for role, stage_list in (("ref", ["ref_logprobs"]), ("critic", ["critic_values", "critic_update"])):
        if role == "ref" and not uses_ref or role == "critic" and not has_critic:
            continue
        backend, sizes = parse_backend(get(f"{role}.backend", get("actor.backend")), f"{role}.backend") \
            if get(f"{role}.backend") is not None else (train_backend, tr)
        colocated = get(f"{role}.scheduling_strategy.type") == "colocation"
        if colocated:
            target = get(f"{role}.scheduling_strategy.target", "actor")
            if target != "actor":
                raise RpegError(f"{source}: {role}.scheduling_strategy.target = {target!r}: RPEG reads colocation "
                                "with the actor")
            group = "actor"
            n = train_n
        else:
            n = sizes["d"] * sizes["p"] * sizes["t"] * sizes["c"]
            groups.append((role, nxt, n))
            nxt += n
            group = role
        s = shape(sizes, backend)
        if s.devices != n:
            raise RpegError(f"{source}: {role}.backend's d x p x t x c = {s.devices} does not fill its {n} GPUs")
        for st in stage_list:
            train = st.endswith("_update")
            r = ("full" if get(f"{role}.gradient_checkpointing", False) else "none") if train else "none"
            layouts[st] = s.replace(zero=s.zero if train else (0 if backend == "megatron" else 3), recompute=r,
                                    micro_batch=micro(role))
            assign[st] = group
    for st in LOGITS_STAGES:
        if st in layouts:
            layouts[st] = layouts[st].replace(logits=LOGITS)
    names = stage_names(algorithm, critic=has_critic, reference=uses_ref, reward_model=False, share=False)
    k = whole("rollout.max_head_offpolicyness", 0, minimum=0)
    n_nodes, per_node = get("cluster.n_nodes"), get("cluster.n_gpus_per_node")
    if isinstance(n_nodes, int) and isinstance(per_node, int) and n_nodes * per_node < nxt:
        raise RpegError(f"{source}: the backends use {nxt} GPUs; cluster.n_nodes x n_gpus_per_node = "
                        f"{n_nodes} x {per_node} = {n_nodes * per_node}")
    # TrainEngineConfig (api/cli_args.py): use_lora off; lora_rank 32, lora_alpha 16; target_modules a list
    # (empty: read as every linear layer); peft_type lora, the only one
    lora = None
    if get("actor.use_lora", False):
        if get("actor.peft_type", "lora") != "lora":
            raise RpegError(f"{source}: actor.peft_type = {get('actor.peft_type')!r}: RPEG models LoRA")
        modules = get("actor.target_modules") or "all-linear"
        if modules == "all-linear":
            notes.assume("actor.target_modules: none given; the adapters read as on every linear layer (all-linear)")
        lora = lora_of(whole("actor.lora_rank", 32), get("actor.lora_alpha", 16), modules, 0.0, "actor.lora_rank",
                       notes)
    view = PlanView(lora=lora,
                    algorithm=algorithm, actor=actor, job=job, gpus=nxt, critic=critic,
                    config=config_tuple(algorithm, options), cluster=cluster, async_bound=k, partial=k >= 1,
                    groups=tuple(groups), assign=tuple((s, assign.get(s, "actor")) for s in names),
                    layouts=tuple((s, layouts[s]) for s in names if s in layouts),
                    refit_gather="shard" if train_backend == "megatron" else "full")
    if cluster is None:
        notes.assume("the devices: an AReaL config does not name their kind; --cluster sets it (default dgx-h100)")
    for key, value in flat.items():
        if key in _READ or key in read_keys or (isinstance(value, str) and value.startswith("${")):
            continue
        why = next((w for p, w in _NOT_PLAN if key == p or key.startswith(p + ".") or key.startswith(p)), None)
        notes.skip(key, value, (why + ": not part of the plan") if why and "plan" not in why else
                   why or "not read by RPEG (no part of the plan or the job it changes)")
    return Imported(system=SYSTEM, mode=f"async k={k}" if k else "synchronous", view=view,
                    unmapped=tuple(notes.unmapped), assumed=tuple(notes.assumed), source=source)


# ---- what AReaL can run ---------------------------------------------------------------------------

# gather_logprobs (areal/utils/functional/vocab_parallel.py): the model's bf16 logits, log-softmax over fp32 slices
# of 1,024 tokens (rpeg/perf/logits.py "chunked-logsoftmax", counted from its FSDP path; the Megatron engine's
# vocab-parallel slices are read as the same). No key changes it: read into these stages, written back as is
LOGITS = "chunked-logsoftmax"
LOGITS_STAGES = ("actor_update", "actor_logprobs", "ref_logprobs")


def project(view: PlanView) -> tuple[PlanView, list[str]]:
    """The plan as AReaL can run it, and one line for each thing changed to get there."""
    lines: list[str] = []
    v = view
    if v.algorithm not in ("ppo", "grpo"):
        lines.append(f"algorithm {v.algorithm}: exported as GRPO (AReaL's group-normalized advantages)")
        v = v.replace(algorithm="grpo", config=())
    if v.reward is not None:
        raise RpegError("AReaL's experiment configs take a reward function, not a reward model; export a plan with "
                        "a rule reward")
    v, more = one_pass_each(v, "AReaL")
    lines += more
    where = dict(v.assign)
    gen_group = where["generate"]
    train_group = where["actor_update"]
    lay = dict(v.layouts)
    if gen_group == train_group or len(v.groups) == 1:
        # generation and training on disjoint GPUs: the plan's generation share, else half
        n = v.gpus
        g = lay["generate"]
        gen_n = max(g.tp * g.pp, (n // 2) // (g.tp * g.pp) * (g.tp * g.pp))
        lines.append(f"generation colocated with training: AReaL's rollout engines take GPUs of their own "
                     f"({gen_n} of {n} here)")
        v = v.replace(groups=(("rollout", 0, gen_n), ("actor", gen_n, n - gen_n)),
                      assign=tuple((s, "rollout" if s.startswith("generate") else "actor") for s, _ in v.assign))
        lay = {s: resize(lo, gen_n if s.startswith("generate") else n - gen_n) for s, lo in lay.items()}
    else:
        count = {name: c for name, _, c in v.groups}
        others = {g for s, g in v.assign if not s.startswith("generate")}
        rename = {gen_group: "rollout", train_group: "actor"}
        extra = [g for g in others if g not in rename]
        for g in extra:
            role = "ref" if any(s == "ref_logprobs" and where[s] == g for s in where) else "critic"
            rename[g] = role
        groups, nxt = [], 0
        for g in [gen_group, train_group] + extra:
            groups.append((rename[g], nxt, count[g]))
            nxt += count[g]
        v = v.replace(groups=tuple(groups), assign=tuple((s, rename[g]) for s, g in v.assign), gpus=nxt)
    megatron = v.refit_gather == "shard" or lay["actor_update"].pp > 1 or lay["actor_update"].ep > 1
    for s in list(lay):
        lo = lay[s]
        if s.startswith("generate"):
            want = ParallelLayout(dp=lo.dp, tp=lo.tp, pp=lo.pp)
        elif megatron:
            train = s.endswith("_update")
            rec = ("full" if lo.recompute != "none" else "none") if train else "none"
            want = lo.replace(zero=1 if train else 0, sequence_parallel=lo.tp > 1, pp_interleave=1, pp_uneven=False,
                              packing=True, recompute=rec)
        else:
            train = s.endswith("_update")
            want = ParallelLayout(dp=lo.dp * lo.pp, tp=lo.tp, cp=lo.cp,
                                  zero=3, micro_batch=lo.micro_batch,
                                  recompute=("full" if lo.recompute != "none" else "none") if train else "none")
        if s in LOGITS_STAGES:
            want = want.replace(logits=LOGITS)
        if want != lo and not s.startswith("generate"):
            lines.append(f"{s} laid out as {lo.describe()}: AReaL's {'Megatron' if megatron else 'FSDP'} backend "
                         f"runs {want.describe()}")
        lay[s] = want
    # the forward passes run in the actor's (or critic's) engine: its shape and micro-batch budget
    for fwd, train in (("actor_logprobs", "actor_update"), ("critic_values", "critic_update")):
        if fwd in lay:
            t = lay[train]
            want = t.replace(zero=0 if megatron else 3, recompute="none")
            if want != lay[fwd]:
                lines.append(f"{fwd}: AReaL runs it in the {train.split('_')[0]}'s engine ({want.describe()})")
            lay[fwd] = want
    if "ref_logprobs" in lay:
        r = lay["ref_logprobs"]
        lay["ref_logprobs"] = r.replace(micro_batch=lay["actor_update"].micro_batch)
    v = v.replace(layouts=tuple((s, lay[s]) for s, _ in v.layouts), refit_gather="shard" if megatron else "full",
                  reference_on_host=False)
    if view.reference_on_host:
        lines.append("reference on the host: not set by this export")
    if not v.async_bound:
        lines.append("synchronous: AReaL's trainer is asynchronous; exported as k = 0 (max_head_offpolicyness 0)")
    v = v.replace(partial=v.async_bound >= 1)
    opts = dict(v.config)
    if opts.get("off_policy") not in (None, "none", "decoupled"):
        lines.append(f"off_policy {opts['off_policy']}: AReaL's correction is its decoupled objective")
        opts.pop("off_policy")
    full = {**defaults_of(v.algorithm), **opts}
    if full["kl_coef"] and full["kl_in"] != "reward":
        lines.append("KL in the loss: AReaL's kl_ctl penalizes the reward")
        opts["kl_in"] = "reward"
    for k in ("loss_agg", "entropy_coef", "norm_adv_by_std", "oversample", "is_low"):
        if k in opts:
            lines.append(f"{k} {opts.pop(k)}: not written by this export (AReaL's defaults apply)")
    v = v.replace(config=config_tuple(v.algorithm, opts))
    return v, lines


# the optimizer AReaL's examples train with (examples/math/gsm8k_grpo.yaml); RPEG's plan does not set one
OPTIMIZER = {"type": "adam", "lr": 1.7e-5, "weight_decay": 0.017, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
             "lr_scheduler_type": "constant", "gradient_clipping": 1.0, "warmup_steps_proportion": 0.001}


def _backend(lo: ParallelLayout, kind: str) -> str:
    parts = f"d{lo.dp}p{lo.pp}t{lo.tp}"
    if lo.cp > 1:
        parts += f"c{lo.cp}"
    if lo.ep > 1:
        parts += f"e{lo.ep}"
    return f"{kind}:{parts}"


def config_data(view: PlanView) -> dict[str, Any]:
    """The AReaL experiment config (a mapping) that runs `view` (already projected)."""
    v = view
    lay = dict(v.layouts)
    opts = {**defaults_of(v.algorithm), **dict(v.config)}
    megatron = v.refit_gather == "shard"
    seq = v.job.prompt_len + v.job.response.max
    kind = "megatron" if megatron else "fsdp"
    n = v.gpus
    per = 8 if n % 8 == 0 else n
    a = lay["actor_update"]
    actor: dict[str, Any] = {
        "backend": _backend(a, kind), "path": hf_name(v.actor), "gradient_checkpointing": a.recompute != "none",
        "mb_spec": {"max_tokens_per_mb": a.micro_batch * seq}, "ppo_n_minibatches": v.job.mini_batches,
        "eps_clip": opts["clip_low"], "kl_ctl": opts["kl_coef"], "discount": opts["gamma"],
        "gae_lambda": opts["lam"], "use_decoupled_loss": opts["off_policy"] == "decoupled",
        "recompute_logprob": True, "max_new_tokens": v.job.response.max,
    }
    if v.lora is not None:  # TrainEngineConfig's LoRA fields (FSDP only, as AReaL says)
        if v.lora.alpha != int(v.lora.alpha):
            raise RpegError(f"AReaL's lora_alpha is a whole number; the plan's is {v.lora.alpha:g}")
        actor |= {"use_lora": True, "lora_rank": v.lora.rank, "lora_alpha": int(v.lora.alpha),
                  "target_modules": [PEFT_NAMES[t] for t in v.lora.targets]}  # a list: peft reads each as a name
    # AReaL's algorithm is its normalization (trainer/ppo/actor.py): GRPO normalizes rewards per group, then
    # whitens advantages over the batch (its gsm8k_grpo example); PPO whitens GAE advantages over the batch.
    # Without these AReaL would run plain REINFORCE. And an engine with no optimizer does not train
    # (cli_args.py TrainEngineConfig): every trained engine gets one (the examples' AdamW figures).
    if v.algorithm == "grpo":
        actor["reward_norm"] = {"mean_level": "group", "std_level": "group", "group_size": v.job.samples_per_prompt}
    actor["adv_norm"] = {"mean_level": "batch", "std_level": "batch"}
    actor["optimizer"] = dict(OPTIMIZER)
    if opts["clip_high"] != opts["clip_low"]:
        actor["eps_clip_higher"] = opts["clip_high"]
    if opts["dual_clip"]:
        actor["c_clip"] = opts["dual_clip"]
    if opts["kl_coef"]:
        actor["kl_estimator"] = opts["kl_estimator"]
    if opts["policy_loss"] == "gspo":
        actor["importance_sampling_level"] = "sequence"
    if opts["off_policy"] == "decoupled":
        actor["rejection_sampling"] = {"metric": "ratio", "upper": opts["is_cap"]}
    if megatron and a.recompute == "selective":
        actor["gradient_checkpointing"] = True
    names = {"experiment_name": "${experiment_name}", "trial_name": "${trial_name}"}
    files = {**names, "fileroot": "${cluster.fileroot}"}
    actor.update(names)
    data: dict[str, Any] = {
        "experiment_name": "rpeg-plan", "trial_name": "trial0", "tokenizer_path": "${actor.path}",
        "cluster": {"n_nodes": n // per, "n_gpus_per_node": per, "fileroot": "/tmp/areal/experiments",
                    "name_resolve": {"type": "nfs", "nfs_record_root": "/tmp/areal/name_resolve"}},
        "rollout": {"backend": _backend(lay["generate"], "sglang"), "max_head_offpolicyness": v.async_bound,
                    **names, "fileroot": "${cluster.fileroot}", "tokenizer_path": "${tokenizer_path}",
                    "consumer_batch_size": "${train_dataset.batch_size}"},
        "gconfig": {"n_samples": v.job.samples_per_prompt, "max_new_tokens": v.job.response.max},
        "actor": actor,
        "train_dataset": {"batch_size": v.job.prompts, "max_length": v.job.prompt_len, "path": "openai/gsm8k",
                          "type": "rl"},
        # what AReaL's dataclasses require of every experiment (its examples set the same)
        "saver": dict(files), "recover": {"mode": "disabled", **files}, "evaluator": dict(files),
        "stats_logger": {**files, "wandb": {"mode": "disabled"}},
    }
    where = dict(v.assign)
    for role, stage in (("ref", "ref_logprobs"), ("critic", "critic_update")):
        if stage not in lay:
            continue
        lo = lay[stage]
        sec: dict[str, Any] = {"backend": _backend(lo, kind), "path": hf_name(v.critic or v.actor if role == "critic"
                                                                              else v.actor),
                               "mb_spec": {"max_tokens_per_mb": lo.micro_batch * seq}, **names}
        if where[stage] == where["actor_update"]:
            sec["scheduling_strategy"] = {"type": "colocation", "target": "actor"}
        if role == "critic":
            sec["optimizer"] = dict(OPTIMIZER)
            sec["gradient_checkpointing"] = lo.recompute != "none"
            sec["eps_clip"] = opts["value_clip"]
        data[role] = sec
    return data


def write(view: PlanView) -> Exported:
    v, lines = project(view)
    head = ["# written by rpeg export for AReaL 1.0.4 "
            f"(rollout {dict(v.layouts)['generate'].devices} GPUs, training the rest; max_head_offpolicyness "
            f"{v.async_bound})"]
    if lines:
        head.append("# AReaL cannot express, so this config leaves out:")
        head += [f"#   - {line}" for line in lines]
    head.append("# the dataset, reward function, optimizer and logging: add your own keys")
    text = "\n".join(head) + "\n" + yaml.safe_dump(config_data(v), sort_keys=False)
    return Exported(system=SYSTEM, text=text, view=v, left_out=tuple(lines), filename=f"areal{SUFFIX}")
