"""The performance model against published measurements (`rpeg validate NAME` or `FILE.yaml`).

RPEG ships its validation files in rpeg/data/validation (SOURCES.md there says where each figure
was published); `bundled()` names them. Reads any file of their schema: `models` (ModelSpec fields),
`training` entries (Megatron-LM iterations), `rl` entries (whole RL steps) and `refit` entries (one
weight sync each, read by rpeg/perf/validation_refit.py), predicts each with
the one global set of efficiency factors, and reports predicted vs measured. It lives beside the
model it checks; unlike the cost functions it reads a file, and it builds each RL entry's plan
with the algorithm builders and passes (upstream of perf), never with the search.

An entry the model predicts not to fit in memory has no error (a run that did run was predicted
impossible: a memory-model error, reported by name); mean errors are over the entries that fit.

Assumptions the schema leaves open, the same for every entry:
- training entries default to what Megatron-LM 2022 ran: unfused attention (their Table 5
  predates FlashAttention in Megatron), fp16, the distributed optimizer off (dp = 1 in every row);
  an entry of another stack says `dtype`, `flash_attention` and `zero` (TRAIN_OPTIONS). The loss is
  Megatron's vocab-parallel cross-entropy (MEGATRON_LOGITS).
- training entries may carry the Megatron-Core recipe options that set a run's memory
  (`recompute_modules`, `recompute_layers`, `offload_activation_layers`, `grad_dtype`,
  `optimizer_moments`, `pp_embedding_loss_slots`: rpeg/perf/recipe_options.py); without them, none.
- training entries' MoE run conditions (`routing`, `cuda_graphs`, `dispatcher`, `ep_overlap`,
  `capacity_factor`, `rank_capacity_factor`) go to the layout (rpeg/perf/moe.py prices them), absent
  ones at MOE_OPTIONS: balanced routing, no CUDA graphs, the per-(token, expert) all-to-all, not overlapped, dropless.
  Conditions the model has no mechanism for yet (`packing`, and `etp` beyond its check) are parsed,
  checked and printed with the entry's result (its note), and change no prediction.
- RL entries: GRPO as NeMo-RL runs it: generation, policy logprobs, reference logprobs (its GRPO
  default reference_policy_kl_penalty is 0.01), training, refit; Megatron's distributed optimizer
  (ZeRO-1) with bf16 gradient buffers (NEMO_RL_GRAD_BYTES) for training, log-probs by its
  DistributedLogprob (NEMO_RL_LOGITS), its optimizer state moved
  to the host and back around generation through
  pageable memory (NEMO_RL_PAGEABLE); one vLLM engine per `generation.tp x pp` devices; the reference's weights
  swapped in from the host (`reference_on_host`); sequence packing with micro-batches of
  `training.micro_batch` (1) and `training.logprob_batch` (NEMO_RL_LOGPROB_BATCH) maximum-length
  sequences unless the entry says `packing: false`; an MoE model as NEMO_RL_MOE (natural routing, the
  per-(token, expert) all-to-all, no overlap, no CUDA graphs), its token permutation unfused unless the
  entry's `training.permute_fusion` is true (megatron_cfg.moe_permute_fusion: false in grpo_math_1B.yaml
  from v0.4, set true by the DeepSeek-V3 and Qwen3-235B performance recipes). vLLM's engine processes its outputs in
  its step loop (the layout's `inline_output`) unless the entry's `generation.async_engine` is true:
  NeMo-RL's vllm_cfg.async_engine, false in grpo_math_1B.yaml (v0.3-v0.6) and true in every async
  recipe, which an entry with async_bound > 0 defaults to. An engine runs at most `generation.max_num_seqs`
  sequences at once; NeMo-RL sets none, so vLLM's default applies: AsyncLLM's 128 for an async engine
  (generation.ASYNC_ENGINE_MAX_SEQS), the LLM class's for the device otherwise. `in_flight_weight_updates`
  (grpo.async_grpo.in_flight_weight_updates: false in grpo_math_1B.yaml, true in every async performance
  recipe, which an entry with async_bound > 0 defaults to) keeps async_bound steps' prompts in flight and
  the engine from draining (bound_asynchrony's in_flight and refill); without it each step drains.
  Prompt length PROMPT_TOKENS; response lengths
  log-normal with the entry's mean, truncated at its max, shape RESPONSE_SIGMA.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import Job, Kind, LengthDistribution, ModelSpec, ParallelLayout
from rpeg.graph.layout import CUDA_GRAPH_SCOPES, RECOMPUTE_MODULES
from rpeg.graph.bounds import MAX_SECONDS, problem, show
from rpeg.graph.serde import from_data, read_yaml_file
from rpeg.hardware import load_cluster
from rpeg.passes import bound_asynchrony, keep_reference_on_host, parallelize, place, refit
from rpeg.perf.efficiency import Factor
from rpeg.perf.generation import ASYNC_ENGINE_MAX_SEQS
from rpeg.perf.step import SWITCH, predict_step
from rpeg.perf.training import PassWorkload, pass_cost
from rpeg.perf.validation_entry import (NEMO_RL_PAGEABLE, Result, StageResult, _check_keys, _get, _model, _need,
                                        _value)
from rpeg.perf.validation_refit import predict_refit
from rpeg.perf.weightsync import ENGINE_SLEEP, ENGINE_WAKE, OFFLOAD_TRAINER, RELOAD_TRAINER

PROMPT_TOKENS = Factor(150, "OpenMathInstruct-2 problems (GSM8K/MATH-style statements of ~100 words) plus a chat "
                            "template: about 150 tokens")
RESPONSE_SIGMA = Factor(0.8, "log-normal shape of reasoning-response lengths: the p90/p50 ratio of about 2.8 seen "
                             "in published GRPO length histograms")

# the logits paths (rpeg/perf/logits.py): Megatron's pretraining and SFT loss is its vocab-parallel cross-entropy
# over the fp32 copy it makes in place (GPTModel with labels; the native fused and unfused versions hold the same);
# NeMo-RL's log-probs are DistributedLogprob's over Megatron's fp32-upcast output (defer_fp32_logits false, its
# default; logprob_chunk_size unset in the published configs)
MEGATRON_LOGITS = "fused-ce"
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
TRAIN_LAYOUT_KEYS = {"tp", "pp", "cp", "ep", "sequence_parallel", "recompute", "micro_batch", "logprob_batch", "packing",
                     "permute_fusion"}
NEMO_RL_PERMUTE_FUSION = False  # megatron_cfg.moe_permute_fusion in grpo_math_1B.yaml, v0.4-v0.6
GEN_LAYOUT_KEYS = {"tp", "pp", "ep", "async_engine", "max_num_seqs"}

TRAIN_KEYS = {"id", "system", "model", "gpus", "tp", "pp", "dp", "cp", "ep", "global_batch", "micro_batch", "seq",
              "recompute", "pp_interleave", "measured_iteration_s", "sequence_parallel", "notes", "source",
              "measured_tokens_per_s_per_gpu", "measured_model_tflops_per_gpu", "model_gflop_per_token", "etp", "zero",
              "offload_optimizer",
              "dtype", "flash_attention", "routing", "cuda_graphs", "dispatcher", "ep_overlap", "packing",
              "recompute_modules", "recompute_layers", "offload_activation_layers", "grad_dtype", "optimizer_moments",
              "pp_embedding_loss_slots", "capacity_factor", "rank_capacity_factor"}
# A training entry's named options: key -> (allowed values, what it means). All but IGNORED_OPTIONS reach
# the cost model (PassWorkload / ParallelLayout; the MoE ones rpeg/perf/moe.py, with recompute_modules,
# recompute_layers and offload_activation_layers: _recipe_options); the ignored ones it has no mechanism
# for yet: they are checked, printed beside the result, and change nothing.
TRAIN_OPTIONS: dict[str, tuple[tuple[Any, ...], str]] = {
    "dtype": (("fp16", "bf16", "fp8"), "compute precision of the GEMMs (fp8: FP8 tensor-core rate, any scaling)"),
    "flash_attention": ((False, True), "a fused attention kernel (TE / FlashAttention) instead of Megatron-2022's"),
    "recompute": (("none", "selective", "full"), "activation recomputation"),
    "sequence_parallel": ((False, True), "Megatron sequence parallelism along tp"),
    "routing": (("balanced", "natural"), "MoE routing: forced load balance (benchmarks) or the learned router"),
    "cuda_graphs": (("none", "partial", "full"), "CUDA graphs: off, the attention and dense parts, the whole "
                                                 "iteration, or a list of Megatron-Core's cuda_graph_scope values"),
    "dispatcher": (("alltoall", "allgather", "deepep", "hybridep"), "MoE token dispatcher (flex backends by name)"),
    "ep_overlap": ((False, True), "expert-parallel all-to-all overlapped with another micro-batch's compute"),
    "packing": ((False, True), "several documents packed into each seq-long sample (attention per document)"),
    "grad_dtype": (("fp32", "bf16"), "the gradient buffer (bf16: Megatron-Bridge's grad_reduce_in_fp32 false)"),
    "optimizer_moments": (("fp32", "bf16"), "Adam's moments (bf16: the precision-aware optimizer)"),
    "pp_embedding_loss_slots": ((False, True), "the embedding and the loss each take a layer's slot of the pipeline "
                                               "split (account_for_embedding/loss_in_pipeline_split)"),
}
IGNORED_OPTIONS = ("packing",)
MOE_OPTIONS = {"routing": "balanced", "cuda_graphs": "none", "dispatcher": "alltoall", "ep_overlap": False}  # defaults
TOKENS_CHECK = 0.05  # measured_iteration_s and measured_tokens_per_s_per_gpu, both given, agree this closely
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


def _models(data: Any, source: str) -> dict[str, ModelSpec]:
    models = {}
    if data is not None and not isinstance(data, dict):
        raise RpegError(f"{source}: models: expected a mapping of model names to dimensions")
    for name, dims in (data or {}).items():
        if not isinstance(dims, dict):
            raise RpegError(f"{source}: models.{name}: expected a mapping of dimensions")
        d = dict(dims)
        if d.get("ffn_act") == "gelu":  # GPT/Megatron models: LayerNorm, biases, tied embeddings
            d.setdefault("norm", "layernorm")
            d.setdefault("linear_bias", True)
            d.setdefault("tied_embeddings", True)
        models[name.lower()] = from_data(ModelSpec, {"name": name, **d}, f"{source}: models.{name}")
    return models


def _option(entry: dict, key: str, where: str, default: Any) -> Any:
    """A named option of TRAIN_OPTIONS: one of its allowed values (booleans as true / false)."""
    if key not in entry:
        return default
    allowed, meaning = TRAIN_OPTIONS[key]
    value = entry[key]
    if key == "cuda_graphs" and isinstance(value, list):  # Megatron-Core's scope list (ParallelLayout checks it)
        bad = [v for v in value if v not in CUDA_GRAPH_SCOPES]
        if bad or not value:
            raise RpegError(f"{where}.cuda_graphs: {value!r:.80} must list scopes of {', '.join(CUDA_GRAPH_SCOPES)}")
        return tuple(value)
    if not any(value is a if isinstance(a, bool) else (not isinstance(value, bool) and value == a) for a in allowed):
        names = ", ".join(str(a).lower() if isinstance(a, bool) else str(a) for a in allowed)
        raise RpegError(f"{where}.{key}: {value!r:.80} is not one of {names} ({meaning})")
    return value


def _conditions(entry: dict, spec: ModelSpec, tp: int, ep: int, where: str) -> tuple[int, str]:
    """The entry's expert tensor parallelism, checked, and its ignored run conditions as a note."""
    etp = _get(entry, "etp", where, 1)
    if etp not in (1, tp):
        raise RpegError(f"{where}.etp: {etp} must be 1 or tp = {tp} (experts split over the tensor-parallel "
                        "ranks, or not); the cost model splits experts as ep > 1 implies and reads no other etp")
    moe_only = [k for k in ("routing", "dispatcher", "ep_overlap", "etp", "capacity_factor",
                                      "rank_capacity_factor")
                if k in entry and not spec.is_moe]
    if moe_only:
        raise RpegError(f"{where}.{moe_only[0]}: {spec.name} has no experts; {moe_only[0]} applies to MoE models only")
    if entry.get("ep_overlap") and ep == 1:
        raise RpegError(f"{where}.ep_overlap: true needs ep > 1 (there is no expert-parallel all-to-all to overlap)")
    shown = []
    for key in IGNORED_OPTIONS:
        value = _option(entry, key, where, None)
        if value is not None:
            shown.append(key if value is True else f"no {key}" if value is False else f"{key} {value}")
    if etp > 1:
        shown.append(f"etp {etp}")
    return etp, ", ".join(shown)


