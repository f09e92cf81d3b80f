"""Training and forward passes (pass_cost): the 1F1B pipeline bubble, recomputation, data-parallel
gradient sync, ZeRO, tensor-parallel communication, and parts that add up to the total.

Llama-3.1-8B (32 layers) on DGX H100 nodes; 2048-token sequences, one per micro-batch unless a
test says otherwise."""

import pytest

from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import get_model
from rpeg.hardware import load_cluster
from rpeg.perf.collectives import Group, all_gather_s, all_reduce_s, reduce_scatter_s
from rpeg.perf.compute import BF16, head_forward
from rpeg.perf.efficiency import DP_OVERLAP, HBM, OPTIMIZER_BYTES_PER_PARAM
from rpeg.perf.memory import ADAM_BYTES_PER_PARAM, device_params
from rpeg.perf.training import PassWorkload, pass_cost

LLAMA = get_model("llama-3.1-8B")
MOE = get_model("qwen3-30B-A3B")
SEQ = 2048


@pytest.fixture(scope="module")
def dgx():
    return load_cluster("dgx-h100", 32)


def cost(cluster, layout, spec=LLAMA, **work):
    w = dict(sequences=64, seq_len=SEQ, attention_context=SEQ / 2, micro_batch=1)
    w.update(work)
    return pass_cost("train", spec, layout, cluster, PassWorkload(**w))


def pipeline_s(c):
    """The micro-batch part of a pass: everything before the gradient sync and the optimizer."""
    return c.seconds - c.part("gradient sync") - c.part("optimizer")


# ---- pipeline bubble ----------------------------------------------------------------------------
@pytest.mark.parametrize("v", [1, 2])
def test_more_microbatches_shrink_the_bubble(dgx, v):
    """Narayanan et al. 2021: the bubble is (pp-1)/v micro-batch times, of the stages without the
    output head (the last stage's head is paid m times, not in the fill and drain): fraction
    (pp-1)/v x (t - h) / (m t + (pp-1)/v x (t - h)), t a micro-batch's time on the last stage,
    h the head's forward and backward."""
    fractions = []
    head = 3 * head_forward(LLAMA, dgx.device, tokens=8 * SEQ).seconds
    for m in (2, 4, 8, 16):
        c = cost(dgx, Layout(pp=4, pp_interleave=v), sequences=8 * m, micro_batch=8)
        assert c.microbatches == m
        bubble = 3 / v
        t = (pipeline_s(c) - c.part("pipeline bubble")) / m
        fraction = c.part("pipeline bubble") / pipeline_s(c)
        assert fraction == pytest.approx(bubble * (t - head) / (m * t + bubble * (t - head)), rel=1e-9)
        fractions.append(fraction)
    assert fractions == sorted(fractions, reverse=True) and len(set(fractions)) == 4


def test_the_output_head_counts_once_per_pipeline_in_the_work(dgx):
    """The head runs on the last stage only: the pass's FLOPs summed over devices do not grow with
    pp (x1.20 at pp 4 and x1.47 at pp 8 when every stage was charged it), and equal the hand count:
    3 x (layers' forward + head) per token, times the tokens."""
    flops = {pp: cost(dgx, Layout(pp=pp), sequences=64).flops for pp in (1, 4, 8)}
    assert flops[4] == pytest.approx(flops[1], rel=1e-9) and flops[8] == pytest.approx(flops[1], rel=1e-9)
    # attention over SEQ / 2 keys per query (the workload's attention_context): the layers' forward
    # and the head per token, without the causal sum's +1/2 per key
    per_token = 2.0 * LLAMA.params_matmul_active() + 2.0 * LLAMA.layers * LLAMA.heads * (
        LLAMA.q_head_dim + LLAMA.v_head_dim) * SEQ / 2
    assert flops[1] == pytest.approx(3 * 64 * SEQ * per_token, rel=1e-4)  # layer_forward's own op count


def test_a_critic_pays_a_scalar_head_not_the_vocabulary(dgx):
    """A value or score head is hidden x 1 per token: the vocabulary head's 2 x vocab x hidden FLOPs
    per token (+7-9% of an 8B model's pass) are gone, the decoder layers' are the same."""
    lm, value = cost(dgx, Layout(), sequences=16), cost(dgx, Layout(), sequences=16, value_head=True)
    tokens = 16 * SEQ
    assert lm.flops - value.flops == pytest.approx(3 * tokens * 2.0 * LLAMA.hidden * (LLAMA.vocab - 1), rel=1e-9)
    assert 0.05 < (lm.flops - value.flops) / lm.flops < 0.12
    assert value.seconds < lm.seconds


