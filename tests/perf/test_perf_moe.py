"""The MoE terms (rpeg/perf/moe.py) against hand-computed cases.

Qwen3-30B-A3B: 128 experts, top-8, hidden 2048, moe_ffn 768, SwiGLU. DGX H100 (rpeg/hardware/clusters/
dgx-h100.yaml): 8 GPUs per node over NVLink (450 GB/s x LINK[nvlink] 0.8 = 360 GB/s, 2 us a step),
one 400 Gb/s NIC per GPU across nodes (50 GB/s x LINK[infiniband] 0.9 = 45 GB/s, 5 us a step).

The fitted constants (moe.LAYER_KERNELS, moe.HOST_OP_S, moe.ROUTING_LOAD_CV; rpeg/data/fitted.yaml) are pinned
here to round values (40 kernels, 13.5 us, cv 0.2) so that the hand computations do not move with a refit;
`test_the_fitted_constants_are_read_where_they_act` checks each one reaches its term.
"""

from __future__ import annotations

import math

import pytest

from rpeg.errors import RpegError
from rpeg.graph import ParallelLayout, get_model
from rpeg.hardware import load_cluster
from rpeg.perf import moe
from rpeg.perf.collectives import Group, all_to_all_s, exchange_s
from rpeg.perf.efficiency import EP_OVERLAP_SM_SHARE, KERNEL_LAUNCH_S, LINK, MOE_KERNELS_PER_EXPERT
from rpeg.perf.fitted import override
from rpeg.perf.moe import HOST_OP_S as MOE_HOST_OP_S
from rpeg.perf.moe import LAYER_KERNELS as MOE_LAYER_KERNELS
from rpeg.perf.moe import ROUTING_LOAD_CV
from rpeg.perf.training import PassWorkload, pass_cost

NVLINK = 450e9 * LINK["nvlink"].value
NIC = 50e9 * LINK["infiniband"].value
PINNED = {"moe.layer_kernels": 40.0, "moe.host_op_s": 13.5e-6, "moe.routing_load_cv": 0.2}


@pytest.fixture(autouse=True)
def pinned_constants():
    with override(PINNED):
        yield


@pytest.fixture(scope="module")
def qwen():
    return get_model("qwen3-30B-A3B")


@pytest.fixture(scope="module")
def dgx():
    return load_cluster("dgx-h100", 16)  # two nodes of 8


def test_hit_probability_is_the_hypergeometric_miss():
    # 16 ranks of 8 experts: a token misses one rank when all 8 of its experts are among the other 120:
    # 120/128 x 119/127 x ... x 113/121 = 0.58772, so it reaches 0.41228 of the ranks: 6.60 of 16
    miss = math.prod((120 - i) / (128 - i) for i in range(8))
    assert moe.hit_probability(128, 8, 16) == pytest.approx(1 - miss, rel=1e-12)
    assert 16 * moe.hit_probability(128, 8, 16) == pytest.approx(6.5965, abs=1e-4)
    # two nodes of 64 experts: missing one needs all 8 in the other half: C(64, 8) / C(128, 8) = 0.0031
    assert moe.hit_probability(128, 8, 2) == pytest.approx(1 - math.comb(64, 8) / math.comb(128, 8), rel=1e-12)
    assert moe.hit_probability(128, 8, 1) == 1.0
    assert moe.hit_probability(8, 8, 8) == 1.0  # 8 experts of 8 groups of one: every group is hit


def test_copies_per_token_by_dispatcher(qwen):
    p_rank, p_node = moe.hit_probability(128, 8, 16), moe.hit_probability(128, 8, 2)
    # per (token, expert) pair: 8 copies spread evenly over 16 ranks: 7 of them in the node, 8 across
    c = moe.token_copies(qwen, 16, 8, "alltoall", scale_out=True)
    assert (c.inside, c.outside) == (pytest.approx(8 * 7 / 16), pytest.approx(8 * 8 / 16))  # 3.5, 4
    # allgather: every token to every other rank
    c = moe.token_copies(qwen, 16, 8, "allgather", scale_out=True)
    assert (c.inside, c.outside) == (7, 8)
    # DeepEP / HybridEP across the network: once to the other node (0.9969), then from each node's receiver to
    # its destination ranks over NVLink: 2 nodes x 7 x 0.41228 = 5.772
    for d in ("deepep", "hybridep"):
        c = moe.token_copies(qwen, 16, 8, d, scale_out=True)
        assert c.outside == pytest.approx(p_node) and c.inside == pytest.approx(2 * 7 * p_rank)
    # inside one NVLink domain (GB200's rack): once per destination rank, 7 and 8 x 0.41228
    c = moe.token_copies(qwen, 16, 8, "deepep", scale_out=False)
    assert (c.inside, c.outside) == (pytest.approx(7 * p_rank), pytest.approx(8 * p_rank))
    assert moe.token_copies(qwen, 1, 8, "alltoall", scale_out=True) == moe.Copies(0.0, 0.0)


