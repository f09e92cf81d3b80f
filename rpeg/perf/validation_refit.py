"""`refit` entries of a validation file: one measured weight sync (trainer -> generation engines)
against rpeg/perf/weightsync.py, costed the way rpeg/perf/stages.py costs a plan's SYNC stage.

An entry names the model, the cluster, the trainer's and one engine's layout, and the transport:

- `nccl-broadcast`: disaggregated; every tensor gathered in full on the trainer, then one rank
  broadcasts it to every engine (NeMo-RL's default non-colocated refit, packed_broadcast_producer;
  verl's `nccl` checkpoint engine) - weight_sync_cost(colocated=False, gather="full");
- `nccl-reshard`: disaggregated; each trainer shard goes to the engine shards that hold part of it
  (NeMo-RL's `refit_transport: nccl_reshard`) - weight_sync_cost(colocated=False, gather="shard");
- `cuda-ipc`: colocated; the trainer gathers each tensor in full and hands it to the engine on the
  same device (NeMo-RL's colocated refit, verl's hybrid engine) - weight_sync_cost(colocated=True,
  gather="full").

`covers` says what the measurement timed: `transfer`, the weight sync alone; or, colocated only,
`prepare-for-generation`, NeMo-RL's refit timer, which also holds the optimizer's offload to the
host and the engine's wake (context_switch_cost's OFFLOAD_TRAINER and ENGINE_WAKE, with NeMo-RL's
pageable optimizer copies, as rpeg.perf.validation.stage_split assigns them).

The trainer sits on devices [0, train_gpus), the engines on the next gen_gpus (the layout a
disaggregated plan places), so the transfer crosses the level that separates the two groups.
"""

from __future__ import annotations

from typing import Any

from rpeg.errors import RpegError
from rpeg.graph import ModelSpec, ParallelLayout
from rpeg.hardware import load_cluster
from rpeg.perf import memory
from rpeg.perf.compute import BF16
from rpeg.perf.efficiency import Factor, host_copy_bytes_per_s
from rpeg.perf.validation_entry import NEMO_RL_PAGEABLE, Result, _check_keys, _get, _model, _need
from rpeg.perf.weightsync import ENGINE_WAKE, OFFLOAD_TRAINER, context_switch_cost, weight_sync_cost

REFIT_KEYS = {"id", "system", "model", "gpus", "train_gpus", "gen_gpus", "gpus_per_node", "training", "generation",
              "transport", "covers", "bucket_mb", "offload", "measured_s", "notes", "source"}
REFIT_TRAIN_KEYS = {"tp", "pp", "cp", "ep", "zero"}
REFIT_GEN_KEYS = {"tp", "pp", "ep"}
# transport -> (colocated, how the sync assembles the engine's weights: weight_sync_cost's `gather`)
TRANSPORTS = {"nccl-broadcast": (False, "full"), "nccl-reshard": (False, "shard"), "cuda-ipc": (True, "full")}
COVERS = ("transfer", "prepare-for-generation")
_SWITCH_PARTS = (OFFLOAD_TRAINER, ENGINE_WAKE)  # the moves NeMo-RL's refit timer holds besides the transfer
FSDP_PARAM_BYTES = Factor(4.0, "verl's FSDP actor keeps its sharded parameters in fp32 (fsdp_workers: torch_dtype "
                               "float32 for the actor; bf16 is the mixed-precision compute copy)")


def _choice(entry: dict, key: str, where: str, choices, default: str | None = None) -> str:
    if key not in entry and default is not None:
        return default
    value = entry.get(key)
    if value not in choices:
        raise RpegError(f"{where}.{key}: expected one of {', '.join(choices)}, got {value!r:.80}")
    return value


def _layout(part: Any, keys: set[str], where: str) -> dict:
    if part is None:
        return {}
    if not isinstance(part, dict):
        raise RpegError(f"{where}: expected a mapping ({', '.join(sorted(keys))}), got {part!r:.80}")
    _check_keys(part, keys, where)
    return part


def _zero(train: dict, where: str) -> int:
    zero = train.get("zero", 0)
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise RpegError(f"{where}.zero: expected 0, 1, 2 or 3 (3 = FSDP / ZeRO-3), got {zero!r:.80}")
    return zero


