"""Writing a verl job: a PlanView projected onto what verl can run (`project`), then written as the Hydra
overrides of its trainer (`overrides`) and a launch script (`write`).

rpeg/interop/verl.py re-exports these; its docstring says what verl cannot express.
"""

from __future__ import annotations

from typing import Any

from rpeg.errors import RpegError
from rpeg.graph import ParallelLayout, get_model
from rpeg.hardware import load_cluster
from rpeg.interop.common import (Exported, PlanView, colocate_all, config_tuple, defaults_of, hf_name, one_pass_each,
                                 peft_modules)
from rpeg.interop.verl_keys import (CONFIG_NAMES, DEFAULTS, ENTRIES, ESTIMATORS, ROLLOUT_IS, SUFFIX, SYSTEM,
                                     _OFFLOAD_KEYS)
from rpeg.perf.generation import engine_max_seqs


def _engine_seqs(v: PlanView, g: ParallelLayout) -> int:
    """The max_num_seqs verl is to pass to vLLM (rollout.max_num_seqs): the plan's engine, or, where the plan
    sets none, the one vLLM builds by default on the plan's devices (perf/generation.py engine_max_seqs); with
    no devices named, verl's own default."""
    if g.max_seqs:
        return g.max_seqs
    if v.cluster:
        return engine_max_seqs(g, load_cluster(v.cluster).device)
    return DEFAULTS["actor_rollout_ref.rollout.max_num_seqs"]


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
    if megatron and ("weights" in want.resident) != ("gradients" in want.resident):
        # verl 0.9's param_offload moves the weights and releases the gradient buffers together
        keep = "weights" in want.resident
        want = want.replace(resident=tuple(p for p in ("weights", "gradients", "optimizer")
                                           if (p == "optimizer" and "optimizer" in want.resident)
                                           or (p != "optimizer" and keep)))
        lines.append(f"{stage} weights {'resident' if keep else 'on the host'} with gradients "
                     f"{'released' if keep else 'resident'}: verl's Megatron param_offload moves both together")
    # how verl copies what it moves (rpeg/perf/offload.py): Megatron's weights out through pageable memory,
    # FSDP1 pinned, FSDP2's offload_policy keeps the state on the host throughout
    pageable = ("weights-out",) if megatron and "weights" not in want.resident else ()
    if want.pageable != pageable:
        want = want.replace(pageable=pageable)
        lines.append(f"{stage} host copies: verl's {'Megatron' if megatron else 'FSDP'} backend copies "
                     + ("its weights out through pageable memory" if pageable else "through pinned memory"))
    return want


def _megatron_keys(M: str, lay: ParallelLayout, layers: int) -> list[str]:
    """A trained model's Megatron layout as verl's keys under the prefix `M` (actor or critic)."""
    out = [f"{M}tensor_model_parallel_size={lay.tp}", f"{M}pipeline_model_parallel_size={lay.pp}",
           f"{M}context_parallel_size={lay.cp}", f"{M}expert_model_parallel_size={lay.ep}",
           f"{M}sequence_parallel={_fmt(lay.sequence_parallel)}", f"{M}use_distributed_optimizer={_fmt(lay.zero == 1)}"]
    if lay.pp_interleave > 1:
        out.append(f"{M}virtual_pipeline_model_parallel_size={lay.pp_interleave}")
    if lay.pp_uneven and lay.pp > 1:
        first, last = _uneven_split(layers, lay.pp)
        out += [f"{M}override_transformer_config.num_layers_in_first_pipeline_stage={first}",
                f"{M}override_transformer_config.num_layers_in_last_pipeline_stage={last}"]
    return out + _megatron_recompute(M, lay.recompute)