def test_the_exchange_runs_its_two_legs_at_once(dgx):
    # 10 MB inside the node at 360 GB/s (27.8 us) beside 9 MB across at 45 GB/s (200 us): the network leg,
    # plus 15 steps of the outer latency (5 us)
    expected = max(10e6 / NVLINK, 9e6 / NIC) + 15 * 5e-6
    assert exchange_s(dgx, 10e6, 9e6, Group(16)) == pytest.approx(expected, rel=1e-12)
    # the per-pair all-to-all is the exchange of (n-1)/n of its bytes split by where the ranks are
    s = 16e6
    assert exchange_s(dgx, 7 / 16 * s, 8 / 16 * s, Group(16)) == pytest.approx(all_to_all_s(dgx, s, Group(16)))


def test_dispatch_time_per_dispatcher_on_two_h100_nodes(qwen, dgx):
    tokens = 4096
    per_copy = tokens * 2048 * 2  # 16.78 MB of bf16 hidden states per copy of every token
    alpha = 15 * 5e-6
    alltoall = max(3.5 * per_copy / NVLINK, 4 * per_copy / NIC) + alpha  # 1.491 ms + 75 us
    assert moe.dispatch_s(dgx, qwen, tokens, 16, "alltoall") == pytest.approx(alltoall, rel=1e-12)
    p_rank, p_node = moe.hit_probability(128, 8, 16), moe.hit_probability(128, 8, 2)
    hybrid = max(2 * 7 * p_rank * per_copy / NVLINK, p_node * per_copy / NIC) + alpha  # 0.372 ms + 75 us
    assert moe.dispatch_s(dgx, qwen, tokens, 16, "hybridep") == pytest.approx(hybrid, rel=1e-12)
    assert alltoall / hybrid > 3.3
    # the busiest rank's load scales the bytes; within one node (EP8) no network leg
    assert moe.dispatch_s(dgx, qwen, tokens, 16, "hybridep", load=1.2) == pytest.approx(
        max(2 * 7 * p_rank * per_copy * 1.2 / NVLINK, p_node * per_copy * 1.2 / NIC) + alpha, rel=1e-12)
    one_node = 7 * moe.hit_probability(128, 8, 8) * per_copy / NVLINK + 7 * 2e-6
    assert moe.dispatch_s(dgx, qwen, tokens, 8, "deepep") == pytest.approx(one_node, rel=1e-12)


def test_natural_routing_loads_the_busiest_rank(qwen):
    # 1 + cv sqrt(2 ln ep) / sqrt(E / ep): EP16 (8 experts a rank) 1 + 0.2 x 2.3548 / 2.8284 = 1.1665
    assert ROUTING_LOAD_CV.value == 0.2
    assert moe.busiest_rank_load(qwen, 16, "natural") == pytest.approx(1.1665, abs=1e-4)
    # EP8 (16 experts a rank): 1 + 0.2 x 2.0393 / 4 = 1.1020
    assert moe.busiest_rank_load(qwen, 8, "natural") == pytest.approx(1.1020, abs=1e-4)
    assert moe.busiest_rank_load(qwen, 16, "balanced") == 1.0
    assert moe.busiest_rank_load(qwen, 1, "natural") == 1.0


def test_overlap_hides_the_exchange_behind_the_other_micro_batch():
    share = EP_OVERLAP_SM_SHARE.value
    assert moe.overlapped(3.0, 10.0, True, 8) == (0.0, pytest.approx(3.0 * share))  # all hidden, SMs lent
    assert moe.overlapped(12.0, 10.0, True, 8) == (pytest.approx(2.0), pytest.approx(10.0 * share))
    assert moe.overlapped(3.0, 10.0, False, 8) == (3.0, 0.0)
    assert moe.overlapped(3.0, 10.0, True, 1) == (3.0, 0.0)  # one micro-batch: nothing to pair with


