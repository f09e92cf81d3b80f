"""Weight sync from the trainer to the engine, and the context switch of a colocated plan."""

import pytest

from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import get_model
from rpeg.hardware import load_cluster
from rpeg.perf.efficiency import HBM, HOST_LINK_BYTES_PER_S, LINK
from rpeg.perf.weightsync import (RECEIVE_BUFFER, SLEEPING_ENGINE, context_switch_cost, receive_buffer_bytes,
                                  sleeping_engine_bytes, weight_sync_cost)

MODELS = [get_model(n) for n in ("qwen3-0.6B", "llama-3.1-8B", "llama-3.1-70B")]  # growing
TRAIN = Layout(dp=2, tp=4)
GEN = Layout(dp=2, tp=4)


@pytest.fixture(scope="module")
def dgx():
    return load_cluster("dgx-h100", 16)


def sync(cluster, spec, colocated, train=TRAIN, gen=GEN):
    return weight_sync_cost("sync", spec, train, gen, cluster, colocated=colocated, separation=0 if colocated else 8)


@pytest.mark.parametrize("spec", MODELS, ids=lambda m: m.name)
def test_colocated_sync_is_cheaper_than_sending_across_nodes(dgx, spec):
    colocated, disaggregated = sync(dgx, spec, True), sync(dgx, spec, False)
    assert colocated.seconds < disaggregated.seconds
    assert colocated.part("copy into engine") == disaggregated.part("copy into engine")
    assert disaggregated.part("send to generation") > colocated.part("gather shards")


def test_disaggregated_send_by_hand(dgx):
    """4 training shard holders send 2 bytes per parameter over their own 400 Gb/s NICs."""
    spec = MODELS[1]
    nic = 50e9 * LINK["infiniband"].value
    c = sync(dgx, spec, False)
    assert c.part("send to generation") == pytest.approx(spec.params_total() * 2 / (4 * nic) + 5e-6, rel=1e-12)
    shard = spec.params_total() * 2 / 4  # one tp=4 engine shard
    assert c.part("copy into engine") == pytest.approx(shard / (3.35e12 * HBM["gpu"].value), rel=1e-12)
    assert sum(v for _, v in c.parts) == pytest.approx(c.seconds, rel=1e-12)


@pytest.mark.parametrize("colocated", [True, False])
def test_bigger_models_take_longer_to_sync(dgx, colocated):
    times = [sync(dgx, spec, colocated).seconds for spec in MODELS]
    assert times[0] < times[1] < times[2]


def test_context_switch_grows_with_the_model():
    times = [context_switch_cost("switch", spec, TRAIN, GEN).seconds for spec in MODELS]
    assert times[0] < times[1] < times[2]


def test_context_switch_by_hand():
    """Trainer state (bf16 weights, 12 B of Adam state and master weights; gradients are dropped,
    not moved) and the engine's bf16 weights go to host and come back over a 25 GB/s host link."""
    spec = MODELS[1]
    c = context_switch_cost("switch", spec, Layout(dp=8), Layout(dp=8))
    p = spec.params_total()
    host = HOST_LINK_BYTES_PER_S.value
    for move in ("offload trainer state", "reload trainer state"):  # each its own line: they land in different
        assert c.part(move) == pytest.approx(p * (2 + 12) / host, rel=1e-12)  # timers of the systems
    for move in ("engine sleep", "engine wake"):
        assert c.part(move) == pytest.approx(p * 2 / host, rel=1e-12)
    assert c.seconds == pytest.approx(2 * p * 16 / host, rel=1e-12)
    # ZeRO-1 leaves 1/dp of the optimizer state to move, ZeRO-3 also 1/dp of the weights
    z1 = context_switch_cost("switch", spec, Layout(dp=8, zero=1), Layout(dp=8))
    assert z1.part("offload trainer state") == pytest.approx(p * (2 + 12 / 8) / host, rel=1e-12)
    z3 = context_switch_cost("switch", spec, Layout(dp=8, zero=3), Layout(dp=8))
    assert z3.part("offload trainer state") == pytest.approx(p * (2 + 12) / 8 / host, rel=1e-12)


