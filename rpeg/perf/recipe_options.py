"""Megatron-Core recipe options: what each one does to a training step's memory and time.

The options are ParallelLayout fields (rpeg/graph/layout.py), each as Megatron-Core names it:

- recompute_modules (TransformerConfig.recompute_modules with recompute_granularity "selective"):
  the submodules whose stored activations are dropped and recomputed in the backward pass.
  "layernorm", "moe_act" and "mla_up_proj" discard their outputs (CheckpointWithoutOutput);
  "core_attn", "mlp", "moe" and "shared_experts" checkpoint the whole submodule and keep only its
  input. "mlp" applies to dense MLP layers only (TransformerLayer: `if not self.is_moe_layer`).
- recompute_layers (recompute_granularity "full", recompute_method "block", recompute_num_layers):
  the first N layers of each model chunk keep only their input; the others keep everything.
- offload_activation_layers (cpu_offloading, cpu_offloading_num_layers; Transformer Engine's
  get_cpu_offload_context): the stored activations of that many layers are copied to host memory
  during the forward and back before their backward, overlapped with the other layers' compute.
- grad_dtype: the DDP gradient buffer, fp32 (Megatron's default) or bf16 (grad_reduce_in_fp32
  false: every Megatron-Bridge performance recipe, perf_recipes/_common.py `_benchmark_common`).
  With bf16 buffers the distributed optimizer makes an fp32 copy of its shard's gradients for the
  step (DistributedOptimizer._copy_model_grads_to_main_grads: `shard_model_grad.float()`) unless
  the optimizer is precision-aware (it reads the bf16 shard: `decoupled_grad`).
- pp_embedding_loss_slots (account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split):
  the embedding and the loss each take one layer's slot of the pipeline split (pipeline_slots).
- optimizer_moments: Adam's moments, fp32 or bf16 (use_precision_aware_optimizer with
  exp_avg_dtype = exp_avg_sq_dtype = bfloat16, e.g. the DeepSeek-V3 recipes); fp32 master weights.

Byte counts per token follow rpeg/perf/memory.py's tensor bookkeeping (Korthikanti et al. 2022).
Tests: tests/perf/test_perf_recipe_options.py (hand-computed cases).
"""

from __future__ import annotations

from rpeg.graph.layout import ParallelLayout
from rpeg.graph.model import ModelSpec

BF16_BYTES = 2
FP32_BYTES = 4
MASTER_BYTES = 4  # fp32 master weights, whatever the moments' dtype (Megatron's main_params_dtype fp32)
# Transformer Engine's FP8 linear layers (Linear, LayerNormLinear, GroupedLinear) save for the backward the
# quantized copy of their input that the forward GEMM used (one byte per element; only the columnwise copy
# for the weight gradient), not the bf16 input; MXFP8 adds one E8M0 scale per 32 elements (per-tensor
# scaling: one scale per tensor, nothing per element)
FP8_SAVED_BYTES = 1.0 + 1.0 / 32


def selective_modules(layout: ParallelLayout) -> tuple[str, ...]:
    """The submodules that selective recomputation re-runs: the layout's, or Megatron's default."""
    return layout.recompute_modules or ("core_attn",)


def dropped_bytes_per_token(spec: ModelSpec, index: int, modules: tuple[str, ...], *, tp: int, sp: bool) -> float:
    """Bytes per token of decoder layer `index` that the selective `modules` other than core_attn stop
    storing (memory.py handles core_attn: the attention core's softmax statistics), on one device.

    layernorm: both norms' outputs (the QKV and the MLP's first-linear inputs, b h each, whole on every
    tensor-parallel rank unless SP splits them). mla_up_proj: Q, K and V after MLA's up projections and
    RoPE (b heads (2 q_head_dim + v_head_dim), split over tp). mlp (dense layers): the MLP's intermediates
    (b act ffn / tp), its input kept. moe (MoE layers): every routed copy's input and intermediates
    (b k (h + act moe_ffn) / tp) and the shared experts' intermediates. moe_act: the activation
    function's output of every routed copy (b k moe_ffn / tp). shared_experts: the shared experts'
    intermediates.
    """
    b, h = BF16_BYTES, spec.hidden
    act = 3 if spec.ffn_act == "swiglu" else 2
    moe_layer = spec.is_moe and index >= spec.dense_layers
    whole = split = 0.0
    if "layernorm" in modules:
        whole += 2 * b * h
    if "mla_up_proj" in modules and spec.attention == "mla":
        split += b * spec.heads * (2 * spec.q_head_dim + spec.v_head_dim)
    if "mlp" in modules and not moe_layer:
        split += b * act * spec.ffn
    if moe_layer:
        routed = spec.experts_per_token * b * (h + act * spec.moe_ffn)
        shared = spec.shared_experts * b * act * spec.moe_ffn
        if "moe" in modules:
            split += routed + shared
        else:
            if "moe_act" in modules:
                split += spec.experts_per_token * b * spec.moe_ffn
            if "shared_experts" in modules:
                split += shared
    return whole / (tp if sp else 1) + split / tp


