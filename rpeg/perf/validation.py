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
from pathlib import Path
from typing import Any

from rpeg.errors import RpegError
from rpeg.graph import ModelSpec, ParallelLayout
from rpeg.graph.layout import CUDA_GRAPH_SCOPES, RECOMPUTE_MODULES
from rpeg.graph.serde import from_data, read_yaml_file
from rpeg.hardware import load_cluster
from rpeg.perf.training import PassWorkload, pass_cost
from rpeg.perf.validation_entry import (  # noqa: F401 (NEMO_RL_PAGEABLE: read from here by callers)
    NEMO_RL_PAGEABLE, Result, StageResult, _check_keys, _get, _model, _need, _value)
from rpeg.perf.validation_refit import predict_refit
from rpeg.perf.validation_rl import (  # noqa: F401 (the rl entries' names, read from here by callers and tests)
    GEN_LAYOUT_KEYS, MEASURED_KEYS, NEMO_RL_GRAD_BYTES, NEMO_RL_KL, NEMO_RL_LOGITS, NEMO_RL_LOGPROB_BATCH, NEMO_RL_MOE,
    NEMO_RL_PERMUTE_FUSION, NEMO_RL_ZERO, PROMPT_TOKENS, RESPONSE_SIGMA, RL_KEYS, SCORED_STAGES, STAGES_S,
    TRAIN_LAYOUT_KEYS, NemoRlRun, nemo_rl_plan, predict_rl, read_rl_entry, rl_graph, stage_split)

# the logits path (rpeg/perf/logits.py) of Megatron's pretraining and SFT loss: its vocab-parallel cross-entropy
# over the fp32 copy it makes in place (GPTModel with labels; the native fused and unfused versions hold the same)
MEGATRON_LOGITS = "fused-ce"

TRAIN_KEYS = {"id", "system", "model", "gpus", "tp", "pp", "dp", "cp", "ep", "global_batch", "micro_batch", "seq",
              "recompute", "pp_interleave", "measured_iteration_s", "sequence_parallel", "notes", "source",
              "measured_tokens_per_s_per_gpu", "measured_model_tflops_per_gpu", "model_gflop_per_token", "etp", "zero",
              "offload_optimizer",
              "dtype", "flash_attention", "routing", "cuda_graphs", "dispatcher", "ep_overlap", "packing",
              "recompute_modules", "recompute_layers", "offload_activation_layers", "grad_dtype", "optimizer_moments",
              "pp_embedding_loss_slots", "capacity_factor", "rank_capacity_factor", "lora"}
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
    lora = None
    if entry.get("lora") is not None:  # low-rank adapters trained, the weights frozen (rpeg/graph/lora.py)
        from rpeg.graph.lora import LoRA
        from rpeg.graph.serde import from_data

        try:
            lora = from_data(LoRA, entry["lora"], "lora")
            lora.check(spec)
        except RpegError as e:
            raise RpegError(f"{where}: {e}") from None
    work = PassWorkload(sequences=batch, seq_len=seq, attention_context=(seq + 1) / 2, micro_batch=micro,
                        dtype=_option(entry, "dtype", where, "fp16"),
                        flash_attention=_option(entry, "flash_attention", where, False), lora=lora)
    cost = pass_cost(entry["id"], spec, layout, cluster, work)
    if cost.peak_memory_bytes > cost.capacity_bytes:
        gib = 2.0 ** 30
        oom = (f"OOM: {cost.peak_memory_bytes / gib:.0f} GiB of {cost.capacity_bytes / gib:.0f} GiB per device; "
               f"{cost.seconds:.2f} s if it fit")
        return Result(entry["id"], "training", math.inf, measured, cost.parts, f"{oom}; {note}" if note else oom)
    return Result(entry["id"], "training", cost.seconds, measured, cost.parts, note)


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


__all__ = ["BUNDLED_DIR", "bundled", "resolve", "validate_data", "STAGES_S", "NemoRlRun", "Result", "StageResult",
           "mape", "stage_mapes", "stage_split", "nemo_rl_plan", "predict_rl", "predict_training", "read_rl_entry",
           "rl_graph", "summary", "validate_file"]
