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

from rpeg.graph.layout import ParallelLayout
from rpeg.graph.model import ModelSpec
from rpeg.hardware.topology import Cluster
from rpeg.perf import memory
from rpeg.perf.collectives import (Group, all_gather_s, broadcast_s, tensorwise_all_gather_s, tp_split_tensors,
                                   weight_tensors)
from rpeg.perf.compute import BF16
from rpeg.perf.cost import StageCost
from rpeg.perf.efficiency import HBM, Factor, host_copy_bytes_per_s, link_efficiency
from rpeg.perf.offload import switch_seconds, switched_state_bytes

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


def receive_buffer_bytes(spec: ModelSpec, gen: ParallelLayout, gather: str = "shard") -> float:
    """Bytes per engine device of the buckets a weight sync receives into (module docstring): the largest
    bucket is a decoder layer's or the embedding's bf16 weights, whole with `gather="full"` (every tensor
    sent in full: NeMo-RL, OpenRLHF, prime-rl), the engine's tensor-parallel slice with `shard`; a bucket
    holds at most RECEIVE_BUCKET_BYTES."""
    largest = max(max(spec.layer_params(i) for i in range(spec.layers)), spec.vocab * spec.hidden)
    bucket = min(largest * BF16 / (1 if gather == "full" else gen.tp), RECEIVE_BUCKET_BYTES.value)
    return RECEIVE_BUCKETS.value * bucket


def sleeping_engine_bytes(gen: ParallelLayout) -> float:
    """Bytes a sleeping colocated engine keeps on each of its devices: its NCCL communicators' buffers,
    when it has any (an engine of one device runs without a communicator)."""
    return SLEEP_NCCL_BYTES.value if gen.tp * gen.pp > 1 else 0.0


def weight_sync_cost(name: str, spec: ModelSpec, train: ParallelLayout, gen: ParallelLayout, cluster: Cluster, *,
                     colocated: bool, separation: int, gather: str = "shard") -> StageCost:
    """`separation`: device-id distance between the training and generation groups (0 when colocated).
    `gather`: how the sync assembles the engine's weights (rpeg/passes/refit.py): `shard`, each device
    gets only its slice (disaggregated: every shard holder sends in parallel); `full`, every tensor
    gathered in full (disaggregated: then broadcast from one sender)."""
    total = spec.params_total() * BF16
    shard = total / gen.tp / gen.pp
    dev = cluster.device
    copy_s = shard / (dev.hbm_bandwidth_bytes_per_s * HBM[dev.kind].value)
    mp = train.tp * train.pp * train.ep
    if colocated and gather == "full":
        parts = full_gather_parts(spec, train, cluster) + (("convert to engine format", _convert_s(total, dev)),
                                                           ("copy into engine", copy_s))
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
        parts += (("copy into engine", copy_s),)
    elif gather == "full":
        # the trainers gather every tensor in full, then one rank broadcasts the whole model to every
        # generation device (NeMo-RL's packed_broadcast_producer(src=0), OpenRLHF's rank-0 broadcast
        # after ZeRO-3's GatheredParameters): a pipelined ring whose slowest link sets the pace. The
        # loop gathers tensor i + 1 while tensor i is broadcast, so only the longer of the two shows.
        span = cluster.span(2, max(1, separation))
        link = span.level.effective_bandwidth_bytes_per_s * link_efficiency(span.level.link)
        ring = broadcast_s(cluster, total, Group(gen.devices, 1))
        send_s = max(total / link + span.level.latency_s, ring)
        gather_s = sum(v for _, v in full_gather_parts(spec, train, cluster))
        parts = (("broadcast to generation, one sender", send_s),
                 ("gather in full, beyond the broadcast", max(0.0, gather_s - send_s)),
                 ("convert to engine format", _convert_s(total, dev)), ("copy into engine", copy_s))
    else:
        span = cluster.span(2, max(1, separation))
        link = span.level.effective_bandwidth_bytes_per_s * link_efficiency(span.level.link)
        senders = max(1, min(mp, gen.tp * gen.pp))
        send_s = total / (senders * link) + span.level.latency_s
        fan_out = broadcast_s(cluster, shard, Group(gen.dp, gen.tp * gen.pp))
        parts = (("send to generation", send_s), ("broadcast to instances", fan_out), ("copy into engine", copy_s))
    seconds = sum(v for _, v in parts)
    return StageCost(stage=name, seconds=seconds, comm_s=seconds - copy_s, memory_s=copy_s,
                     bytes=total * gen.dp, devices=gen.devices, parts=parts)


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
    if experts and train.ep > 1:
        parts.append(("gather experts", all_gather_s(cluster, experts / train.pp, Group(train.ep, 1))))
    if train.pp > 1:
        parts.append(("broadcast over pipeline stages",
                      broadcast_s(cluster, total, Group(train.pp, train.tp * train.cp * train.dp))))
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


def _convert_s(total: float, dev) -> float:
    """The full model converted to the engine's format: each tensor read and written once."""
    return 2 * total / (dev.hbm_bandwidth_bytes_per_s * HBM[dev.kind].value)


# the four moves of a colocated step's context switch (their own lines in the breakdown)
OFFLOAD_TRAINER = "offload trainer state"  # before generation
RELOAD_TRAINER = "reload trainer state"  # before training
ENGINE_SLEEP = "engine sleep"  # after generation: the engine releases weights and KV cache
ENGINE_WAKE = "engine wake"  # before generation


def context_switch_cost(name: str, spec: ModelSpec, train: ParallelLayout, gen: ParallelLayout,
                        device=None) -> StageCost:
    """Offload the trainer's state to host before generation and reload it after; the engine
    likewise releases its weights after generation (vLLM's sleep mode) and reloads them. What the
    training layout keeps resident, or on the host anyway, is not moved (rpeg/perf/offload.py); each
    part moves at its copy's rate, pinned or, where the training layout lists it in `pageable`,
    pageable (rpeg/perf/offload.py says which systems copy through pageable memory). The engine's
    backup is pinned (vLLM's sleep level 1, CuMemAllocator). `device`: whose host link the copies take
    (None: an x86 host's PCIe)."""
    params = memory.params_per_device(spec, train)
    state = switched_state_bytes(params, train)  # gradients are freed, not moved
    engine = spec.params_total() * BF16 / (gen.tp * gen.pp)
    host = host_copy_bytes_per_s(device, "weights-out")
    out, back = switch_seconds(params, train, device, "out"), switch_seconds(params, train, device, "in")
    parts = ((OFFLOAD_TRAINER, out), (RELOAD_TRAINER, back), (ENGINE_SLEEP, engine / host),
             (ENGINE_WAKE, engine / host))
    seconds = out + back + 2 * engine / host
    return StageCost(stage=name, seconds=seconds, memory_s=seconds, bytes=2 * (state + engine) * train.devices,
                     devices=train.devices, parts=parts)