def test_grouped_gemm_curve_and_fp8_extras(qwen):
    # rows / (rows + half): bf16 half at 64 rows, fp8 at 100
    assert moe.expert_rows_efficiency(64, "gpu", "bf16") == pytest.approx(0.5)
    assert moe.expert_rows_efficiency(256, "gpu", "fp8") == pytest.approx(256 / 356)
    # Qwen3-30B's expert writes gate + up (2 x 768) and its hidden (2048) per (token, expert), bf16
    assert moe.expert_output_bytes(qwen, 1000, 1) == 2 * 1000 * (2 * 768 + 2048)
    # fp8: each expert input (2048 + 768 elements) read in bf16, written in fp8 and transposed: 4 B each
    assert moe.quantize_bytes(qwen, 1000, 1, "fp8") == 4 * 1000 * (2048 + 768)
    assert moe.quantize_bytes(qwen, 1000, 1, "bf16") == 0.0


def test_moe_kernel_launches_and_cuda_graphs(qwen):
    # EP8: 16 local experts: 40 + 2 x 16 = 72 kernels in bf16, 40 + 4 x 16 = 104 in fp8
    assert MOE_LAYER_KERNELS.value == 40 and MOE_KERNELS_PER_EXPERT["bf16"].value == 2
    assert moe.moe_launches(qwen, 8, "bf16", "none") == 72
    assert moe.moe_launches(qwen, 8, "fp8", "partial") == 104  # partial graphs leave the experts eager
    assert moe.moe_launches(qwen, 8, "bf16", "full") == 0
    # the forward's kernels wait on the host (13.5 us each), the backward's twice as many cost 4 us each; a
    # Grace host takes HOST_TIME[grace] = 2.6 times as long: 72 x 13.5 x 2.6 = 2527.2 us, 2 x 72 x 4 x 2.6 = 1497.6
    fwd, bwd = moe.moe_host_s(72, 2.6)
    assert (fwd, bwd) == (pytest.approx(2527.2e-6), pytest.approx(1497.6e-6))


def _pass(qwen, **layout):
    lay = ParallelLayout(dp=16, ep=16, zero=1, **layout)
    work = PassWorkload(sequences=128, seq_len=4096, attention_context=2048.5, micro_batch=1, dtype="bf16")
    return pass_cost("t", qwen, lay, load_cluster("dgx-h100", 16), work)


def test_training_pass_prices_each_knob_on_its_own_line(qwen):
    base = _pass(qwen)
    parts = dict(base.parts)
    # EP16: 8 local experts, 40 + 2 x 8 = 56 kernels a layer forward; 8 micro-batches x 48 MoE layers x (56 x
    # 13.5 us in the forward, after the dispatcher's sync, + 2 x 56 x 4 us in the backward) = 0.4623 s on x86
    assert parts["MoE kernel launches"] == pytest.approx(8 * 48 * (56 * 13.5e-6 + 2 * 56 * 4e-6))
    assert MOE_HOST_OP_S.value == 13.5e-6 and KERNEL_LAUNCH_S.value == 4e-6
    # the all-to-all: 8 micro-batches x 48 layers x 2 (fwd, bwd) x 2 (dispatch, combine) x one direction
    one = moe.dispatch_s(load_cluster("dgx-h100", 16), qwen, 4096, 16, "alltoall")
    assert parts["expert-parallel comm"] == pytest.approx(8 * 48 * 4 * one, rel=1e-9)
    hybrid = dict(_pass(qwen, dispatcher="hybridep").parts)
    assert hybrid["expert-parallel comm"] < parts["expert-parallel comm"] / 3
    over = dict(_pass(qwen, dispatcher="hybridep", ep_overlap=True).parts)
    assert "expert-parallel comm" not in over  # all hidden behind the other micro-batch's layers
    assert over["expert-parallel overlap, SMs lent"] == pytest.approx(
        hybrid["expert-parallel comm"] * EP_OVERLAP_SM_SHARE.value, rel=1e-9)
    full = dict(_pass(qwen, cuda_graphs="full").parts)
    assert "MoE kernel launches" not in full and "kernel launches" not in full
    partial = dict(_pass(qwen, cuda_graphs="partial").parts)
    assert "kernel launches" not in partial and partial["MoE kernel launches"] == parts["MoE kernel launches"]
    natural = _pass(qwen, routing="natural")
    assert natural.seconds > base.seconds and natural.flops == pytest.approx(base.flops)  # time of the busiest rank
    for cost in (base, natural, _pass(qwen, dispatcher="deepep", ep_overlap=True)):
        assert sum(s for _, s in cost.parts) == pytest.approx(cost.seconds, rel=1e-9)


