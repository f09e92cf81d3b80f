"""The `rl` entries of a validation file: one NeMo-RL GRPO step each, read as NeMo-RL's config states
it (`read_rl_entry`), planned as NeMo-RL runs it (`nemo_rl_plan`), predicted and split the way its step
timers split it (`predict_rl`, `stage_split`). The file format and the assumptions it leaves open are
rpeg/perf/validation.py's docstring; the training and refit entries are validation.py's and
validation_refit.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import Job, Kind, LengthDistribution, ModelSpec
from rpeg.graph.bounds import MAX_SECONDS, problem, show
from rpeg.hardware import load_cluster
from rpeg.passes import bound_asynchrony, keep_reference_on_host, parallelize, place, refit
from rpeg.perf.efficiency import Factor
from rpeg.perf.generation import ASYNC_ENGINE_MAX_SEQS
from rpeg.perf.step import SWITCH, predict_step
from rpeg.perf.validation_entry import (NEMO_RL_PAGEABLE, Result, StageResult, _check_keys, _get, _model, _need,
                                        _value)
from rpeg.perf.weightsync import ENGINE_SLEEP, ENGINE_WAKE, OFFLOAD_TRAINER, RELOAD_TRAINER

PROMPT_TOKENS = Factor(150, "OpenMathInstruct-2 problems (GSM8K/MATH-style statements of ~100 words) plus a chat "
                            "template: about 150 tokens")
RESPONSE_SIGMA = Factor(0.8, "log-normal shape of reasoning-response lengths: the p90/p50 ratio of about 2.8 seen "
                             "in published GRPO length histograms")

# the logits paths (rpeg/perf/logits.py): Megatron's pretraining and SFT loss is its vocab-parallel cross-entropy
# over the fp32 copy it makes in place (GPTModel with labels; the native fused and unfused versions hold the same);
# NeMo-RL's log-probs are DistributedLogprob's over Megatron's fp32-upcast output (defer_fp32_logits false, its
# default; logprob_chunk_size unset in the published configs)
NEMO_RL_LOGITS = "distributed-logprob"
NEMO_RL_KL = Factor(0.01, "NeMo-RL's GRPO default reference_policy_kl_penalty (grpo_math_1B.yaml): a reference "
                          "logprob pass every step")
NEMO_RL_GRAD_BYTES = Factor(2, "NeMo-RL's Megatron configs set distributed_data_parallel_config.grad_reduce_in_fp32: "
                               "false (examples/configs/grpo_math_1B_megatron.yaml, v0.3.0): Megatron-Core keeps "
                               "its gradient buffers in the parameters' bf16")
NEMO_RL_ZERO = Factor(1, "NeMo-RL's Megatron policy uses the distributed optimizer (use_distributed_optimizer: "
                         "true in its Megatron configs): optimizer state sharded over data parallelism, ZeRO-1")
NEMO_RL_LOGPROB_BATCH = Factor(4, "NeMo-RL's default policy.logprob_batch_size (grpo_math_1B.yaml at v0.5.0, the "
                                   "8B/70B/30B-A3B Megatron configs at v0.3.0): with sequence packing a logprob "
                                   "micro-batch holds 4 x max_total_sequence_length tokens")
# How NeMo-RL's Megatron policy runs an MoE model (its megatron_cfg: moe_token_dispatcher_type "alltoall",
# moe_enable_deepep false, moe_shared_expert_overlap false, no CUDA graphs in training) on the learned
# router's natural routing (an RL run never forces the balance); vLLM's engine routes naturally too
NEMO_RL_MOE = {"dispatcher": "alltoall", "ep_overlap": False, "cuda_graphs": "none", "routing": "natural"}
TRAIN_LAYOUT_KEYS = {"tp", "pp", "cp", "ep", "sequence_parallel", "recompute", "micro_batch", "logprob_batch",
                     "packing", "permute_fusion"}
NEMO_RL_PERMUTE_FUSION = False  # megatron_cfg.moe_permute_fusion in grpo_math_1B.yaml, v0.4-v0.6
GEN_LAYOUT_KEYS = {"tp", "pp", "ep", "async_engine", "max_num_seqs"}

RL_KEYS = {"id", "system", "model", "gpus", "gpus_per_node", "gen_gpus", "prompts", "samples_per_prompt",
           "train_global_batch", "max_seq_len", "mean_seq_len", "async_bound", "colocated", "generation", "training",
           "measured", "notes", "source", "algorithm", "prompt_len", "in_flight_weight_updates"}


# `measured.stages_s` of an rl entry: NeMo-RL's step timers (nemo_rl/algorithms/grpo.py):
# generation = "generation" (vLLM generate, then its sleep: finish_generation), logprobs =
# "policy_and_reference_logprobs", training = "policy_training", refit =
# "prepare_for_generation/total" (optimizer offload, vLLM wake, weight transfer), other = the rest
# of the step (data processing, rewards, advantages, "training_prep" reloading the optimizer,
# "logprob_inference_prep").
STAGES_S = ("generation", "logprobs", "training", "refit", "other")
SCORED_STAGES = STAGES_S[:4]  # `other` is what the publication leaves over: a remainder, not a timer
MEASURED_KEYS = {"step_s", "tokens_per_s_per_gpu", "stages_s"}
_BY_KIND = {Kind.GENERATE: "generation", Kind.INFER: "logprobs", Kind.TRAIN: "training", Kind.SYNC: "refit"}
_SWITCH_MOVES = {OFFLOAD_TRAINER: "refit", ENGINE_WAKE: "refit", ENGINE_SLEEP: "generation", RELOAD_TRAINER: "other"}


@dataclass(frozen=True, slots=True)
class NemoRlRun:
    """One published NeMo-RL GRPO run, as its config states it."""
    model: ModelSpec
    system: str  # cluster preset
    gpus: int
    job: Job
    algorithm: str
    async_bound: int  # grpo.async_grpo.max_trajectory_age_steps (0: synchronous)
    in_flight_updates: bool  # grpo.async_grpo.in_flight_weight_updates
    colocated: bool  # policy.generation.colocated.enabled
    gen_gpus: int  # colocated.resources when not colocated (else all gpus)
    generation: dict[str, int]  # vllm_cfg: tp, pp, ep
    training: dict[str, Any]  # megatron_cfg: tp, pp, cp, ep, sequence_parallel, recompute


def read_rl_entry(entry: dict, models: dict[str, ModelSpec], where: str) -> NemoRlRun:
    _check_keys(entry, RL_KEYS, where)
    spec = _model(_need(entry, "model", where, str), models)
    gpus = _need(entry, "gpus", where)
    prompts, samples = _need(entry, "prompts", where), _need(entry, "samples_per_prompt", where)
    sequences = prompts * samples
    tgb = _get(entry, "train_global_batch", where, sequences)
    if sequences % tgb:
        raise RpegError(f"{where}: train_global_batch {tgb} does not divide the {sequences} sequences per step")
    max_len, mean_len = _need(entry, "max_seq_len", where), _need(entry, "mean_seq_len", where, float)
    if mean_len > max_len:
        raise RpegError(f"{where}: mean_seq_len = {mean_len:g} exceeds max_seq_len = {max_len}")
    prompt = _get(entry, "prompt_len", where, min(PROMPT_TOKENS.value, mean_len / 4), float)
    if prompt >= mean_len:
        raise RpegError(f"{where}: prompt_len = {prompt:g} leaves no response in mean_seq_len = {mean_len:g}")
    response = LengthDistribution(kind="lognormal", mean=mean_len - prompt, max=int(max_len - prompt),
                                  sigma=RESPONSE_SIGMA.value)
    job = Job(prompts=prompts, samples_per_prompt=samples, prompt_len=int(prompt), response=response,
              ppo_epochs=1, mini_batches=sequences // tgb)
    k = entry.get("async_bound", 0)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= 64:
        raise RpegError(f"{where}.async_bound: expected an integer in [0, 64], got "
                        f"{show(k) if isinstance(k, int) and not isinstance(k, bool) else repr(k)[:80]}")
    colocated = entry.get("colocated", k == 0)
    gen, train = entry.get("generation") or {}, entry.get("training") or {}
    for name, part in (("generation", gen), ("training", train)):
        if not isinstance(part, dict):
            raise RpegError(f"{where}.{name}: expected a mapping (tp, pp, ...), got {part!r}")
    if colocated:
        gen_gpus = gpus
    else:
        gen_gpus = _need(entry, "gen_gpus", where)
        if gpus - gen_gpus <= 0:
            raise RpegError(f"{where}: gen_gpus = {gen_gpus} leaves no training devices of {gpus}")
    _check_keys(gen, GEN_LAYOUT_KEYS, f"{where}.generation")
    _check_keys(train, TRAIN_LAYOUT_KEYS, f"{where}.training")
    generation = {k: _get(gen, k, f"{where}.generation", 1) for k in ("tp", "pp", "ep")}
    # NeMo-RL's vllm_cfg.async_engine: AsyncLLM (its engine core in a process of its own) or the synchronous
    # vllm.LLM, whose engine core its worker runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    generation["async_engine"] = gen.get("async_engine", k > 0)
    if not isinstance(generation["async_engine"], bool):
        raise RpegError(f"{where}.generation.async_engine: expected true or false (vllm_cfg.async_engine), got "
                        f"{generation['async_engine']!r:.80}")
    # vllm_kwargs.max_num_seqs where a recipe sets it; else vLLM's default for the engine NeMo-RL builds
    seqs = gen.get("max_num_seqs", int(ASYNC_ENGINE_MAX_SEQS.value) if generation["async_engine"] else 0)
    if "max_num_seqs" in gen and (isinstance(seqs, bool) or not isinstance(seqs, int) or seqs < 1):
        raise RpegError(f"{where}.generation.max_num_seqs: expected a whole number >= 1 (vllm_kwargs.max_num_seqs), "
                        f"got {seqs!r:.80}")
    generation["max_seqs"] = seqs
    updates = entry.get("in_flight_weight_updates", k > 0)
    if not isinstance(updates, bool):
        raise RpegError(f"{where}.in_flight_weight_updates: expected true or false "
                        f"(grpo.async_grpo.in_flight_weight_updates), got {updates!r:.80}")
    if updates and k == 0:
        raise RpegError(f"{where}.in_flight_weight_updates: true needs async_bound >= 1 (a synchronous step updates "
                        "the weights between generations, never during one)")
    training = {k: _get(train, k, f"{where}.training", 1) for k in ("tp", "pp", "cp", "ep", "micro_batch")}
    training["logprob_batch"] = _get(train, "logprob_batch", f"{where}.training", int(NEMO_RL_LOGPROB_BATCH.value))
    training["sequence_parallel"] = bool(train.get("sequence_parallel", False))
    training["recompute"] = train.get("recompute", "none")
    packing = train.get("packing", True)
    if not isinstance(packing, bool):
        raise RpegError(f"{where}.training.packing: expected true or false (policy.sequence_packing.enabled), "
                        f"got {packing!r:.80}")
    training["packing"] = packing
    # megatron_cfg.moe_permute_fusion: false in grpo_math_1B.yaml (v0.4-v0.6); the DeepSeek-V3 and Qwen3-235B
    # performance recipes set it true
    fusion = train.get("permute_fusion", NEMO_RL_PERMUTE_FUSION)
    if not isinstance(fusion, bool):
        raise RpegError(f"{where}.training.permute_fusion: expected true or false (megatron_cfg.moe_permute_fusion), "
                        f"got {fusion!r:.80}")
    training["permute_fusion"] = fusion
    return NemoRlRun(model=spec, system=_need(entry, "system", where, str), gpus=gpus, job=job,
                     algorithm=entry.get("algorithm", "grpo"), async_bound=k, in_flight_updates=updates,
                     colocated=bool(colocated),
                     gen_gpus=gen_gpus, generation=generation, training=training)


def nemo_rl_plan(run: NemoRlRun, where: str):
    """NeMo-RL's plan of a GRPO step with the run's own layout: generation, policy and reference
    logprobs, training (Megatron, ZeRO-1), refit (every tensor gathered in full, as the nemo-rl
    baseline's); colocated, or generation on `gen_gpus` devices."""
    spec = run.model
    g = build_graph(run.algorithm, run.job, Models(actor=spec), kl_coef=NEMO_RL_KL.value)
    # NeMo-RL keeps num_prompts_per_step x max_trajectory_age_steps prompts in flight and, with in-flight weight
    # updates, admits the next weight version's as the current one's finish: the engine never drains
    # (rpeg/passes/asynchrony.py); without them it waits for every pending generation before each refit
    if run.in_flight_updates:
        g = bound_asynchrony(g, run.async_bound, in_flight=max(1, run.async_bound), refill=True)
    else:
        g = bound_asynchrony(g, run.async_bound)
    gpus = run.gpus
    if run.colocated:
        groups, gen_gpus, train_gpus = {"all": gpus}, gpus, gpus
        assign = {s.name: "all" for s in g.stages if s.group is None and s.kind.value != "sync"}
    else:
        gen_gpus, train_gpus = run.gen_gpus, gpus - run.gen_gpus
        groups = {"generation": gen_gpus, "training": train_gpus}
        assign = {s.name: ("generation" if s.kind.value == "generate" else "training")
                  for s in g.stages if s.kind.value != "sync"}
    g = place(g, groups, assign)
    gtp, gpp, gep = (run.generation[k] for k in ("tp", "pp", "ep"))
    if gen_gpus % (gtp * gpp):
        raise RpegError(f"{where}: generation tp*pp = {gtp}*{gpp} does not divide its {gen_gpus} devices")
    moe_kw = {"routing": NEMO_RL_MOE["routing"]} if spec.is_moe else {}
    g = parallelize(g, "generate", dp=gen_gpus // (gtp * gpp), tp=gtp, pp=gpp, ep=gep,
                    pp_uneven=bool(spec.layers % gpp), inline_output=not run.generation["async_engine"],
                    max_seqs=run.generation["max_seqs"], **moe_kw)
    ttp, tpp, tcp, tep = (run.training[k] for k in ("tp", "pp", "cp", "ep"))
    if train_gpus % (ttp * tpp * tcp):
        raise RpegError(f"{where}: training tp*pp*cp = {ttp}*{tpp}*{tcp} does not divide its {train_gpus} devices")
    tdp = train_gpus // (ttp * tpp * tcp)
    lay = dict(dp=tdp, tp=ttp, pp=tpp, cp=tcp, ep=tep, sequence_parallel=run.training["sequence_parallel"]
               and ttp > 1, pp_uneven=bool(spec.layers % tpp))
    for s in g.stages:
        if s.kind.value in ("infer", "train") or (s.kind.value == "reward" and s.model):
            train = s.kind.value == "train"
            extra = {"zero": NEMO_RL_ZERO.value, "recompute": run.training["recompute"],
                     "grad_dtype": "bf16" if NEMO_RL_GRAD_BYTES.value == 2 else "fp32",
                     "pageable": NEMO_RL_PAGEABLE} if train else {}
            mb = run.training["micro_batch" if train else "logprob_batch"]
            experts = dict(NEMO_RL_MOE, permute_fusion=run.training["permute_fusion"]) if spec.is_moe else {}
            g = parallelize(g, s.name, **lay, **extra, micro_batch=mb, packing=run.training["packing"],
                            bins="ffd", **experts, logits=NEMO_RL_LOGITS)
    g = refit(g, "full")  # NeMo-RL's refit gathers every tensor in full (refit_utils.gather_params)
    g = keep_reference_on_host(g)  # the reference's weights wait on the host (use_reference_model)
    return g, load_cluster(run.system, gpus)


def rl_graph(entry: dict, models: dict[str, ModelSpec], where: str):
    """An `rl` entry's plan and cluster."""
    return nemo_rl_plan(read_rl_entry(entry, models, where), where)


def predict_rl(entry: dict, models: dict[str, ModelSpec], where: str) -> Result:
    g, cluster = rl_graph(entry, models, where)
    pred = predict_step(g, cluster)
    measured = entry.get("measured") or {}
    if not isinstance(measured, dict) or "step_s" not in measured:
        raise RpegError(f"{where}.measured.step_s: expected a number")
    _check_keys(measured, MEASURED_KEYS, f"{where}.measured")
    step = _value(measured, "step_s", f"{where}.measured", float)
    parts = tuple((name, c.seconds) for name, c in pred.stages.items() if c.seconds > 0)
    note = "" if pred.fits else "OOM: " + "; ".join(m.describe() for m in pred.oom)
    stages = ()
    if "stages_s" in measured:
        given = _stages_s(measured["stages_s"], f"{where}.measured.stages_s")
        split = stage_split(g, pred) if pred.fits else {}
        stages = tuple(StageResult(k, split.get(k, math.inf), v) for k, v in given.items())
    return Result(entry["id"], "rl", pred.step_s, float(step), parts, note, stages)


def _stages_s(data: Any, where: str) -> dict[str, float]:
    if not isinstance(data, dict) or not data:
        raise RpegError(f"{where}: expected a mapping of {', '.join(STAGES_S)} to seconds, got {data!r:.80}")
    out = {}
    for key in STAGES_S:  # in this order, whatever the file's
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RpegError(f"{where}.{key}: expected a number of seconds, got {value!r:.80}")
        bad = problem(key, value, minimum=0, maximum=MAX_SECONDS)
        if bad:
            raise RpegError(f"{where}.{key}: {bad}")
        out[key] = float(value)
    unknown = sorted(set(data) - set(STAGES_S), key=str)
    if unknown:
        raise RpegError(f"{where}: unknown stage {unknown[0]!r} (known: {', '.join(STAGES_S)})")
    return out


def stage_split(graph, pred) -> dict[str, float]:
    """The predicted step split the way NeMo-RL's timers split it (STAGES_S): each stage by its
    kind; the colocated context switch by its moves (the optimizer offload and the engine's wake
    are timed in refit, its sleep in generation, the optimizer reload in training_prep)."""
    out = dict.fromkeys(STAGES_S, 0.0)
    kinds = {s.name: s.kind for s in graph.stages}
    for name, cost in pred.stages.items():
        if name == SWITCH:
            for move, seconds in cost.parts:
                out[_SWITCH_MOVES[move]] += seconds
        else:
            out[_BY_KIND.get(kinds[name], "other")] += cost.seconds
    return out