def _recipe_options(entry: dict, recompute: str, pp: int, where: str) -> dict[str, Any]:
    """The entry's Megatron-Core recipe options (ParallelLayout fields; rpeg/perf/recipe_options.py),
    checked here so that an error names the entry and the key."""
    out: dict[str, Any] = {}
    if "recompute_modules" in entry:
        modules = entry["recompute_modules"]
        if not isinstance(modules, list) or not modules or not all(m in RECOMPUTE_MODULES for m in modules):
            raise RpegError(f"{where}.recompute_modules: {modules!r:.80} is not a list of "
                            f"{', '.join(RECOMPUTE_MODULES)} (Megatron's recompute_modules)")
        if recompute != "selective":
            raise RpegError(f"{where}.recompute_modules: needs recompute: selective, not {recompute!r}")
        out["recompute_modules"] = tuple(modules)
    if "recompute_layers" in entry:
        if recompute != "full":
            raise RpegError(f"{where}.recompute_layers: needs recompute: full, not {recompute!r} (recompute_method "
                            "block, recompute_num_layers)")
        out["recompute_layers"] = _value(entry, "recompute_layers", where, int)
    if "offload_activation_layers" in entry:
        if pp > 1:
            raise RpegError(f"{where}.offload_activation_layers: needs pp = 1, not {pp} (Megatron-Core's "
                            "cpu_offloading has no pipeline support)")
        out["offload_activation_layers"] = _value(entry, "offload_activation_layers", where, int)
    for key in ("grad_dtype", "optimizer_moments"):
        if key in entry:
            out[key] = _option(entry, key, where, "fp32")
    if _option(entry, "pp_embedding_loss_slots", where, False):
        if pp == 1:
            raise RpegError(f"{where}.pp_embedding_loss_slots: needs pp > 1 (it moves layers between pipeline stages)")
        out["pp_embedding_loss_slots"] = True
    return out


