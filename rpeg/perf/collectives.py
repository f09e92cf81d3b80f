"""Collectives with an alpha-beta model at each level of the cluster hierarchy.

`span = cluster.span(size, stride)` says where a group's ranks sit; the slowest level its traffic
crosses sets the bandwidth, and the number of group ranks per unit below that level sets how
many links carry it in parallel (NCCL runs one ring channel per NIC, so a group with k ranks per
node drives k NICs). Formulas (Thakur et al. 2005; Chan et al. 2007; NCCL's documented
algorithms):

- ring all-reduce: 2 (n-1)/n S / B + 2 (n-1) alpha
- tree all-reduce (double binary tree): 2 S / B + 2 log2(n) alpha
- hierarchical all-reduce: reduce-scatter inside units, all-reduce of S/k across them,
  all-gather inside units
- all-gather / reduce-scatter: (n-1)/n S / B + (n-1) alpha, S the full (gathered) size
- all-to-all: each rank sends (n-1)/n of its S bytes; the part leaving the unit goes over the
  outer links, the rest over the inner ones, in parallel
- exchange: an all-to-all with its inside and outside bytes given (a deduplicating MoE dispatcher)
- broadcast: pipelined, S / B + (n-1) alpha
- point-to-point: S / B + alpha over the level that separates the two ranks
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rpeg.hardware.topology import Cluster, Level, Span
from rpeg.perf.efficiency import link_efficiency


@dataclass(frozen=True, slots=True)
class Group:
    """`size` ranks, consecutive ranks `stride` devices apart."""

    size: int
    stride: int = 1


def _bw(level: Level) -> float:
    return level.effective_bandwidth_bytes_per_s * link_efficiency(level.link)


def bus_bandwidth(span: Span) -> float:
    """Bytes/s of a ring over the span ("bus bandwidth"). With k ranks per unit, NCCL runs k ring
    channels, each leaving the unit through another rank's NIC, so the outer links carry k-fold
    bandwidth until the inner links (every rank carries all channels) become the limit."""
    if span.inner is None:
        return _bw(span.level)
    k = span.ranks_per_unit
    return min(k * _bw(span.level), _bw(span.inner)) if k > 1 else _bw(span.level)


def _alpha(span: Span) -> float:
    return span.level.latency_s


def all_reduce_s(cluster: Cluster, nbytes: float, group: Group, algorithm: str = "best") -> float:
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    sp = cluster.span(n, group.stride)
    ring = 2 * (n - 1) / n * nbytes / bus_bandwidth(sp) + 2 * (n - 1) * _alpha(sp)
    tree = 2 * nbytes / bus_bandwidth(sp) + 2 * math.log2(n) * _alpha(sp)
    options = {"ring": ring, "tree": tree}
    if sp.inner is not None and sp.ranks_per_unit > 1:
        k, m = sp.ranks_per_unit, sp.units
        inner = Group(k, group.stride)
        outer_span = Span(sp.level, None, 1, m)
        options["hierarchical"] = (
            2 * reduce_scatter_s(cluster, nbytes, inner)
            + 2 * (m - 1) / m * (nbytes / k) / _bw(outer_span.level) + 2 * (m - 1) * _alpha(outer_span))
    if algorithm == "best":
        return min(options.values())
    return options[algorithm]


def all_gather_s(cluster: Cluster, nbytes: float, group: Group) -> float:
    """`nbytes`: the size of the gathered result on every rank."""
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    sp = cluster.span(n, group.stride)
    return (n - 1) / n * nbytes / bus_bandwidth(sp) + (n - 1) * _alpha(sp)


def reduce_scatter_s(cluster: Cluster, nbytes: float, group: Group) -> float:
    """`nbytes`: the size of the full input on every rank (each keeps 1/n of the sum)."""
    return all_gather_s(cluster, nbytes, group)


def all_to_all_s(cluster: Cluster, nbytes: float, group: Group) -> float:
    """`nbytes`: what one rank holds before the exchange (it keeps 1/n, sends the rest)."""
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    sp = cluster.span(n, group.stride)
    if sp.inner is None:
        return (n - 1) / n * nbytes / _bw(sp.level) + (n - 1) * _alpha(sp)
    k = sp.ranks_per_unit
    inside = (k - 1) / n * nbytes
    outside = (n - k) / n * nbytes
    return max(inside / _bw(sp.inner), outside / _bw(sp.level)) + (n - 1) * _alpha(sp)


def exchange_s(cluster: Cluster, inside_bytes: float, outside_bytes: float, group: Group) -> float:
    """An all-to-all whose sender knows what it sends where: `inside_bytes` to the group's ranks in its
    own unit, `outside_bytes` across the level above, both legs at once (rpeg/perf/moe.py: a dispatcher
    that sends a token once per destination rank or node)."""
    n = group.size
    if n <= 1 or inside_bytes + outside_bytes <= 0:
        return 0.0
    sp = cluster.span(n, group.stride)
    if sp.inner is None:
        return (inside_bytes + outside_bytes) / _bw(sp.level) + (n - 1) * _alpha(sp)
    return max(inside_bytes / _bw(sp.inner), outside_bytes / _bw(sp.level)) + (n - 1) * _alpha(sp)


def broadcast_s(cluster: Cluster, nbytes: float, group: Group) -> float:
    n = group.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    sp = cluster.span(n, group.stride)
    return nbytes / bus_bandwidth(sp) + (n - 1) * _alpha(sp)


def p2p_s(cluster: Cluster, nbytes: float, distance: int) -> float:
    """Send `nbytes` between two devices `distance` ranks apart."""
    if nbytes <= 0:
        return 0.0
    sp = cluster.span(2, max(1, distance))
    return nbytes / _bw(sp.level) + _alpha(sp)


def weight_tensors(spec) -> int:
    """The weight tensors of a Hugging Face checkpoint of `spec`: per layer q, k, v and o (their
    biases, q/k norms), two norms and the MLP's (each routed and shared expert's, and the router,
    in an MoE layer); the embedding, the final norm and an untied output head. A gather that moves
    the weights tensor by tensor (FSDP's full_tensor(), ZeRO-3's GatheredParameters, NeMo-RL's
    gather_params) pays a collective's latency for each."""
    mla = spec.attention == "mla"
    attn = (5 if spec.q_lora_rank else 4) + 2 if mla else 4
    if spec.qkv_bias:
        attn += 3
    if spec.linear_bias:
        attn += 4
    attn += 2 * spec.qk_norm
    mlp = 3 if spec.ffn_act == "swiglu" else 2
    per_dense = attn + 2 + mlp * (2 if spec.linear_bias else 1)
    per_moe = attn + 2 + mlp * (spec.experts + spec.shared_experts) + 1
    dense = spec.layers - spec.moe_layers
    return dense * per_dense + spec.moe_layers * per_moe + 2 + (0 if spec.tied_embeddings else 1) + \
        (1 if spec.position_embeddings else 0)


def tp_split_tensors(spec) -> int:
    """The weight tensors tensor parallelism splits: `weight_tensors` less the norms, which every
    tensor-parallel rank holds whole (Megatron's `tensor_model_parallel` attribute; a Replicate
    DTensor), so gathering the full weights moves no data for them."""
    norms = spec.layers * (2 + 2 * spec.qk_norm + (2 if spec.attention == "mla" else 0)) + 1
    return max(1, weight_tensors(spec) - norms)


def tensorwise_all_gather_s(cluster: Cluster, nbytes: float, group: Group, tensors: int) -> float:
    """An all-gather of `nbytes` in `tensors` collectives of equal size, one after another."""
    tensors = max(1, int(tensors))
    return tensors * all_gather_s(cluster, nbytes / tensors, group)