def _uneven_split(layers: int, pp: int) -> tuple[int, int]:
    """First and last stage layer counts (Megatron's num_layers_in_first/last_pipeline_stage) that leave
    the middle stages an equal share, as even as the layers allow."""
    if pp == 2:
        return (layers + 1) // 2, layers // 2
    best = None
    for middle in range(max(1, layers // pp - 1), layers // pp + 2):
        rest = layers - (pp - 2) * middle
        first, last = (rest + 1) // 2, rest // 2
        if last >= 1 and (best is None or max(first, middle) < max(best[0], best[2])):
            best = (first, last, middle)
    if best is None:
        raise RpegError(f"pipeline of {pp} stages over {layers} layers: no uneven split leaves every stage a layer")
    return best[0], best[1]


def _offload_keys(stage: str, lay: ParallelLayout, megatron: bool) -> list[str]:
    """verl's offload keys of a trained model's layout (after _offload_project)."""
    fsdp, meg, opt = _OFFLOAD_KEYS[stage]
    if megatron:
        out = [f"{meg}{k}={_fmt(part not in lay.resident)}" for part, k in (
            ("weights", "param_offload"), ("optimizer", "optimizer_offload"))]  # param_offload frees the gradients
        if lay.offload_optimizer:
            out += [f"+{opt}optimizer_cpu_offload=True", f"+{opt}optimizer_offload_fraction={lay.offload_optimizer!r}"]
        return out
    if lay.offload_params:
        return [f"{fsdp}offload_policy=True"]  # with strategy fsdp2 (the caller writes it)
    return [f"{fsdp}param_offload={_fmt('weights' not in lay.resident)}",
            f"{fsdp}optimizer_offload={_fmt('optimizer' not in lay.resident)}"]


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
    elif a.pp_uneven and a.pp > 1 and not get_model(v.actor).layers % a.pp:
        a = a.replace(pp_uneven=False)  # equal stages anyway
    lay["actor_update"] = a = _offload_project("actor_update", a, megatron, lines)
    shape = dict(dp=a.dp, tp=a.tp, pp=a.pp, cp=a.cp, ep=a.ep, zero=a.zero, sequence_parallel=a.sequence_parallel,
                 pp_interleave=a.pp_interleave, pp_uneven=a.pp_uneven, packing=a.packing)
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
            want = cu.replace(zero=cu.zero if cu.zero in (0, 1) else 1,
                              pp_uneven=cu.pp_uneven and bool(get_model(v.critic or v.actor).layers % cu.pp))
        else:
            want = ParallelLayout(dp=cu.devices // cu.cp, cp=cu.cp, zero=3, packing=cu.packing,
                                  micro_batch=cu.micro_batch, recompute="full" if cu.recompute != "none" else "none",
                                  offload_optimizer=cu.offload_optimizer, offload_params=cu.offload_params,
                                  resident=cu.resident, pageable=cu.pageable)
        want = _offload_project("critic_update", want, megatron, lines)
        if want != cu:
            lines.append(f"critic_update laid out as {cu.describe()}: verl's {'Megatron' if megatron else 'FSDP'} "
                         f"critic takes {want.describe()}")
        lay["critic_update"] = want
        cv = lay["critic_values"]
        # Megatron's critic has no forward micro-batch of its own: its ppo_micro_batch_size_per_gpu
        want_v = want.replace(recompute="none", micro_batch=want.micro_batch if megatron else cv.micro_batch,
                              zero=0 if megatron else 3, offload_optimizer=0.0, offload_params=False, resident=(),
                              pageable=())
        if want_v != cv:
            lines.append(f"critic_values laid out as {cv.describe()}: verl runs it on the critic's workers")
        lay["critic_values"] = want_v
    g = lay["generate"]
    if g.cp > 1 or g.ep > 1 or g.zero or g.sequence_parallel or g.recompute != "none" or g.micro_batch != 1 \
            or not g.packing or g.pp_interleave > 1:
        lines.append(f"generate laid out as {g.describe()}: verl's rollout takes tensor and pipeline parallelism")
    lay["generate"] = ParallelLayout(dp=g.dp, tp=g.tp, pp=g.pp, max_seqs=_engine_seqs(v, g))
    if "generate_greedy" in lay:
        lay["generate_greedy"] = lay["generate"]
    if "reward" in lay:
        r = lay["reward"]
        lay["reward"] = ParallelLayout(dp=r.devices // r.tp, tp=r.tp, zero=0 if megatron else 3)  # as verl_read
    _logits_project(lay, megatron, dict(v.config).get("entropy_coef", 0.0), lines)
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


def _logits_project(lay: dict[str, ParallelLayout], megatron: bool, entropy_coef: float, lines: list[str]) -> None:
    """verl's logits paths (verl_read._logits): fused-linear is `model.use_fused_kernels=True`; any other path
    becomes the one verl's backend takes without it."""
    a = lay["actor_update"]
    if a.logits == "fused-linear":
        want = ("fused-linear", "fused-linear")
    elif megatron:
        want = ("fused-ce", "fused-ce")
    else:  # the entropy's gradient with an entropy term, or with actor.calculate_entropy (written back)
        want = ("bf16-ce-entropy" if entropy_coef or a.logits == "bf16-ce-entropy" else "bf16-ce", "bf16-ce")
    if a.logits != want[0]:
        lines.append(f"logits path {a.logits}: verl's {'Megatron' if megatron else 'FSDP'} actor computes its "
                     f"log-probs as {want[0]} (model.use_fused_kernels=True for fused-linear)")
    for s in ("actor_update", "actor_logprobs", "ref_logprobs"):
        if s in lay:
            lay[s] = lay[s].replace(logits=want[0] if s == "actor_update" else want[1])


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
    if v.lora is not None:  # model/hf_model.yaml's LoRA keys
        mods = peft_modules(v.lora)
        out += [f"actor_rollout_ref.model.lora_rank={v.lora.rank}",
                f"actor_rollout_ref.model.lora_alpha={v.lora.alpha:g}",
                f"actor_rollout_ref.model.target_modules={mods if mods == 'all-linear' else '[' + mods + ']'}"]
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
    if a.logits == "fused-linear":
        out.append("actor_rollout_ref.model.use_fused_kernels=True")
    if a.logits == "bf16-ce-entropy" and not opts["entropy_coef"]:
        out.append(f"{A}calculate_entropy=True")
    out.append(f"{A}use_dynamic_bsz=False")
    if megatron:
        out += [f"{A}strategy=megatron"] + _megatron_keys(A + "megatron.", a, get_model(v.actor).layers)
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
    out.append(f"{R}max_num_seqs={g.max_seqs}")  # set by project (_engine_seqs)
    if job.episode is not None and job.episode.max_turns > 1:  # the agent loop, with the job's cap on replies
        out += [f"{R}multi_turn.enable=True", f"{R}multi_turn.max_assistant_turns={job.episode.max_turns}"]
    if "critic_update" in lay:
        cu, cv = lay["critic_update"], lay["critic_values"]
        out += ["critic.enable=True", f"critic.model.path={hf_name(v.critic or v.actor)}",
                f"critic.model.use_remove_padding={_fmt(cu.packing)}"]
        if megatron:
            out += ["critic.strategy=megatron"] + _megatron_keys("critic.megatron.", cu,
                                                                  get_model(v.critic or v.actor).layers)
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