def _measured_iteration(entry: dict, tokens: int, gpus: int, where: str) -> float:
    """measured_iteration_s, or the iteration that measured_tokens_per_s_per_gpu implies (global_batch x
    seq tokens per iteration), or, where only model TFLOP/s were published, the iteration that
    measured_model_tflops_per_gpu implies with the publication's own FLOPs per token
    (model_gflop_per_token); an iteration time and a throughput both given must agree within TOKENS_CHECK."""
    given = "measured_iteration_s" in entry, "measured_tokens_per_s_per_gpu" in entry
    tflops = _value(entry, "measured_model_tflops_per_gpu", where, float) if (
        "measured_model_tflops_per_gpu" in entry) else None
    per_token = _value(entry, "model_gflop_per_token", where, float) if "model_gflop_per_token" in entry else None
    if per_token is not None and (tflops is None or any(given)):
        raise RpegError(f"{where}.model_gflop_per_token: only for an entry whose one measurement is "
                        "measured_model_tflops_per_gpu (it turns that into an iteration time)")
    if not any(given):
        if tflops is not None and per_token is not None:
            return tokens * per_token * 1e9 / (tflops * 1e12 * gpus)
        raise RpegError(f"{where}: missing 'measured_iteration_s' (or 'measured_tokens_per_s_per_gpu', or "
                        "'measured_model_tflops_per_gpu' with 'model_gflop_per_token')")
    implied = None
    if given[1]:
        rate = _value(entry, "measured_tokens_per_s_per_gpu", where, float)
        implied = tokens / (rate * gpus)
    if not given[0]:
        return implied
    seconds = float(_value(entry, "measured_iteration_s", where, float))
    if implied is not None and abs(implied - seconds) > TOKENS_CHECK * seconds:
        raise RpegError(f"{where}: measured_iteration_s = {seconds:g} but measured_tokens_per_s_per_gpu implies "
                        f"{implied:.4g} s ({tokens} tokens = global_batch x seq over {gpus} GPUs); one is wrong")
    return seconds