def fp8_saved_input_savings(spec: ModelSpec, index: int, recompute: str, modules: tuple[str, ...], *, tp: int,
                            sp: bool) -> float:
    """Bytes per token that FP8 linear layers save over bf16 in decoder layer `index`: each GEMM input still
    stored (memory.py's bookkeeping) at FP8_SAVED_BYTES instead of 2. The GEMM inputs: the QKV and the MLP's
    first linear's inputs (the norms' outputs, h each, whole unless SP), MLA's latent-norm outputs (the up
    projections' inputs), the output projection's input, the dense MLP's second linear's input (ffn), and
    for each routed copy its first (h) and second (moe_ffn) expert linears' inputs, the shared experts'
    second linear's input. Full recomputation keeps only the layer input (no GEMM input); selective modules
    that drop a GEMM input (layernorm, mlp, moe, moe_act, shared_experts) leave nothing to save there, and
    "mlp" / "moe" checkpoint their input (the norm output) as it is, in bf16."""
    if recompute == "full":
        return 0.0
    modules = modules if recompute == "selective" else ()
    moe_layer = spec.is_moe and index >= spec.dense_layers
    whole = split = 0.0
    if "layernorm" not in modules:
        whole += spec.hidden  # the QKV input
        kept_bf16 = "moe" in modules if moe_layer else "mlp" in modules
        if not kept_bf16:
            whole += spec.hidden  # the MLP's (or the experts' and router's) input
    if spec.attention == "mla":
        whole += spec.q_lora_rank + spec.kv_lora_rank
    split += spec.heads * spec.v_head_dim  # the output projection's input
    if moe_layer and "moe" not in modules:
        split += spec.experts_per_token * spec.hidden
        if "moe_act" not in modules:
            split += spec.experts_per_token * spec.moe_ffn
        if "shared_experts" not in modules:
            split += spec.shared_experts * spec.moe_ffn
    elif not moe_layer and "mlp" not in modules:
        split += spec.ffn
    return (BF16_BYTES - FP8_SAVED_BYTES) * (whole / (tp if sp else 1) + split / tp)


