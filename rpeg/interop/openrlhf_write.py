"""Writing an OpenRLHF job: a PlanView projected onto what OpenRLHF can run (`project`), then written as the
flags of `train_ppo_ray` (`arguments`) and a launch script (`write`).

rpeg/interop/openrlhf.py re-exports these; its docstring says what OpenRLHF cannot express.
"""

from __future__ import annotations

import math
from typing import Any

from rpeg.errors import RpegError
from rpeg.graph import ParallelLayout
from rpeg.graph.episode import MAX_TURNS
from rpeg.interop.common import (
    Exported, PlanView, colocate_all, config_tuple, defaults_of, hf_name, one_pass_each, peft_modules, resize,
)
from rpeg.interop.openrlhf_keys import ENTRY, ESTIMATORS, EXPORTS, LOGITS, LOGITS_STAGES, SUFFIX, SYSTEM


# ---- what OpenRLHF can run ------------------------------------------------------------------------

_ROLE = {"generate": "vllm", "generate_greedy": "vllm", "reward": "reward", "ref_logprobs": "ref",
         "critic_values": "critic", "critic_update": "critic"}
# what an export of a job with episodes names as its agent: a plan holds no agent code (write's header says so)
AGENT = "./agent_func.py"


def project(view: PlanView) -> tuple[PlanView, list[str]]:
    """The plan as OpenRLHF can run it, and one line for each thing changed to get there."""
    if view.algorithm not in ESTIMATORS.values() and view.algorithm != "dapo":
        raise RpegError(f"OpenRLHF has no {view.algorithm} estimator to export to")
    if view.algorithm == "dapo":
        raise RpegError("OpenRLHF's dynamic filtering needs a remote reward server (--reward.remote_url), which a "
                        "plan does not name; export dapo to verl or AReaL")
    v, lines = one_pass_each(view, "OpenRLHF")
    if v.reward is None and "reward" in dict(v.layouts):
        v = v.replace(layouts=tuple((s, lo) for s, lo in v.layouts if s != "reward"))
    # placement: engines + one group per model (or the colocations the flags allow)
    role_group = _role_groups(v)
    one = len(v.groups) == 1
    if one and v.async_bound:
        lines.append(f"async k={v.async_bound} with the engines on the training GPUs: OpenRLHF's async mode gives "
                     "the engines GPUs of their own; run synchronously")
        v = v.replace(async_bound=0, partial=False)
    models = {r: g for r, g in role_group.items() if r != "vllm"}
    if not one and role_group.get("vllm") in models.values():
        lines.append("generation sharing GPUs with a model but not with all of them: OpenRLHF colocates the engines "
                     "only with every model (--train.colocate_all)" + _sync_note(v))
        v = _colocate_all(v)
    elif not one and len(set(models.values())) == 1 and len(models) > 1 and not v.async_bound \
            and set(models) - {"actor", "ref"}:
        lines.append("actor and critic (or reward model) on the same GPUs apart from the engines: OpenRLHF colocates "
                     "them only with the engines too (--train.colocate_all)" + _sync_note(v))
        v = _colocate_all(v)
    elif not one and not _per_model(models):
        lines.append("device groups other than one per model: OpenRLHF places each model on GPUs of its own, or "
                     "colocates them all (--train.colocate_all)" + _sync_note(v))
        v = _colocate_all(v)
    # layouts
    lay = dict(v.layouts)
    a = lay["actor_update"]
    if a.pp > 1 or a.ep > 1 or a.sequence_parallel or a.pp_interleave > 1 or a.pp_uneven:
        lines.append(f"actor_update laid out as {a.describe()}: OpenRLHF's DeepSpeed has no pipeline or expert "
                     "parallelism; folded into data parallelism")
    if a.recompute == "selective":
        lines.append("selective recomputation: OpenRLHF checkpoints whole layers (full)")
    zero, tp, cp, packing = a.zero, a.tp, a.cp, a.packing
    host = 1.0 if a.offload_optimizer else 0.0
    if a.offload_optimizer not in (0.0, 1.0) or a.offload_params:
        lines.append(f"actor_update {a.describe()}: OpenRLHF's --ds.adam_offload keeps all of the optimizer on the "
                     "host, and the parameters on the GPUs")
    resident = _sleep_resident(a, len(v.groups) == 1)
    if resident != a.resident:
        lines.append(f"actor_update keeping {'+'.join(a.resident) or 'nothing'} resident through generation: "
                     + ("OpenRLHF's trainers keep their bf16 weights on the GPUs even asleep (--ds.enable_sleep), "
                        "and everything without it" if len(v.groups) == 1 else
                        "OpenRLHF's trainers do not share GPUs with the engines here, so nothing moves"))
    rec = "full" if a.recompute != "none" else "none"
    fz = 3 if zero == 3 else 0
    groups = {n: c for n, _, c in v.groups}
    fwd = lay["actor_logprobs"].micro_batch
    for s in list(lay):
        if s == "generate" or s == "generate_greedy":
            g = lay[s]
            want = ParallelLayout(dp=g.devices // g.tp, tp=g.tp)
        else:
            n = groups[dict(v.assign)[s]]
            train = s.endswith("_update")
            base = resize(ParallelLayout(tp=tp, cp=cp, packing=packing), n)
            if n % (tp * cp):
                raise RpegError(f"OpenRLHF export: tp x ring = {tp} x {cp} does not divide {s}'s {n} GPUs")
            want = base.replace(zero=zero if train else fz, recompute=rec if train else "none",
                                micro_batch=a.micro_batch if train else fwd, offload_optimizer=host if train else 0.0,
                                resident=resident if train else ())
            if s in LOGITS_STAGES:
                want = want.replace(logits=LOGITS)
                if s == "actor_update" and a.logits != LOGITS:
                    lines.append(f"logits path {a.logits}: OpenRLHF's actor computes its log-probs as {LOGITS}")
        if want != lay[s] and s != "actor_update":
            if s not in ("generate", "generate_greedy") or lay[s].devices != want.devices or lay[s].pp > 1:
                lines.append(f"{s} laid out as {lay[s].describe()}: OpenRLHF runs it as {want.describe()} (one "
                             "DeepSpeed config and micro-batch for every model)")
        lay[s] = want
    v = v.replace(layouts=tuple((s, lay[s]) for s, _ in v.layouts))
    if v.refit_gather != "full":
        lines.append("weight sync gathering the engine's shard: OpenRLHF broadcasts every tensor gathered in full")
        v = v.replace(refit_gather="full")
    opts = dict(v.config)
    off = opts.get("off_policy")
    if off not in (None, "none", *EXPORTS):
        lacks = ("a sequence weight (its loss refuses clip at level seq)" if off == "tis-seq" else
                 "rejection that weighs the kept tokens 1")
        lines.append(f"off_policy {off}: OpenRLHF's corrections are token clip (tis), token mask (IcePop: decoupled "
                     f"with a lower bound) and seq mask (rho on the kept sequences' tokens); it has no {lacks}")
    if off not in EXPORTS:
        opts.pop("off_policy", None)
        opts.pop("is_cap", None)
    opts.pop("is_low", None)  # not written: tis and decoupled have no lower bound
    if opts.get("loss_agg") == "seq-mean-token-sum-norm":
        lines.append("loss_agg seq-mean-token-sum-norm: OpenRLHF aggregates by token-mean or seq-mean-token-mean")
        opts["loss_agg"] = "token-mean"
    if opts.get("kl_coef", 0) and opts.get("kl_estimator") not in (None, "k1", "k3"):
        opts["kl_estimator"] = "k1"
    v = v.replace(config=config_tuple(v.algorithm, opts))
    v = _episode(v, lines)
    return _canonical(v), lines


def _episode(v: PlanView, lines: list[str]) -> PlanView:
    """The job's multi-turn episodes as OpenRLHF runs them: through an agent (--train.agent_func_path), which
    gives the reward (OpenRLHF runs no reward model beside it) and whose episodes no flag caps in turns, only
    the token budget (openrlhf_read._agent). A line for each thing that changes."""
    ep = v.job.episode
    if ep is None:
        return v
    if ep.max_turns <= 1:  # one reply, no observations: a single-turn job, written as one
        return v.replace(job=v.job.replace(episode=None))
    if v.reward is not None:
        lines.append(f"multi-turn episodes ({ep.describe()}) beside a reward model: OpenRLHF's agent "
                     "(--train.agent_func_path) gives the reward and runs no reward model; written single-turn")
        return v.replace(job=v.job.replace(episode=None))
    cap = max(min(v.job.response.max, MAX_TURNS), math.ceil(ep.turns))
    if ep.max_turns == cap:
        return v
    lines.append(f"episode.max_turns = {ep.max_turns}: OpenRLHF has no turn cap (an episode ends when the agent "
                 f"says done or at --data.max_len: at most {cap} replies); your agent must end it after "
                 f"{ep.max_turns}")
    return v.replace(job=v.job.replace(episode=ep.replace(max_turns=cap)))


def _sleep_resident(a: ParallelLayout, colocated: bool) -> tuple[str, ...]:
    """What OpenRLHF keeps resident for a trainer laid out as `a` (see openrlhf_read._resident): with the engines on its
    GPUs, asleep (--ds.enable_sleep) unless the plan keeps the optimizer resident too."""
    if not colocated:
        return ()
    if "optimizer" not in a.resident:
        return ("weights",)
    return ("weights", "gradients", "optimizer") if a.zero == 3 else ("weights", "optimizer")


def _role_groups(v: PlanView) -> dict[str, str]:
    """role (vllm, actor, ref, critic, reward) -> the group its stages run on."""
    out: dict[str, str] = {}
    for s, g in v.assign:
        role = _ROLE.get(s, "actor")
        if role == "reward" and v.reward is None:
            role = "actor"  # a rule reward runs beside the actor
        out.setdefault(role, g)
    return out


def _canonical(v: PlanView) -> PlanView:
    """Groups named and laid out as the importer does: one `all`, or vllm, actor, ref, critic, reward end
    to end, each named after the first of those roles it holds."""
    if len(v.groups) == 1:
        return v.replace(groups=(("all", 0, v.groups[0][2]),), assign=tuple((s, "all") for s, _ in v.assign))
    roles = _role_groups(v)
    count = {n: c for n, _, c in v.groups}
    rename, groups, nxt = {}, [], 0
    for role in ("vllm", "actor", "ref", "critic", "reward"):
        g = roles.get(role)
        if g is None or g in rename:
            continue
        rename[g] = role
        groups.append((role, nxt, count[g]))
        nxt += count[g]
    return v.replace(groups=tuple(groups), assign=tuple((s, rename[g]) for s, g in v.assign), gpus=nxt)


def _sync_note(v: PlanView) -> str:
    return f"; so run synchronously (async k={v.async_bound} needs the engines apart)" if v.async_bound else ""


def _per_model(models: dict[str, str]) -> bool:
    """Whether the models' groups are what OpenRLHF's flags can say: each its own, ref with the actor,
    reward with the critic."""
    seen: dict[str, str] = {}
    for role, g in models.items():
        if g in seen:
            pair = {seen[g], role}
            if pair not in ({"actor", "ref"}, {"critic", "reward"}):
                return False
        seen[g] = role
    return True


def _colocate_all(v: PlanView) -> PlanView:
    """Everything on one group, synchronous: --train.colocate_all in async mode would keep the engines
    apart, which is the placement being given up."""
    return colocate_all(v).replace(async_bound=0, partial=False)


# ---- writing ---------------------------------------------------------------------------------------

def arguments(view: PlanView) -> list[str]:
    """The train_ppo_ray flags that run `view` (already projected)."""
    v = view
    lay = dict(v.layouts)
    opts = {**defaults_of(v.algorithm), **dict(v.config)}
    groups = {n: (f, c) for n, f, c in v.groups}
    out: list[str] = []

    def flag(name: str, value: Any = None) -> None:
        out.append(f"--{name}" if value is None else f"--{name} {value}")

    flag("actor.model_name_or_path", hf_name(v.actor))
    est = {b: a for a, b in ESTIMATORS.items()}[v.algorithm]
    flag("algo.advantage.estimator", est)
    job = v.job
    flag("rollout.batch_size", job.prompts)
    flag("rollout.n_samples_per_prompt", job.samples_per_prompt)
    flag("train.batch_size", job.sequences // job.mini_batches)
    flag("train.max_epochs", job.ppo_epochs)
    flag("data.max_len", job.prompt_len + job.response.max)
    flag("rollout.max_new_tokens", job.response.max)
    kl = opts.get("kl_coef", 0.0)
    flag("algo.kl.init_coef", kl)
    if kl > 0:
        if opts["kl_in"] == "loss":
            flag("algo.kl.use_loss")
        flag("algo.kl.estimator", opts["kl_estimator"])
    flag("actor.eps_clip_low_high", f"{opts['clip_low']!r} {opts['clip_high']!r}")
    if opts["dual_clip"]:
        flag("actor.dual_clip", repr(opts["dual_clip"]))
    flag("actor.loss_agg_mode", opts["loss_agg"])
    flag("actor.policy_loss_type", opts["policy_loss"])
    flag("actor.entropy_coef", repr(opts["entropy_coef"]))
    flag("algo.advantage.gamma", repr(opts["gamma"]))
    flag("algo.advantage.lambd", repr(opts["lam"]))
    if v.algorithm == "grpo" and not opts["norm_adv_by_std"]:
        flag("algo.advantage.no_std_norm")
    if v.algorithm == "ppo":
        flag("critic.value_clip", repr(opts["value_clip"]))
        flag("critic.model_name_or_path", hf_name(v.critic or v.actor))
    if v.reward:
        flag("reward.model_name_or_path", hf_name(v.reward))
    elif job.episode is not None:
        flag("train.agent_func_path", AGENT)  # your agent: it runs the episodes and gives the reward
    else:
        flag("reward.remote_url", "http://localhost:5000/get_reward")  # your rule reward's server
    corr = EXPORTS.get(opts.get("off_policy"))
    if corr:
        flag("algo.advantage.is_correction_level", corr[0])
        flag("algo.advantage.is_correction_mode", corr[1])
        flag("algo.advantage.is_correction_threshold", f"0.0 {opts['is_cap']!r}")
    # devices
    g = lay["generate"]
    flag("vllm.num_engines", g.dp)
    flag("vllm.tensor_parallel_size", g.tp)
    one = len(v.groups) == 1
    role_group = _role_groups(v)

    def nodes(role: str) -> None:
        n = groups[role_group[role]][1]
        per = 8 if n % 8 == 0 else n
        flag(f"{role}.num_nodes", n // per)
        flag(f"{role}.num_gpus_per_node", per)

    # async with every model on one group apart from the engines: --train.colocate_all (which then leaves
    # the engines their own GPUs); the actor with only its reference: --train.colocate_actor_ref
    models = {r: g for r, g in role_group.items() if r != "vllm"}
    colocate_all = one or bool(v.async_bound and len(set(models.values())) == 1 and set(models) - {"actor", "ref"})
    if colocate_all:
        flag("train.colocate_all")
        if one:
            flag("vllm.enable_sleep")
            if "optimizer" not in lay["actor_update"].resident:  # asleep: the bf16 weights alone stay
                flag("ds.enable_sleep")
    for role in ("actor", "ref", "critic", "reward"):
        if role in role_group:
            nodes(role)
    if not colocate_all:
        if "ref" in role_group and role_group["ref"] == role_group["actor"]:
            flag("train.colocate_actor_ref")
        if "reward" in role_group and "critic" in role_group and role_group["reward"] == role_group["critic"]:
            flag("train.colocate_critic_reward")
    a = lay["actor_update"]
    flag("ds.zero_stage", a.zero)
    if v.lora is not None:  # DeepSpeed's trainer through peft (train_ppo_ray.py's LoRA flags)
        flag("ds.lora.rank", v.lora.rank)
        flag("ds.lora.alpha", f"{v.lora.alpha:g}")
        flag("ds.lora.target_modules", " ".join(peft_modules(v.lora).split(",")))
        if v.lora.dropout:
            flag("ds.lora.dropout", f"{v.lora.dropout:g}")
    if a.offload_optimizer:
        flag("ds.adam_offload")
    if a.tp > 1:
        flag("ds.tensor_parallel_size", a.tp)
    if a.cp > 1:
        flag("ds.ring_attn_size", a.cp)
    if a.packing:
        flag("ds.packing_samples")
    if a.recompute == "full":
        flag("actor.gradient_checkpointing_enable")
    flag("train.micro_batch_size", a.micro_batch)
    flag("rollout.micro_batch_size", lay["actor_logprobs"].micro_batch)
    if v.reference_on_host:
        flag("ref.offload")
    if v.async_bound:
        flag("train.async_enable")
        flag("train.async_queue_size", v.async_bound)
        if v.partial:
            flag("train.partial_rollout_enable")
    return out


def write(view: PlanView) -> Exported:
    """`view` as an OpenRLHF launch script (see `project` for what is left out)."""
    v, lines = project(view)
    args = arguments(v)
    head = ["#!/usr/bin/env bash", "# written by rpeg export for OpenRLHF 0.11.2 "
            f"({'async' if v.async_bound else 'synchronous'} train_ppo_ray)"]
    if lines:
        head.append("# OpenRLHF cannot express, so this launch leaves out:")
        head += [f"#   - {line}" for line in lines]
    head.append("# data (--data.prompt_dataset), the reward server, optimizer and logging: add your own flags")
    if v.job.episode is not None:
        head.append("# --train.agent_func_path below is a placeholder for your agent (a Python file with an "
                    "AgentExecutor: it runs each episode and gives its reward)")
    elif not v.reward:
        head.append("# --reward.remote_url below is a placeholder for your rule reward's server")
    body = [f"python3 -m {ENTRY} \\"] + [f"    {x} \\" for x in args[:-1]] + [f"    {args[-1]} \"$@\""]
    return Exported(system=SYSTEM, text="\n".join(head + ["set -euo pipefail", ""] + body) + "\n", view=v,
                    left_out=tuple(lines), filename=f"openrlhf{SUFFIX}")