@pytest.mark.parametrize("field, value, needle", [
    ("dispatcher", "nccl", "dispatcher = 'nccl' must be one of alltoall, allgather, deepep, hybridep"),
    ("cuda_graphs", "some", "cuda_graphs = 'some' must be one of none, partial, full"),
    ("routing", "random", "routing = 'random' must be one of balanced, natural"),
    ("ep_overlap", 1, "ep_overlap = 1 must be true or false"),
])
def test_layout_refuses_bad_moe_knobs_in_one_line(field, value, needle):
    with pytest.raises(RpegError) as info:
        ParallelLayout(dp=16, ep=16, **{field: value})
    assert needle in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(RpegError, match="ep_overlap needs ep > 1"):
        ParallelLayout(dp=16, ep_overlap=True)


def test_decode_pays_the_exchange_and_the_busiest_rank(qwen, dgx):
    """A decode step of an engine with expert parallelism dispatches and combines its batch at every MoE
    layer (48 in Qwen3-30B-A3B): the difference between two dispatchers is 2 x 48 x the difference of one
    direction; natural routing slows an EP engine's step and not a tensor-parallel one's."""
    from rpeg.perf.generation import _StepModel

    batch, context = 64, 64 * 2000
    per_pair = ParallelLayout(dp=2, tp=8, ep=8)
    deepep = per_pair.replace(dispatcher="deepep")
    t_pair = _StepModel(qwen, per_pair, dgx, "bf16")(batch, context)[0]
    t_deep = _StepModel(qwen, deepep, dgx, "bf16")(batch, context)[0]
    one = moe.dispatch_s(dgx, qwen, batch, 8, "alltoall") - moe.dispatch_s(dgx, qwen, batch, 8, "deepep")
    assert t_pair - t_deep == pytest.approx(2 * 48 * one, rel=1e-9)
    natural = _StepModel(qwen, per_pair.replace(routing="natural"), dgx, "bf16")(batch, context)[0]
    assert natural > t_pair
    tp_only = ParallelLayout(dp=2, tp=8)
    assert _StepModel(qwen, tp_only.replace(routing="natural"), dgx, "bf16")(batch, context)[0] == \
        _StepModel(qwen, tp_only, dgx, "bf16")(batch, context)[0]


def test_logprob_passes_pay_the_forward_terms_without_overlap(qwen):
    """A forward-only pass (policy or reference logprobs) has one exchange each way per MoE layer, the
    forward's host time (56 kernels at 13.5 us), and no overlap: there is no backward to pair with."""
    lay = ParallelLayout(dp=16, ep=16, dispatcher="hybridep")
    work = PassWorkload(sequences=128, seq_len=4096, attention_context=2048.5, micro_batch=1, forward_only=True)
    cluster = load_cluster("dgx-h100", 16)
    cost = dict(pass_cost("lp", qwen, lay, cluster, work).parts)
    one = moe.dispatch_s(cluster, qwen, 4096, 16, "hybridep")
    assert cost["expert-parallel comm"] == pytest.approx(8 * 48 * 2 * one, rel=1e-9)
    assert cost["MoE kernel launches"] == pytest.approx(8 * 48 * 56 * 13.5e-6)
    # the ep_overlap knob is for training: a forward-only pass exposes the same exchange
    assert pass_cost("lp", qwen, lay.replace(ep_overlap=True), cluster, work).parts == \
        pass_cost("lp", qwen, lay, cluster, work).parts


