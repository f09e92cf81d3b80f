"""Collectives against hand-worked alpha-beta values on DGX H100 nodes.

Figures (rpeg/hardware/clusters/dgx-h100.yaml): NVLink 450 GB/s per direction, 2 us per step; one
400 Gb/s NDR NIC per GPU (50 GB/s), 5 us per step; each scaled by its link efficiency
(efficiency.LINK). n ranks, S bytes, B bandwidth, alpha latency:

    ring all-reduce   2 (n-1)/n S / B + 2 (n-1) alpha
    all-gather        (n-1)/n S / B + (n-1) alpha
    broadcast         S / B + (n-1) alpha
    point-to-point    S / B + alpha
"""

import pytest

from rpeg.hardware import load_cluster
from rpeg.perf.collectives import (
    Group,
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    broadcast_s,
    bus_bandwidth,
    p2p_s,
    reduce_scatter_s,
)
from rpeg.perf.efficiency import LINK

GB = 1e9
MB = 1e6
NVLINK = 450e9 * LINK["nvlink"].value  # bytes/s per GPU per direction inside a node
NVLINK_ALPHA = 2e-6
NIC = 400e9 / 8 * LINK["infiniband"].value  # one NIC per GPU across nodes
NIC_ALPHA = 5e-6
COLLECTIVES = [all_reduce_s, all_gather_s, reduce_scatter_s, all_to_all_s, broadcast_s]


@pytest.fixture(scope="module")
def dgx():
    return load_cluster("dgx-h100", 32)  # 4 nodes of 8


# ---- inside one node ---------------------------------------------------------------------------
def test_ring_all_reduce_of_1GB_over_one_node(dgx):
    expected = 2 * 7 / 8 * GB / NVLINK + 14 * NVLINK_ALPHA  # 4.889 ms
    assert all_reduce_s(dgx, GB, Group(8), algorithm="ring") == pytest.approx(expected, rel=1e-12)
    # for a large message the ring beats the tree (2 S / B), so "best" picks it
    assert all_reduce_s(dgx, GB, Group(8), algorithm="tree") > expected
    assert all_reduce_s(dgx, GB, Group(8)) == pytest.approx(expected, rel=1e-12)
    assert all_reduce_s(dgx, GB, Group(8)) == pytest.approx(4.889111e-3, rel=1e-6)


def test_tree_all_reduce_wins_for_small_messages_inside_a_node(dgx):
    tree = 2 * MB / NVLINK + 2 * 3 * NVLINK_ALPHA  # log2(8) = 3 steps each way
    assert all_reduce_s(dgx, MB, Group(8), algorithm="tree") == pytest.approx(tree, rel=1e-12)
    assert all_reduce_s(dgx, MB, Group(8)) == pytest.approx(tree, rel=1e-12)
    assert all_reduce_s(dgx, MB, Group(8), algorithm="ring") > tree


def test_all_gather_reduce_scatter_and_broadcast_inside_a_node(dgx):
    gather = 7 / 8 * GB / NVLINK + 7 * NVLINK_ALPHA
    assert all_gather_s(dgx, GB, Group(8)) == pytest.approx(gather, rel=1e-12)
    assert reduce_scatter_s(dgx, GB, Group(8)) == pytest.approx(gather, rel=1e-12)
    assert all_gather_s(dgx, GB, Group(4)) == pytest.approx(3 / 4 * GB / NVLINK + 3 * NVLINK_ALPHA, rel=1e-12)
    assert broadcast_s(dgx, GB, Group(8)) == pytest.approx(GB / NVLINK + 7 * NVLINK_ALPHA, rel=1e-12)


# ---- across nodes --------------------------------------------------------------------------------
def test_dp_group_with_stride_8_uses_one_nic_per_rank(dgx):
    """dp = 4 over 4 nodes with tp = 8 inside each: every rank sits in a node of its own."""
    span = dgx.span(4, 8)
    assert (span.level.link, span.ranks_per_unit, span.units) == ("infiniband", 1, 4)
    assert bus_bandwidth(span) == pytest.approx(NIC, rel=1e-12)
    ring = 2 * 3 / 4 * GB / NIC + 6 * NIC_ALPHA  # 33.36 ms: 7x the same reduction inside a node
    assert all_reduce_s(dgx, GB, Group(4, 8)) == pytest.approx(ring, rel=1e-12)
    assert all_gather_s(dgx, GB, Group(4, 8)) == pytest.approx(3 / 4 * GB / NIC + 3 * NIC_ALPHA, rel=1e-12)


