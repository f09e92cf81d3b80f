"""Mixture of experts as it runs: the expert-parallel exchange, routing imbalance, the grouped expert
GEMMs and the host time of an MoE layer. Pure functions; `compute.layer_forward`'s MoE branch,
`training.pass_cost` and `generation._StepModel` call them.

- The exchange (dispatch before the experts, combine after, each one direction of bf16 hidden
  states per token copy). What a token costs depends on the dispatcher (ParallelLayout.dispatcher):
  `alltoall` sends one copy per (token, expert) pair (Megatron's --moe-token-dispatcher-type
  alltoall: the permuted tokens are split by destination rank); `allgather` gathers every token of
  the group to every rank; `deepep` and `hybridep` (Megatron's flex dispatcher) send a token once
  per destination rank, and across a scale-out network once per destination node, which forwards it
  over NVLink to its ranks there (DeepEP README: "kernels optimized for asymmetric-domain bandwidth
  forwarding, such as forwarding data from NVLink domain to RDMA domain"). With top-k of E experts
  spread evenly over g groups (ranks or nodes), a token reaches a group with probability
  1 - C(E - E/g, k) / C(E, k) (`hit_probability`): 6.6 of 16 ranks and 1.99 of 2 nodes for Qwen3's
  top-8 of 128, where the per-pair all-to-all sends 8 copies, 4 of them across the network. A model
  with node-limited routing (ModelSpec.expert_groups / groups_per_token: DeepSeek-V3 draws its 8
  experts from 4 of 8 groups) reaches fewer nodes: 3.2 of 7 others for DeepSeek-V3 on 8 nodes, not 4.6.
  What one rank sends: its own tokens, 1/tp of the micro-batch's with tensor parallelism (sequence
  parallel, as Megatron requires for MoE: `dispatched_tokens`); in bf16 both ways, as Megatron's flex
  dispatcher sends them (megatron/core/transformer/moe/fused_a2a.py: "HybridEP dispatcher does not
  support fp8 dispatch now", and its DeepEP path passes fp8_dispatch false), whatever the GEMMs' dtype.
  Across nodes each GPU's own NIC carries its copies at the link's rate (LINK[infiniband] 0.9 of a
  400 Gb/s CX7 port, 45 GB/s): DeepEP's normal kernels reach a bottleneck RDMA bandwidth of 43-58 GB/s
  per H800 and CX7 at EP16-64 (README, DeepSeek-V3 pretraining setting), counting the own node's share.
  An iteration runs the exchange four times per MoE layer and micro-batch (dispatch and combine in the
  forward, their gradients in the backward); a full recompute re-runs the recomputed layers' forward
  exchanges (training._recompute_s), a selective one (the recipes' moe_act, mlp, mla_up_proj) none.
- Overlap (ParallelLayout.ep_overlap, training only: it pairs one micro-batch's forward with
  another's backward, so it needs two of them): the exchange hides behind the other micro-batch's
  compute, which meanwhile loses the SMs the exchange runs on (EP_OVERLAP_SM_SHARE).
- Routing (ParallelLayout.routing): balanced (forced, as benchmarks run) or natural, where the
  busiest of the ep ranks sets the time of the expert GEMMs and of the exchange (`busiest_rank_load`);
  with an expert capacity (ParallelLayout.capacity_factor) every expert is padded to it instead; with a
  per-rank capacity (ParallelLayout.rank_capacity_factor, the full-iteration-graph recipes') the expert
  part runs over the rank's whole static buffer (`expert_buffer_load`: the `expert capacity padding` line),
  while the exchange sends only the routed tokens.
- Grouped GEMMs: each local expert's GEMM over the rows routed to it follows a curve over rows per
  expert (GROUPED_GEMM_ROWS_HALF, by dtype), and writes its output after its short K loop, a write
  that adds to its time (`expert_output_bytes`); in fp8 each expert input is quantized first
  (`quantize_bytes`). Both are why fp8 buys little on small experts: they do not shrink with the rate.
- Host time: an MoE layer's forward launches LAYER_KERNELS kernels plus MOE_KERNELS_PER_EXPERT per
  local expert. The dropless dispatcher copies the per-expert token counts to the host every layer
  (a device-to-host sync; DeepEP and HybridEP wait on the host for their receive counts likewise), so
  in the forward the host cannot queue the layer's kernels ahead of the GPU and each costs the host
  time of one framework op (HOST_OP_S); the backward, without a sync, costs each of its kernels
  its launch and tail (KERNEL_LAUNCH_S; `moe_host_s`), as does a forward padded to an expert or a
  rank capacity, whose shapes are known without a sync. Full CUDA graphs (ParallelLayout.cuda_graphs =
  full) remove both; partial graphs capture the attention and dense parts only; the moe_router scope
  (with moe_preprocess) captures the router's and the dispatcher preprocessing's kernels (ROUTER_KERNELS,
  fitted), the moe scope (drop-and-pad only) the whole MoE layer (`moe_launches`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rpeg.graph.layout import graph_scopes
from rpeg.graph.model import ModelSpec
from rpeg.hardware.topology import Cluster
from rpeg.perf.collectives import Group, exchange_s
from rpeg.perf.efficiency import (EP_OVERLAP_SM_SHARE, GEMM_ROWS_HALF, GROUPED_GEMM_ROWS_HALF, KERNEL_LAUNCH_S,
                                  MOE_KERNELS_PER_EXPERT, UNFUSED_CHUNK_BWD_S, UNFUSED_CHUNK_S,
                                  UNFUSED_PERMUTE_KERNELS)
from rpeg.perf.fitted import declare

# ---- fitted constants (rpeg/perf/fitted.py; values in rpeg/data/fitted.yaml, `python scripts/fit_factors.py`) ----
# Fitted on the Megatron-Core training iterations of both files; a row run under a condition the model has no
# mechanism for (packing) is left out (rpeg/perf/fit.py), and each group keeps only the rows it moves.
_TRAINING_ROWS = ("megatron-bridge:training", "megatron-lm-moe-recipes:training")
ROUTER_KERNELS = declare(
    "moe.router_kernels", unit="kernels per MoE layer forward", bounds=(0.5, 40.0), rows=_TRAINING_ROWS,
    group="moe-graph-scopes",
    mechanism="the kernels of moe.layer_kernels that the moe_router and moe_preprocess CUDA-graph scopes capture "
              "(Megatron-Core TransformerConfig.cuda_graph_modules: 'operations in TransformerLayer._forward_mlp() up "
              "to MoELayer.router()' and 'operations in MoELayer.preprocess()': the pre-MLP norm, the router GEMM, "
              "score and top-k, the aux loss and token counts, the dispatcher's metadata), replayed by one graph "
              "launch; they run before the dispatcher's device-to-host sync. How many a recipe's fusions leave is "
              "not published")
ROUTING_LOAD_CV = declare(
    "moe.routing_load_cv", unit="coefficient of variation", bounds=(0.02, 1.0), rows=_TRAINING_ROWS,
    group="moe-routing",
    mechanism="natural routing: the spread (coefficient of variation) of one expert's load over a batch's mean under "
              "aux-loss balancing; the busiest of ep ranks holding E/ep experts each carries 1 + cv sqrt(2 ln ep) / "
              "sqrt(E/ep) of the mean (the expected maximum of ep near-normal loads; busiest_rank_load). The "
              "aux-loss-free balancing paper (Wang et al. 2024, arXiv 2408.15664) reports the busiest expert of a "
              "batch well above the mean (MaxVio of order 0.5) under aux-loss control; no per-rank figure is "
              "published")
LAYER_KERNELS = declare(
    "moe.layer_kernels", unit="kernels per MoE layer forward", bounds=(10.0, 200.0), rows=_TRAINING_ROWS,
    group="moe-host",
    mechanism="the kernels of a Megatron-Core MoE layer's forward besides the per-expert GEMMs "
              "(MOE_KERNELS_PER_EXPERT): the router GEMM, score function and top-k, the aux loss and token counts, "
              "permute (argsort, gather), the dispatcher's pre-processing and its two exchanges, sort by expert, the "
              "activation, unpermute and the weighted combine (megatron/core/transformer/moe/), each launched by the "
              "host; how many a recipe's fusions leave is not published")
HOST_OP_S = declare(
    "moe.host_op_s", unit="s per kernel (x86 host)", bounds=(4e-6, 1e-4), rows=_TRAINING_ROWS, group="moe-host",
    mechanism="host time of one framework op of an MoE layer's forward on an x86 host (HOST_TIME scales it on "
              "Grace), paid in full because the GPU waits for it: after the dropless dispatcher's device-to-host "
              "sync nothing is queued (moe_host_s). At least a launch (KERNEL_LAUNCH_S, 4 us); a Transformer Engine "
              "Linear forward took 13.5 us of CPU time on a DGX H100's Xeon 8480C (TransformerEngine issue #2053, "
              "2025), but most of the layer's ops are lighter than a Linear")

BF16 = 2
# fp8 GEMM inputs: Transformer Engine's cast-transpose reads the bf16 input (2 B) and writes it in fp8 (1 B) and,
# for the backward's weight gradient, transposed in fp8 (1 B) once more
QUANTIZE_BYTES_PER_ELEMENT = 4


def _miss(pool: float, unit: float, top_k: int) -> float:
    """C(pool - unit, k) / C(pool, k): k distinct experts drawn uniformly from `pool` miss all `unit` of them."""
    miss = 1.0
    for i in range(top_k):
        miss *= max(0.0, (pool - unit - i) / (pool - i))
    return miss


def hit_probability(experts: int, top_k: int, groups: float, expert_groups: int = 0,
                    groups_per_token: int = 0) -> float:
    """The probability that a token's top_k distinct experts include one of a given unit's, with `experts`
    spread evenly over `groups` units (ranks or nodes), consecutive experts to a unit. Uniform routing:
    1 - C(E - E/u, k) / C(E, k). Node-limited routing (ModelSpec.expert_groups G, groups_per_token g:
    DeepSeek-V3's n_group 8, topk_group 4) draws the k experts from the g E/G experts of g groups only; under
    forced balance (random router logits) the g groups are a uniform draw of G. A unit inside one group is
    hit with probability g/G (1 - C(gE/G - E/u, k) / C(gE/G, k)); a unit of h whole groups misses with
    probability sum_j P(j) C(gE/G - j E/G, k) / C(gE/G, k), P(j) the hypergeometric chance that j of its h
    groups are among the g drawn. DeepSeek-V3 on 8 nodes of 32 experts each: a token reaches 0.45 of the
    other nodes (3.2 of 7) against 0.66 (4.6 of 7) with uniform routing."""
    if groups <= 1:
        return 1.0
    per = experts / groups
    big, g = expert_groups, groups_per_token
    size = experts / big if big else 0.0
    aligned = big > 1 and 0 < g < big and (size % per == 0 if per < size else per % size == 0)
    if not aligned:  # no node limit (or units that straddle groups: taken as uniform)
        return 1.0 - _miss(experts, per, top_k)
    pool = g * size
    if per < size:
        return g / big * (1.0 - _miss(pool, per, top_k))
    h = round(per / size)
    miss = sum(math.comb(h, j) * math.comb(big - h, g - j) / math.comb(big, g) * _miss(pool, j * size, top_k)
               for j in range(min(h, g) + 1))
    return 1.0 - miss


@dataclass(frozen=True, slots=True)
class Copies:
    """Copies of one token's hidden state a rank sends in one direction of the exchange: to ranks
    of its own node (`inside`) and across the level above (`outside`)."""

    inside: float
    outside: float


def token_copies(spec: ModelSpec, ep: int, ranks_per_node: int, dispatcher: str, scale_out: bool) -> Copies:
    """Copies per token for `ep` ranks, `ranks_per_node` of them per node; `scale_out`: the level
    above the node is a network (a deduplicating dispatcher sends once per node across it)."""
    n, k, experts = ep, spec.experts_per_token, spec.experts
    r = max(1, min(ranks_per_node, n))
    if n <= 1:
        return Copies(0.0, 0.0)
    if dispatcher == "allgather":
        return Copies(r - 1.0, float(n - r))
    if dispatcher == "alltoall":
        return Copies(k * (r - 1) / n, k * (n - r) / n)
    limit = spec.expert_groups, spec.groups_per_token
    p_rank = hit_probability(experts, k, n, *limit)
    nodes = n / r
    if scale_out and nodes > 1:
        # once to each destination node over the network, then from there to its destination ranks over
        # NVLink (by symmetry each rank forwards as many as it sends): (r - 1) p_rank per node, own included
        return Copies(nodes * (r - 1) * p_rank, (nodes - 1) * hit_probability(experts, k, nodes, *limit))
    return Copies((r - 1) * p_rank, (n - r) * p_rank)


def busiest_rank_load(spec: ModelSpec, ep: int, routing: str, capacity_factor: float = 0.0) -> float:
    """The busiest expert-parallel rank's tokens over the mean: 1 with balanced routing or one rank;
    with natural routing 1 + cv sqrt(2 ln ep) / sqrt(E / ep) (ROUTING_LOAD_CV, fitted: the expected maximum of
    ep rank loads, each the sum of E/ep experts' loads of spread cv). With an expert capacity (padded),
    every expert takes exactly capacity_factor x its mean share, whatever the routing."""
    if capacity_factor > 0 and spec.is_moe:
        return capacity_factor
    if routing != "natural" or ep <= 1 or not spec.is_moe:
        return 1.0
    return 1.0 + ROUTING_LOAD_CV.value * math.sqrt(2 * math.log(ep)) / math.sqrt(spec.experts / ep)


def expert_buffer_load(load: float, rank_capacity_factor: float) -> float:
    """The rows an MoE layer's expert part runs over, as a multiple of the rank's mean (token, expert) pairs:
    the busiest rank's `load`, or with a per-rank capacity (ParallelLayout.rank_capacity_factor) the whole
    static buffer. Megatron's HybridEP path sizes the receive buffer at tokens x top-k x
    moe_expert_rank_capacity_factor when the factor is set (token_dispatcher.py `setup_metadata`: "Static
    upper bound on permuted tokens ... (dropless EP rank budget)"), so that full-iteration CUDA graphs see
    one shape; the grouped MLP then takes that buffer whole (experts.py: `max_num_tokens =
    permuted_local_hidden_states.shape[0]`), its GEMMs, activation and quantization over the empty rows
    as over the routed ones. The exchange sends only the routed tokens (`load`, not this)."""
    return rank_capacity_factor if rank_capacity_factor > 0 else load


def dispatched_tokens(tokens: float, tp: int) -> float:
    """The tokens one rank puts into the exchange when its tensor-parallel group holds `tokens`: Megatron-Core
    requires sequence parallelism for an MoE model with tp > 1 (megatron/training/arguments.py: "When using MoE
    and tensor parallelism, sequence parallelism must be used"), so each tp rank holds and dispatches its own
    1/tp of the sequence over the expert-parallel group (token_dispatcher.py: the all-to-all runs over the ep
    group with each rank's local tokens; with expert tensor parallelism etp = tp they are all-gathered over
    etp afterwards, an NVLink step not priced here), as layer_forward's expert GEMMs take 1/tp of the
    assignments."""
    return tokens / max(1, tp)


def dispatch_s(cluster: Cluster, spec: ModelSpec, tokens: float, ep: int, dispatcher: str,
               load: float = 1.0) -> float:
    """One direction of the exchange (dispatch, or combine) of this rank's `tokens` tokens over `ep`
    ranks (consecutive devices), the busiest rank carrying `load` x the mean."""
    if ep <= 1 or tokens <= 0 or not spec.is_moe:
        return 0.0
    span = cluster.span(ep, 1)
    per_node = ep if span.inner is None else span.ranks_per_unit
    scale_out = span.inner is not None and span.level.link != span.inner.link
    c = token_copies(spec, ep, per_node, dispatcher, scale_out)
    per_copy = tokens * spec.hidden * BF16 * load
    return exchange_s(cluster, per_copy * c.inside, per_copy * c.outside, Group(ep, 1))


def overlapped(comm_s: float, compute_s: float, overlap: bool, microbatches: int) -> tuple[float, float]:
    """(exposed exchange, compute lost to the exchange's SMs) of `comm_s` seconds of exchange beside
    `compute_s` seconds of another micro-batch's compute; without overlap (or with one micro-batch,
    which has no other to pair with) all of it is exposed."""
    if not overlap or microbatches < 2 or comm_s <= 0:
        return comm_s, 0.0
    hidden = min(comm_s, compute_s)
    return comm_s - hidden, hidden * EP_OVERLAP_SM_SHARE.value


def expert_rows_efficiency(rows: float, kind: str, dtype: str) -> float:
    """The fraction of the large-GEMM rate an expert GEMM over `rows` rows reaches (GROUPED_GEMM_ROWS_HALF
    on GPUs, by dtype; GEMM_ROWS_HALF elsewhere)."""
    if rows <= 0:
        return 1.0
    curve = GROUPED_GEMM_ROWS_HALF["fp8" if dtype == "fp8" else "bf16"] if kind == "gpu" else GEMM_ROWS_HALF[kind]
    half = curve.value
    return rows / (rows + half)


def expert_output_bytes(spec: ModelSpec, assignments: float, tp: int) -> float:
    """What the expert GEMMs of `assignments` (token, expert) pairs write: fc1's gate and up (one of
    them for a GELU MLP) and fc2's hidden, in bf16. A GEMM writes its output tile after its K loop (the
    epilogue), so with short K loops (an expert's hidden of 2-7K, its moe_ffn of 0.7-2K) the write
    adds to the GEMM's time instead of hiding under it: DeepGEMM's fp8 GEMMs on H800 at M = 4,096
    reach 590 TFLOP/s with K = 512 (N = 32,768) against 1,358 with K = 16,384 (README tables, 2025), as
    FLOPs at the large-K rate plus the output at HBM speed has it (680 and 1,280)."""
    width = (2 if spec.ffn_act == "swiglu" else 1) * spec.moe_ffn + spec.hidden
    return BF16 * assignments * width / tp


def quantize_bytes(spec: ModelSpec, assignments: float, tp: int, dtype: str) -> float:
    """HBM traffic of quantizing the expert GEMMs' inputs (fc1's hidden, fc2's moe_ffn) of
    `assignments` (token, expert) pairs in fp8; 0 in other dtypes."""
    if dtype != "fp8":
        return 0.0
    return QUANTIZE_BYTES_PER_ELEMENT * assignments * (spec.hidden + spec.moe_ffn) / tp


def local_experts(spec: ModelSpec, ep: int) -> float:
    return spec.experts / max(1, ep)


def moe_host_s(kernels: float, host: float, sync: bool = True) -> tuple[float, float]:
    """(forward, backward) host time of `kernels` kernels of MoE layers' forward, on a host `host` times
    as slow as the x86 reference (HOST_TIME). In a dropless forward (`sync`) the dispatcher's
    device-to-host sync leaves the GPU waiting for the host, so each kernel costs the host time of one
    framework op (HOST_OP_S); the backward (twice the kernels), and a forward padded to capacity,
    have no sync: the host runs ahead, and each kernel costs its launch and tail (KERNEL_LAUNCH_S)."""
    forward = HOST_OP_S.value if sync else KERNEL_LAUNCH_S.value
    return kernels * forward * host, 2 * kernels * KERNEL_LAUNCH_S.value * host


def unfused_permute_host_s(spec: ModelSpec, ep: int, tp: int, dispatcher: str, host: float,
                           sync: bool = True, layers: float = 1.0) -> tuple[float, float]:
    """(forward, backward) host seconds that `layers` MoE layers add without permute fusion, on a host
    `host` times as slow as the x86 reference: UNFUSED_PERMUTE_KERNELS priced as the layer's other kernels
    (moe_host_s), and, with the all-to-all dispatcher and more than one local expert,
    sort_chunks_by_idxs over num_experts x tp chunks three times a forward (tokens and probs after the
    dispatch, tokens before the combine; the dispatcher's tp is the expert tensor parallelism, tp here:
    no etp apart) and as often in the backward (UNFUSED_CHUNK_S, UNFUSED_CHUNK_BWD_S)."""
    if not spec.is_moe:
        return 0.0, 0.0
    chunks = 3 * spec.experts * tp if dispatcher == "alltoall" and local_experts(spec, ep) > 1 else 0
    fwd, bwd = moe_host_s(UNFUSED_PERMUTE_KERNELS.value * layers, host, sync)
    return (fwd + chunks * UNFUSED_CHUNK_S.value * layers * host,
            bwd + chunks * UNFUSED_CHUNK_BWD_S.value * layers * host)


def moe_launches(spec: ModelSpec, ep: int, dtype: str, cuda_graphs: str | tuple[str, ...]) -> float:
    """Kernels the host launches for one MoE layer's forward outside CUDA graphs: LAYER_KERNELS plus
    MOE_KERNELS_PER_EXPERT per local expert; none under full-iteration graphs or the `moe` scope (which
    Megatron-Core allows with drop-and-pad only); the `moe_router` scope (with or without
    `moe_preprocess`) captures ROUTER_KERNELS of them; `partial` and the dense scopes leave the MoE part
    eager: its shapes change with the routing."""
    scopes = graph_scopes(cuda_graphs)
    if not spec.is_moe or scopes & {"full_iteration", "moe"}:
        return 0.0
    per_expert = MOE_KERNELS_PER_EXPERT["fp8" if dtype == "fp8" else "bf16"].value
    layer = LAYER_KERNELS.value
    if "moe_router" in scopes:
        layer -= min(ROUTER_KERNELS.value, layer)
    return layer + per_expert * local_experts(spec, ep)