def test_nemo_rl_runs_moe_models_with_natural_routing_and_the_plain_all_to_all():
    from rpeg.graph.serde import read_yaml_file
    from rpeg.perf.validation import NEMO_RL_MOE, bundled, rl_graph

    assert NEMO_RL_MOE == {"dispatcher": "alltoall", "ep_overlap": False, "cuda_graphs": "none", "routing": "natural"}
    data = read_yaml_file(str(bundled()["nemo-rl-v0.5-extra"]))
    by_id = {e["id"]: e for e in data["rl"]}
    g, _ = rl_graph(by_id["h100-qwen3-30b-a3b-on"], {}, "x")
    for s in g.stages:
        if s.layout is not None:
            assert s.layout.routing == "natural" and s.layout.dispatcher == "alltoall", s.name
    g, _ = rl_graph(by_id["h100-qwen3-32b-1off"], {}, "x")  # a dense model keeps the defaults
    assert all(s.layout.routing == "balanced" for s in g.stages if s.layout is not None)


def test_an_expert_capacity_pads_every_rank_and_drops_the_sync(qwen):
    # padded to capacity: every expert takes exactly capacity_factor x its mean share, whatever the routing
    assert moe.busiest_rank_load(qwen, 16, "natural", capacity_factor=1.25) == 1.25
    assert moe.busiest_rank_load(qwen, 16, "balanced", capacity_factor=1.0) == 1.0
    # no device-to-host sync: the forward's 72 kernels cost a launch each (4 us), as the backward's 144
    assert moe.moe_host_s(72, 1.0, sync=False) == (pytest.approx(72 * 4e-6), pytest.approx(144 * 4e-6))
    dropless = dict(_pass(qwen, routing="natural").parts)
    capped = dict(_pass(qwen, routing="natural", capacity_factor=1.0).parts)
    assert capped["MoE kernel launches"] == pytest.approx(8 * 48 * 3 * 56 * 4e-6)
    assert capped["compute"] < dropless["compute"]  # no rank above the mean
    assert capped["compute"] == pytest.approx(dict(_pass(qwen).parts)["compute"])


@pytest.mark.parametrize("layout, needle", [
    (dict(capacity_factor=-1), "capacity_factor = -1 must be 0 (dropless) or an expert capacity factor up to 64"),
    (dict(capacity_factor=True), "capacity_factor = True must be 0"),
    (dict(capacity_factor=1.0, dispatcher="deepep"), "capacity_factor = 1 needs the alltoall or allgather dispatcher"),
])
def test_layout_refuses_a_bad_capacity(layout, needle):
    with pytest.raises(RpegError) as info:
        ParallelLayout(dp=16, ep=16, **layout)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_the_fitted_constants_are_read_where_they_act(qwen):
    # cv 0.5 at EP16: 1 + 0.5 x 2.3548 / 2.8284 = 1.4163
    with override({"moe.routing_load_cv": 0.5}):
        assert moe.busiest_rank_load(qwen, 16, "natural") == pytest.approx(1.4163, abs=1e-4)
    # 25 kernels + 2 x 16 local experts = 57; at 20 us each in the forward, 4 us each twice over in the backward
    with override({"moe.layer_kernels": 25.0, "moe.host_op_s": 20e-6}):
        assert moe.moe_launches(qwen, 8, "bf16", "none") == 57
        assert moe.moe_host_s(57, 1.0) == (pytest.approx(57 * 20e-6), pytest.approx(2 * 57 * 4e-6))


def test_node_limited_routing_reaches_fewer_nodes():
    """DeepSeek-V3: 256 experts in 8 groups of 32, each token's 8 experts from 4 of the groups. On 8 nodes
    (EP64 of DGX H100s) a node holds one group: it is hit only if its group is drawn (4 of 8) and then
    unless all 8 experts fall in the other 3 drawn groups' 96 of 128: 1/2 (1 - C(96, 8) / C(128, 8))."""
    miss_in_pool = math.comb(96, 8) / math.comb(128, 8)  # 0.0930
    node = moe.hit_probability(256, 8, 8, 8, 4)
    assert node == pytest.approx(0.5 * (1 - miss_in_pool), rel=1e-12)
    assert 7 * node == pytest.approx(3.175, abs=1e-3)  # other nodes reached, against 7 x 0.6618 = 4.633 uniform
    assert moe.hit_probability(256, 8, 8) == pytest.approx(1 - math.comb(224, 8) / math.comb(256, 8), rel=1e-12)
    # a rank of 4 experts inside one group: 1/2 (1 - C(124, 8) / C(128, 8))
    assert moe.hit_probability(256, 8, 64, 8, 4) == pytest.approx(
        0.5 * (1 - math.comb(124, 8) / math.comb(128, 8)), rel=1e-12)
    # 4 nodes of two groups each: j of a node's 2 groups drawn with C(2, j) C(6, 4 - j) / C(8, 4) = 15, 40, 15 / 70
    four = 1 - (15 + 40 * miss_in_pool + 15 * math.comb(64, 8) / math.comb(128, 8)) / 70
    assert moe.hit_probability(256, 8, 4, 8, 4) == pytest.approx(four, rel=1e-12)
    # no limit when every group may be drawn, or with one group
    assert moe.hit_probability(256, 8, 8, 8, 8) == moe.hit_probability(256, 8, 8)
    assert moe.hit_probability(256, 8, 8, 1, 1) == moe.hit_probability(256, 8, 8)