def predict_training(entry: dict, models: dict[str, ModelSpec], where: str) -> Result:
    """One training iteration: global_batch sequences of seq tokens over all data-parallel ranks,
    micro_batch sequences per micro-batch on each (Megatron's --global-batch-size, --micro-batch-size)."""
    _check_keys(entry, TRAIN_KEYS, where)
    spec = _model(_need(entry, "model", where, str), models)
    tp, pp, dp = (_need(entry, k, where) for k in ("tp", "pp", "dp"))
    cp, ep = _get(entry, "cp", where, 1), _get(entry, "ep", where, 1)
    gpus = _need(entry, "gpus", where)
    if tp * pp * dp * cp != gpus:
        raise RpegError(f"{where}: tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} = {tp * pp * dp * cp} != gpus = {gpus}")
    etp, note = _conditions(entry, spec, tp, ep, where)
    if ep > 1 and (dp * cp * tp) % (ep * etp):
        raise RpegError(f"{where}: ep*etp = {ep}*{etp} does not divide dp*cp*tp = {dp * cp * tp} (Megatron's MoE "
                        "parallel folding carves the expert groups out of the other dimensions of one pipeline stage)")
    zero = entry.get("zero", 0)
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise RpegError(f"{where}.zero: {zero!r:.80} is not one of 0, 1, 2, 3 (0: plain DDP, 1: Megatron's "
                        "distributed optimizer, 3: FSDP)")
    offload = entry.get("offload_optimizer", 0.0)
    if isinstance(offload, bool) or not isinstance(offload, (int, float)) or not 0 <= offload <= 1:
        raise RpegError(f"{where}.offload_optimizer: {offload!r:.80} is not a fraction in [0, 1] (Megatron-Core's "
                        "--optimizer-offload-fraction)")
    recompute = _option(entry, "recompute", where, "none")
    sp = _option(entry, "sequence_parallel", where, recompute == "selective" and tp > 1)
    if sp and tp == 1:
        raise RpegError(f"{where}.sequence_parallel: true needs tp > 1")
    moe_options = {k: _option(entry, k, where, default) for k, default in MOE_OPTIONS.items()}
    moe_options["capacity_factor"] = _get(entry, "capacity_factor", where, 0.0, float)
    moe_options["rank_capacity_factor"] = _get(entry, "rank_capacity_factor", where, 0.0, float)
    layout = ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, recompute=recompute, sequence_parallel=sp,
                            pp_interleave=_get(entry, "pp_interleave", where, 1), pp_uneven=bool(spec.layers % pp),
                            zero=zero, offload_optimizer=float(offload), **_recipe_options(entry, recompute, pp, where),
                            **moe_options, logits=MEGATRON_LOGITS)
    cluster = load_cluster(_need(entry, "system", where, str), gpus)
    seq, batch = _need(entry, "seq", where), _need(entry, "global_batch", where)
    micro = _need(entry, "micro_batch", where)
    if batch % (dp * micro):
        raise RpegError(f"{where}: global_batch = {batch} is not a whole number of micro-batches of {micro} on each "
                        f"of dp = {dp} ranks")
    measured = _measured_iteration(entry, batch * seq, gpus, where)
    work = PassWorkload(sequences=batch, seq_len=seq, attention_context=(seq + 1) / 2, micro_batch=micro,
                        dtype=_option(entry, "dtype", where, "fp16"),
                        flash_attention=_option(entry, "flash_attention", where, False))
    cost = pass_cost(entry["id"], spec, layout, cluster, work)
    if cost.peak_memory_bytes > cost.capacity_bytes:
        gib = 2.0 ** 30
        oom = (f"OOM: {cost.peak_memory_bytes / gib:.0f} GiB of {cost.capacity_bytes / gib:.0f} GiB per device; "
               f"{cost.seconds:.2f} s if it fit")
        return Result(entry["id"], "training", math.inf, measured, cost.parts, f"{oom}; {note}" if note else oom)
    return Result(entry["id"], "training", cost.seconds, measured, cost.parts, note)


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


