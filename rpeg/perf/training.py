"""Training and forward-only (logprob / value / reward) passes under DP/TP/PP/CP/EP.

Megatron-style schedule: micro-batches through a 1F1B pipeline (Narayanan et al. 2021, arXiv
2104.04473): time = (m + (pp - 1) / v) x (forward + backward of one micro-batch on one stage),
v the interleaving. Per layer and micro-batch: the compute of `compute.layer_forward`, backward
twice the forward, recomputation per `recompute`; tensor-parallel all-reduces (or all-gather +
reduce-scatter with sequence parallelism, the same bytes) twice in the forward and twice in the
backward, not overlapped (Megatron-LM's default); context-parallel KV exchange overlapped with
attention; the expert-parallel exchange (dispatch and combine) in the forward and again in the
backward, as the layout's dispatcher sends it, overlapped with the other micro-batch's compute under
ep_overlap, the busiest rank's under natural routing (rpeg/perf/moe.py); kernel launches per layer,
an MoE layer's own (moe.LAYER_KERNELS and per local expert; in the forward at a host op's time, the
dispatcher's sync leaving the GPU waiting) on a line of their own, removed by CUDA graphs (partial:
the dense part; full: all); pipeline sends of the activations at each stage boundary. After the
last micro-batch: the gradient reduction over data parallelism, partly overlapped, and the
optimizer step, which is memory-bound. A layout that offloads the optimizer (or the parameters) to
the host adds the host link's traffic and the CPU's Adam step, each its own line of the breakdown
(rpeg/perf/offload.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rpeg.graph.layout import ParallelLayout, graph_scopes
from rpeg.graph.lora import LoRA
from rpeg.graph.model import ModelSpec
from rpeg.hardware.device import Device
from rpeg.hardware.topology import Cluster
from rpeg.perf import logits, memory, moe, offload, recipe_options
from rpeg.perf.collectives import Group, all_gather_s, all_reduce_s, p2p_s, reduce_scatter_s, tensorwise_all_gather_s
from rpeg.perf.compute import BF16, LayerTime, eager_host_s, head_forward, layer_forward
from rpeg.perf.cost import StageCost
from rpeg.perf.efficiency import (ATTENTION_KERNELS_PER_LAYER, DP_OVERLAP, HBM, KERNEL_LAUNCH_S, KERNELS_PER_LAYER,
                                  OPTIMIZER_BYTES_PER_PARAM,
                                  host_copy_bytes_per_s, host_link_bytes_per_s, host_time)


@dataclass(frozen=True, kw_only=True, slots=True)
class PassWorkload:
    """What a training or forward pass processes per step (global, all data-parallel ranks).

    sequences: per optimizer step; seq_len: mean tokens per sequence; attention_context: mean
    keys per query (E[s^2] / (2 E[s]) for causal attention over packed sequences of length s);
    micro_batch: sequences per micro-batch; optimizer_steps: epochs x mini-batches (forward-only
    passes: the number of passes over `sequences`). `lora`: a training pass's backward computes no
    gradients of the frozen weights (their GEMMs' second half), the adapters' GEMMs run beside the
    layers', and gradient sync and optimizer step cover the adapters alone."""

    sequences: float
    seq_len: float
    attention_context: float
    micro_batch: float = 1
    optimizer_steps: int = 1
    forward_only: bool = False
    dtype: str = "bf16"
    value_head: bool = False
    flash_attention: bool = True
    lora: LoRA | None = None  # the model's low-rank adapters (rpeg/graph/lora.py): its weights frozen


def _layer_mix(spec: ModelSpec) -> tuple[float, float]:
    """(dense layers, MoE layers) of the model."""
    return (float(spec.layers), 0.0) if not spec.is_moe else (float(spec.dense_layers), float(spec.moe_layers))


def layer_launches(cuda_graphs: str | tuple[str, ...], moe_layer: bool) -> float:
    """Kernels of one layer's forward, besides an MoE layer's own (moe.moe_launches), that the host launches
    outside CUDA graphs: KERNELS_PER_LAYER, less the attention half under the `attn` scope and the MLP half
    under `mlp` (a dense layer) or `moe` (an MoE layer); none under full-iteration graphs, and none under
    `partial` (the attention and dense parts of every layer)."""
    scopes = graph_scopes(cuda_graphs)
    if "full_iteration" in scopes:
        return 0.0
    attention = 0 if "attn" in scopes else ATTENTION_KERNELS_PER_LAYER
    mlp_scopes = {"moe", "partial"} if moe_layer else {"mlp"}
    return attention + (0 if scopes & mlp_scopes else KERNELS_PER_LAYER - ATTENTION_KERNELS_PER_LAYER)


def pass_cost(name: str, spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, work: PassWorkload,
              first_device: int = 0) -> StageCost:
    dp, tp, pp, cp, ep, v = layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, layout.pp_interleave
    dev = cluster.device
    seqs_per_rank = work.sequences / dp
    m = max(1, math.ceil(seqs_per_rank / work.micro_batch))
    mb_seqs = seqs_per_rank / m
    tokens = mb_seqs * work.seq_len / cp  # per device, per micro-batch
    ctx = work.attention_context  # ring attention: each rank's queries see the whole context over the ring
    dense_l, moe_l = _layer_mix(spec)
    layers_per_stage = layout.layers_per_stage(spec.layers) / v  # per virtual stage; v of them per rank
    share = layers_per_stage * v / spec.layers  # this rank's share of each kind of layer
    kw = dict(tokens=tokens, context=ctx, tp=tp, ep=ep, sp=layout.sequence_parallel, dtype=work.dtype,
              flash_attention=work.flash_attention)
    fwd = LayerTime(0, 0, 0, 0, 0)
    load = moe.busiest_rank_load(spec, ep, layout.routing, layout.capacity_factor)  # the busiest rank's share
    buffer_load = moe.expert_buffer_load(load, layout.rank_capacity_factor)  # the rows the expert part runs over
    pad_fwd = 0.0  # a forward's expert work on the static buffer's empty rows (rank_capacity_factor)
    if dense_l:
        fwd = fwd + layer_forward(spec, dev, moe_layer=False, **kw).scaled(dense_l * share)
    if moe_l:
        moe_fwd = layer_forward(spec, dev, moe_layer=True, moe_load=buffer_load, **kw).scaled(moe_l * share)
        fwd = fwd + moe_fwd
        if buffer_load != load:
            pad_fwd = moe_fwd.seconds - layer_forward(spec, dev, moe_layer=True, moe_load=load,
                                                      **kw).scaled(moe_l * share).seconds
    # the output head runs on the last pipeline stage only: the step's time is that of its slowest
    # (the last) stage, but the work summed over devices counts the head once per pipeline (1 / pp)
    head = head_forward(spec, dev, tokens=tokens, tp=tp, dtype=work.dtype, value_head=work.value_head)
    # the log-probs' path over the vocabulary beyond the head's own fp32 write and read (rpeg/perf/logits.py
    # TRAFFIC), memory-bound, on the last stage with the head; a packed training loss slices per sequence
    vocab_bytes = logits.traffic_bytes(spec, tokens=tokens, tp=tp, path=layout.logits, train=not work.forward_only,
                                       sequences=mb_seqs if layout.packing else 0.0, value_head=work.value_head)
    vocab_s = vocab_bytes / (dev.hbm_bandwidth_bytes_per_s * HBM[dev.kind].value)
    # a packed training loss run sequence by sequence: its ops wait on the host (rpeg/perf/logits.py LOSS_HOST)
    loss_host = 0.0
    if layout.packing and not work.forward_only and not work.value_head:
        loss_host = logits.loss_host_s(path=layout.logits, sequences=mb_seqs, op_s=moe.HOST_OP_S.value * host_time(dev),
                                       launch_s=KERNEL_LAUNCH_S.value * host_time(dev))
    layers_per_stage *= v
    # per micro-batch on the host: measured per layer (cpu-local), else kernel launches (none inside CUDA
    # graphs: partial ones capture the attention and dense parts, full ones the whole iteration); an MoE
    # layer's own kernels are launched eagerly unless the graphs are full (moe.moe_launches)
    launch = eager_host_s(dev, layers_per_stage) or KERNEL_LAUNCH_S.value * host_time(dev) * (
        layer_launches(layout.cuda_graphs, moe_layer=False) * dense_l * share
        + layer_launches(layout.cuda_graphs, moe_layer=True) * moe_l * share)
    moe_kernels = moe.moe_launches(spec, ep, work.dtype, layout.cuda_graphs) * moe_l * share \
        if dev.layer_host_s <= 0 else 0.0
    static = bool(layout.capacity_factor or layout.rank_capacity_factor)  # shapes known without a sync
    moe_fwd_host, moe_bwd_host = moe.moe_host_s(moe_kernels, host_time(dev), sync=not static)
    # without permute fusion: PyTorch's permutation kernels, and the host's split and concatenation per
    # (rank, local expert) chunk, eager even under CUDA graphs (their shapes change)
    perm_fwd_host = perm_bwd_host = 0.0
    if moe_l and not layout.permute_fusion and dev.layer_host_s <= 0:
        perm_fwd_host, perm_bwd_host = moe.unfused_permute_host_s(spec, ep, tp, layout.dispatcher, host_time(dev),
                                                                  sync=not static, layers=moe_l * share)

    # communication per micro-batch on one stage
    act_bytes = tokens * spec.hidden * BF16
    tp_group = Group(tp, 1)
    tp_one = all_reduce_s(cluster, act_bytes, tp_group)  # = all-gather + reduce-scatter with SP
    tp_fwd = 2 * tp_one * layers_per_stage
    cp_fwd = 0.0
    if cp > 1:
        kv_local = tokens * 2 * spec.kv_elements_per_token() / spec.layers / 2 * BF16 / max(1, min(tp, spec.kv_heads))
        ring = (cp - 1) * p2p_s(cluster, kv_local, tp)
        cp_fwd = max(0.0, ring - fwd.attention_s / layers_per_stage) * layers_per_stage
    ep_fwd = 0.0
    if moe_l and ep > 1:  # dispatch and combine, each one direction of the dispatcher's copies (perf/moe.py)
        ep_fwd = 2 * moe.dispatch_s(cluster, spec, moe.dispatched_tokens(tokens, tp), ep, layout.dispatcher,
                                    load) * moe_l * share

    passes = 1 if work.forward_only else 3  # a backward is twice the forward
    # LoRA: the backward skips the frozen weights' gradient GEMMs (the layers' and the head's: as long as their
    # forward GEMMs); the adapters' own GEMMs (x A, then B; forward, and a backward twice it) run beside, at the
    # rate the layers' forward achieves (a lower bound: rank-r GEMMs run further from peak)
    frozen_s = adapter_s = adapter_flops = 0.0
    if work.lora is not None:
        if not work.forward_only:
            frozen_s = fwd.gemm_s + head.gemm_s
        lora_layers = layout.layers_per_stage(spec.layers)
        per_token = sum(work.lora.flops_per_token(spec, i) for i in range(spec.layers)) / spec.layers
        adapter_flops = tokens * per_token * lora_layers / tp
        rate = fwd.flops / fwd.seconds if fwd.seconds > 0 else 0.0
        adapter_s = passes * adapter_flops / rate if rate > 0 else 0.0
    # a full recompute runs the recomputed layers' forward again (recipe_options.recomputed_fraction)
    refwd = recipe_options.recomputed_fraction(layout, round(layers_per_stage)) if layout.recompute == "full" else 0.0
    moe_launch = moe_fwd_host + (0.0 if work.forward_only else moe_bwd_host + refwd * moe_fwd_host)
    permute_s = perm_fwd_host + (0.0 if work.forward_only else perm_bwd_host + refwd * perm_fwd_host)
    launch_s = passes * launch + moe_launch + permute_s
    if work.forward_only:
        compute = fwd.seconds + head.seconds + launch_s + adapter_s
        ep_mb, cp_tp_mb = ep_fwd, tp_fwd + cp_fwd
        recompute_s = 0.0
    else:
        recompute_s = _recompute_s(spec, layout, fwd, dense_l * share, moe_l * share, tp_fwd + ep_fwd,
                                   layers_per_stage)
        compute = 3 * (fwd.seconds + head.seconds) - frozen_s + adapter_s + launch_s
        ep_mb, cp_tp_mb = 2 * ep_fwd, 2 * (tp_fwd + cp_fwd)
    # EP overlap (training: one micro-batch's forward beside another's backward) hides the exchange behind
    # the other micro-batch's layers, which lose the exchange's SMs meanwhile
    ep_exposed, ep_sm_s = moe.overlapped(ep_mb, 3 * fwd.seconds, layout.ep_overlap and not work.forward_only, m)
    comm = cp_tp_mb + ep_exposed
    per_mb = compute + ep_sm_s + comm + recompute_s + vocab_s + loss_host
    p2p = 0.0
    if pp > 1:
        # Megatron's scatter/gather optimization (Narayanan 2021, section 4.1): each tensor-parallel rank
        # sends 1/tp of the activation to the next stage, which all-gathers it over its fast links
        boundary = p2p_s(cluster, act_bytes / tp, tp * cp * dp)
        if not layout.sequence_parallel:
            boundary += all_gather_s(cluster, act_bytes, Group(tp, 1))
        p2p = (1 if work.forward_only else 2) * boundary * v
    per_mb += p2p
    bubble_mbs = (pp - 1) / v
    # 1F1B with a heavier last stage: its m micro-batches in a row, plus the other stages' fill and
    # drain once each (pp - 1 stages without the head; /v with interleaving)
    head_mb = (1 if work.forward_only else 3) * head.seconds + vocab_s + loss_host
    bubble_mb = per_mb - head_mb if pp > 1 else per_mb
    pipeline_s = m * per_mb + bubble_mbs * bubble_mb

    # after the micro-batches: gradient reduction and optimizer. FSDP gathers (ZeRO-3) go one unit at a
    # time: each decoder layer, and the root with the embedding and head (FSDP2's fully_shard per layer)
    units = math.ceil(layers_per_stage) + 1
    dp_s = opt_s = 0.0
    # measured (cpu-local): what FSDP2 adds per unit of a forward, exposed (gloo on the same cores); a
    # backward gathers again and reduce-scatters the gradients: three times the forward's
    fsdp_measured = layout.zero == 3 and dev.fsdp_unit_s > 0 and dp * cp > 1
    fsdp_measured_s = (1 if work.forward_only else 3) * m * units * dev.fsdp_unit_s
    params_dev = memory.params_per_device(spec, layout)
    host_parts: tuple[tuple[str, float], ...] = ()
    if not work.forward_only:
        split = memory.device_params(spec, layout)
        dense_params, expert_params = split.dense, split.expert
        if work.lora is not None:  # the adapters' gradients alone (they shard as the dense weights do)
            dense_params, expert_params = memory.adapter_params_per_device(spec, layout, work.lora), 0.0
        grad_bytes = recipe_options.grad_bytes(layout)  # fp32 main gradients unless the layout's are bf16
        dp_group = Group(dp * cp, tp)
        if layout.zero >= 1:
            sync = reduce_scatter_s(cluster, dense_params * grad_bytes, dp_group) + all_gather_s(
                cluster, dense_params * BF16, dp_group)
        else:
            sync = all_reduce_s(cluster, dense_params * grad_bytes, dp_group)
        if expert_params:
            edp = max(1, dp * cp * tp // ep)
            sync += all_reduce_s(cluster, expert_params * grad_bytes, Group(edp, ep))
        exposed = 1.0 if m == 1 else (1 - DP_OVERLAP.value)
        dp_s = sync * exposed
        if fsdp_measured:
            dp_s = fsdp_measured_s
        elif layout.zero == 3:  # parameters gathered before each micro-batch's forward and backward
            gather = tensorwise_all_gather_s(cluster, params_dev * BF16, Group(dp, tp * cp), units)
            dp_s += max(0.0, 2 * m * gather - pipeline_s) + gather
        # ZeRO shards the optimizer state as the memory model does: dense over dp*cp, experts over dp*cp*tp/ep
        dense_dp, expert_dp = memory.data_parallel_groups(spec, layout) if layout.zero >= 1 else (1, 1)
        owned = dense_params / dense_dp + expert_params / expert_dp  # parameters whose optimizer state it keeps
        opt_s = (1.0 - layout.offload_optimizer) * owned * recipe_options.optimizer_step_traffic_per_param(
            layout, OPTIMIZER_BYTES_PER_PARAM.value) / (dev.hbm_bandwidth_bytes_per_s * HBM[dev.kind].value)
        host_parts = offload.optimizer_offload_parts(owned, layout, dev)
        if layout.offload_activation_layers:
            host_parts += (("activation offload", m * _activation_offload_s(spec, layout, dev, work, mb_seqs, fwd)),)
        if layout.offload_params:  # each micro-batch's forward and backward copy the shards up, overlapped
            fetch = offload.param_fetch_bytes(spec, layout, value_head=work.value_head) / host_copy_bytes_per_s(
                dev, "weights-in", layout.pageable)
            host_parts += ((offload.fetch_label(layout), max(0.0, 2 * m * fetch - pipeline_s) + fetch / units),)
    if work.forward_only and fsdp_measured:
        dp_s = fsdp_measured_s
    elif work.forward_only and layout.zero == 3:  # FSDP forward: gather each micro-batch's weights, overlapped
        gather = tensorwise_all_gather_s(cluster, params_dev * BF16, Group(dp, tp * cp), units)
        dp_s = max(0.0, m * gather - pipeline_s) + gather
    host_s = sum(s for _, s in host_parts)
    per_step = pipeline_s + dp_s + opt_s + host_s
    steps = work.optimizer_steps
    total = per_step * steps

    devices = layout.devices
    flops_dev = (fwd.flops + head.flops / pp) * (1 if work.forward_only else 3) * m  # per device, on average
    if work.lora is not None:  # no frozen weight gradients; the adapters' GEMMs
        frozen_flops = 0.0 if work.forward_only else fwd.gemm_flops + head.gemm_flops / pp
        flops_dev += (passes * adapter_flops - frozen_flops) * m
    if not work.forward_only and layout.recompute == "full":
        flops_dev += fwd.flops * m * recipe_options.recomputed_fraction(layout, round(layers_per_stage))
    if work.forward_only:
        mem = memory.inference_memory(spec, layout, seq_len=work.seq_len, micro_batch=mb_seqs,
                                      value_head=work.value_head)
    else:
        mem = memory.training_memory(spec, layout, seq_len=work.seq_len, micro_batch=mb_seqs,
                                     microbatches_in_flight=m, value_head=work.value_head, dtype=work.dtype,
                                     lora=work.lora)
    bubble_s = bubble_mbs * bubble_mb * steps
    comm_s = (m * (comm + p2p) + dp_s) * steps
    compute_s = (m * (compute + ep_sm_s + recompute_s)) * steps
    pad_s = passes * pad_fwd  # the padded rows' expert work, forward and backward
    parts = (("compute", m * (compute - launch_s + recompute_s - pad_s - adapter_s) * steps),
             ("LoRA adapters' GEMMs", m * adapter_s * steps),
             ("expert capacity padding", m * pad_s * steps),
             ("kernel launches", m * passes * launch * steps),
             (f"log-probs over the vocabulary ({layout.logits})", m * vocab_s * steps),
             ("loss per packed sequence, host", m * loss_host * steps),
             ("MoE kernel launches", m * moe_launch * steps),
             ("MoE permutation, unfused (host)", m * permute_s * steps),
             ("tensor-parallel comm", m * tp_fwd * (1 if work.forward_only else 2) * steps),
             ("context-parallel comm", m * cp_fwd * (1 if work.forward_only else 2) * steps),
             ("expert-parallel comm", m * ep_exposed * steps),
             ("expert-parallel overlap, SMs lent", m * ep_sm_s * steps),
             ("pipeline sends", m * p2p * steps),
             ("pipeline bubble", bubble_s),
             ("gradient sync", dp_s * steps),
             ("optimizer", opt_s * steps)) + tuple((k, s * steps) for k, s in host_parts)
    return StageCost(stage=name, seconds=total, compute_s=compute_s, memory_s=(opt_s + host_s + m * vocab_s) * steps,
                     comm_s=comm_s, overhead_s=bubble_s + m * loss_host * steps,
                     flops=flops_dev * devices * steps,
                     bytes=(fwd.bytes + head.bytes / pp) * m * devices * steps,
                     peak_memory_bytes=mem.total, capacity_bytes=dev.hbm_capacity_bytes,
                     memory_parts=mem.parts(), devices=devices, microbatches=m * steps,
                     parts=tuple(p for p in parts if p[1] > 0))



def _recompute_s(spec: ModelSpec, layout: ParallelLayout, fwd: LayerTime, dense_layers: float, moe_layers: float,
                 comm_s: float, stage_layers: float) -> float:
    """Forward work re-run in the backward of one micro-batch on one stage. Full: the recomputed
    fraction of the stage's layers (recipe_options.recomputed_fraction) with their tensor- and
    expert-parallel collectives. Selective: the attention core (core_attn) plus the GEMM and
    elementwise shares of the other modules (recipe_options), per layer kind."""
    if layout.recompute == "full":
        return recipe_options.recomputed_fraction(layout, round(stage_layers)) * (fwd.seconds + comm_s)
    if layout.recompute != "selective":
        return 0.0
    modules = recipe_options.selective_modules(layout)
    s = fwd.attention_s if "core_attn" in modules else 0.0
    layers = dense_layers + moe_layers
    if not layers:
        return s
    for count, moe_layer in ((dense_layers, False), (moe_layers, True)):
        if count:
            gemm = recipe_options.selective_recompute_share(spec, modules, moe_layer)
            elem = recipe_options.elementwise_recompute_share(spec, modules, moe_layer)
            s += count / layers * (gemm * fwd.gemm_s + elem * fwd.elementwise_s)
    return s


def _activation_offload_s(spec: ModelSpec, layout: ParallelLayout, dev: Device, work: PassWorkload, mb_seqs: float,
                          fwd: LayerTime) -> float:
    """Exposed time of one micro-batch's activation offload (offload_activation_layers): the offloaded
    layers' stored activations go to the host during the forward and come back during the backward over
    the host link (efficiency.host_link_bytes_per_s: PCIe or NVLink-C2C, pinned buffers), each copy
    overlapped with that pass's compute (backward: twice the forward)."""
    per_layer = memory.activation_bytes_per_layer(spec, seq_len=work.seq_len, micro_batch=mb_seqs, tp=layout.tp,
                                                  sequence_parallel=layout.sequence_parallel,
                                                  recompute=layout.recompute, cp=layout.cp)
    copy = layout.offload_activation_layers * per_layer / host_link_bytes_per_s(dev)
    forward = fwd.seconds  # the stage's layers: the whole model (offload needs pp = 1)
    return max(0.0, copy - forward) + max(0.0, copy - 2 * forward)
