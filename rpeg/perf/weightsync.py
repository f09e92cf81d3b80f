"""Weight sync from the training layout to the generation layout, and colocation switches.

Colocated (verl's 3D-HybridEngine, NeMo-RL's refit, DeepSpeed-Chat's hybrid engine): every
generation device assembles its tensor-parallel shard (weights / tp_gen) from the training
shards of the model-parallel group it sits in — an all-gather over the training tp x pp group —
then copies it into the engine. Disaggregated: the training shards are sent to the generation
devices over the links between the groups (all shard holders send in parallel, each at its
device's bandwidth across the level separating the groups), then broadcast among the
generation instances.

A context switch is what colocation costs besides the sync: while the engine generates, the
trainer's state (bf16 weights and the optimizer's fp32 master weights and moments, each as sharded
as the layout keeps them) is moved to host memory and back afterwards, over the host link. The
gradients are dropped, not moved: Megatron's `offload_to_cpu` frees the gradient buffer and
`reload_from_cpu` zeroes a fresh one (megatron/core/distributed/param_and_grad_buffer.py), and FSDP
trainers set them to None after the optimizer step (verl, OpenRLHF).

Memory the sync and the sleep leave on the devices (lines of the stages' memory breakdowns, applied in
rpeg/perf/stages.py):
- `receive_buffer_bytes`: the engine receives the new weights one bucket at a time into buffers it
  allocates beside its weights and KV cache, outside vLLM's gpu_memory_utilization share. prime-rl's
  NCCL receiver takes each trainer state dict (one decoder layer, or the embedding) into one flat buffer
  and cloned every tensor out of it (PR #3365: an H200 engine at gpu_memory_utilization 0.94 ran out of
  memory on a 20 MiB clone in state dict 3 of 49; fixed by yielding views); verl's SGLang bucket cloned
  every tensor too (PR #6738); vLLM's packed NCCL transfer fills one buffer while the other is broadcast
  (PR #31943's review: up to twice the buffers). RECEIVE_BUCKETS buckets of the largest layer's (or the
  embedding's) weights, full tensors when the sync gathers in full (`gather="full"`), the engine's
  tensor-parallel slice otherwise, each at most RECEIVE_BUCKET_BYTES (vLLM's packed transfer, which
  NeMo-RL's refit and prime-rl's port use; prime-rl's older receiver took a whole layer's state dict,
  larger for MoE layers: not modelled apart).
- `sleeping_engine_bytes`: a colocated engine put to sleep releases its weights and KV cache, but its
  NCCL communicators keep their buffers (SLEEP_NCCL_BYTES per device of a multi-device engine) while the
  trainer and the log-prob passes run on the same devices. vLLM's `--enable-nccl-comm-suspend` (PR
  #51485, NCCL >= 2.29.7) releases them but ships off by default; SGLang's PR #30908 is open.
"""

from __future__ import annotations

import dataclasses
import math

from rpeg.graph.layout import ParallelLayout
from rpeg.graph.lora import LoRA
from rpeg.graph.model import ModelSpec
from rpeg.hardware.topology import Cluster
from rpeg.perf.collectives import (Group, all_gather_s, broadcast_s, tensorwise_all_gather_s, tp_split_tensors,
                                   weight_tensors)
from rpeg.perf.compute import BF16
from rpeg.perf.cost import StageCost
from rpeg.perf.efficiency import HBM, Factor, host_copy_bytes_per_s, host_time, link_efficiency
from rpeg.perf.fitted import declare
from rpeg.perf.offload import switch_seconds, switched_state_parts

RECEIVE_BUCKETS = Factor(2, "buckets of received weights live at once on an engine's device: the receive buffer "
                            "and the clone of each tensor taken out of it (prime-rl's NCCL receiver before PR "
                            "#3365, verl's get_named_tensor_buckets before PR #6738), or vLLM's packed NCCL "
                            "transfer filling one buffer while the other is broadcast (PR #31943)")