def refit_layouts(entry: dict, spec: ModelSpec, where: str) -> tuple[ParallelLayout, ParallelLayout, int, int, bool]:
    """The trainer's and the engines' layouts, the two device counts and whether they are colocated."""
    colocated, _ = TRANSPORTS[entry["transport"]]
    if colocated:
        for key in ("train_gpus", "gen_gpus"):
            if key in entry:
                raise RpegError(f"{where}.{key}: a colocated (cuda-ipc) entry gives `gpus`, the devices both share")
        train_gpus = gen_gpus = _need(entry, "gpus", where)
    else:
        if "gpus" in entry:
            raise RpegError(f"{where}.gpus: a disaggregated ({entry['transport']}) entry gives train_gpus and "
                            f"gen_gpus, not gpus")
        train_gpus, gen_gpus = _need(entry, "train_gpus", where), _need(entry, "gen_gpus", where)
    train = _layout(entry.get("training"), REFIT_TRAIN_KEYS, f"{where}.training")
    gen = _layout(entry.get("generation"), REFIT_GEN_KEYS, f"{where}.generation")
    tw, gw = f"{where}.training", f"{where}.generation"
    tp, pp, cp, ep = (_get(train, k, tw, 1) for k in ("tp", "pp", "cp", "ep"))
    if train_gpus % (tp * pp * cp):
        raise RpegError(f"{where}: training tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp} does not divide its "
                        f"{train_gpus} devices")
    dp = train_gpus // (tp * pp * cp)
    if ep > dp * cp * tp:
        raise RpegError(f"{where}: training ep = {ep} exceeds the dp*cp*tp = {dp * cp * tp} devices of a pipeline "
                        f"stage it is carved out of")
    gtp, gpp, gep = (_get(gen, k, gw, 1) for k in ("tp", "pp", "ep"))
    if gen_gpus % (gtp * gpp):
        raise RpegError(f"{where}: generation tp*pp = {gtp}*{gpp} = {gtp * gpp} does not divide its {gen_gpus} "
                        f"devices")
    zero = _zero(train, tw)
    prepare = entry.get("covers") == "prepare-for-generation"
    trainer = ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, pp_uneven=bool(spec.layers % pp),
                             pageable=NEMO_RL_PAGEABLE if prepare else ())
    engine = ParallelLayout(dp=gen_gpus // (gtp * gpp), tp=gtp, pp=gpp, ep=gep, pp_uneven=bool(spec.layers % gpp))
    return trainer, engine, train_gpus, gen_gpus, colocated


def staging_parts(spec: ModelSpec, trainer: ParallelLayout, device) -> tuple[tuple[str, float], ...]:
    """A trainer whose parameters wait on the host between phases brings them to its devices for the
    export and puts them back before it iterates (verl's get_per_tensor_param: load_fsdp_model_to_gpu,
    state_dict, offload_fsdp_model_to_cpu). FSDP2 moves its fp32 shards with `module.to(device)` /
    `module.cpu()`, pageable both ways; verl's Megatron parameter buffer (bf16) goes out pageable and
    comes back from a pinned copy (rpeg/perf/offload.py). verl issue #7060 puts 2.4-2.7 s of the 7B
    sync on this staging."""
    params = memory.params_per_device(spec, trainer)
    if trainer.zero >= 3:
        nbytes, pageable = params * FSDP_PARAM_BYTES.value / trainer.dp, ("weights-in", "weights-out")
    else:
        nbytes, pageable = params * BF16, ("weights-out",)
    return ((f"load trainer weights from host{' (pageable)' if 'weights-in' in pageable else ''}",
             nbytes / host_copy_bytes_per_s(device, "weights-in", pageable)),
            ("offload trainer weights to host (pageable)", nbytes / host_copy_bytes_per_s(device, "weights-out",
                                                                                          pageable)))


def predict_refit(entry: dict, models: dict[str, ModelSpec], where: str) -> Result:
    _check_keys(entry, REFIT_KEYS, where)
    spec = _model(_need(entry, "model", where, str), models)
    transport = _choice(entry, "transport", where, tuple(TRANSPORTS))
    colocated, gather = TRANSPORTS[transport]
    covers = _choice(entry, "covers", where, COVERS, default="transfer")
    if covers == "prepare-for-generation" and not colocated:
        raise RpegError(f"{where}.covers: prepare-for-generation (the optimizer offload and the engine's wake "
                        f"around a colocated refit) needs transport cuda-ipc, got {transport}")
    bucket_mb = _get(entry, "bucket_mb", where, 0, float)  # names the bucket count in the breakdown
    offload = entry.get("offload", False)
    if not isinstance(offload, bool):
        raise RpegError(f"{where}.offload: expected true or false (the trainer's parameters offloaded to the host "
                        f"between phases), got {offload!r:.80}")
    _get(entry, "gpus_per_node", where, 0)  # the cluster preset sets it; recorded as published
    trainer, engine, train_gpus, gen_gpus, colocated = refit_layouts(entry, spec, where)
    system = _need(entry, "system", where, str)
    cluster = load_cluster(system, train_gpus if colocated else train_gpus + gen_gpus)
    cost = weight_sync_cost(entry["id"], spec, trainer, engine, cluster, colocated=colocated,
                            separation=0 if colocated else train_gpus, gather=gather,
                            bucket_bytes=bucket_mb * 2**20 if bucket_mb else None)
    parts = staging_parts(spec, trainer, cluster.device) if offload else ()
    parts += cost.parts
    if covers == "prepare-for-generation":
        switch = context_switch_cost("switch", spec, trainer, engine, cluster.device)
        parts += tuple((k, v) for k, v in switch.parts if k in _SWITCH_PARTS)
    measured = _need(entry, "measured_s", where, float)
    return Result(entry["id"], "refit", sum(v for _, v in parts), float(measured), parts, note=transport)


__all__ = ["COVERS", "REFIT_KEYS", "TRANSPORTS", "predict_refit", "refit_layouts", "staging_parts"]
