"""Time of one decoder layer's forward on one device: GEMMs, attention core, elementwise ops.

Each part is a roofline: time = max(FLOPs / (peak x GEMM efficiency), bytes / (HBM bandwidth x
HBM efficiency)). That is the "curve over operation size": a prefill or training micro-batch of
thousands of tokens is compute-bound, a decode step of a few hundred tokens reads the weights
and the KV cache and is memory-bound, with no per-case factor.

Where the device file holds measured eager-PyTorch layer figures (cpu-local, `rpeg calibrate`'s probe),
a layer's forward is its FLOPs at the matmul rate plus a measured time per token (`_eager`): on a
CPU the attention kernel and the elementwise ops of a small layer do not follow the GPU rooflines.

Shapes per device: tensor parallelism splits heads and MLP width by `tp`; with sequence
parallelism the elementwise work is split too; expert parallelism splits the experts by `ep`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rpeg.graph.model import ModelSpec
from rpeg.hardware.device import Device
from rpeg.perf.efficiency import ATTENTION, DECODE_HBM, GEMM_ROWS_HALF, HBM, gemm_efficiency
from rpeg.perf.flops import attended_keys, attended_pairs
from rpeg.perf.moe import expert_output_bytes, expert_rows_efficiency, quantize_bytes

BF16 = 2


@dataclass(frozen=True, slots=True)
class LayerTime:
    gemm_s: float
    attention_s: float
    elementwise_s: float
    flops: float  # on this device
    bytes: float  # HBM traffic on this device
    gemm_flops: float = 0.0  # the weights' GEMMs' share of `flops` (what a backward's weight gradients repeat)

    @property
    def seconds(self) -> float:
        return self.gemm_s + self.attention_s + self.elementwise_s

    def scaled(self, k: float) -> LayerTime:
        return LayerTime(self.gemm_s * k, self.attention_s * k, self.elementwise_s * k, self.flops * k, self.bytes * k,
                         self.gemm_flops * k)

    def __add__(self, o: LayerTime) -> LayerTime:
        return LayerTime(self.gemm_s + o.gemm_s, self.attention_s + o.attention_s,
                         self.elementwise_s + o.elementwise_s, self.flops + o.flops, self.bytes + o.bytes,
                         self.gemm_flops + o.gemm_flops)


# The attention core's precision under an FP8 recipe: Transformer Engine quantizes the linear layers' GEMMs
# only; its fused attention (dot-product attention) stays in bf16 unless fp8_dot_product_attention is set, which
# is off by default (Megatron-Core TransformerConfig, Megatron-Bridge MixedPrecisionConfig: False; its
# performance recipes turn it on for NVFP4 only). vLLM's fp8 checkpoints likewise run attention in bf16.
ATTENTION_DTYPE = {"fp8": "bf16"}
# An FP8 GEMM's input must be quantized first where no earlier kernel writes it in FP8. Transformer Engine fuses
# the cast into its LayerNorm for the QKV and the MLP's first linear (LayerNormLinear), but the output
# projection's input (fused attention writes bf16) and the second linear's input (Megatron-Core's bias-SwiGLU
# writes bf16), and an MoE layer's permuted expert inputs, take its cast-transpose kernel: read the bf16 tensor
# (2 bytes), write the rowwise FP8 copy for the GEMM (1) and the columnwise copy kept for the weight gradient (1)
FP8_CAST_BYTES = 4


def _rates(device: Device, dtype: str, decode: bool = False) -> tuple[float, float, float]:
    """(GEMM FLOP/s, attention FLOP/s, HBM bytes/s) achieved; decode steps read at DECODE_HBM; the attention
    core at its own precision (ATTENTION_DTYPE)."""
    kind = device.kind
    hbm = DECODE_HBM.value if decode and kind == "gpu" else HBM[kind].value
    attention = device.flop_per_s(ATTENTION_DTYPE.get(dtype, dtype)) * ATTENTION[kind].value
    return (device.flop_per_s(dtype) * gemm_efficiency(device), attention, device.hbm_bandwidth_bytes_per_s * hbm)


def rows_efficiency(rows: float, kind: str) -> float:
    """GEMM_ROWS_HALF: the fraction of the large-GEMM rate a GEMM with `rows` rows (tokens) reaches on a
    device of `kind`."""
    return rows / (rows + GEMM_ROWS_HALF[kind].value) if rows > 0 else 1.0


def experts_touched(spec: ModelSpec, tokens: float) -> float:
    """Expected distinct routed experts a batch of `tokens` hits in one layer (uniform routing)."""
    if not spec.is_moe:
        return 0.0
    miss = (1 - spec.experts_per_token / spec.experts) ** max(tokens, 0.0)
    return spec.experts * (1 - miss)


def layer_forward(spec: ModelSpec, device: Device, *, tokens: float, context: float, tp: int = 1, ep: int = 1,
                  sp: bool = False, moe_layer: bool | None = None, kv_read_tokens: float | None = None,
                  dtype: str = "bf16", flash_attention: bool = True, moe_load: float = 1.0) -> LayerTime:
    """Forward of one layer over `tokens` tokens on one device.

    context: the mean number of keys each token attends to (s/2 for a causal pass over s tokens,
    the current length for a decode step). kv_read_tokens: tokens of KV cache read from HBM
    (decode); None for a pass whose keys are computed on chip (prefill, training). moe_load: the
    tokens the busiest expert-parallel rank's experts get over the mean (moe.busiest_rank_load); the
    time is that rank's, the FLOPs the mean.
    """
    gemm_rate, attn_rate, bw = _rates(device, dtype, decode=bool(kv_read_tokens))
    moe = spec.is_moe if moe_layer is None else moe_layer
    attn_params = spec.attention_params()
    # GEMMs, each a roofline whose compute rate falls off for few rows (GEMM_ROWS curve)
    dense_params = attn_params / tp
    if moe:
        expert = spec.mlp_params(spec.moe_ffn)
        dense_params += spec.shared_experts * expert / tp + spec.router_params()
        mlp_width = (spec.experts_per_token + spec.shared_experts) * spec.moe_ffn
    else:
        dense_params += spec.mlp_params(spec.ffn) / tp
        mlp_width = spec.ffn
    act_bytes = BF16 * tokens * (4 * spec.hidden + 3 * mlp_width) / tp  # GEMM inputs and outputs
    gemm_flops = 2.0 * tokens * dense_params
    weight_bytes = BF16 * dense_params
    gemm_s = max(gemm_flops / (gemm_rate * rows_efficiency(tokens, device.kind)), (weight_bytes + act_bytes) / bw)
    permute_bytes = 0.0
    if moe:
        # Routed experts: spread over `ep` devices at full width (Megatron EP, vLLM EP) or, without
        # expert parallelism, each split over the tensor-parallel ranks (vLLM's default). Each
        # expert is its own GEMM (a grouped GEMM) over the tokens routed to it.
        spread = ep if ep > 1 else 1
        width_split = 1 if ep > 1 else tp
        # experts' GEMMs follow the grouped-GEMM curve over rows per expert (moe.expert_rows_efficiency); in fp8
        # each expert's input is quantized first (moe.quantize_bytes); the output write adds (moe.expert_output_bytes)
        assignments = tokens * spec.experts_per_token * moe_load  # the busiest device's share, after dispatch
        touched = experts_touched(spec, tokens * spread) / spread
        rows = assignments / max(touched, 1e-9)
        e_flops = 2.0 * assignments * expert / tp
        e_bytes = BF16 * touched * expert / width_split
        e_out = expert_output_bytes(spec, assignments, tp)  # written after each expert GEMM's short K loop
        e_rate = gemm_rate * expert_rows_efficiency(rows, device.kind, dtype)
        gemm_s += max(e_flops / e_rate, e_bytes / bw) + e_out / bw
        gemm_flops += e_flops / moe_load
        weight_bytes += e_bytes
        permute_bytes = 4 * BF16 * assignments * spec.hidden / tp  # permute in and out, read and write
        permute_bytes += quantize_bytes(spec, assignments, tp, dtype)
    # attention core: QK^T and AV, over the keys each layer attends to on average (flops.attended_*:
    # sliding-window layers at most their window, linear-attention layers none)
    heads = spec.heads / tp
    if spec.layer_types:
        span = max(2 * context - 1, 0.0)  # the pass's length, from its mean causal context (S + 1) / 2
        if kv_read_tokens:
            context = attended_keys(spec, context)
        else:
            context = attended_pairs(spec, span) / span if span > 0 else 0.0
    keys = context if flash_attention else 2 * context
    attn_flops = 2.0 * tokens * keys * heads * (spec.q_head_dim + spec.v_head_dim)
    score_bytes = 0.0 if flash_attention else 4 * BF16 * tokens * keys * heads  # write, read, write, read
    kv_bytes = 0.0
    if kv_read_tokens:
        per_token = spec.kv_elements_per_token(kv_read_tokens / max(tokens, 1e-9)) / spec.layers * BF16
        if spec.attention != "mla":
            per_token /= min(tp, spec.kv_heads)
        kv_bytes = kv_read_tokens * per_token
    attention_s = max(attn_flops / (attn_rate if flash_attention else gemm_rate), (kv_bytes + score_bytes) / bw)
    # elementwise: norms, residual adds, rotary, activation function (read + write, bf16)
    elem_bytes = BF16 * tokens * (2 * 4 * spec.hidden + 3 * mlp_width) / tp + permute_bytes
    if dtype == "fp8":  # FP8_CAST_BYTES (the backward's casts of the output gradients: its 2x the forward)
        cast = spec.heads * spec.v_head_dim + mlp_width + (spec.experts_per_token * spec.hidden if moe else 0)
        elem_bytes += FP8_CAST_BYTES * tokens * cast / tp
    if not sp:
        elem_bytes += BF16 * tokens * 2 * 4 * spec.hidden * (1 - 1 / tp)  # norms/residuals replicated over tp
    elementwise_s = elem_bytes / bw
    flops, traffic = gemm_flops + attn_flops, weight_bytes + act_bytes + kv_bytes + score_bytes + elem_bytes
    if device.layer_token_s > 0:
        return dataclasses.replace(_eager(device, tokens, flops, traffic, gemm_rate, bw), gemm_flops=gemm_flops)
    return LayerTime(gemm_s, attention_s, elementwise_s, flops, traffic, gemm_flops)


def _eager(device: Device, tokens: float, flops: float, traffic: float, rate: float, bw: float) -> LayerTime:
    """A layer (or the head) as eager PyTorch runs it where that was measured (cpu-local: `rpeg
    calibrate`'s probe): its FLOPs at the matmul rate (GEMM_ROWS curve; or its traffic at the memory
    bandwidth if that is longer: a large model's decode step), plus the measured time per token of the
    elementwise ops and the attention kernel, which on a CPU cost per token at small widths."""
    gemm_s = max(flops / (rate * rows_efficiency(tokens, device.kind)), traffic / bw)
    return LayerTime(gemm_s, 0.0, tokens * device.layer_token_s, flops, traffic)


def eager_host_s(device: Device, layers: float) -> float:
    """Host time of one eager forward call through `layers` decoder layers where it was measured
    (cpu-local's `layer_host_us`: the dispatcher and Python time of a layer's forward, per call; the
    model call and its output head count as one layer more); 0 elsewhere (GPU devices: the
    kernel-launch terms of perf.training and the engine's step overhead)."""
    return device.layer_host_s * (layers + 1) if device.layer_host_s > 0 else 0.0


def head_forward(spec: ModelSpec, device: Device, *, tokens: float, tp: int = 1, dtype: str = "bf16",
                 decode: bool = False, value_head: bool = False) -> LayerTime:
    """The output projection to the vocabulary (and its softmax/logprob) for `tokens` tokens; with
    `value_head`, a critic's or reward model's scalar head instead (hidden x 1 per token: a GEMV
    that reads the final hidden states once, no logits)."""
    if value_head:
        _, _, bw = _rates(device, dtype, decode)
        traffic = BF16 * (tokens * spec.hidden / tp + spec.hidden)
        flops = 2.0 * tokens * spec.hidden / tp
        return LayerTime(0.0, 0.0, traffic / bw, flops, traffic, flops)
    gemm_rate, _, bw = _rates(device, dtype, decode)
    flops = 2.0 * tokens * spec.vocab * spec.hidden / tp
    weight_bytes = BF16 * spec.vocab * spec.hidden / tp
    logits_bytes = 4 * tokens * spec.vocab / tp * 2  # fp32 logits written and read by the log-softmax
    if device.layer_token_s > 0:
        return dataclasses.replace(_eager(device, tokens, flops, weight_bytes + logits_bytes, gemm_rate, bw),
                                   gemm_flops=flops)
    gemm_s = max(flops / gemm_rate, (weight_bytes + BF16 * tokens * spec.hidden) / bw)
    return LayerTime(gemm_s, 0.0, logits_bytes / bw, flops, weight_bytes + logits_bytes, flops)