def test_context_switch_moves_the_experts_optimizer_state_by_its_own_data_parallel_group():
    """Megatron's distributed optimizer shards a MoE model's experts over dp*cp*tp/ep, not dp: Qwen3-30B-A3B
    with tp 1, ep 8, dp 8 has an expert data-parallel group of one, so each device moves the whole Adam state
    of its 16 experts (12 B a parameter) and 1/8 of the dense parts'; with cp 2 the dense group is dp*cp."""
    from rpeg.perf.memory import device_params

    spec = get_model("qwen3-30B-A3B")
    host = HOST_LINK_BYTES_PER_S.value
    layout = Layout(dp=8, ep=8, zero=1)
    d = device_params(spec, layout)
    assert d.expert > 2 * d.dense  # 16 of 128 experts of every layer against one dense copy and the embeddings
    c = context_switch_cost("switch", spec, layout, Layout(dp=8))
    assert c.part("offload trainer state") == pytest.approx((d.total * 2 + (d.dense / 8 + d.expert) * 12) / host,
                                                            rel=1e-12)
    # against sharding the experts over dp as well: 7/8 of their state more
    assert c.part("offload trainer state") - (d.total * 2 + d.total * 12 / 8) / host == pytest.approx(
        d.expert * 12 * 7 / 8 / host, rel=1e-9)
    cp = Layout(dp=4, cp=2, ep=8, zero=1)  # dense group dp*cp = 8, expert group 4*2*1/8 = 1
    dc = device_params(spec, cp)
    assert context_switch_cost("switch", spec, cp, Layout(dp=8)).part("offload trainer state") == pytest.approx(
        (dc.total * 2 + (dc.dense / 8 + dc.expert) * 12) / host, rel=1e-12)


# ---- refit(gather="full"): every device gathers every tensor in full ------------------------------
def test_a_full_gather_moves_the_whole_model_to_every_device_and_costs_more_than_the_shard():
    from rpeg.perf.collectives import Group, broadcast_s, tensorwise_all_gather_s, tp_split_tensors, weight_tensors

    cluster = load_cluster("dgx-h100", 64)
    spec = get_model("llama-3.1-70B")
    train, gen = Layout(dp=4, tp=4, pp=4, zero=1), Layout(dp=16, tp=4)
    shard = weight_sync_cost("s", spec, train, gen, cluster, colocated=True, separation=0)
    full = weight_sync_cost("s", spec, train, gen, cluster, colocated=True, separation=0, gather="full")
    assert full.seconds > shard.seconds
    total = spec.params_total() * 2
    # one collective per split tensor of a pipeline stage (the norms are whole on every rank)
    assert tp_split_tensors(spec) == weight_tensors(spec) - 2 * spec.layers - 1
    assert full.part("gather over tensor parallelism") == pytest.approx(
        tensorwise_all_gather_s(cluster, total / 4, Group(4, 1), round(tp_split_tensors(spec) / 4)))
    # the pipeline group is 16 ranks apart (tp x dp): its broadcast crosses nodes, over InfiniBand
    assert full.part("broadcast over pipeline stages") == pytest.approx(broadcast_s(cluster, total, Group(4, 16)))
    assert full.part("broadcast over pipeline stages") > total / 50e9 * 0.9  # one 400 Gb/s NIC per GPU at most
    dev = cluster.device
    assert full.part("pack into buckets") == pytest.approx(
        2 * total / (dev.hbm_bandwidth_bytes_per_s * HBM["gpu"].value))
    assert full.part("copy into engine") == shard.part("copy into engine")


def test_a_full_gather_under_zero3_gathers_over_data_parallelism_and_moe_over_experts():
    cluster = load_cluster("dgx-h100", 16)
    dense = weight_sync_cost("s", get_model("llama-3.1-8B"), Layout(dp=16, zero=3), Layout(dp=16), cluster,
                             colocated=True, separation=0, gather="full")
    assert dense.part("gather over data parallelism") > 0 and "broadcast over pipeline stages" not in dict(dense.parts)
    moe = weight_sync_cost("s", get_model("qwen3-30B-A3B"), Layout(dp=8, tp=2, ep=8, zero=1), Layout(dp=4, tp=4),
                           cluster, colocated=True, separation=0, gather="full")
    assert moe.part("gather experts") > 0 and moe.part("gather over tensor parallelism") > 0


