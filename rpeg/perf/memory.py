"""Memory per device: weights, gradients, optimizer state, activations, KV cache, buffers.

Training (mixed-precision Adam, Rajbhandari et al. 2020, ZeRO, arXiv 1910.02054): bf16 weights
(2 bytes/param), fp32 main gradients (Megatron accumulates and reduces gradients in fp32:
`grad_dtype_bytes=4`), fp32 master weights + two Adam moments (12 bytes/param). ZeRO-1 shards the
optimizer state over the data-parallel group, ZeRO-2 also the gradients, ZeRO-3 (FSDP) also the
weights. The dense parts' data-parallel group is dp*cp (Megatron's distributed optimizer shards
over data x context parallel ranks); routed experts have their own, dp*cp*tp/ep, because experts are
folded onto the dp*cp*tp ranks with expert tensor parallelism 1 (Liu et al. 2025, "MoE parallel
folding", arXiv 2504.14960).

Activations follow Korthikanti et al. 2022 (arXiv 2205.05198, section 4), tensor by tensor, so the
paper's 34 sbh + 5 as^2 b per GPT layer comes out exactly with `dropout=True, flash_attention=False`
and the same bookkeeping extends to SwiGLU, GQA, q/k norms, MLA and routed experts. The defaults
differ from the paper's runs: dropout=False (Llama and Qwen ship with dropout 0 and the RL
trainers - verl, NeMo-RL, OpenRLHF - keep it so; Megatron's 2022 GPT runs had it) and
FlashAttention (Dao et al. 2022, arXiv 2205.14135), which keeps no s x s matrix, only a fp32
log-sum-exp per head and query. Pipeline schedules: 1F1B's rank r holds pp - r micro-batches at its
peak (Narayanan et al. 2021, arXiv 2104.04473); the interleaved schedule's first rank holds
L(1 + (pp-1)/(pp v)) layers' worth (Korthikanti section 4.2.2). Memory is computed per pipeline stage
(the first one holds the embedding and the most micro-batches; the last one holds the output head
and the logits) and the fullest stage is what `training_memory` returns.

Logits (`MemoryBreakdown.logits`, rpeg/perf/logits.py): a training or log-prob pass turns every token of
its micro-batch into full-vocabulary logits, and the path the system takes from them to log-probs
(ParallelLayout.logits) sets the bytes each (token, vocab/tp) entry holds at the pass's peak: from 2
(verl's bf16 logits with flash-attn's in-place cross-entropy) to 12 (NeMo-RL's DistributedLogprob), or
one chunk's worth where the head is fused with the log-softmax (verl's use_fused_kernels). With long
multi-turn sequences and 150-250k vocabularies this is the largest transient of the pass (slime issue
#2253: 11.6k tokens x 248,320 x 4 bytes = 10.8 GB for one fp32 copy).

Where a figure is a choice rather than a formula, the constant below says why. Tests:
tests/perf/test_perf_memory.py (hand-worked values, the paper's Table 2) and
tests/perf/test_perf_llm_analysis.py (the cross-check against llm-analysis 0.2.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from rpeg.errors import RpegError
from rpeg.graph.layout import ParallelLayout
from rpeg.graph.lora import LoRA
from rpeg.graph.model import ModelSpec
from rpeg.perf import recipe_options
from rpeg.perf.logits import logits_bytes

GB = 1e9
GIB = 2.0**30
BF16_BYTES = 2
ADAM_BYTES_PER_PARAM = 12  # fp32 master weights + first and second moments (ZeRO paper, section 3.1)
LSE_BYTES = 4  # FlashAttention keeps one fp32 log-sum-exp per (head, query) for the backward pass
# A fixed allowance per device for what no tensor formula sees; an estimate from its parts, not a
# measurement: about 1 GiB of CUDA context with the kernel images of PyTorch, cuBLAS and cuDNN
# loaded plus their workspaces; about 1 GiB of NCCL buffers (NCCL_BUFFSIZE is 4 MiB per channel,
# peer and protocol, over the 3-5 communicators of a dp/tp/pp/ep layout); about 1 GiB lost to
# the caching allocator's fragmentation. Calibrate it per system when measurements exist.
BUFFER_BYTES = 3 * GIB
# ZeRO-3 / FSDP gathers each layer's full weights before using it and prefetches the next one:
# two unsharded layers of bf16 weights plus one layer of unsharded gradients before its
# reduce-scatter are live on top of the shards (FSDP2's default forward/backward prefetch of one).
ZERO3_GATHERED_LAYERS = 2


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes per device, by what holds them."""

    weights: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    logits: float = 0.0  # full-vocabulary logits and the log-softmax's temporaries (`logits_bytes`)
    kv_cache: float = 0.0
    buffers: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def fits(self, capacity_bytes: float) -> bool:
        return self.total <= capacity_bytes

    def parts(self) -> tuple[tuple[str, float], ...]:
        """(name, bytes) of every non-zero part, in field order."""
        return tuple((f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name))

    def describe(self) -> str:
        body = ", ".join(f"{name} {b / GB:.1f}" for name, b in self.parts())
        return f"{self.total / GB:.1f} GB per device ({body or 'nothing'})"

    def __add__(self, other: MemoryBreakdown) -> MemoryBreakdown:
        """Two models colocated on the same devices (e.g. actor and reference)."""
        return MemoryBreakdown(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True, slots=True)