def test_deepseek_v3_exchange_on_eight_h100_nodes():
    """EP64 over 8 DGX H100 nodes with HybridEP: 3.175 node copies per token across the network; each rank
    dispatches its 2,048 tokens (4,096 a micro-batch over TP2 with sequence parallelism), 14,336 B each in
    bf16: 2,048 x 3.175 x 14,336 B = 93.2 MB at 45 GB/s = 2.07 ms, plus 63 steps of 5 us."""
    dsv3 = get_model("deepseek-v3")
    assert (dsv3.expert_groups, dsv3.groups_per_token) == (8, 4)
    c = moe.token_copies(dsv3, 64, 8, "hybridep", scale_out=True)
    assert c.outside == pytest.approx(7 * moe.hit_probability(256, 8, 8, 8, 4), rel=1e-12)
    assert c.inside == pytest.approx(8 * 7 * moe.hit_probability(256, 8, 64, 8, 4), rel=1e-12)
    cluster = load_cluster("dgx-h100", 1024)
    tokens = moe.dispatched_tokens(4096, 2)
    assert tokens == 2048
    per_copy = 2048 * 7168 * 2
    expected = max(c.inside * per_copy / NVLINK, c.outside * per_copy / NIC) + 63 * 5e-6
    assert moe.dispatch_s(cluster, dsv3, tokens, 64, "hybridep") == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(2.07e-3 + 315e-6, rel=0.01)


def test_a_tensor_parallel_rank_dispatches_its_sequence_shard(qwen):
    """With tp = 2 (sequence parallel, as Megatron requires for MoE) each rank sends half the micro-batch's
    tokens into the exchange: 8 micro-batches x 48 layers x 4 directions x dispatch_s(2,048 tokens)."""
    cluster = load_cluster("dgx-h100", 32)
    lay = ParallelLayout(dp=16, tp=2, ep=16, zero=1, sequence_parallel=True)
    work = PassWorkload(sequences=128, seq_len=4096, attention_context=2048.5, micro_batch=1, dtype="bf16")
    parts = dict(pass_cost("t", qwen, lay, cluster, work).parts)
    assert parts["expert-parallel comm"] == pytest.approx(8 * 48 * 4 * moe.dispatch_s(cluster, qwen, 2048, 16,
                                                                                      "alltoall"), rel=1e-9)


def test_a_rank_capacity_runs_the_experts_over_the_whole_buffer(qwen):
    """moe_expert_rank_capacity_factor (the full-iteration-graph recipes'): a static receive buffer of 1.5x the
    rank's mean (token, expert) pairs; the expert part runs over all of it, the exchange sends the routed
    tokens only, and the fixed shapes need no device-to-host sync."""
    from rpeg.perf.compute import layer_forward
    assert moe.expert_buffer_load(1.0, 1.5) == 1.5 and moe.expert_buffer_load(1.3, 0.0) == 1.3
    plain = dict(_pass(qwen, dispatcher="hybridep").parts)
    padded = _pass(qwen, dispatcher="hybridep", rank_capacity_factor=1.5)
    parts = dict(padded.parts)
    assert parts["expert-parallel comm"] == pytest.approx(plain["expert-parallel comm"], rel=1e-12)
    # EP16 on 16 H100, 8 micro-batches of 4,096 tokens, 48 MoE layers: forward + backward (3 forwards) of
    # the expert work on the 0.5 x 4,096 x 8 empty rows a layer
    kw = dict(tokens=4096, context=2048.5, tp=1, ep=16, sp=False, dtype="bf16", flash_attention=True)
    dev = load_cluster("dgx-h100", 16).device
    one = (layer_forward(qwen, dev, moe_layer=True, moe_load=1.5, **kw).seconds
           - layer_forward(qwen, dev, moe_layer=True, moe_load=1.0, **kw).seconds)
    assert one > 0 and parts["expert capacity padding"] == pytest.approx(8 * 48 * 3 * one, rel=1e-9)
    assert parts["compute"] == pytest.approx(plain["compute"], rel=1e-9)  # the routed rows' work is unchanged
    # no sync: 56 kernels a layer forward at a launch each (4 us), 112 in the backward
    assert parts["MoE kernel launches"] == pytest.approx(8 * 48 * 3 * 56 * 4e-6)
    assert sum(s for _, s in padded.parts) == pytest.approx(padded.seconds, rel=1e-9)