def test_no_bubble_without_pipeline_parallelism(dgx):
    assert cost(dgx, Layout()).part("pipeline bubble") == 0.0
    assert cost(dgx, Layout(tp=8)).part("pipeline bubble") == 0.0


def test_interleaving_shrinks_the_bubble(dgx):
    """32 layers over pp=4: 8 per rank either way, in 1 or 2 chunks."""
    plain = cost(dgx, Layout(pp=4))
    inter = cost(dgx, Layout(pp=4, pp_interleave=2))
    assert inter.part("pipeline bubble") < 0.6 * plain.part("pipeline bubble")
    assert inter.part("compute") == pytest.approx(plain.part("compute"), rel=1e-12)
    assert inter.part("pipeline sends") == pytest.approx(2 * plain.part("pipeline sends"), rel=1e-12)
    assert inter.seconds < plain.seconds


# ---- recomputation and forward-only passes ---------------------------------------------------------
def test_full_recompute_costs_more_than_selective_which_costs_more_than_none(dgx):
    none, selective, full = (cost(dgx, Layout(tp=2, recompute=r)) for r in ("none", "selective", "full"))
    assert none.seconds < selective.seconds < full.seconds
    assert none.flops < full.flops
    # full recomputation repeats every layer's forward, its tensor-parallel all-reduces included
    # (not the output head); selective recomputes the attention core only
    m = none.microbatches
    head = head_forward(LLAMA, dgx.device, tokens=SEQ, tp=2).seconds
    layers_fwd = none.part("compute") / (3 * m) - head
    tp_fwd = none.part("tensor-parallel comm") / (2 * m)
    assert full.part("compute") - none.part("compute") == pytest.approx(m * (layers_fwd + tp_fwd), rel=1e-9)
    assert selective.part("compute") - none.part("compute") < 0.1 * m * layers_fwd

def test_a_forward_only_pass_is_about_a_third_of_training(dgx):
    train = cost(dgx, Layout(), sequences=8)
    fwd = cost(dgx, Layout(), sequences=8, forward_only=True)
    assert train.part("compute") == pytest.approx(3 * fwd.part("compute"), rel=1e-12)  # backward = 2 x forward
    assert train.part("kernel launches") == pytest.approx(3 * fwd.part("kernel launches"), rel=1e-12)
    assert 0.25 < fwd.seconds / train.seconds < 1 / 3  # training also runs the optimizer
    assert fwd.part("optimizer") == 0.0 and fwd.part("gradient sync") == 0.0
    assert train.part("optimizer") > 0


# ---- data parallelism and ZeRO -----------------------------------------------------------------------
def test_data_parallelism_adds_a_gradient_sync(dgx):
    assert cost(dgx, Layout()).part("gradient sync") == 0.0
    c = cost(dgx, Layout(dp=8))  # 8 micro-batches per rank: half of the all-reduce overlaps the backward
    params = device_params(LLAMA, Layout(dp=8)).dense
    assert params == pytest.approx(LLAMA.params_total(), rel=1e-12)
    sync = all_reduce_s(dgx, params * 4, Group(8))  # fp32 gradients over one node
    assert c.part("gradient sync") == pytest.approx((1 - DP_OVERLAP.value) * sync, rel=1e-12)
    # one micro-batch per rank: nothing to overlap with
    one = cost(dgx, Layout(dp=8), sequences=8)
    assert one.part("gradient sync") == pytest.approx(sync, rel=1e-12)


def test_data_parallel_group_across_nodes_syncs_slower(dgx):
    """dp=4 with tp=8: one rank per node, the gradients cross InfiniBand."""
    inside = cost(dgx, Layout(dp=4, tp=2))
    across = cost(dgx, Layout(dp=4, tp=8))
    per_param_inside = inside.part("gradient sync") / device_params(LLAMA, Layout(dp=4, tp=2)).dense
    per_param_across = across.part("gradient sync") / device_params(LLAMA, Layout(dp=4, tp=8)).dense
    assert per_param_across > 5 * per_param_inside