def test_the_refit_pass_sets_the_gather_the_cost_follows_it_and_bad_values_are_refused():
    from rpeg.errors import PassRefused
    from rpeg.graph.io import graph_from_text, graph_to_yaml
    from rpeg.hardware import load_cluster as cl
    from rpeg.passes import refit
    from rpeg.search.baselines import BASELINES
    from rpeg.search.layouts import LayoutCache
    from rpeg.spec import spec_from_data

    spec = spec_from_data({"algorithm": "grpo", "model": "llama-3.1-8B",
                           "job": {"prompts": 16, "samples_per_prompt": 4, "prompt_len": 256,
                                   "response": {"kind": "fixed", "mean": 512}}})
    cluster = cl("dgx-h100", 16)
    plan = BASELINES["nemo-rl"].build(spec.graph(), cluster, 16, LayoutCache())
    assert plan.refit_gather == "full" and "refit(gather='full')" in plan.history
    assert graph_from_text(graph_to_yaml(plan)) == plan
    from rpeg.perf.step import predict_step

    as_shard = predict_step(refit(plan, "shard"), cluster).stages["actor_sync"]
    as_full = predict_step(plan, cluster).stages["actor_sync"]
    assert "pack into buckets" in dict(as_full.parts) and "gather shards" in dict(as_shard.parts)
    assert as_full.seconds > as_shard.seconds
    with pytest.raises(PassRefused, match="gather must be one of shard, full"):
        refit(plan, "half")


def test_a_full_sync_to_separate_engines_comes_from_one_sender_and_hides_the_gather_under_it():
    """NeMo-RL's broadcast_weights_for_collective (packed_broadcast_producer, src=0) and OpenRLHF's
    rank-0 broadcast: the whole model leaves one rank, in a ring through the NCCL group of every trainer
    and engine rank, so it costs at least the model over the NICs of the root's node, whatever the
    number of trainers; the gathers of the next tensors and the engines' loads overlap it."""
    cluster = load_cluster("dgx-h100", 32)
    spec = get_model("llama-3.1-70B")
    train, gen = Layout(dp=2, tp=4, pp=2, zero=1), Layout(dp=4, tp=4)
    full = weight_sync_cost("s", spec, train, gen, cluster, colocated=False, separation=16, gather="full")
    shard = weight_sync_cost("s", spec, train, gen, cluster, colocated=False, separation=16)
    total = spec.params_total() * 2
    node_nics = 8 * 400e9 / 8 * LINK["infiniband"].value
    wire = "broadcast to generation, one sender, beyond the sender's and receiver's work"
    rest = sum(v for k, v in full.parts if k not in (wire, "copy into engine"))
    # the broadcast of bucket i overlaps the filling of bucket i + 1: the longer of the two shows
    assert rest + full.part(wire) >= total / node_nics
    assert full.seconds > shard.seconds  # shard holders send in parallel
    assert full.seconds == pytest.approx(sum(v for _, v in full.parts), rel=1e-12)
    more = weight_sync_cost("s", spec, Layout(dp=4, tp=4, pp=2, zero=1), gen, load_cluster("dgx-h100", 48),
                            colocated=False, separation=32, gather="full")
    assert more.seconds == pytest.approx(full.seconds, rel=0.05)  # more trainers do not send faster


def test_a_colocated_sync_from_zero3_shards_gathers_over_data_parallelism_first():
    """FSDP / ZeRO-3 keeps 1/dp of the weights per device, so even a shard-wise colocated sync must
    all-gather over data parallelism (the hybrid engine's full state dict); ZeRO-1 keeps them whole."""
    cluster = load_cluster("dgx-h100", 16)
    spec = get_model("llama-3.1-8B")
    z3 = weight_sync_cost("s", spec, Layout(dp=16, zero=3), Layout(dp=16), cluster, colocated=True, separation=0)
    z1 = weight_sync_cost("s", spec, Layout(dp=16, zero=1), Layout(dp=16), cluster, colocated=True, separation=0)
    assert z3.part("gather over data parallelism") > 0
    assert "gather over data parallelism" not in dict(z1.parts)
    assert z3.seconds > z1.seconds