BUNDLED_DIR = Path(__file__).resolve().parents[1] / "data" / "validation"


def bundled() -> dict[str, Path]:
    """The validation files RPEG ships, by name (the file name without .yaml), in name order."""
    return {p.stem: p for p in sorted(BUNDLED_DIR.glob("*.yaml"))}


def resolve(name: str) -> str:
    """`name` itself when it is a path that exists, else the shipped file of that name (with or
    without .yaml): a user's own file always wins over a shipped one of the same name. A bare
    word that names neither is refused with the shipped names."""
    if os.path.exists(name):
        return name
    files = bundled()
    stem = name[:-5] if name.endswith(".yaml") else name
    if stem in files:
        return str(files[stem])
    if os.sep in name or name.endswith((".yaml", ".yml")):
        return name  # a path: reading it says what is wrong with it
    raise RpegError(f"no file {name!r}, and RPEG ships no validation file of that name ({', '.join(files)})")


def validate_file(path: str, progress=None) -> list[Result]:
    return validate_data(read_yaml_file(path), path, progress)


def validate_data(data: Any, path: str, progress=None) -> list[Result]:
    """The training, rl and refit entries of a parsed validation file (`path` names it in messages)."""
    if not isinstance(data, dict):
        raise RpegError(f"{path}: expected a mapping with models, training, rl, refit and ratios")
    unknown = sorted(set(data) - {"models", "training", "rl", "refit", "ratios"}, key=str)
    if unknown:  # `ratios` (comparisons between systems) are read by rpeg.search.ratios
        raise RpegError(f"{path}: unknown top-level key {unknown[0]!r} (models, training, rl, refit, ratios)")
    predict = {"training": predict_training, "rl": predict_rl, "refit": predict_refit}
    models = _models(data.get("models"), path)
    for kind in predict:
        if data.get(kind) is not None and not isinstance(data[kind], list):
            raise RpegError(f"{path}: {kind}: expected a list of entries")
    results = []
    entries = [(kind, i, e) for kind in predict for i, e in enumerate(data.get(kind) or [])]
    for kind, i, entry in entries:
        where = f"{path}: {kind}[{i}]" + (f" ({entry.get('id')})" if isinstance(entry, dict) else "")
        if not isinstance(entry, dict) or "id" not in entry:
            raise RpegError(f"{where}: expected a mapping with an id")
        try:
            results.append(predict[kind](entry, models, where))
        except RpegError as e:
            msg = str(e)
            raise RpegError(msg if msg.startswith(path) else f"{where}: {msg}") from None
        if progress:
            progress(len(results), len(entries))
    return results