class DeviceParams:
    """Parameters one device holds for one pipeline stage, before ZeRO-3 sharding."""

    dense: float  # sharded by ZeRO over the dense data-parallel group, dp*cp
    expert: float  # routed experts: sharded over the expert data-parallel group, dp*cp*tp/ep

    @property
    def total(self) -> float:
        return self.dense + self.expert


# ---- parameters ---------------------------------------------------------------------------------
def stage_layers(spec: ModelSpec, pp: int, *, embedding_loss_slots: bool = False) -> list[range]:
    """The decoder layers of each pipeline stage: as even as possible, the first stages take the
    remainder's extra layers (Megatron needs layers % pp == 0 or an explicit uneven split).
    `embedding_loss_slots` (ParallelLayout.pp_embedding_loss_slots): recipe_options.pipeline_slots."""
    if embedding_loss_slots:
        return recipe_options.pipeline_slots(spec.layers, pp)
    return [range(s * spec.layers // pp, (s + 1) * spec.layers // pp) for s in range(pp)]


def _tp_replicated_params(spec: ModelSpec, index: int) -> int:
    """Parameters of layer `index` that Megatron keeps whole on every tensor-parallel rank: norms,
    q/k norms, MLA's latent norms, row-parallel biases and the MoE router."""
    rep = spec.norm_params()
    if spec.qk_norm:
        rep += 2 * spec.head_dim
    if spec.attention == "mla":
        rep += spec.q_lora_rank + spec.kv_lora_rank
    if spec.linear_bias:
        rep += 2 * spec.hidden  # attention output projection and MLP down projection
    if spec.is_moe and index >= spec.dense_layers:
        rep += spec.router_params()
    return rep


def _layer_device_params(spec: ModelSpec, index: int, tp: int, ep: int) -> DeviceParams:
    if spec.is_moe and index >= spec.dense_layers:
        expert = spec.experts * spec.expert_params() / ep  # expert tensor parallelism 1
        dense = spec.layer_params(index) - spec.experts * spec.expert_params()
    else:
        expert, dense = 0.0, spec.layer_params(index)
    rep = _tp_replicated_params(spec, index)
    return DeviceParams(dense=rep + (dense - rep) / tp, expert=expert)


def device_params(spec: ModelSpec, layout: ParallelLayout, *, stage: int | None = None,
                  value_head: bool = False) -> DeviceParams:
    """Parameters on one device of pipeline `stage` (None: the stage holding the most).

    Decoder layers: dense parts / tp (norms, row-parallel biases and the router whole), routed
    experts / ep at full width. Stage 0 adds the vocab-parallel embedding (/tp) and the position
    table; the last stage the final norm and the output head (/tp) — a copy of the embedding when
    tied and pp > 1, as Megatron keeps one — or a critic's value head (hidden x 1) instead.
    """
    if stage is None:
        return max((device_params(spec, layout, stage=s, value_head=value_head) for s in range(layout.pp)),
                   key=lambda p: p.total)
    tp, pp = layout.tp, layout.pp
    h, vocab_shard = spec.hidden, spec.vocab * spec.hidden / tp
    ep = layout.ep if spec.is_moe else 1
    dense = expert = 0.0
    for i in stage_layers(spec, pp, embedding_loss_slots=layout.pp_embedding_loss_slots)[stage]:
        p = _layer_device_params(spec, i, tp, ep)
        dense, expert = dense + p.dense, expert + p.expert
    if stage == 0:  # a VLM's vision tower sits here too, whole on every tensor-parallel rank (ModelSpec.vision_note)
        dense += vocab_shard + spec.position_embeddings * h + spec.vision_params
    if stage == pp - 1:
        dense += spec.norm_width()  # the final norm
        if value_head:
            dense += h
        elif not spec.tied_embeddings or pp > 1:
            dense += vocab_shard
    return DeviceParams(dense=dense, expert=expert)


def params_per_device(spec: ModelSpec, layout: ParallelLayout, *, value_head: bool = False) -> float:
    """Parameters one device holds before ZeRO-3 sharding, on the fullest pipeline stage."""
    return device_params(spec, layout, value_head=value_head).total


def data_parallel_groups(spec: ModelSpec, layout: ParallelLayout) -> tuple[int, int]:
    """(dense, expert) data-parallel group sizes that ZeRO shards over: dp*cp and dp*cp*tp/ep."""
    dense = layout.dp * layout.cp
    if not spec.is_moe:
        return dense, dense
    folded = layout.dp * layout.cp * layout.tp
    if folded % layout.ep or spec.experts % layout.ep:
        raise RpegError(f"model {spec.name!r}: ep = {layout.ep} must divide dp*cp*tp = {layout.dp}*{layout.cp}*"
                        f"{layout.tp} = {folded} and experts = {spec.experts}")
    return dense, folded // layout.ep


def _sharded(params: DeviceParams, groups: tuple[int, int]) -> float:
    return params.dense / groups[0] + params.expert / groups[1]


def weight_bytes_per_device(spec: ModelSpec, layout: ParallelLayout, dtype_bytes: float = BF16_BYTES, *,
                            value_head: bool = False) -> float:
    """Weight bytes on the fullest stage's device; with zero=3 sharded over the data-parallel
    groups (dense parts over dp*cp, experts over dp*cp*tp/ep)."""
    p = device_params(spec, layout, value_head=value_head)
    if layout.zero == 3:
        return _sharded(p, data_parallel_groups(spec, layout)) * dtype_bytes
    return p.total * dtype_bytes


# ---- activations --------------------------------------------------------------------------------
def _check_recompute(recompute: str) -> None:
    if recompute not in ("none", "selective", "full"):
        raise RpegError(f"recompute must be none, selective or full, not {recompute!r}")


def _act_width(spec: ModelSpec) -> int:
    """Stored MLP intermediates per unit of width, in elements: GELU keeps its input and output
    (Korthikanti's 4sbh + 4sbh); SwiGLU keeps gate, up and their product (the down projection's
    input)."""
    return 3 if spec.ffn_act == "swiglu" else 2


def _layer_bytes_per_token(spec: ModelSpec, index: int, *, seq_len: float, tp: int, sp: bool,
                           recompute: str, flash: bool, dropout: bool,
                           modules: tuple[str, ...] = ("core_attn",), dtype: str = "bf16") -> float:
    """Stored activation bytes of decoder layer `index` per token of a device's sequence slice.

    Three kinds of tensors: `whole` ones every tensor-parallel rank keeps in full (split along the
    sequence under SP), `split` ones divided over tp (per-head or per-column tensors), and K/V,
    divided over min(tp, kv_heads) since ranks past the kv-head count replicate them. `modules`: what
    selective recomputation re-runs (core_attn here, the others: recipe_options.dropped_bytes_per_token).
    `dtype` fp8: the linear layers keep their inputs in FP8 (recipe_options.fp8_saved_input_savings).
    """
    h, b = spec.hidden, BF16_BYTES
    if recompute == "full":
        return b * h / (tp if sp else 1)  # only the layer input (Korthikanti Table 2: 2sbh)
    mask = 1 if dropout else 0  # dropout masks are 1 byte per element
    # attention block: norm input, QKV input, output dropout mask (Korthikanti: 2 + 2 + 1 of its 11)
    whole = b * 2 * h + mask * h
    if spec.attention == "mla":  # the latent path: down-projection outputs and their norms' outputs
        whole += b * (2 * spec.q_lora_rank + spec.kv_lora_rank + spec.rope_head_dim + spec.kv_lora_rank)
        q = k = spec.heads * spec.q_head_dim
        v, kv_div = spec.heads * spec.v_head_dim, tp
    else:
        q, k = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        v, kv_div = k, min(tp, spec.kv_heads)
    split = b * (q + spec.heads * spec.v_head_dim)  # Q and the output projection's input
    kv = b * (k + v)
    if spec.qk_norm:  # per-head norms keep their inputs too
        split, kv = split + b * q, kv + b * k
    if recompute != "selective" or "core_attn" not in modules:  # core_attn: the attention core re-runs
        if flash:
            split += LSE_BYTES * spec.heads
        else:  # softmax output (+ dropout mask and dropout output), per key: Korthikanti's 5as^2b
            split += (b + (b + 1) * mask) * spec.heads * seq_len
    # MLP block: norm input, first linear's input (2 + 2), dropout mask (1) of Korthikanti's 19
    whole += b * 2 * h + mask * h
    act = _act_width(spec)
    if spec.is_moe and index >= spec.dense_layers:
        # each of the k routed copies keeps the expert's input and its intermediates; not its output:
        # Megatron-Core's experts weight by the routing probability inside the activation
        # (experts.py activation_func_with_probs), so the combine is a plain sum with nothing to keep.
        # Tokens spread evenly over ranks and experts (balanced routing)
        split += spec.experts_per_token * b * (h + act * spec.moe_ffn)
        split += spec.shared_experts * b * act * spec.moe_ffn
    else:
        split += b * act * spec.ffn
    stored = whole / (tp if sp else 1) + split / tp + kv / kv_div
    if recompute == "selective":
        stored -= recipe_options.dropped_bytes_per_token(spec, index, modules, tp=tp, sp=sp)
    if dtype == "fp8":
        stored -= recipe_options.fp8_saved_input_savings(spec, index, recompute, modules, tp=tp, sp=sp)
    return stored


def activation_bytes_per_layer(spec: ModelSpec, *, seq_len: float, micro_batch: float, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               flash_attention: bool = True, cp: int = 1, dropout: bool = False,
                               layer: int | None = None) -> float:
    """Activation bytes one decoder layer stores for the backward pass, per device, for one
    micro-batch of `micro_batch` sequences of `seq_len` tokens (Korthikanti et al. 2022, Table 2).

    GPT shapes with dropout=True, flash_attention=False give the paper's formulas exactly:
    sbh(34 + 5as/h); tp t: sbh(10 + 24/t + 5as/(ht)); t + SP: sbh/t (34 + 5as/h); selective drops
    the 5as/h term; full recomputation keeps 2sbh (/t with SP). CP divides the tokens (each rank
    holds s/cp queries; without FlashAttention their scores still span all s keys).
    `layer`: which decoder layer (None: the last, an MoE layer in MoE models).
    """
    _check_recompute(recompute)
    index = spec.layers - 1 if layer is None else layer
    tokens = seq_len * micro_batch / cp
    return tokens * _layer_bytes_per_token(spec, index, seq_len=seq_len, tp=tp, sp=sequence_parallel,
                                           recompute=recompute, flash=flash_attention, dropout=dropout)


def head_activation_bytes(spec: ModelSpec, *, seq_len: float, micro_batch: float, tp: int = 1,
                          sequence_parallel: bool = False, cp: int = 1) -> float:
    """The last stage's output layer: the final norm's input and the head's input (2sbh each, /t
    with SP; Korthikanti section 4.3's 4sbh/t). Its logits are their own line (`logits_bytes`)."""
    tokens = seq_len * micro_batch / cp
    return tokens * 2 * BF16_BYTES * spec.hidden / (tp if sequence_parallel else 1)


def _chunks_in_flight(pp: int, v: int, rank: int, microbatches: int | None) -> float:
    """Micro-batches' worth of a stage's layers that pipeline rank `rank` holds at its peak.

    1F1B: pp - rank micro-batches (Narayanan et al. 2021). Interleaved with v model chunks per
    rank: Megatron's warm-up, 2(pp - rank - 1) + (v - 1)pp chunk-micro-batches plus the one in
    steady state, each 1/v of the stage's layers; for rank 0 that is L(1 + (pp-1)/(pp v)) layers
    (Korthikanti section 4.2.2). `microbatches` (the step's micro-batches per pipeline) caps it.
    """
    if pp == 1:
        return 1.0
    if v == 1:
        held = pp - rank
    else:
        held = (2 * (pp - rank - 1) + (v - 1) * pp + 1) / v
    return float(min(held, microbatches)) if microbatches else float(held)


def adapter_params_per_device(spec: ModelSpec, layout: ParallelLayout, lora: LoRA, stage: int = 0) -> float:
    """The LoRA adapters one device of pipeline `stage` holds: its layers' (rpeg/graph/lora.py), split over
    the tensor-parallel ranks as the layers they sit on are (a lower bound: Megatron keeps one of each pair,
    A or B, whole on every rank)."""
    layers = stage_layers(spec, layout.pp, embedding_loss_slots=layout.pp_embedding_loss_slots)[stage]
    return sum(lora.layer_params(spec, i) for i in layers) / layout.tp


def _zero3_working_set(spec: ModelSpec, layout: ParallelLayout, stage: int, grad_bytes: float,
                       lora: LoRA | None = None) -> float:
    """ZeRO-3's gathered layers, and the gradients of the layer being reduced (with LoRA: its adapters')."""
    layers = stage_layers(spec, layout.pp, embedding_loss_slots=layout.pp_embedding_loss_slots)[stage]
    if layout.zero != 3 or not layers:
        return 0.0
    ep = layout.ep if spec.is_moe else 1
    biggest = max(_layer_device_params(spec, i, layout.tp, ep).total for i in layers)
    if lora is not None:
        return biggest * ZERO3_GATHERED_LAYERS * BF16_BYTES + max(
            lora.layer_params(spec, i) for i in layers) / layout.tp * grad_bytes
    return biggest * (ZERO3_GATHERED_LAYERS * BF16_BYTES + grad_bytes)


# ---- training and inference ---------------------------------------------------------------------
def _trained(spec: ModelSpec, layout: ParallelLayout, stage: int, value_head: bool, groups: tuple[int, int],
             lora: LoRA | None, p: DeviceParams | None = None) -> tuple[float, float]:
    """(parameters with gradients and optimizer state on one device of pipeline `stage`, their ZeRO shard):
    the model's (`p`, its device_params, where the caller has them), or with `lora` its adapters' (which
    shard as the dense weights do)."""
    if lora is not None:
        a = adapter_params_per_device(spec, layout, lora, stage)
        return a, a / groups[0]
    p = device_params(spec, layout, stage=stage, value_head=value_head) if p is None else p
    return p.total, _sharded(p, groups)


def _state_bytes(spec: ModelSpec, layout: ParallelLayout, stage: int, grad_dtype_bytes: float, value_head: bool,
                 host: float, groups: tuple[int, int], lora: LoRA | None = None) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes one device of pipeline `stage` keeps while it trains.

    `host`: the fraction of the optimizer state kept in host memory (ParallelLayout.offload_optimizer).
    It leaves the device, and with ZeRO-2/3 so does that fraction of the gradient partition (ZeRO-Offload
    copies each reduced bucket to pinned host memory: the reduce bucket is the device's working set, as
    without offload); with ZeRO-0/1 the full gradient buffer stays (Megatron's HybridDeviceOptimizer copies
    the gradients of its host part out of the buffer it keeps). `offload_params`: the weight and gradient
    shards live on the host too; what stays is the layers being gathered (`_zero3_working_set`).

    `lora`: the weights frozen in bf16, sharded as the layout says; gradients and optimizer state only for
    the adapters (`adapter_params_per_device`), which sit beside the weights in bf16 and shard alike."""
    p = device_params(spec, layout, stage=stage, value_head=value_head)
    sharded = _sharded(p, groups)
    trained, trained_sharded = _trained(spec, layout, stage, value_head, groups, lora, p)
    adapters = 0.0 if lora is None else trained_sharded if layout.zero == 3 else trained  # beside the weights
    weights = ((sharded if layout.zero == 3 else p.total) + adapters) * BF16_BYTES
    grads = (trained_sharded if layout.zero >= 2 else trained) * grad_dtype_bytes
    optimizer = (trained_sharded if layout.zero >= 1 else trained) * recipe_options.optimizer_bytes_per_param(
        layout) * (1.0 - host)
    if layout.zero >= 2:
        grads *= 1.0 - host
    if layout.offload_params:
        weights = grads = 0.0
    return weights, grads, optimizer


def trainer_state_bytes(spec: ModelSpec, layout: ParallelLayout, *, grad_dtype_bytes: float = 4,
                        value_head: bool = False, lora: LoRA | None = None) -> dict[str, float]:
    """What a trainer keeps on one device between its steps, on its fullest pipeline stage, by
    part (`weights`, `gradients`, `optimizer`): what a colocated engine's phase finds there unless
    it is moved out (ParallelLayout.resident)."""
    groups = data_parallel_groups(spec, layout)
    grad_dtype_bytes = recipe_options.grad_bytes(layout, grad_dtype_bytes)
    stages = [_state_bytes(spec, layout, s, grad_dtype_bytes, value_head, layout.offload_optimizer, groups, lora)
              for s in range(layout.pp)]
    w, g, o = max(stages, key=sum)
    return {"weights": w, "gradients": g, "optimizer": o}


def training_memory_stages(spec: ModelSpec, layout: ParallelLayout, *, seq_len: float, micro_batch: float,
                           microbatches_in_flight: int | None = None, flash_attention: bool = True,
                           offload_optimizer: bool = False, grad_dtype_bytes: float = 4,
                           value_head: bool = False, dropout: bool = False,
                           dtype: str = "bf16", lora: LoRA | None = None) -> list[MemoryBreakdown]:
    """`training_memory` for every pipeline stage, first to last."""
    tp, pp, sp, cp = layout.tp, layout.pp, layout.sequence_parallel, layout.cp
    groups = data_parallel_groups(spec, layout)
    host = max(layout.offload_optimizer, 1.0 if offload_optimizer else 0.0)
    act_kw = dict(seq_len=seq_len, tp=tp, sp=sp, flash=flash_attention, dropout=dropout, dtype=dtype)
    tokens = seq_len * micro_batch / cp
    out = []
    grad_bytes = recipe_options.grad_bytes(layout, grad_dtype_bytes)
    for s, layers in enumerate(stage_layers(spec, pp, embedding_loss_slots=layout.pp_embedding_loss_slots)):
        weights, grads, optimizer = _state_bytes(spec, layout, s, grad_bytes, value_head, host, groups, lora)
        per_mb, working = _stage_activation_bytes(spec, layout, layers, tokens, act_kw)
        in_flight = _chunks_in_flight(pp, layout.pp_interleave, s, microbatches_in_flight)
        acts = in_flight * per_mb + working
        if s == 0 and dropout:  # the embedding's dropout mask, one per micro-batch in flight
            acts += in_flight * tokens * spec.hidden / (tp if sp else 1)
        logits = 0.0
        if s == pp - 1:  # the output layer runs one micro-batch at a time
            acts += head_activation_bytes(spec, seq_len=seq_len, micro_batch=micro_batch, tp=tp,
                                          sequence_parallel=sp, cp=cp)
            logits = logits_bytes(spec, tokens=tokens, tp=tp, path=layout.logits, train=True, value_head=value_head)
        buffers = BUFFER_BYTES + _zero3_working_set(spec, layout, s, grad_bytes, lora)
        peak = MemoryBreakdown(weights=weights, gradients=grads, optimizer=optimizer, activations=acts,
                               logits=logits, buffers=buffers)
        out.append(max(peak, _optimizer_step_phase(spec, layout, s, peak, host, groups, value_head, lora),
                       key=lambda m: m.total))
    return out


def _stage_activation_bytes(spec: ModelSpec, layout: ParallelLayout, layers: range, tokens: float,
                            act_kw: dict) -> tuple[float, float]:
    """(bytes one micro-batch leaves stored on the device over the stage's `layers`, bytes of the working
    set on top: the layer being recomputed or copied to the host holds its full activations once).

    Full recomputation of all layers, or of recompute_layers per model chunk (the others store
    everything); the selective modules of recipe_options; activations of offload_activation_layers
    layers leave the device (recipe_options.offloaded_fraction)."""
    if not layers:
        return 0.0, 0.0
    modules = recipe_options.selective_modules(layout)
    stored = sum(_layer_bytes_per_token(spec, i, recompute=layout.recompute, modules=modules, **act_kw)
                 for i in layers)
    biggest = max(_layer_bytes_per_token(spec, i, recompute="none", **act_kw) for i in layers)
    working = 0.0
    if layout.recompute == "full":
        full = recipe_options.recomputed_fraction(layout, len(layers))
        kept = sum(_layer_bytes_per_token(spec, i, recompute="none", **act_kw) for i in layers)
        stored = full * stored + (1.0 - full) * kept
        working = tokens * biggest  # the layer being recomputed holds everything once
    host = recipe_options.offloaded_fraction(layout, len(layers))
    if host:
        stored *= 1.0 - host
        working = max(working, tokens * biggest)  # the layer in flight to or from the host
    return tokens * stored, working


def _optimizer_step_phase(spec: ModelSpec, layout: ParallelLayout, stage: int, peak: MemoryBreakdown,
                          host: float, groups: tuple[int, int], value_head: bool,
                          lora: LoRA | None = None) -> MemoryBreakdown:
    """The device during the optimizer step: activations freed, and with a bf16 gradient buffer the
    distributed optimizer's fp32 copy of its shard's gradients (recipe_options.step_grad_copy_bytes_per_param)
    next to the buffer."""
    extra = recipe_options.step_grad_copy_bytes_per_param(layout)
    if not extra:
        return peak
    trained, trained_sharded = _trained(spec, layout, stage, value_head, groups, lora)
    owned = trained_sharded if layout.zero >= 1 else trained
    return MemoryBreakdown(weights=peak.weights, gradients=peak.gradients + extra * owned * (1.0 - host),
                           optimizer=peak.optimizer, buffers=peak.buffers)


def training_memory(spec: ModelSpec, layout: ParallelLayout, *, seq_len: float, micro_batch: float,
                    microbatches_in_flight: int | None = None, flash_attention: bool = True,
                    offload_optimizer: bool = False, grad_dtype_bytes: float = 4, value_head: bool = False,
                    dropout: bool = False, dtype: str = "bf16", lora: LoRA | None = None) -> MemoryBreakdown:
    """Peak memory of one device in a training step, on the fullest pipeline stage.

    weights bf16; gradients `grad_dtype_bytes` per parameter (a bf16 layout's grad_dtype: 2); optimizer
    12 bytes per parameter;
    ZeRO stages shard as in the module docstring; what the layout offloads to the host
    (`offload_optimizer`, `offload_params`; `offload_optimizer=True` here offloads all of the
    optimizer state) leaves the device (`_state_bytes`). Activations: the
    stage's layers times the micro-batches its schedule holds (`microbatches_in_flight`, the
    step's micro-batches per pipeline, caps the schedule's count), plus with full recomputation
    one layer's full activations while it is recomputed, plus the output layer's inputs on the last
    stage. Logits: the last stage's micro-batch over the full vocabulary (`logits_bytes`).
    Buffers: the fixed allowance plus, with ZeRO-3, the gathered layers. `dtype`: the GEMMs' precision
    (fp8: the linear layers' saved inputs in FP8). The Megatron-Core recipe options of the layout
    (recompute_modules, recompute_layers, offload_activation_layers, grad_dtype, optimizer_moments):
    rpeg/perf/recipe_options.py; with a bf16 gradient buffer the optimizer step's own peak (its fp32
    gradient copy, activations freed) is the peak when it is larger. `lora`: gradients and optimizer state
    of the adapters alone (`_state_bytes`); the activations as without (an upper bound: a targeted layer's
    adapter A keeps the input a trained layer keeps, a frozen layer without one need not; the adapters'
    r-wide products are left out, under 1% of a layer's at r <= 64).
    """
    stages = training_memory_stages(spec, layout, seq_len=seq_len, micro_batch=micro_batch,
                                    microbatches_in_flight=microbatches_in_flight,
                                    flash_attention=flash_attention, offload_optimizer=offload_optimizer,
                                    grad_dtype_bytes=grad_dtype_bytes, value_head=value_head, dropout=dropout,
                                    dtype=dtype, lora=lora)
    return max(stages, key=lambda m: m.total)


def _forward_bytes_per_token(spec: ModelSpec, index: int, *, seq_len: float, tp: int) -> float:
    """Live bytes per token while one layer runs forward without keeping anything for a backward:
    the residual and the norm output plus the larger of the attention and the MLP working sets."""
    h, b = spec.hidden, BF16_BYTES
    if spec.attention == "mla":
        q = k = spec.heads * spec.q_head_dim
        v, kv_div = spec.heads * spec.v_head_dim, tp
    else:
        q, k = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        v, kv_div = k, min(tp, spec.kv_heads)
    attention = b * (q + spec.heads * spec.v_head_dim) / tp + b * (k + v) / kv_div
    act = _act_width(spec)
    if spec.is_moe and index >= spec.dense_layers:
        mlp = b * (spec.experts_per_token * (2 * h + act * spec.moe_ffn) + spec.shared_experts * act * spec.moe_ffn)
    else:
        mlp = b * act * spec.ffn
    return b * 2 * h + max(attention, mlp / tp)


def inference_memory(spec: ModelSpec, layout: ParallelLayout, *, seq_len: float,
                     micro_batch: float, value_head: bool = False) -> MemoryBreakdown:
    """A forward-only pass (reference or policy log-probs, rewards): weights plus the transient
    activations of one layer (FlashAttention: no s x s scores); on the last stage the micro-batch's
    logits (`logits_bytes`; `value_head`: a critic or reward model's one number per token instead)
    with the head's input, or the layers' working set where that is larger (the two are not live at
    once: activations there are what the peak holds beyond the logits). No gradients or optimizer
    state, and no KV cache kept across calls."""
    tokens = seq_len * micro_batch / layout.cp
    stages = []
    for s, layers in enumerate(stage_layers(spec, layout.pp)):
        p = device_params(spec, layout, stage=s, value_head=value_head)
        weights = BF16_BYTES * (_sharded(p, data_parallel_groups(spec, layout)) if layout.zero == 3 else p.total)
        acts = tokens * max((_forward_bytes_per_token(spec, i, seq_len=seq_len, tp=layout.tp) for i in layers),
                            default=0.0)
        logits = 0.0
        if s == layout.pp - 1:
            logits = logits_bytes(spec, tokens=tokens, tp=layout.tp, path=layout.logits, value_head=value_head)
            head_input = tokens * BF16_BYTES * spec.hidden
            acts = max(acts, head_input + logits) - logits
        buffers = BUFFER_BYTES + _zero3_working_set(spec, layout, s, 0.0)
        stages.append(MemoryBreakdown(weights=weights, activations=acts, logits=logits, buffers=buffers))
    return max(stages, key=lambda m: m.total)


# ---- KV cache -----------------------------------------------------------------------------------
def kv_cache_bytes_per_token(spec: ModelSpec, tp: int = 1, dtype_bytes: float = BF16_BYTES,
                             context: float = 0.0) -> float:
    """KV-cache bytes one token takes on one device, all layers. MHA/GQA: K and V heads split over
    tp, one whole head per rank once tp exceeds kv_heads (vLLM replicates them). MLA caches the
    latent and the rotary key (kv_lora_rank + rope_head_dim per layer), which vLLM keeps whole on
    every tensor-parallel rank. `context`: the sequences' length, for models with sliding-window
    layers (they keep only the window: ModelSpec.kv_elements_per_token)."""
    elements = spec.kv_elements_per_token(context)
    if spec.attention == "mla":
        return elements * dtype_bytes
    return elements * dtype_bytes * math.ceil(spec.kv_heads / tp) / spec.kv_heads


def kv_capacity_tokens(spec: ModelSpec, layout: ParallelLayout, capacity_bytes: float, *,
                       memory_utilization: float = 0.9, activation_reserve_bytes: float = 0.0,
                       context: float = 0.0) -> float:
    """Tokens of KV cache one generation instance can hold, vLLM-style: each device budgets
    `memory_utilization` x capacity (vLLM's gpu_memory_utilization, default 0.9; the rest covers
    CUDA context and NCCL) less its weights and `activation_reserve_bytes`, and fills the rest with
    KV blocks. With pp each stage caches only its own layers; the tightest stage decides."""
    per_token_all_layers = kv_cache_bytes_per_token(spec, layout.tp, context=context)
    tokens = math.inf
    for s, layers in enumerate(stage_layers(spec, layout.pp)):
        weights = BF16_BYTES * device_params(spec, layout, stage=s).total
        free = max(0.0, memory_utilization * capacity_bytes - weights - activation_reserve_bytes)
        if layers:
            tokens = min(tokens, free / (per_token_all_layers * len(layers) / spec.layers))
    return tokens