RECEIVE_BUCKET_BYTES = Factor(2.0**30, "bytes of one packed bucket of a weight sync: vLLM's "
                                       "DEFAULT_PACKED_BUFFER_SIZE_BYTES (1 GiB, with DEFAULT_PACKED_NUM_BUFFERS "
                                       "2; vllm/distributed/weight_transfer/packed_tensor.py)")
SLEEP_NCCL_BYTES = Factor(2.0**30, "bytes of NCCL communicator buffers a sleeping engine keeps on each device: ~958 "
                                   "MiB per GPU at TP8+EP8 and ~1 GiB per rank at TP4 (vLLM PRs #46234, #51485, "
                                   "whose ncclCommSuspend release ships off by default); ~576 MiB per communicator "
                                   "in SGLang (PR #30908, one per rank at TP8/EP8)")
RECEIVE_BUFFER = "weight-sync receive buffer"
SLEEPING_ENGINE = "sleeping engine's NCCL buffers"


def receive_buffer_bytes(spec: ModelSpec, gen: ParallelLayout, gather: str = "shard",
                         lora: LoRA | None = None) -> float:
    """Bytes per engine device of the buckets a weight sync receives into (module docstring): the largest
    bucket is a decoder layer's or the embedding's bf16 weights, whole with `gather="full"` (every tensor
    sent in full: NeMo-RL, OpenRLHF, prime-rl), the engine's tensor-parallel slice with `shard`; a bucket
    holds at most RECEIVE_BUCKET_BYTES. `lora` synced as adapters: the largest bucket is the adapters,
    at most."""
    largest = max(max(spec.layer_params(i) for i in range(spec.layers)), spec.vocab * spec.hidden)
    if lora is not None and lora.sync == "adapters":
        largest = min(largest, lora.params(spec))
    bucket = min(largest * BF16 / (1 if gather == "full" else gen.tp), RECEIVE_BUCKET_BYTES.value)
    return RECEIVE_BUCKETS.value * bucket


def sleeping_engine_bytes(gen: ParallelLayout) -> float:
    """Bytes a sleeping colocated engine keeps on each of its devices: its NCCL communicators' buffers,
    when it has any (an engine of one device runs without a communicator)."""
    return SLEEP_NCCL_BYTES.value if gen.tp * gen.pp > 1 else 0.0


# ---- fitted constants (rpeg/perf/fitted.py; values in rpeg/data/fitted.yaml, `python scripts/fit_factors.py`) ----
_SYNC_ROWS = ("nemo-rl-v0.6:refit", "nemo-rl-v0.3-stages:rl:refit")
TRAINER_ENGINES = ("megatron", "fsdp")  # weight export loops, by the trainer's engine (`trainer_engine`)
TENSOR_HOST_S = {
    "megatron": declare(
        "weightsync.tensor_host_s[megatron]", unit="s per tensor", bounds=(1e-6, 3e-2), rows=_SYNC_ROWS,
        group="weightsync[megatron]",
        mechanism="host time per export task of a Megatron trainer's weight export, on an x86 host (scaled by "
                  "HOST_TIME): the loop over its conversion tasks, one per Megatron parameter and a routed "
                  "expert's per local expert, gathered over expert parallelism in one collective (export_tasks: "
                  "NeMo-RL v0.3's gather_params, Megatron-Bridge's export_hf_weights in v0.5/v0.6, verl's "
                  "per_tensor_generator): name mapping, the collectives' launch and a synchronisation per task, "
                  "the packing of the tensors it yields into the bucket"),
    "fsdp": declare(
        "weightsync.tensor_host_s[fsdp]", unit="s per tensor", bounds=(1e-6, 3e-2), rows=_SYNC_ROWS,
        group="weightsync[fsdp]",
        mechanism="host time per weight tensor of an FSDP / ZeRO-3 trainer's weight export, on an x86 host: "
                  "the loop over the state dict (verl's get_per_tensor_param: DTensor full_tensor(), the cast and "
                  "the copy to the device per parameter; VeOmni's fused experts split into one tensor per expert)"),
}
ASSEMBLY_BYTES_PER_S = {
    "megatron": declare(
        "weightsync.assembly_bytes_per_s[megatron]", unit="B/s", bounds=(1e9, 1e13), rows=_SYNC_ROWS,
        group="weightsync[megatron]",
        mechanism="the rate at which a Megatron trainer's export assembles the bytes each device hands on: the "
                  "gathered tensors made contiguous, cast and re-laid-out into the checkpoint's format (fused QKV "
                  "split, experts stacked or split), one tensor at a time and synchronised per tensor, so below "
                  "the HBM rate of one streaming copy"),
    "fsdp": declare(
        "weightsync.assembly_bytes_per_s[fsdp]", unit="B/s", bounds=(1e9, 1e13), rows=_SYNC_ROWS,
        group="weightsync[fsdp]",
        mechanism="the rate at which an FSDP / ZeRO-3 trainer's export assembles each full tensor from the "
                  "state dict: the per-parameter full_tensor() all-gather of the fp32 shards, the cast to bf16 "
                  "and the copy into the bucket, one parameter at a time with a synchronisation per bucket "
                  "(verl issue #7060: the 72B sender spends 23.5 s of 24 assembling and bucketing 145 GB)"),
}