def stage_mapes(results: list[Result]) -> dict[str, float | None]:
    """Mean absolute error of each measured stage over the entries that give it and fit, and of
    the scored stages together (`all`); `other`, a remainder, is reported but not in `all`."""
    errors: dict[str, list[float]] = {}
    for r in results:
        for s in r.stages:
            if r.fits and s.error is not None:
                errors.setdefault(s.stage, []).append(abs(s.error))
    out: dict[str, float | None] = {k: sum(v) / len(v) for k in STAGES_S if (v := errors.get(k))}
    scored = [e for k in SCORED_STAGES for e in errors.get(k, [])]
    if scored:
        out["all"] = sum(scored) / len(scored)
    return out


def mape(results: list[Result]) -> float | None:
    """Mean absolute error over the entries predicted to fit; None when none does."""
    errors = [abs(r.error) for r in results if r.fits]
    return sum(errors) / len(errors) if errors else None


def summary(results: list[Result]) -> dict[str, float | None]:
    out = {"all": mape(results)}
    for kind in ("training", "rl", "refit"):
        sub = [r for r in results if r.kind == kind]
        if sub:
            out[kind] = mape(sub)
    return out


__all__ = ["BUNDLED_DIR", "bundled", "resolve", "validate_data", "STAGES_S", "NemoRlRun", "Result", "StageResult", "mape", "stage_mapes", "stage_split", "nemo_rl_plan", "predict_rl", "predict_training", "read_rl_entry",
           "rl_graph", "summary", "validate_file"]