def test_sixteen_ranks_eight_per_node_drive_eight_nics_up_to_nvlink(dgx):
    span = dgx.span(16, 1)
    assert (span.level.link, span.inner.link, span.ranks_per_unit, span.units) == ("infiniband", "nvlink", 8, 2)
    assert bus_bandwidth(span) == pytest.approx(min(8 * NIC, NVLINK), rel=1e-12)
    ring = 2 * 15 / 16 * GB / min(8 * NIC, NVLINK) + 30 * NIC_ALPHA
    assert all_reduce_s(dgx, GB, Group(16), algorithm="ring") == pytest.approx(ring, rel=1e-12)


def test_four_ranks_per_node_drive_four_nics(dgx):
    """8 ranks with stride 2 over 2 nodes: 4 per node, so 4 NICs carry the ring, below NVLink."""
    span = dgx.span(8, 2)
    assert (span.ranks_per_unit, span.units) == (4, 2)
    assert 4 * NIC < NVLINK
    assert bus_bandwidth(span) == pytest.approx(4 * NIC, rel=1e-12)


@pytest.mark.parametrize("name, bound", [("dgx-a100-80gb", "nic"), ("mi300x", "scale-up")])
def test_bus_bandwidth_is_the_smaller_of_k_nics_and_the_scale_up_link(name, bound):
    """DGX A100: 8 x 200 Gb/s NICs (8 x 22.5 GB/s) < NVLink 300 x 0.8; MI300X: 8 x 400 Gb/s NICs
    (8 x 45 GB/s) > xGMI 448 x 0.7 = 313.6 GB/s."""
    c = load_cluster(name, 16)
    node, system = c.levels
    nic = system.bandwidth_bytes_per_s * LINK[system.link].value
    scale_up = node.bandwidth_bytes_per_s * LINK[node.link].value
    got = bus_bandwidth(c.span(16, 1))
    assert got == pytest.approx(8 * nic if bound == "nic" else scale_up, rel=1e-12)
    assert got == pytest.approx(min(8 * nic, scale_up), rel=1e-12)


def test_hierarchical_all_reduce_is_chosen_when_cheaper(dgx):
    """1 MB over 8 ranks, 4 per node: reduce-scatter in each node, all-reduce of S/4 across the 2
    nodes, all-gather back. 4 latency steps across nodes instead of the ring's 14."""
    g = Group(8, 2)
    inner = 3 / 4 * MB / NVLINK + 3 * NVLINK_ALPHA  # reduce-scatter (and all-gather) over 4 ranks in a node
    outer = 2 * 1 / 2 * (MB / 4) / NIC + 2 * 1 * NIC_ALPHA  # ring all-reduce of S/4 over 2 nodes
    hier = all_reduce_s(dgx, MB, g, algorithm="hierarchical")
    assert hier == pytest.approx(2 * inner + outer, rel=1e-12)
    assert hier < all_reduce_s(dgx, MB, g, algorithm="ring")
    assert hier < all_reduce_s(dgx, MB, g, algorithm="tree")
    assert all_reduce_s(dgx, MB, g) == hier


def test_hierarchical_all_reduce_is_not_chosen_when_the_ring_is_cheaper(dgx):
    """1 GB over 16 ranks, 8 per node: the ring already drives 8 NICs, so the hierarchy only adds
    the NVLink reduce-scatter and all-gather."""
    g = Group(16)
    hier = all_reduce_s(dgx, GB, g, algorithm="hierarchical")
    ring = all_reduce_s(dgx, GB, g, algorithm="ring")
    assert ring < hier
    assert all_reduce_s(dgx, GB, g) == min(ring, all_reduce_s(dgx, GB, g, algorithm="tree"))


