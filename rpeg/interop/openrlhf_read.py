"""Reading an OpenRLHF job: a `train_ppo_ray` launch script or an args file of its flags, read into a PlanView.

`read` is the entry (rpeg/interop/openrlhf.py re-exports it; its docstring says the mapping flag by flag):
`_words` finds the command's words, `_parse` reads them as the parser would (older underscore flags are
translated first: openrlhf_flags.py), `_from_args` reads them over the parser's defaults into the algorithm,
the job, the models, the devices and each stage's layout.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from rpeg.errors import RpegError
from rpeg.graph import Job, ParallelLayout
from rpeg.graph.serde import from_data
from rpeg.interop.common import (
    Imported, Notes, PlanView, config_tuple, episode_of, lora_of, model_preset, response_of, script_command,
    stage_names,
)
from rpeg.interop.openrlhf_flags import old_flags, translate
from rpeg.interop.openrlhf_keys import (
    CORRECTIONS, DEFAULTS, ENTRY, ESTIMATORS, FLAGS, FLOAT2, LISTS, LOGITS, LOGITS_STAGES, SYSTEM, _NOT_PLAN,
)


def read(text: str, source: str, *, model: str | None = None, response_mean: float | None = None,
         cluster: str | None = None) -> Imported:
    """An OpenRLHF launch (script or args file) as an RPEG view; see the module docstring."""
    words = _words(text, source)
    read_as: list[str] = []
    old = old_flags(words)
    if old:  # OpenRLHF before 0.10.2: underscore flags, renamed one for one (openrlhf_flags.py)
        words, read_as = translate(words)
        read_as.insert(0, f"old OpenRLHF flags (before 0.10.2: {', '.join('--' + n for n in old[:3])}, ...) read as "
                       "the dotted flags that replaced them")
    return _from_args(_parse(words, source), source, model=model, response_mean=response_mean, cluster=cluster,
                      read_as=read_as)


def _words(text: str, source: str) -> list[str]:
    if ENTRY in text:
        words, _ = script_command(text, re.compile(r"^" + re.escape(ENTRY) + r"$"), source)
        return words
    body = "\n".join(line for line in text.splitlines() if not line.strip().startswith("#"))
    try:
        words = shlex.split(body.replace("\\\n", " "))
    except ValueError as e:
        raise RpegError(f"{source}: cannot split the arguments ({e})") from None
    if not words or not words[0].startswith("--"):
        raise RpegError(f"{source}: not an OpenRLHF launch: no command runs {ENTRY} and it is no file of "
                        "--flags either")
    return words


def _parse(words: list[str], source: str) -> dict[str, Any]:
    """Flags -> values, as the parser would read them (dotted names; `_` spelt the same)."""
    args: dict[str, Any] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("", "&&", ";", "|", "&"):
            if w:
                break
            i += 1
            continue
        if not w.startswith("--"):
            raise RpegError(f"{source}: {w!r} is not a train_ppo_ray flag (--name value)")
        key, _, inline = w[2:].partition("=")
        if key in FLAGS:
            args[key] = True
            i += 1
            continue
        values = [inline] if inline else []
        j = i + 1
        while not values or (key in FLOAT2 and len(values) < 2) or key in LISTS:
            if j >= len(words) or (words[j].startswith("--") and not re.match(r"^--?\d", words[j])):
                break
            values.append(words[j])
            j += 1
        if not values:  # a store_true flag this reader does not list
            args[key] = True
        else:
            args[key] = [_num(v) for v in values] if key in FLOAT2 else values if key in LISTS else _num(values[0])
        i = j
    return args


def _num(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


class _Args:
    def __init__(self, args: dict[str, Any], source: str):
        self.args, self.source, self.used = args, source, set()

    def get(self, key: str) -> Any:
        self.used.add(key)
        return self.args.get(key, DEFAULTS.get(key))

    def has(self, key: str) -> bool:
        return key in self.args

    def num(self, key: str, minimum: float = 1, whole: bool = True) -> Any:
        v = self.get(key)
        ok = isinstance(v, int) if whole else isinstance(v, int | float)
        if not ok or isinstance(v, bool) or v < minimum:
            raise RpegError(f"{self.source}: --{key} {v!r}: expected {'a whole number' if whole else 'a number'} "
                            f">= {minimum:g}")
        return v


def _from_args(args: dict[str, Any], source: str, *, model, response_mean, cluster, read_as=()) -> Imported:
    a = _Args(args, source)
    notes = Notes()
    for line in read_as:
        notes.assume(line)
    est = a.get("algo.advantage.estimator")
    if est not in ESTIMATORS:
        raise RpegError(f"{source}: --algo.advantage.estimator {est}: RPEG has no such estimator "
                        f"(it reads {', '.join(ESTIMATORS)})")
    algorithm = ESTIMATORS[est]
    if a.get("algo.dynamic_filtering_enable"):
        a.get("algo.dynamic_filtering_range")
        if algorithm == "grpo" and a.get("algo.kl.init_coef") == 0:
            algorithm = "dapo"
        elif algorithm == "grpo":
            notes.skip("algo.dynamic_filtering_enable", True, "RPEG's dynamic sampling (dapo) runs no reference and "
                       "this job's KL needs one: costed as GRPO without the extra generation it draws")
        else:
            notes.skip("algo.dynamic_filtering_enable", True, f"dynamic filtering is RPEG's dapo (GRPO's); with {est} "
                       "the plan is costed without the extra generation it draws")
    options: dict[str, Any] = {}
    kl = float(a.num("algo.kl.init_coef", minimum=0, whole=False))
    if kl > 0:
        kind = a.get("algo.kl.estimator")
        if kind not in ("k1", "k2", "k3"):
            raise RpegError(f"{source}: --algo.kl.estimator {kind}: OpenRLHF's estimators are k1, k2 and k3")
        if kind == "k2":  # the same reference pass and the same cost; RPEG's runtime has k1 and k3
            notes.assume("--algo.kl.estimator k2 read as k1 (RPEG's runtime has k1 and k3; the plan's cost is the "
                         "same)")
            kind = "k1"
        options.update(kl_coef=kl, kl_in="loss" if a.get("algo.kl.use_loss") else "reward", kl_estimator=kind)
    else:
        options["kl_coef"] = 0.0
        for key in ("algo.kl.use_loss", "algo.kl.estimator"):
            if a.has(key):
                a.used.add(key)
                notes.skip(key, args[key], "no KL penalty is on (--algo.kl.init_coef 0)")
    low_high = a.get("actor.eps_clip_low_high")
    eps = float(a.num("actor.eps_clip", minimum=0, whole=False))
    options["clip_low"], options["clip_high"] = (float(low_high[0]), float(low_high[1])) if low_high else (eps, eps)
    dual = a.get("actor.dual_clip")
    options["dual_clip"] = 0.0 if dual is None else float(dual)
    options["loss_agg"] = a.get("actor.loss_agg_mode")
    options["policy_loss"] = a.get("actor.policy_loss_type")
    ent = a.get("actor.entropy_coef")
    options["entropy_coef"] = 0.0 if ent is None else float(ent)
    options["gamma"] = float(a.num("algo.advantage.gamma", minimum=0, whole=False))
    options["lam"] = float(a.num("algo.advantage.lambd", minimum=0, whole=False))
    if algorithm in ("grpo", "dapo"):
        options["norm_adv_by_std"] = not a.get("algo.advantage.no_std_norm")
    if algorithm == "ppo":
        options["value_clip"] = float(a.num("critic.value_clip", minimum=0, whole=False))
    level = a.get("algo.advantage.is_correction_level")
    if level != "off":
        mode, gating = a.get("algo.advantage.is_correction_mode"), a.get("algo.advantage.is_correction_gating")
        bounds = list(a.get("algo.advantage.is_correction_threshold"))
        low, high = bounds if len(bounds) == 2 else (0.0, bounds[0])  # one value: an upper bound (the parser's)
        if gating != "ratio":
            raise RpegError(f"{source}: --algo.advantage.is_correction_gating {gating}: RPEG's corrections gate on "
                            "the ratio")
        if (level, mode) not in CORRECTIONS:
            raise RpegError(f"{source}: --algo.advantage.is_correction_mode {mode} with --algo.advantage."
                            f"is_correction_level {level}: OpenRLHF's loss refuses it (clip needs level token)")
        name = options["off_policy"] = CORRECTIONS[(level, mode)]
        options["is_cap"] = float(high)
        read_as = (f"--algo.advantage.is_correction_level {level} --algo.advantage.is_correction_mode {mode} "
                   f"read as {name}")
        if name == "mask-seq":
            options["is_low"] = float(low)
            notes.assume(f"{read_as}, which approximates it: OpenRLHF weighs a kept sequence's tokens rho and keeps "
                         "a rejected one in the denominator at weight 0; mask-seq weighs kept tokens 1 and drops "
                         "rejected sequences from the denominator")
        elif low > 0:
            notes.assume(f"{read_as} with the lower bound {low:g} read as 0 ({name} has none): a token with rho "
                         f"below {low:g} keeps its weight rho, which OpenRLHF "
                         + (f"raises to {low:g}" if mode == "clip" else "zeroes"))

    # the job
    prompts = a.num("rollout.batch_size")
    samples = a.num("rollout.n_samples_per_prompt")
    train_batch = a.num("train.batch_size")
    if (prompts * samples) % train_batch:
        raise RpegError(f"{source}: --rollout.batch_size x --rollout.n_samples_per_prompt = {prompts} x {samples} "
                        f"is not a multiple of --train.batch_size {train_batch}")
    max_len = a.num("data.max_len")
    new = a.get("rollout.max_new_tokens")
    if new is None:
        prompt_len = max_len // 4
        new = max_len - prompt_len
        notes.assume(f"prompt and response: --rollout.max_new_tokens is not set (OpenRLHF fills --data.max_len "
                     f"{max_len} with what the prompt leaves); assumed prompts of {prompt_len} and responses up to "
                     f"{new} tokens")
    else:
        new = a.num("rollout.max_new_tokens")
        if new >= max_len:
            raise RpegError(f"{source}: --rollout.max_new_tokens {new} leaves no room for a prompt in --data.max_len "
                            f"{max_len}")
        prompt_len = max_len - new
    response = response_of(new, response_mean, notes)
    job_data = {"prompts": prompts, "samples_per_prompt": samples, "prompt_len": prompt_len, "response": response,
                "ppo_epochs": a.num("train.max_epochs"), "mini_batches": prompts * samples // train_batch}
    episode = _agent(a, new, response, notes)
    if episode is not None:
        job_data["episode"] = episode
    job = from_data(Job, job_data, source)
    seq = prompt_len + new

    # the models
    actor = model_preset(a.get("actor.model_name_or_path"), "--actor.model_name_or_path", model, notes=notes)
    remote = a.get("reward.remote_url") or a.get("train.agent_func_path")  # an agent function is the reward
    reward = None
    if not remote and algorithm != "dapo":
        path = a.get("reward.model_name_or_path")
        if path is None:
            raise RpegError(f"{source}: neither --reward.remote_url nor --reward.model_name_or_path: OpenRLHF needs "
                            "a reward")
        reward = model_preset(path, "--reward.model_name_or_path", notes=notes)
    elif not remote:
        raise RpegError(f"{source}: dynamic filtering needs --reward.remote_url or --train.agent_func_path (the "
                        "parser's own check)")
    critic = None
    if algorithm == "ppo":
        path = a.get("critic.model_name_or_path") or (a.get("reward.model_name_or_path") if not remote
                                                       else a.get("actor.model_name_or_path"))
        critic = model_preset(path, "--critic.model_name_or_path", model if path == args.get(
            "actor.model_name_or_path") else None, notes=notes)
    uses_ref = options["kl_coef"] > 0

    # the devices
    engines = a.get("vllm.num_engines")
    if not engines:
        raise RpegError(f"{source}: --vllm.num_engines is not set: without vLLM engines OpenRLHF generates with the "
                        "training model, which RPEG does not read")
    engines = a.num("vllm.num_engines")
    gen_tp = a.num("vllm.tensor_parallel_size")
    size = {r: a.num(f"{r}.num_nodes") * a.num(f"{r}.num_gpus_per_node") for r in ("actor", "ref", "critic", "reward")}
    colocate_all, async_on = a.get("train.colocate_all"), a.get("train.async_enable")
    actor_ref, critic_reward = a.get("train.colocate_actor_ref"), a.get("train.colocate_critic_reward")
    group_of: dict[str, str] = {}
    groups: list[tuple[str, int, int]] = []
    nxt = 0

    def add(name: str, count: int) -> None:
        nonlocal nxt
        groups.append((name, nxt, count))
        nxt += count

    if colocate_all:
        for key in ("vllm.enable_sleep", "ds.enable_sleep"):  # what colocating them asks for
            a.get(key)
        if not async_on and not a.get("vllm.enable_sleep"):
            notes.assume("the engines share the trainers' GPUs without --vllm.enable_sleep: OpenRLHF keeps their "
                         "weights and KV cache on the GPUs while the models train; RPEG costs them asleep (the "
                         "context switch's engine sleep and wake) and leaves their memory out of training's peak")
        if not async_on:
            if engines * gen_tp != size["actor"]:
                raise RpegError(f"{source}: --train.colocate_all with {engines} engines x tp {gen_tp} on the actor's "
                                f"{size['actor']} GPUs: they must match")
            add("all", size["actor"])
            group_of = {r: "all" for r in ("vllm", "actor", "ref", "critic", "reward")}
        else:
            add("vllm", engines * gen_tp)
            add("actor", size["actor"])
            group_of = {"vllm": "vllm", **{r: "actor" for r in ("actor", "ref", "critic", "reward")}}
    else:
        add("vllm", engines * gen_tp)
        add("actor", size["actor"])
        group_of = {"vllm": "vllm", "actor": "actor"}
        if uses_ref:
            if actor_ref:
                group_of["ref"] = "actor"
            else:
                add("ref", size["ref"])
                group_of["ref"] = "ref"
        if critic:
            add("critic", size["critic"])
            group_of["critic"] = "critic"
        if reward:
            if critic_reward and critic:
                group_of["reward"] = "critic"
            else:
                add("reward", size["reward"])
                group_of["reward"] = "reward"
    for role in ("ref", "critic", "reward"):
        if role not in group_of or (role == "ref" and not uses_ref) or (role == "critic" and not critic) \
                or (role == "reward" and not reward):
            for k in (f"{role}.num_nodes", f"{role}.num_gpus_per_node"):
                if a.has(k):
                    a.used.add(k)
                    notes.skip(k, args[k], f"no {role} model runs")
    count = {n: c for n, _, c in groups}

    # the layouts
    zero = a.get("ds.zero_stage")
    if zero not in (0, 1, 2, 3):
        raise RpegError(f"{source}: --ds.zero_stage {zero}: DeepSpeed's stages are 0-3")
    tp, cp = a.num("ds.tensor_parallel_size"), a.num("ds.ring_attn_size")
    dyn = a.get("train.dynamic_batch_enable")
    packing = bool(a.get("ds.packing_samples") or cp > 1 or dyn)  # the parser turns packing on for both
    recompute = "full" if a.get("actor.gradient_checkpointing_enable") else "none"
    if dyn:
        for key in ("train.micro_batch_size", "rollout.micro_batch_size"):
            if a.has(key):
                a.used.add(key)
                notes.skip(key, args[key], "dynamic batching: the token budgets (--train/--rollout.max_tokens_per_gpu) "
                           "make the micro-batches")
    train_mb = max(1, a.num("train.max_tokens_per_gpu") // seq) if dyn else a.num("train.micro_batch_size")
    roll_tokens = a.get("rollout.max_tokens_per_gpu") or a.get("train.max_tokens_per_gpu")
    fwd_mb = max(1, int(roll_tokens) // seq) if dyn else a.num("rollout.micro_batch_size")

    def shape(role: str) -> ParallelLayout:
        n = count[group_of[role]]
        if n % (tp * cp):
            raise RpegError(f"{source}: --ds.tensor_parallel_size x --ds.ring_attn_size = {tp} x {cp} does not "
                            f"divide the {role}'s {n} GPUs")
        return ParallelLayout(dp=n // (tp * cp), tp=tp, cp=cp, packing=packing)

    fz = 3 if zero == 3 else 0  # forward passes: ZeRO-3 under stage 3, else whole weights
    layouts = {"generate": ParallelLayout(dp=engines, tp=gen_tp),
               "actor_logprobs": shape("actor").replace(zero=fz, micro_batch=fwd_mb),
               "actor_update": shape("actor").replace(zero=zero, recompute=recompute, micro_batch=train_mb)}
    if uses_ref:
        layouts["ref_logprobs"] = shape("ref").replace(zero=fz, micro_batch=fwd_mb)
    if critic:
        layouts["critic_values"] = shape("critic").replace(zero=fz, micro_batch=fwd_mb)
        layouts["critic_update"] = shape("critic").replace(zero=zero, recompute=recompute, micro_batch=train_mb)
    if reward:
        layouts["reward"] = shape("reward").replace(zero=fz, micro_batch=fwd_mb)
    for s in LOGITS_STAGES:
        if s in layouts:
            layouts[s] = layouts[s].replace(logits=LOGITS)
    host = _adam_offload(a)
    resident = _resident(a, zero) if colocate_all and not async_on else ()
    for s in ("actor_update", "critic_update"):
        if s in layouts:
            layouts[s] = layouts[s].replace(offload_optimizer=host, resident=resident)
    names = stage_names(algorithm, critic=bool(critic), reference=uses_ref, reward_model=bool(reward), share=False)
    role_of = {"generate": "vllm", "generate_greedy": "vllm", "reward": "reward", "ref_logprobs": "ref",
               "critic_values": "critic", "critic_update": "critic"}
    assign = tuple((s, group_of[role_of.get(s, "actor")] if role_of.get(s, "actor") in group_of
                    else group_of["actor"]) for s in names)
    async_bound = a.num("train.async_queue_size") if async_on else 0
    partial = bool(a.get("train.partial_rollout_enable"))
    if partial and not async_on:
        raise RpegError(f"{source}: --train.partial_rollout_enable requires --train.async_enable (the parser's check)")
    if not async_on and a.has("train.async_queue_size"):
        a.used.add("train.async_queue_size")
        notes.skip("train.async_queue_size", args["train.async_queue_size"], "async training is off")
    lora = lora_of(a.num("ds.lora.rank", minimum=0), a.num("ds.lora.alpha", minimum=0, whole=False),
                   a.get("ds.lora.target_modules"), a.num("ds.lora.dropout", minimum=0, whole=False), "--ds.lora.rank",
                   notes)
    view = PlanView(lora=lora,
                    algorithm=algorithm, actor=actor, job=job, gpus=nxt, critic=critic, reward=reward,
                    config=config_tuple(algorithm, options), cluster=cluster, async_bound=async_bound,
                    partial=partial, groups=tuple(groups), assign=assign,
                    layouts=tuple((s, layouts[s]) for s in names if s in layouts), refit_gather="full",
                    reference_on_host=bool(uses_ref and a.get("ref.offload")))
    if cluster is None:
        notes.assume("the devices: an OpenRLHF launch does not name them; --cluster sets them (default dgx-h100)")
    for key, value in args.items():
        if key in a.used:
            continue
        why = next((w for p, w in _NOT_PLAN if key.startswith(p)), None)
        notes.skip(key, value, why or "not read by RPEG (no part of the plan or the job it changes)")
    return Imported(system=SYSTEM, mode="async" if async_on else "sync", view=view, unmapped=tuple(notes.unmapped),
                    assumed=tuple(notes.assumed), source=source)


def _agent(a: _Args, budget: int, response: dict, notes: Notes) -> dict | None:
    """--train.agent_func_path (agent RLHF): its episodes as Job.episode, or None without an agent.

    The file holds an AgentExecutor (openrlhf/utils/agent.py; the examples' is a MultiTurnAgentExecutor whose
    AgentInstance.step returns the environment's feedback, a reward and `done`). RPEG does not read or run it,
    and says so. OpenRLHF has no turn flag: the executor loops until the agent says done or the sequence
    reaches --data.max_len, every reply at least one token (min_tokens 1), so the cap on replies is the
    response's token budget (0.8.0-0.9.0 also stopped at 10,000 steps, a keyword default, not a flag). The
    agent gives the reward: OpenRLHF then sets --reward.remote_url to "agent" and runs no reward model."""
    path = a.get("train.agent_func_path")
    if path is True:  # the flag without a value: argparse's "expected one argument"
        raise RpegError(f"{a.source}: --train.agent_func_path needs a value: the agent's Python file")
    if path is None or path == "":  # "" turns the agent off (train_ppo_ray tests it for truth)
        return None
    for key in ("reward.remote_url", "reward.model_name_or_path"):
        if a.has(key):
            a.used.add(key)
            notes.skip(key, a.args[key], "the agent gives the reward (OpenRLHF sets --reward.remote_url to 'agent' "
                       "and runs no reward model with --train.agent_func_path)")
    notes.assume(f"--train.agent_func_path {path}: the agent file is not read (RPEG does not run the peer's Python "
                 "agent); its rollouts read as multi-turn episodes (a single-turn agent: drop job.episode), capped by "
                 "the response's token budget, a token a reply at least: OpenRLHF has no turn flag and ends an "
                 "episode when the agent says done or at --data.max_len")
    return episode_of(budget, None, response, notes, "--train.agent_func_path")


def _adam_offload(a: _Args) -> float:
    """--ds.adam_offload (older releases: --adam_offload): DeepSpeed's offload_optimizer {device: cpu,
    pin_memory: true} for the actor and the critic, the optimizer state and its Adam step on the host
    (DeepSpeedCPUAdam; mechanism (a) of rpeg/perf/offload.py): ParallelLayout.offload_optimizer = 1."""
    return 1.0 if a.get("ds.adam_offload") or a.get("adam_offload") else 0.0


def _resident(a: _Args, zero: int) -> tuple[str, ...]:
    """What a trainer keeps on the GPUs it shares with the engines (ParallelLayout.resident).
    --ds.enable_sleep: DeepSpeed's offload_states (utils/deepspeed/deepspeed_utils.py) moves the fp32
    master weights, the Adam moments and the bf16 gradient partition into pinned host buffers and frees
    the gradient bucket, but leaves the bf16 weights (lp_params is not in its list) on the GPUs:
    ["weights"] (the gradient partition's move, 2 bytes a parameter over dp under ZeRO-3, is not
    charged: RPEG frees gradients). With --ds.adam_offload the optimizer is on the host already and
    offload_states returns at once. Without --ds.enable_sleep nothing moves: the weights and the
    optimizer stay, and under ZeRO-3 the gradient partition buffer too."""
    if a.get("ds.enable_sleep"):
        return ("weights",)
    return ("weights", "gradients", "optimizer") if zero == 3 else ("weights", "optimizer")