def test_the_sender_pays_per_tensor_and_per_byte_by_its_trainer_engine():
    """Each HF tensor (one per expert) costs the trainer engine's fitted host time; an MoE model of
    similar size has many more tensors, so its sync's per-tensor line is far longer."""
    from rpeg.perf.collectives import weight_tensors
    from rpeg.perf.weightsync import TENSOR_HOST_S, trainer_engine

    cluster = load_cluster("dgx-h100", 16)
    dense, moe = get_model("qwen2.5-32B"), get_model("qwen3-30B-A3B")
    fsdp = Layout(dp=8, zero=3)
    assert trainer_engine(fsdp) == "fsdp" and trainer_engine(Layout(dp=8, zero=1)) == "megatron"
    costs = {m.name: weight_sync_cost("s", m, fsdp, Layout(dp=2, tp=4), cluster, colocated=False, separation=8,
                                      gather="full") for m in (dense, moe)}
    line = {n: next(v for k, v in c.parts if k.startswith("sender: per-tensor work")) for n, c in costs.items()}
    assert line[moe.name] == pytest.approx(weight_tensors(moe) * TENSOR_HOST_S["fsdp"].value)
    assert line[moe.name] > 10 * line[dense.name]
    assert any(k.startswith("sender: assemble") for k, _ in costs[dense.name].parts)


def test_receive_buffer_hand_worked():
    """Two buckets of the largest layer-or-embedding, each at most vLLM's 1 GiB packed buffer. Llama-3.1-8B:
    the embedding, 128,256 x 4,096 = 525.3M parameters (a decoder layer has 218.1M), 1.05 GB in bf16, under
    the cap: two in full are 2.10 GB, two tp-4 slices 525.3 MB. Llama-3.1-70B's decoder layer, 855.6M
    parameters (1.71 GB), is capped: two buckets of 1 GiB."""
    m = get_model("llama-3.1-8B")
    assert m.vocab * m.hidden == 525_336_576 > m.layer_params(0)
    assert receive_buffer_bytes(m, Layout(tp=4), "full") == 2 * 525_336_576 * 2 == 2_101_346_304
    assert receive_buffer_bytes(m, Layout(tp=4), "shard") == 2 * 525_336_576 * 2 / 4 == 525_336_576
    big = get_model("llama-3.1-70B")
    assert big.layer_params(0) * 2 > 2**30
    assert receive_buffer_bytes(big, Layout(tp=4), "full") == 2 * 2**30


def test_sleeping_engine_keeps_its_nccl_buffers():
    assert sleeping_engine_bytes(Layout(dp=8)) == 0  # one device per engine: no communicator
    assert sleeping_engine_bytes(Layout(dp=2, tp=4)) == 2**30 == sleeping_engine_bytes(Layout(dp=4, pp=2))


def test_memory_lines_reach_the_stages():
    """A colocated GRPO plan: the engine holds the receive buffer, the trainer and the log-prob passes
    the sleeping engine's NCCL buffers, each a line of `memory_parts` (what `rpeg predict` prints)."""
    from rpeg.perf.step import predict_step
    from rpeg.search.default import default_plan
    from rpeg.spec import spec_from_data

    graph = spec_from_data({"algorithm": "grpo", "model": "qwen2.5-32B", "job": {
        "prompts": 8, "samples_per_prompt": 4, "prompt_len": 256, "response": {"kind": "fixed", "mean": 256}},
        "cluster": "dgx-h100", "gpus": 8}).graph()
    cluster = load_cluster("dgx-h100", 8)
    g = default_plan(graph, cluster, 8)
    pred = predict_step(g, cluster)
    gen = next(s for s in g.stages if s.kind.value == "generate")
    parts = dict(pred.stages[gen.name].memory_parts)
    assert parts[RECEIVE_BUFFER] == receive_buffer_bytes(g.model(gen.model).spec, gen.layout, g.refit_gather)
    sleeping = sleeping_engine_bytes(gen.layout)
    assert sleeping > 0, gen.layout.describe()  # the default plan gives a 32B engine tensor parallelism
    for s in g.stages:
        if s.kind.value in ("train", "infer"):
            assert dict(pred.stages[s.name].memory_parts)[f"{SLEEPING_ENGINE} ({gen.name})"] == sleeping


# ---- DeepSeek-V3's full-weight refit, as NeMo-RL v0.5/v0.6 runs it (Megatron-Bridge export_hf_weights) ----
DSV3_TRAIN, DSV3_GEN = Layout(dp=16, pp=16, ep=16, zero=1), Layout(dp=1, tp=32)  # nrl-nccl-h100-dsv3


def _dsv3_full(colocated: bool):
    spec = get_model("deepseek-v3")
    cluster = load_cluster("dgx-h100", 256 if colocated else 288)
    return spec, cluster, weight_sync_cost("s", spec, DSV3_TRAIN, DSV3_GEN, cluster, colocated=colocated,
                                           separation=0 if colocated else 256, gather="full")