LOAD_TENSOR_S = declare(
    "weightsync.load_tensor_s", unit="s per tensor", bounds=(1e-6, 3e-2), rows=_SYNC_ROWS, group="weightsync[engine]",
    mechanism="host time per Hugging Face tensor an engine loads from a full-weight sync, on an x86 host (scaled by "
              "HOST_TIME): the engine's load_weights loop maps each name (vLLM's DeepSeek-V2/V3 and Qwen3-MoE "
              "loaders walk the stacked and expert parameter mappings, three per routed expert, for every tensor) "
              "and calls the parameter's weight_loader, which narrows the full tensor to the engine's slice and "
              "copies it in (vLLM FusedMoE.weight_loader per expert and shard). Every engine worker loads every "
              "tensor it is sent in full (NeMo-RL packed_broadcast_consumer, stream_weights_via_ipc_zmq)")


def trainer_engine(train: ParallelLayout) -> str:
    """Whose weight export loop a sync runs: FSDP / ZeRO-3 (zero 3) or Megatron (the rest)."""
    return "fsdp" if train.zero >= 3 else "megatron"


def export_tasks(spec: ModelSpec, train: ParallelLayout) -> float:
    """The tensors a trainer's full-weight export loop walks, each with its collectives and its host work.
    FSDP / ZeRO-3: every Hugging Face tensor (`weight_tensors`: verl's get_per_tensor_param, one
    full_tensor() each; VeOmni splits fused experts into one per expert). Megatron: one task per Megatron
    parameter, and a routed expert's is per *local* expert: the owning pipeline stage broadcasts its
    expert-parallel rank's linear_fc1 / linear_fc2 of local expert L, then one all-gather over expert
    parallelism yields that weight of all ep experts {L + k E/ep} (Megatron-Bridge's
    broadcast_from_pp_rank then gather_from_ep_ranks, which NeMo-RL v0.5/v0.6's export_hf_weights runs;
    NeMo-RL v0.3's gather_params likewise), gate and up coming out of one fused fc1: DeepSeek-V3 at ep 16
    walks 58 x 16 x 2 expert tasks, not 58 x 256 x 3 expert tensors."""
    tensors = weight_tensors(spec)
    if trainer_engine(train) == "fsdp" or not spec.is_moe:
        return tensors
    per_expert = 3 if spec.ffn_act == "swiglu" else 2
    return tensors - spec.moe_layers * spec.experts * (per_expert - 2 / max(1, train.ep))