@pytest.mark.parametrize("value", [0.5, -1, True, "1.5"])
def test_layout_refuses_a_bad_rank_capacity(value):
    with pytest.raises(RpegError) as info:
        ParallelLayout(dp=16, ep=16, rank_capacity_factor=value)
    assert f"rank_capacity_factor = {value!r}" in str(info.value) and "\n" not in str(info.value)


def test_cuda_graph_scopes_take_their_kernels_off_the_host(qwen):
    """Megatron-Core's cuda_graph_scope: attn takes the attention half (6) of a layer's 12 dense kernels, mlp
    the other half of a dense layer, moe an MoE layer's other half and its whole MoE part; moe_router (with
    moe_preprocess) captures moe.router_kernels of the MoE layer's own kernels; partial and full as before."""
    from rpeg.perf.training import layer_launches
    assert layer_launches("none", moe_layer=True) == 12 and layer_launches("partial", moe_layer=True) == 0
    assert layer_launches(("attn",), moe_layer=True) == 6 and layer_launches(("attn", "mlp"), moe_layer=False) == 0
    assert layer_launches(("attn", "mlp"), moe_layer=True) == 6  # mlp scope is the dense layers' MLP only
    assert layer_launches(("full_iteration",), moe_layer=False) == 0 == layer_launches("full", moe_layer=True)
    with override({"moe.router_kernels": 10.0}):
        # EP8: 16 local experts; 40 - 10 + 2 x 16 = 62 kernels with the router captured, 72 without
        assert moe.moe_launches(qwen, 8, "bf16", ("attn", "moe_router", "moe_preprocess")) == 62
        assert moe.moe_launches(qwen, 8, "bf16", ("attn",)) == 72 == moe.moe_launches(qwen, 8, "bf16", "partial")
        assert moe.moe_launches(qwen, 8, "bf16", ("moe",)) == 0
        # the pass: 8 micro-batches x 48 layers x (62 x 13.5 us + 2 x 62 x 4 us) on x86, and the dense
        # launches: 3 passes x 48 layers x 6 kernels (the MLP half; attention captured) x 4 us
        parts = dict(_pass(qwen, cuda_graphs=("attn", "moe_router", "moe_preprocess")).parts)
        assert parts["MoE kernel launches"] == pytest.approx(8 * 48 * (56 - 10) * (13.5e-6 + 2 * 4e-6))
        assert parts["kernel launches"] == pytest.approx(8 * 3 * 48 * 6 * 4e-6)


@pytest.mark.parametrize("value, needle", [
    (("attn", "router"), "cuda_graphs scope 'router' is not one of attn, mlp, moe, moe_router"),
    (("moe_preprocess",), "moe_preprocess needs moe_router too"),
    (("moe", "moe_router"), "has both moe and moe_router"),
    (("moe",), "scope moe needs capacity_factor > 0"),
    (("full_iteration", "attn"), "combines full_iteration with per-layer scopes"),
    ((), "must be none, partial, full or a non-empty list"),
])
def test_layout_refuses_bad_cuda_graph_scopes(value, needle):
    with pytest.raises(RpegError) as info:
        ParallelLayout(dp=16, ep=16, cuda_graphs=value)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert ParallelLayout(dp=16, ep=16, cuda_graphs=["moe_preprocess", "attn", "moe_router"]).cuda_graphs == (
        "attn", "moe_router", "moe_preprocess")  # a list, in Megatron-Core's order