def test_megatron_export_walks_local_experts_and_the_pipeline_broadcast_carries_one_ep_share_by_hand():
    """Megatron-Bridge broadcasts each pipeline stage's own expert-parallel share of local expert L over
    the pipeline group, then all-gathers it over expert parallelism (one task gives ep experts' tensors).
    DeepSeek-V3: 61 layers, 58 MoE with 256 routed experts (gate, up, down in the checkpoint; fused
    fc1 and fc2 in Megatron), moe_ffn 2048, hidden 7168."""
    from rpeg.perf.collectives import weight_tensors
    from rpeg.perf.weightsync import export_tasks

    spec, cluster, c = _dsv3_full(colocated=False)
    assert weight_tensors(spec) == 45_337
    expert_tensors = 58 * 256 * 3  # 44,544 of them
    assert export_tasks(spec, DSV3_TRAIN) == 45_337 - expert_tensors + 58 * 16 * 2  # 2,649 tasks
    assert export_tasks(spec, Layout(dp=16, pp=16, ep=16, zero=3)) == 45_337  # FSDP walks every HF tensor
    experts = 256 * 58 * 3 * 7168 * 2048 * 2  # bf16 bytes of the routed experts: 1.308 TB
    dense = spec.params_total() * 2 - experts  # 34 GB
    # 16 ranks 16 devices apart: one per node, one 400 Gb/s NIC each (x 0.9), 5 us a hop
    expected = (dense + experts / 16) / (50e9 * 0.9) + 15 * 5e-6
    assert c.part("broadcast over pipeline stages") == pytest.approx(expected, rel=1e-9)
    assert c.part("broadcast over pipeline stages") == pytest.approx(2.58, abs=0.01)
    assert "2,649 tensors" in next(k for k, _ in c.parts if k.startswith("sender: per-tensor work"))


def test_one_sender_broadcast_overlaps_sender_receiver_and_wire_but_a_colocated_sync_adds_them():
    """Disaggregated: packed_broadcast_producer / _consumer keep two buckets in flight, so the sender's
    export, the wire and the engines' load_weights run at once and the slowest sets the time. The NCCL
    group holds all 256 trainer and 32 engine ranks (NeMo-RL's init_collective), so the ring leaves each
    node through its 8 NICs: min(8 x 50 GB/s x 0.9, NVLink 450 GB/s x 0.8) = 360 GB/s. Colocated, the
    engine acknowledges each bucket before the next is sent, and the lines add."""
    from rpeg.perf.collectives import weight_tensors
    from rpeg.perf.fitted import override

    total = get_model("deepseek-v3").params_total() * 2
    wire_s = total / 360e9 + 287 * 5e-6  # 3.73 s
    recv = f"receiver: load {45_337:,} tensors"
    for load, assembly, host in ((5e-4, 1e11, 3e-4), (1e-6, 1e11, 3e-4), (1e-6, 1e13, 1e-6)):
        with override({"weightsync.load_tensor_s": load, "weightsync.assembly_bytes_per_s[megatron]": assembly,
                       "weightsync.tensor_host_s[megatron]": host}):
            spec, _, c = _dsv3_full(colocated=False)
            _, _, co = _dsv3_full(colocated=True)
        copy = c.part("copy into engine")
        receiver = weight_tensors(spec) * load
        sender = sum(v for k, v in c.parts if not k.startswith(("receiver", "broadcast to generation", "copy")))
        assert c.seconds == pytest.approx(max(sender, receiver, wire_s) + copy, rel=1e-9)
        assert c.part(f"{recv}, beyond the sender's work") == pytest.approx(max(0.0, receiver - sender), rel=1e-9)
        assert co.part(recv) == pytest.approx(receiver, rel=1e-9)
        co_sender = sum(v for k, v in co.parts if not k.startswith(("receiver", "copy")))
        assert co.seconds == pytest.approx(co_sender + receiver + co.part("copy into engine"), rel=1e-9)
        wire = c.part("broadcast to generation, one sender, beyond the sender's and receiver's work")
        assert wire == pytest.approx(max(0.0, wire_s - max(sender, receiver)), abs=1e-9)
    # host-free, the sender's collectives still take longer than the wire: the pipeline broadcast of
    # 116 GB at 45 GB/s, the experts' all-gather and the bucket copy
    assert sender > wire_s and c.seconds == pytest.approx(sender + copy, rel=1e-9)