def export_parts(spec: ModelSpec, train: ParallelLayout, dev, nbytes: float, tensors: float) -> tuple[tuple[str, float],
                                                                                                       ...]:
    """The sender's own work besides the collectives, each its own line: `tensors` export tasks at
    TENSOR_HOST_S (per tensor, by the trainer's engine, times the host's HOST_TIME) and `nbytes`
    assembled at ASSEMBLY_BYTES_PER_S. cpu-local devices: none (their calibrated gather_tensor_s
    times the per-tensor loop itself)."""
    if dev.kind == "cpu" or tensors <= 0:
        return ()
    engine = trainer_engine(train)
    return ((f"sender: per-tensor work ({tensors:,.0f} tensors, {engine})",
             tensors * TENSOR_HOST_S[engine].value * host_time(dev)),
            (f"sender: assemble {nbytes / 1e9:,.1f} GB ({engine})", nbytes / ASSEMBLY_BYTES_PER_S[engine].value))


def load_s(spec: ModelSpec, dev) -> float:
    """The engine's host time to load a full-weight sync: every Hugging Face tensor through its
    load_weights / weight_loader (LOAD_TENSOR_S, times the engine host's HOST_TIME). cpu-local: none."""
    if dev.kind == "cpu":
        return 0.0
    return weight_tensors(spec) * LOAD_TENSOR_S.value * host_time(dev)