def test_unfused_permutation_adds_its_kernels_and_a_host_cost_per_chunk(qwen):
    """Without --moe-permute-fusion (NeMo-RL's default megatron_cfg), each MoE layer's forward launches
    8 kernels more than Transformer Engine's fused path, and the all-to-all dispatcher splits and
    concatenates its tokens (and once its probs) in 128 experts x tp 1 chunks three times a forward and
    a backward: 3 x 128 x 0.55 us = 211.2 us forward, 3 x 128 x 1.0 us = 384 us backward, on x86."""
    # the 8 kernels: 8 x 13.5 us after the sync, 2 x 8 x 4 us in the backward
    kernels = (8 * 13.5e-6, 2 * 8 * 4e-6)
    fwd, bwd = moe.unfused_permute_host_s(qwen, 16, 1, "alltoall", 1.0)
    assert (fwd, bwd) == (pytest.approx(kernels[0] + 211.2e-6), pytest.approx(kernels[1] + 384e-6))
    assert moe.unfused_permute_host_s(qwen, 16, 2, "alltoall", 1.0)[0] == pytest.approx(kernels[0] + 422.4e-6)
    assert moe.unfused_permute_host_s(qwen, 16, 1, "alltoall", 2.6)[0] == pytest.approx(2.6 * fwd)  # Grace
    # one local expert: no chunk sort; the allgather dispatcher has none either
    assert moe.unfused_permute_host_s(qwen, 128, 1, "alltoall", 1.0) == pytest.approx(kernels)
    assert moe.unfused_permute_host_s(qwen, 16, 1, "allgather", 1.0) == pytest.approx(kernels)
    assert moe.unfused_permute_host_s(get_model("qwen3-8B"), 1, 1, "alltoall", 1.0) == (0.0, 0.0)
    # the training pass (EP16, 8 micro-batches, 48 MoE layers, x86): 8 kernels x 13.5 us after the sync and
    # 2 x 8 x 4 us in the backward, plus the chunks: 8 x 48 x (108 + 211.2 + 64 + 384) us = 0.29460 s, on its
    # own line; nothing else moves
    base, unfused = _pass(qwen), _pass(qwen, permute_fusion=False)
    line = dict(unfused.parts)["MoE permutation, unfused (host)"]
    assert line == pytest.approx(8 * 48 * (8 * 13.5e-6 + 211.2e-6 + 2 * 8 * 4e-6 + 384e-6))
    assert unfused.seconds - base.seconds == pytest.approx(line, rel=1e-9)
    assert "MoE permutation, unfused (host)" not in dict(base.parts)
    assert sum(s for _, s in unfused.parts) == pytest.approx(unfused.seconds, rel=1e-9)
    assert "unfused-permute" in ParallelLayout(dp=16, ep=16, permute_fusion=False).describe()
    with pytest.raises(RpegError, match="permute_fusion = 1 must be true or false"):
        ParallelLayout(dp=16, ep=16, permute_fusion=1)


def test_nemo_rl_rows_run_the_permutation_their_recipes_set():
    """grpo_math_1B.yaml's megatron_cfg.moe_permute_fusion is false (v0.4-v0.6): the Qwen3-30B-A3B
    recipes keep it; the DeepSeek-V3 and Qwen3-235B performance recipes set it true."""
    from rpeg.graph.serde import read_yaml_file
    from rpeg.perf.validation import bundled, rl_graph

    data = read_yaml_file(str(bundled()["nemo-rl-v0.6"]))
    by_id = {e["id"]: e for e in data["rl"]}
    for row, fused in (("v06-h100-qwen3-30b-a3b-on-32", False), ("v06-h100-dsv3-on-256", True),
                       ("v06-gb200-qwen3-235b-on-64", True)):
        g, _ = rl_graph(by_id[row], {}, "x")
        assert {s.layout.permute_fusion for s in g.stages if s.layout and s.kind.value != "generate"} == {fused}
    with pytest.raises(RpegError, match=r"training.permute_fusion: expected true or false"):
        rl_graph(dict(by_id["v06-h100-qwen3-30b-a3b-on-32"], training={"ep": 8, "permute_fusion": "no"}), {}, "x")