def test_zero1_shards_the_optimizer_step_and_syncs_by_reduce_scatter_and_all_gather(dgx):
    plain = cost(dgx, Layout(dp=8))
    z1 = cost(dgx, Layout(dp=8, zero=1))
    assert z1.part("optimizer") == pytest.approx(plain.part("optimizer") / 8, rel=1e-12)
    params = LLAMA.params_total()
    bw = 3.35e12 * HBM["gpu"].value
    assert plain.part("optimizer") == pytest.approx(params * OPTIMIZER_BYTES_PER_PARAM.value / bw, rel=1e-9)
    sync = reduce_scatter_s(dgx, params * 4, Group(8)) + all_gather_s(dgx, params * BF16, Group(8))
    assert z1.part("gradient sync") == pytest.approx((1 - DP_OVERLAP.value) * sync, rel=1e-9)
    assert z1.seconds < plain.seconds


@pytest.mark.parametrize("spec, layout", [
    (LLAMA, Layout(dp=8)),
    (LLAMA, Layout(dp=8, zero=1)),
    (LLAMA, Layout(dp=4, tp=2, zero=2)),
    (LLAMA, Layout(dp=4, cp=2, zero=1)),  # the distributed optimizer shards over dp x cp
    (MOE, Layout(dp=8, ep=8, zero=1)),  # experts live on one rank each: their state is not sharded
    (MOE, Layout(dp=4, tp=2, ep=4, zero=1)),
])
def test_optimizer_step_streams_the_state_the_device_holds(dgx, spec, layout):
    """The optimizer part is the memory-bound Adam step over this device's share of the
    parameters: the same share whose 12 bytes each the memory model puts in `optimizer`."""
    c = cost(dgx, layout, spec=spec)
    params = dict(c.memory_parts)["optimizer"] / ADAM_BYTES_PER_PARAM
    bw = dgx.device.hbm_bandwidth_bytes_per_s * HBM["gpu"].value
    assert c.part("optimizer") == pytest.approx(params * OPTIMIZER_BYTES_PER_PARAM.value / bw, rel=1e-9)


# ---- tensor and sequence parallelism -------------------------------------------------------------------
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_comm_is_two_all_reduces_per_layer_each_way(dgx, tp):
    c = cost(dgx, Layout(tp=tp), sequences=8)
    act = SEQ * LLAMA.hidden * BF16  # one sequence per micro-batch
    per_mb = 2 * 2 * LLAMA.layers * all_reduce_s(dgx, act, Group(tp))  # forward and backward
    assert c.part("tensor-parallel comm") == pytest.approx(8 * per_mb, rel=1e-12)
    assert cost(dgx, Layout(), sequences=8).part("tensor-parallel comm") == 0.0


def test_sequence_parallelism_moves_the_same_bytes_and_splits_the_elementwise_work(dgx):
    plain = cost(dgx, Layout(tp=4))
    sp = cost(dgx, Layout(tp=4, sequence_parallel=True))
    assert sp.part("tensor-parallel comm") == pytest.approx(plain.part("tensor-parallel comm"), rel=1e-12)
    assert sp.part("compute") < plain.part("compute")  # norms and residuals split over tp
    assert plain.part("compute") - sp.part("compute") < 0.1 * plain.part("compute")


# ---- the breakdown -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, layout, work", [
    (LLAMA, Layout(), {}),
    (LLAMA, Layout(dp=2, tp=4, pp=4, pp_interleave=2, zero=1, recompute="selective"), {}),
    (LLAMA, Layout(dp=4, tp=4, pp=2, zero=3), {"micro_batch": 2}),
    (LLAMA, Layout(dp=2, cp=4, tp=4, sequence_parallel=True, recompute="full"), {"seq_len": 32768,
                                                                                 "attention_context": 16384}),
    (LLAMA, Layout(dp=8, tp=4), {"forward_only": True}),
    (MOE, Layout(dp=4, tp=2, ep=4, zero=1), {"optimizer_steps": 4}),
    (MOE, Layout(dp=2, tp=2, pp=4, ep=2), {"forward_only": True}),
])
def test_parts_add_up_to_the_total(dgx, spec, layout, work):
    c = cost(dgx, layout, spec=spec, **work)
    assert c.seconds > 0
    assert all(v > 0 for _, v in c.parts)
    assert sum(v for _, v in c.parts) == pytest.approx(c.seconds, rel=1e-6)
    assert len({k for k, _ in c.parts}) == len(c.parts)