def weight_sync_cost(name: str, spec: ModelSpec, train: ParallelLayout, gen: ParallelLayout, cluster: Cluster, *,
                     colocated: bool, separation: int, gather: str = "shard",
                     bucket_bytes: float | None = None, lora: LoRA | None = None) -> StageCost:
    """`separation`: device-id distance between the training and generation groups (0 when colocated).
    `gather`: how the sync assembles the engine's weights (rpeg/passes/refit.py): `shard`, each device
    gets only its slice (disaggregated: every shard holder sends in parallel); `full`, every tensor
    gathered in full (disaggregated: then broadcast from one sender). `bucket_bytes`: the sender's
    bucket, where known (it only names the bucket count in the breakdown).

    Lines, as the systems run a sync (their order): the collectives that gather the tensors; the
    sender's per-tensor work over its export tasks (`export_tasks`) and its assembly (`export_parts`,
    fitted); the copy into the buckets (full gathers pack every tensor into a bucket buffer: NeMo-RL's
    packed_broadcast_producer and stream_weights_via_ipc_zmq, verl's checkpoint engines); with full
    gathers, the engine's per-tensor load of every Hugging Face tensor (`load_s`, fitted); the wire per
    transport; the receiver's load_weights copy into the engine. Colocated, the engine reads each
    bucket through a CUDA IPC handle (no wire) and the sender waits for its acknowledgement before
    refilling the buffer (verl PR #7589: the bucketed sync is lock-step), so the lines add (NeMo-RL
    v0.5+'s stream_weights_via_ipc_zmq ping-pongs two buffers; not modelled apart). Disaggregated with
    one sender, the NCCL broadcast of bucket i runs while bucket i + 1 is filled and the engines load
    bucket i - 1 (NeMo-RL's double-buffered packed broadcast, verl's nccl engine), so only the
    slowest of the three shows, the others as what lies beyond.

    `lora`: a model that trains low-rank adapters syncs them alone (`lora.sync` adapters: `adapter_sync_cost`),
    or the merged weights (merged: the full sync above, after the merge of every adapter into its weight)."""
    if lora is not None and lora.sync == "adapters":
        return adapter_sync_cost(name, spec, train, gen, cluster, lora, colocated=colocated)
    if lora is not None:
        merged = weight_sync_cost(name, spec, train, gen, cluster, colocated=colocated, separation=separation,
                                  gather=gather, bucket_bytes=bucket_bytes)
        merge = ("merge adapters into the weights", _merge_s(spec, train, cluster, lora))
        return dataclasses.replace(merged, seconds=merged.seconds + merge[1], memory_s=merged.memory_s + merge[1],
                                   parts=(merge,) + merged.parts)
    total = spec.params_total() * BF16
    shard = total / gen.tp / gen.pp
    dev = cluster.device
    copy_s = shard / (dev.hbm_bandwidth_bytes_per_s * HBM[dev.kind].value)
    load = ("copy into engine", copy_s)  # the receiver's load_weights: its shard written into the engine
    mp = train.tp * train.pp * train.ep
    tensors = weight_tensors(spec)
    if gather == "full":
        buckets = f" ({math.ceil(total / bucket_bytes):,} of {bucket_bytes / 2**20:,.0f} MB)" if bucket_bytes else ""
        sender = full_gather_parts(spec, train, cluster) + \
            export_parts(spec, train, dev, total, export_tasks(spec, train)) + \
            ((f"pack into buckets{buckets}", _pack_s(total, dev)),)
        sender_s, receiver_s = sum(v for _, v in sender), load_s(spec, dev)
        receiver = f"receiver: load {weight_tensors(spec):,} tensors"
        if colocated:
            # the engine loads each bucket before the sender refills it (lock-step): the lines add
            parts = sender + ((receiver, receiver_s), load)
        else:
            # one rank broadcasts the whole model (NeMo-RL's packed_broadcast_producer(src=0), verl's
            # nccl engine, OpenRLHF's rank-0 broadcast after ZeRO-3's GatheredParameters) in an NCCL
            # communicator that holds every trainer rank and every engine rank (NeMo-RL's init_collective:
            # world_size = train_world_size + inference_world_size): a pipelined ring whose channels leave
            # each node through each of its ranks' NICs. Double-buffered (packed_broadcast_producer and
            # _consumer, NRL_REFIT_NUM_BUFFERS 2): the sender fills bucket i + 1 while bucket i is on the
            # wire and the engines load bucket i - 1, so the slowest of the three sets the pace
            wire = broadcast_s(cluster, total, Group(train.devices + gen.devices, 1))
            parts = sender + ((f"{receiver}, beyond the sender's work", max(0.0, receiver_s - sender_s)),
                              ("broadcast to generation, one sender, beyond the sender's and receiver's work",
                               max(0.0, wire - max(sender_s, receiver_s))), load)
    elif colocated:
        gather_s = all_gather_s(cluster, shard, Group(min(mp, cluster.gpus_per_node), 1))
        if mp > cluster.gpus_per_node:  # pipeline stages on other nodes
            gather_s += all_gather_s(cluster, shard, Group(mp // cluster.gpus_per_node, cluster.gpus_per_node))
        parts = (("gather shards", gather_s),)
        if train.zero >= 3 and train.dp > 1:
            # ZeRO-3 / FSDP: each device holds 1/dp of its model-parallel shard, so the engine's weights
            # are first all-gathered over data parallelism (verl's FSDP sharding manager takes the
            # full state dict; Megatron's distributed optimizer keeps the weights whole per rank)
            parts += (("gather over data parallelism", _dp_gather_s(spec, cluster, total / mp, train)),)
        parts += export_parts(spec, train, dev, shard, tensors) + (load,)
    else:
        span = cluster.span(2, max(1, separation))
        link = span.level.effective_bandwidth_bytes_per_s * link_efficiency(span.level.link)
        senders = max(1, min(mp, gen.tp * gen.pp))
        send_s = total / (senders * link) + span.level.latency_s
        fan_out = broadcast_s(cluster, shard, Group(gen.dp, gen.tp * gen.pp))
        # every shard holder sends its part in parallel: each walks the tensors of its pipeline stage
        # (a slice of each under tensor parallelism) and its expert-parallel share of the experts
        parts = export_parts(spec, train, dev, total / senders, _stage_tensors(spec, train)) + \
            (("send to generation", send_s), ("broadcast to instances", fan_out), load)
    seconds = sum(v for _, v in parts)
    return StageCost(stage=name, seconds=seconds, comm_s=seconds - copy_s, memory_s=copy_s,
                     bytes=total * gen.dp, devices=gen.devices, parts=parts)


def _merge_s(spec: ModelSpec, train: ParallelLayout, cluster: Cluster, lora: LoRA) -> float:
    """W + (alpha / r) B A for every targeted weight of one trainer device's shard: read and write each (bf16,
    memory-bound; the rank-r product is r / in of the traffic's FLOPs)."""
    dev = cluster.device
    targeted = sum(i * o * n for layer in range(spec.layers) for i, o, n in lora._shapes(spec, layer))
    bandwidth = dev.hbm_bandwidth_bytes_per_s * HBM[dev.kind].value
    return 2 * BF16 * targeted / (train.tp * train.pp * train.ep) / bandwidth


def adapter_sync_cost(name: str, spec: ModelSpec, train: ParallelLayout, gen: ParallelLayout, cluster: Cluster,
                      lora: LoRA, *, colocated: bool) -> StageCost:
    """A sync of LoRA adapters alone (verl's LoRA refit, vLLM's load_lora_adapter / add_lora, NeMo-RL's and
    prime-rl's adapter broadcasts): every trainer rank gathers the adapters in full (`lora.tensors` of them,
    `lora.params` x 2 bytes), the sender's per-tensor work and assembly, the wire (colocated: none, the
    engine reads the buffer in place; else one sender's broadcast to every engine rank), and the engine's
    load, per tensor, of the new adapter."""
    nbytes = lora.params(spec) * BF16
    tensors = float(lora.tensors(spec))
    dev = cluster.device
    mp = train.tp * train.pp * train.ep
    parts: tuple[tuple[str, float], ...] = ()
    if mp > 1 or (train.zero >= 3 and train.dp > 1):  # the adapters' shards gathered in full
        group = Group(min(mp * (train.dp if train.zero >= 3 else 1), cluster.gpus_per_node), 1)
        parts += (("gather the adapters", all_gather_s(cluster, nbytes / group.size, group)),)
    parts += export_parts(spec, train, dev, nbytes, tensors)
    if not colocated:
        parts += (("broadcast the adapters to generation", broadcast_s(cluster, nbytes,
                                                                       Group(train.devices + gen.devices, 1))),)
    load = 0.0 if dev.kind == "cpu" else tensors * LOAD_TENSOR_S.value * host_time(dev)
    parts += ((f"receiver: load the adapter ({tensors:,.0f} tensors)", load),
              ("copy into engine", nbytes / (dev.hbm_bandwidth_bytes_per_s * HBM[dev.kind].value)))
    parts = tuple(p for p in parts if p[1] > 0)
    seconds = sum(v for _, v in parts)
    copy_s = parts[-1][1] if parts and parts[-1][0] == "copy into engine" else 0.0
    return StageCost(stage=name, seconds=seconds, comm_s=seconds - copy_s, memory_s=copy_s, bytes=nbytes * gen.dp,
                     devices=gen.devices, parts=parts)


def full_gather_parts(spec: ModelSpec, train: ParallelLayout, cluster: Cluster) -> tuple[tuple[str, float], ...]:
    """Every device gathers every tensor in full (NeMo-RL's gather_params, FSDP's full_tensor(),
    ZeRO-3's GatheredParameters): the owning pipeline stage all-gathers each tensor over tensor
    parallelism (experts over expert parallelism), then broadcasts the full tensor over the
    pipeline group; with ZeRO-3 the data-parallel ranks first all-gather their shards."""
    total = spec.params_total() * BF16
    experts = (spec.experts * spec.mlp_params(spec.moe_ffn) * spec.moe_layers * BF16) if spec.is_moe else 0.0
    dense = total - experts
    parts = []
    if train.zero >= 3 and train.dp > 1:
        parts.append(("gather over data parallelism", _dp_gather_s(spec, cluster, total / (train.tp * train.pp),
                                                                   train)))
    if train.tp > 1:  # each split tensor its own collective, as NeMo-RL's gather_params and DTensor's full_tensor()
        parts.append(("gather over tensor parallelism",
                      _tensorwise_s(cluster, dense / train.pp, Group(train.tp, 1), tp_split_tensors(spec) / train.pp)))
    if train.pp > 1:
        # every pipeline group broadcasts in parallel, each its own expert-parallel rank's local experts
        # (Megatron-Bridge's broadcast_from_pp_rank before gather_from_ep_ranks; NeMo-RL v0.3's
        # gather_params): the dense weights and 1/ep of the routed experts
        parts.append(("broadcast over pipeline stages", broadcast_s(cluster, dense + experts / max(1, train.ep),
                                                                    Group(train.pp, train.tp * train.cp * train.dp))))
    if experts and train.ep > 1:  # after the broadcast every rank gathers every layer's experts
        parts.append(("gather experts", all_gather_s(cluster, experts, Group(train.ep, train.tp))))
    return tuple(parts)


def _dp_gather_s(spec: ModelSpec, cluster: Cluster, nbytes: float, train: ParallelLayout) -> float:
    """The weights gathered from their ZeRO-3 shards one tensor at a time (FSDP's full_tensor(),
    ZeRO-3's GatheredParameters): a collective each; per tensor as measured where it was (cpu-local:
    `gather_tensor_us`, FSDP2 over gloo)."""
    return _tensorwise_s(cluster, nbytes, Group(train.dp, train.tp * train.cp), weight_tensors(spec))


def _tensorwise_s(cluster: Cluster, nbytes: float, group: Group, tensors: float) -> float:
    """`nbytes` gathered over `group` in `tensors` collectives one after another; per tensor as
    measured where it was (cpu-local: `gather_tensor_us`, a DTensor's full_tensor() over gloo)."""
    if cluster.device.gather_tensor_s > 0:
        return max(1.0, tensors) * cluster.device.gather_tensor_s
    return tensorwise_all_gather_s(cluster, nbytes, group, max(1, round(tensors)))


def _stage_tensors(spec: ModelSpec, train: ParallelLayout) -> float:
    """Weight tensors one trainer rank holds (a slice of each under tensor parallelism): its pipeline
    stage's, with 1/ep of the routed experts."""
    experts = spec.moe_layers * spec.experts * (3 if spec.ffn_act == "swiglu" else 2) if spec.is_moe else 0
    return (weight_tensors(spec) - experts + experts / train.ep) / train.pp


def _pack_s(total: float, dev) -> float:
    """The full model copied into the bucket buffers: each tensor read and written once at the HBM rate."""
    return 2 * total / (dev.hbm_bandwidth_bytes_per_s * HBM[dev.kind].value)


# the four moves of a colocated step's context switch (their own lines in the breakdown)
OFFLOAD_TRAINER = "offload trainer state"  # before generation
RELOAD_TRAINER = "reload trainer state"  # before training
ENGINE_SLEEP = "engine sleep"  # after generation: the engine releases weights and KV cache
ENGINE_WAKE = "engine wake"  # before generation


def context_switch_cost(name: str, spec: ModelSpec, train: ParallelLayout, gen: ParallelLayout,
                        device=None, lora: LoRA | None = None) -> StageCost:
    """Offload the trainer's state to host before generation and reload it after; the engine
    likewise releases its weights after generation (vLLM's sleep mode) and reloads them. What the
    training layout keeps resident, or on the host anyway, is not moved (rpeg/perf/offload.py); each
    part moves at its copy's rate, pinned or, where the training layout lists it in `pageable`,
    pageable (rpeg/perf/offload.py says which systems copy through pageable memory). The engine's
    backup is pinned (vLLM's sleep level 1, CuMemAllocator). `device`: whose host link the copies take
    (None: an x86 host's PCIe). `lora`: the trainer's optimizer state is its adapters' alone."""
    moved = switched_state_parts(spec, train, lora)  # gradients are freed, not moved
    state = sum(moved.values())
    engine = spec.params_total() * BF16 / (gen.tp * gen.pp)
    host = host_copy_bytes_per_s(device, "weights-out")
    out, back = switch_seconds(moved, train, device, "out"), switch_seconds(moved, train, device, "in")
    parts = ((OFFLOAD_TRAINER, out), (RELOAD_TRAINER, back), (ENGINE_SLEEP, engine / host),
             (ENGINE_WAKE, engine / host))
    seconds = out + back + 2 * engine / host
    return StageCost(stage=name, seconds=seconds, memory_s=seconds, bytes=2 * (state + engine) * train.devices,
                     devices=train.devices, parts=parts)
