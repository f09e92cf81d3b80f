"""OpenRLHF: its `train_ppo_ray` command line, read into RPEG and written from RPEG's plans.

What is read (OpenRLHF 0.11.2, openrlhf/cli/train_ppo_ray.py, whose flags are dotted since 0.10:
`--actor.num_nodes`, `--vllm.num_engines`, ...): a launch script running
`python3 -m openrlhf.cli.train_ppo_ray` (after `ray job submit ... --` or not), or an args file of
the flags alone. Only the flags given are read; the parser's defaults fill the rest.

The mapping (sources: train_ppo_ray.py's parser and the checks after it; trainer/ray/*):
- `--algo.advantage.estimator`: gae -> ppo, group_norm -> grpo (dapo with
  `--algo.dynamic_filtering_enable`), rloo, reinforce -> reinforce_pp, reinforce_baseline ->
  reinforce_pp_baseline, dr_grpo. `--algo.kl.init_coef` (0.01 by default: a reference runs unless
  it is 0), in the loss with `--algo.kl.use_loss`, else in the reward; `--algo.kl.estimator` k1 or
  k3. `--actor.eps_clip` / `--actor.eps_clip_low_high`, `--actor.dual_clip` (off by default),
  `--actor.loss_agg_mode`, `--actor.policy_loss_type`, `--actor.entropy_coef`,
  `--algo.advantage.gamma` / `lambd` / `no_std_norm`, `--critic.value_clip`, and the rollout
  correction `--algo.advantage.is_correction_level` / `_mode` / `_threshold` gating on the ratio
  rho (models/loss.py PolicyLoss): token clip, weight clamp(rho, low, high), is tis; token mask,
  IcePop's weight rho inside [low, high] and 0 outside with every token in the denominator, is
  decoupled; both exactly when low is 0, and a lower bound above 0 is read as 0 and said so. seq
  mask (a sequence whose geometric-mean rho leaves [low, high] weighs 0, the others' tokens keep
  rho) has no RPEG equal: it is read as mask-seq, which approximates it, and said so.
- The job: `--rollout.batch_size` prompts of `--rollout.n_samples_per_prompt` samples; mini-batches
  of `--train.batch_size` samples (its global training batch); `--train.max_epochs`; the response
  cap `--rollout.max_new_tokens`, the prompt `--data.max_len` less it.
- The plan: one device group per model, laid end to end in the order vLLM engines
  (`--vllm.num_engines` x `--vllm.tensor_parallel_size`), actor, reference, critic, reward
  (`--<role>.num_nodes` x `num_gpus_per_node`); `--train.colocate_actor_ref` puts the reference on
  the actor's GPUs, `--train.colocate_critic_reward` the reward model on the critic's,
  `--train.colocate_all` every model and the engines on one group (in async mode the engines keep
  their own GPUs: the parser's own warning). The actor's old logprobs run on the actor's group.
  Layouts: DeepSpeed ZeRO `--ds.zero_stage` (forward passes ZeRO-3 under stage 3, else whole
  weights: utils/deepspeed/deepspeed.py), `--ds.tensor_parallel_size` as tp, `--ds.ring_attn_size`
  as cp, `--actor.gradient_checkpointing_enable` (actor and critic) as full recomputation,
  `--train.micro_batch_size` and `--rollout.micro_batch_size` as micro-batches,
  `--ds.packing_samples` as packing (`--train.dynamic_batch_enable`: `--train.max_tokens_per_gpu`
  over the longest sequence, packed); `--ref.offload` keeps the reference on the host;
  `--ds.adam_offload` (older `--adam_offload`) keeps the actor's and the critic's optimizer on the
  host with its Adam step (offload_optimizer = 1, rpeg/perf/offload.py). With the engines on the
  trainers' GPUs, `--ds.enable_sleep` moves the trainers' optimizer state to pinned host memory around
  generation and keeps their bf16 weights on the GPUs (resident = weights); without it everything stays
  (resident = weights + optimizer, + gradients under ZeRO-3); `--vllm.enable_sleep` is the context
  switch's engine sleep and wake (vLLM level 1, a pinned backup). Async:
  `--train.async_enable` with a queue of `--train.async_queue_size` batches (k), and
  `--train.partial_rollout_enable`. The weight sync broadcasts every tensor gathered in full.

What OpenRLHF cannot express (`project`): critic sharing, fusion, streaming, pipeline
parallelism, device groups other than the per-model ones and the three colocation flags,
asynchrony with the engines on the training GPUs, forward passes laid out apart from their
model's group, the corrections tis-seq (its loss refuses clip at level seq), mask-token and
mask-seq (its masks keep the kept tokens' weight rho and every token in the denominator).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from rpeg.errors import RpegError
from rpeg.graph import Job, ParallelLayout
from rpeg.graph.serde import from_data
from rpeg.interop.openrlhf_flags import old_flags, translate
from rpeg.interop.common import (
    colocate_all, defaults_of, hf_name, one_pass_each, resize,
    Exported, Imported, Notes, PlanView, config_tuple, model_preset, response_of, script_command, stage_names,
)

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
}
FLAGS = {k for k, v in DEFAULTS.items() if isinstance(v, bool)} | {"vllm.enable_sleep", "ds.enable_sleep",
                                                                    "ds.adam_offload", "adam_offload"}
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
    ("train.agent_func_path", "an agent function: the reward, read as a rule reward"),
    ("reward.", "a reward's shaping is not part of the plan"),
    ("ds.bf16", "RPEG costs bf16 weights"), ("ds.flash_attn", "the attention kernel is not modelled"),
    ("actor.max_norm", "gradient clipping does not change a step's cost in RPEG's model"),
    ("actor.ptx_coef", "a pretraining loss mixed in (with --pretrain_data) is not modelled"),
)


# ---- reading --------------------------------------------------------------------------------------

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
        while not values or (key in FLOAT2 and len(values) < 2):
            if j >= len(words) or (words[j].startswith("--") and not re.match(r"^--?\d", words[j])):
                break
            values.append(words[j])
            j += 1
        if not values:  # a store_true flag this reader does not list
            args[key] = True
        else:
            args[key] = [_num(v) for v in values] if key in FLOAT2 else _num(values[0])
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
    job = from_data(Job, {"prompts": prompts, "samples_per_prompt": samples, "prompt_len": prompt_len,
                          "response": response_of(new, response_mean, notes), "ppo_epochs": a.num("train.max_epochs"),
                          "mini_batches": prompts * samples // train_batch}, source)
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
    view = PlanView(algorithm=algorithm, actor=actor, job=job, gpus=nxt, critic=critic, reward=reward,
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


# ---- what OpenRLHF can run ------------------------------------------------------------------------

_ROLE = {"generate": "vllm", "generate_greedy": "vllm", "reward": "reward", "ref_logprobs": "ref",
         "critic_values": "critic", "critic_update": "critic"}


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
    return _canonical(v), lines


def _sleep_resident(a: ParallelLayout, colocated: bool) -> tuple[str, ...]:
    """What OpenRLHF keeps resident for a trainer laid out as `a` (see _resident): with the engines on its
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
    if not v.reward:
        head.append("# --reward.remote_url below is a placeholder for your rule reward's server")
    body = [f"python3 -m {ENTRY} \\"] + [f"    {x} \\" for x in args[:-1]] + [f"    {args[-1]} \"$@\""]
    return Exported(system=SYSTEM, text="\n".join(head + ["set -euo pipefail", ""] + body) + "\n", view=v,
                    left_out=tuple(lines), filename=f"openrlhf{SUFFIX}")