def test_all_to_all_inside_and_across_nodes(dgx):
    inside = all_to_all_s(dgx, GB, Group(8))
    assert inside == pytest.approx(7 / 8 * GB / NVLINK + 7 * NVLINK_ALPHA, rel=1e-12)
    # 16 ranks over 2 nodes: 7/16 of S stays in the node over NVLink, 8/16 leaves over the rank's
    # own NIC, at the same time; the NIC part is the slower one
    across = all_to_all_s(dgx, GB, Group(16))
    nvlink_part, nic_part = 7 / 16 * GB / NVLINK, 8 / 16 * GB / NIC
    assert nic_part > nvlink_part
    assert across == pytest.approx(nic_part + 15 * NIC_ALPHA, rel=1e-12)
    assert across > inside
    # one rank per node: everything but the kept 1/n goes over the NIC
    assert all_to_all_s(dgx, GB, Group(4, 8)) == pytest.approx(3 / 4 * GB / NIC + 3 * NIC_ALPHA, rel=1e-12)


def test_point_to_point_inside_and_across_nodes(dgx):
    assert p2p_s(dgx, GB, 1) == pytest.approx(GB / NVLINK + NVLINK_ALPHA, rel=1e-12)
    assert p2p_s(dgx, GB, 7) == pytest.approx(GB / NVLINK + NVLINK_ALPHA, rel=1e-12)
    assert p2p_s(dgx, GB, 8) == pytest.approx(GB / NIC + NIC_ALPHA, rel=1e-12)


# ---- properties ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", COLLECTIVES)
def test_zero_bytes_or_one_rank_cost_nothing(dgx, fn):
    assert fn(dgx, 0.0, Group(8)) == 0.0
    assert fn(dgx, GB, Group(1)) == 0.0
    assert fn(dgx, GB, Group(1, 8)) == 0.0
    assert p2p_s(dgx, 0.0, 8) == 0.0


@pytest.mark.parametrize("fn", COLLECTIVES)
@pytest.mark.parametrize("size, stride", [(8, 1), (16, 1), (4, 8), (8, 2)])
def test_cost_grows_with_bytes(dgx, fn, size, stride):
    costs = [fn(dgx, b, Group(size, stride)) for b in (1e3, 1e6, 1e8, 1e9, 1e10)]
    assert all(0 < a < b for a, b in zip(costs, costs[1:]))


@pytest.mark.parametrize("fn", COLLECTIVES)
def test_crossing_a_slower_level_costs_more(dgx, fn):
    for size in (2, 4):
        inside = fn(dgx, GB, Group(size, 1))
        across = fn(dgx, GB, Group(size, 8))  # the same number of ranks, one per node
        assert across > inside
    assert fn(dgx, GB, Group(16)) > fn(dgx, GB, Group(8))
    assert p2p_s(dgx, GB, 8) > p2p_s(dgx, GB, 1)


def test_weight_tensors_count_a_checkpoints_tensors():
    from rpeg.graph import get_model
    from rpeg.perf.collectives import weight_tensors

    # tiny-qwen2: per layer q, k, v, o, the q/k/v biases, 2 norms, gate, up, down; embedding (tied) and final norm
    assert weight_tensors(get_model("tiny-qwen2")) == 4 * 12 + 2
    moe = get_model("qwen3-30B-A3B")  # 48 layers of 128 experts: the experts' tensors dominate
    assert weight_tensors(moe) > 48 * 3 * 128


def test_a_tensorwise_gather_pays_a_latency_per_tensor():
    from rpeg.hardware import load_cluster
    from rpeg.perf.collectives import Group, all_gather_s, tensorwise_all_gather_s

    c = load_cluster("dgx-h100", 16)
    g = Group(2, 8)  # across the two nodes
    one = all_gather_s(c, 1e9, g)
    many = tensorwise_all_gather_s(c, 1e9, g, 100)
    alpha = c.span(2, 8).level.latency_s
    assert many == pytest.approx(one + 99 * alpha)
    assert tensorwise_all_gather_s(c, 1e9, g, 0) == pytest.approx(one)