def pipeline_slots(layers: int, pp: int) -> list[range]:
    """The decoder layers of each pipeline stage when the embedding and the loss each take a layer's
    slot in the split (Megatron-Core's account_for_embedding_in_pipeline_split and
    account_for_loss_in_pipeline_split, or a pipeline_model_parallel_layout such as Megatron-Bridge's
    DeepSeek-V3 "Et|(tt|)*30mL"): layers + 2 slots as even as possible, the first stages taking the
    remainder; the first stage's first slot is the embedding and the last stage's last is the loss."""
    slots = layers + 2
    bounds = [-(-s * slots // pp) for s in range(pp + 1)]
    return [range(max(0, bounds[s] - 1), min(layers, bounds[s + 1] - 1)) for s in range(pp)]


def recomputed_fraction(layout: ParallelLayout, stage_layer_count: int) -> float:
    """The fraction of a pipeline stage's layers that full recomputation re-runs: all of them, or
    recompute_layers of each of its pp_interleave model chunks (block method)."""
    if layout.recompute != "full":
        return 0.0
    if not layout.recompute_layers or stage_layer_count == 0:
        return 1.0
    return min(1.0, layout.recompute_layers * layout.pp_interleave / stage_layer_count)


def offloaded_fraction(layout: ParallelLayout, stage_layer_count: int) -> float:
    """The fraction of a stage's layers whose stored activations live in host memory between their
    forward and backward; the layer being copied is on the device too (`offload_staging_layers`)."""
    if not layout.offload_activation_layers or stage_layer_count == 0:
        return 0.0
    return min(1.0, layout.offload_activation_layers / stage_layer_count)


def grad_bytes(layout: ParallelLayout, default: float = FP32_BYTES) -> float:
    """Bytes per parameter of the gradient buffer: the layout's bf16, or `default` (fp32)."""
    return BF16_BYTES if layout.grad_dtype == "bf16" else default


def optimizer_bytes_per_param(layout: ParallelLayout) -> float:
    """Optimizer state per owned parameter: fp32 master weights and two moments (ZeRO's 12 bytes), or
    8 with the precision-aware optimizer's bf16 moments."""
    moment = BF16_BYTES if layout.optimizer_moments == "bf16" else FP32_BYTES
    return MASTER_BYTES + 2 * moment


def step_grad_copy_bytes_per_param(layout: ParallelLayout) -> float:
    """Bytes per owned parameter the optimizer step adds: the distributed optimizer's fp32 copy of a
    bf16 gradient shard (none with fp32 buffers, where `.float()` is the buffer itself, nor with the
    precision-aware optimizer, which reads the bf16 shard)."""
    return FP32_BYTES if layout.grad_dtype == "bf16" and layout.optimizer_moments == "fp32" else 0.0


def optimizer_step_traffic_per_param(layout: ParallelLayout, fp32_traffic: float) -> float:
    """HBM bytes per owned parameter of the Adam step, from `fp32_traffic` (efficiency.
    OPTIMIZER_BYTES_PER_PARAM, fp32 gradients and moments): bf16 moments read and write 2 bytes each
    instead of 4 (8 fewer), a bf16 gradient shard is read and zeroed at 2 bytes instead of 4 (4 fewer)."""
    traffic = fp32_traffic
    if layout.optimizer_moments == "bf16":
        traffic -= 2 * 2 * (FP32_BYTES - BF16_BYTES)
    if layout.grad_dtype == "bf16":
        traffic -= 2 * (FP32_BYTES - BF16_BYTES)
    return traffic


def selective_recompute_share(spec: ModelSpec, modules: tuple[str, ...], moe_layer: bool) -> float:
    """The share of a layer's GEMM time that the selective `modules` other than core_attn re-run in the
    backward: by FLOPs per token, the MLP's (dense layers, "mlp"), the routed and shared experts'
    ("moe"), the shared experts' ("shared_experts"), MLA's up projections ("mla_up_proj"). layernorm
    and moe_act re-run elementwise ops only (their time: `elementwise_recompute_share`)."""
    attn = spec.attention_params()
    if moe_layer:
        expert = spec.mlp_params(spec.moe_ffn)
        routed, shared = spec.experts_per_token * expert, spec.shared_experts * expert
        total = attn + routed + shared
        mlp = (routed + shared) if "moe" in modules else (shared if "shared_experts" in modules else 0.0)
    else:
        total = attn + spec.mlp_params(spec.ffn)
        mlp = spec.mlp_params(spec.ffn) if "mlp" in modules else 0.0
    up = 0.0
    if "mla_up_proj" in modules and spec.attention == "mla":
        up = spec.q_lora_rank * spec.heads * spec.q_head_dim + spec.kv_lora_rank * spec.heads * (
            spec.q_head_dim - spec.rope_head_dim + spec.v_head_dim)
    return (mlp + up) / total if total else 0.0


def elementwise_recompute_share(spec: ModelSpec, modules: tuple[str, ...], moe_layer: bool) -> float:
    """The share of a layer's elementwise traffic (perf.compute: 8h for norms, residual adds and
    rotary, 3 x MLP width for the activation function, per token) that "layernorm" (its two norms,
    read and write: 4h) and "moe_act" (the routed experts' activation: 3 k moe_ffn) re-run."""
    width = (spec.experts_per_token + spec.shared_experts) * spec.moe_ffn if moe_layer else spec.ffn
    total = 8 * spec.hidden + 3 * width
    share = 4 * spec.hidden if "layernorm" in modules else 0.0
    if moe_layer and "moe_act" in modules:
        share += 3 * spec.experts_per_token * spec.moe_ffn
    return share / total
