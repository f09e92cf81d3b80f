"""Per-device memory against hand-worked values: ZeRO's byte counts, Korthikanti's Table 2,
KV-cache sizes from the model cards, and which layouts of Llama-3.1-70B fit on 80 GB."""

import pytest

from rpeg.errors import RpegError
from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import get_model
from rpeg.perf.memory import (
    BUFFER_BYTES,
    MemoryBreakdown,
    activation_bytes_per_layer,
    device_params,
    head_activation_bytes,
    inference_memory,
    kv_cache_bytes_per_token,
    kv_capacity_tokens,
    logits_bytes,
    params_per_device,
    stage_layers,
    training_memory,
    training_memory_stages,
    weight_bytes_per_device,
)

GPU_80GB = 80e9


# ---- weights, gradients, optimizer state under ZeRO ------------------------------------------------
@pytest.mark.parametrize("zero, shards", [(0, (1, 1, 1)), (1, (1, 1, 8)), (2, (1, 8, 8)), (3, (8, 8, 8))])
def test_zero_stages_shard_optimizer_then_gradients_then_weights(zero, shards):
    """Llama-2-7B (6,738,415,616 parameters) over dp=8: bf16 weights 2 B, fp32 main gradients 4 B,
    Adam's fp32 master + two moments 12 B per parameter (ZeRO paper, section 3.1)."""
    m = get_model("llama-2-7B")
    p = 6_738_415_616
    assert m.params_total() == p
    mem = training_memory(m, Layout(dp=8, zero=zero), seq_len=1024, micro_batch=1)
    w, g, o = shards
    assert (mem.weights, mem.gradients, mem.optimizer) == (2 * p / w, 4 * p / g, 12 * p / o)
    if zero == 0:
        assert mem.weights + mem.gradients + mem.optimizer == 18 * p  # 121.3 GB: no 80 GB device holds it


def test_offloaded_optimizer_and_bf16_gradients():
    m = get_model("llama-2-7B")
    mem = training_memory(m, Layout(dp=8, zero=1), seq_len=1024, micro_batch=1, offload_optimizer=True,
                          grad_dtype_bytes=2)
    assert mem.optimizer == 0 and mem.gradients == 2 * m.params_total()


def test_zero3_divides_weights_by_dp_and_keeps_gathered_layers_in_buffers():
    m = get_model("llama-3.1-8B")
    full = weight_bytes_per_device(m, Layout(dp=8))
    assert full == 2 * m.params_total()
    assert weight_bytes_per_device(m, Layout(dp=8, zero=3)) == full / 8
    assert weight_bytes_per_device(m, Layout(dp=4, cp=2, zero=3)) == full / 8  # dense parts shard over dp*cp
    z3 = training_memory(m, Layout(dp=8, zero=3), seq_len=1024, micro_batch=1)
    layer = m.layer_params(0)
    assert z3.buffers == BUFFER_BYTES + layer * (2 * 2 + 4)  # two gathered bf16 layers + one fp32 grad layer


def test_tensor_parallel_splits_all_but_norms():
    m = get_model("llama-3.1-8B")
    replicated = m.layers * m.norm_params() + m.hidden  # layer norms + final norm stay whole
    assert params_per_device(m, Layout(tp=8)) == pytest.approx(replicated + (m.params_total() - replicated) / 8)


def test_pipeline_divides_layers_embedding_first_head_last():
    m = get_model("llama-3.1-8B")
    layer, emb = m.layer_params(0), m.vocab * m.hidden
    assert [len(r) for r in stage_layers(m, 4)] == [8, 8, 8, 8]
    lay = Layout(pp=4)
    assert device_params(m, lay, stage=0).total == 8 * layer + emb
    assert device_params(m, lay, stage=1).total == 8 * layer
    assert device_params(m, lay, stage=3).total == 8 * layer + emb + m.hidden  # head and final norm
    assert params_per_device(m, lay) == 8 * layer + emb + m.hidden
    assert [len(r) for r in stage_layers(get_model("deepseek-v3"), 16)].count(4) == 13  # 61 = 13*4 + 3*3


def test_tied_embeddings_copied_to_last_stage_and_value_head_replaces_lm_head():
    m = get_model("qwen3-1.7B")  # tied
    emb = m.vocab * m.hidden
    assert device_params(m, Layout()).total == m.params_total()
    assert device_params(m, Layout(pp=2), stage=1).total == sum(
        m.layer_params(i) for i in range(14, 28)) + emb + m.hidden
    critic = device_params(m, Layout(pp=2), stage=1, value_head=True).total
    assert critic == sum(m.layer_params(i) for i in range(14, 28)) + m.hidden + m.hidden


def test_moe_experts_divide_by_ep_and_shard_over_their_own_group():
    m = get_model("qwen3-30B-A3B")
    experts = m.moe_layers * m.experts * m.mlp_params(m.moe_ffn)
    assert device_params(m, Layout(dp=8, ep=8)).expert == experts / 8
    assert device_params(m, Layout(dp=8)).expert == experts
    # tp splits attention, not experts (expert tensor parallelism 1)
    assert device_params(m, Layout(dp=2, tp=4, ep=8)).expert == experts / 8
    # ZeRO-3: dense parts over dp*cp = 2, experts over dp*cp*tp/ep = 2*1*4/8 = 1
    lay = Layout(dp=2, tp=4, ep=8, zero=3)
    p = device_params(m, lay)
    assert weight_bytes_per_device(m, lay) == 2 * (p.dense / 2 + p.expert / 1)
    with pytest.raises(RpegError, match=r"ep = 3 must divide dp\*cp\*tp = 8\*1\*1 = 8"):
        training_memory(m, Layout(dp=8, ep=3), seq_len=128, micro_batch=1)


# ---- activations: Korthikanti et al. 2022, Table 2 ------------------------------------------------
@pytest.mark.parametrize("tp, sp, recompute, formula", [
    (1, False, "none", lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h)),
    (8, False, "none", lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    (8, True, "none", lambda s, b, h, a, t: s * b * h / t * (34 + 5 * a * s / h)),
    (8, False, "selective", lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
    (8, True, "selective", lambda s, b, h, a, t: s * b * h * 34 / t),
    (8, False, "full", lambda s, b, h, a, t: 2 * s * b * h),
    (8, True, "full", lambda s, b, h, a, t: 2 * s * b * h / t),
])
def test_korthikanti_table2_for_gpt3(tp, sp, recompute, formula):
    """GPT-3 175B (h 12288, 96 heads), s = 2048, b = 1, 16-bit with dropout, no FlashAttention."""
    m = get_model("gpt3-175B")
    s, b, h, a = 2048, 1, m.hidden, m.heads
    got = activation_bytes_per_layer(m, seq_len=s, micro_batch=b, tp=tp, sequence_parallel=sp, recompute=recompute,
                                     flash_attention=False, dropout=True)
    assert got == pytest.approx(formula(s, b, h, a, tp), rel=1e-12)


def test_without_dropout_and_with_flash_attention():
    """No dropout: the two sbh masks and the softmax's mask and dropout output go: 32sbh + 2as^2b.
    FlashAttention: no s x s matrix at all, one fp32 log-sum-exp per head and query instead."""
    m = get_model("gpt3-175B")
    s, b, h, a = 2048, 2, m.hidden, m.heads
    no_drop = activation_bytes_per_layer(m, seq_len=s, micro_batch=b, flash_attention=False)
    assert no_drop == pytest.approx(s * b * h * 32 + 2 * a * s * s * b, rel=1e-12)
    flash = activation_bytes_per_layer(m, seq_len=s, micro_batch=b)
    assert flash == pytest.approx(s * b * h * 32 + 4 * a * s * b, rel=1e-12)
    selective = activation_bytes_per_layer(m, seq_len=s, micro_batch=b, recompute="selective")
    assert selective == pytest.approx(s * b * h * 32, rel=1e-12)


def test_swiglu_gqa_layer_by_hand():
    """Llama-3.1-8B, per token: norm inputs + QKV and MLP inputs 4 x 2h, Q and attention output
    2 x 2h, K and V 2 x 2 x 1024, fp32 LSE 4 x 32 heads, SwiGLU gate, up, product 3 x 2 x 14336."""
    m = get_model("llama-3.1-8B")
    per_token = 8 * 4096 + 4 * 4096 + 4 * 1024 + 4 * 32 + 6 * 14336
    assert per_token == 139_392
    assert activation_bytes_per_layer(m, seq_len=1, micro_batch=1) == per_token
    assert activation_bytes_per_layer(m, seq_len=4096, micro_batch=2) == 8192 * per_token
    assert activation_bytes_per_layer(m, seq_len=4096, micro_batch=2, cp=4) == 2048 * per_token
    # tp 16 > 8 kv heads: each rank keeps one whole K and V head, the rest splits 16 ways
    tp16 = activation_bytes_per_layer(m, seq_len=1, micro_batch=1, tp=16, sequence_parallel=True)
    assert tp16 == (per_token - 4 * 1024) / 16 + 4 * 1024 / 8


def test_moe_activations_scale_with_experts_per_token():
    m = get_model("qwen3-30B-A3B")
    one = activation_bytes_per_layer(m, seq_len=1, micro_batch=1)
    two = activation_bytes_per_layer(m.replace(experts_per_token=16), seq_len=1, micro_batch=1)
    # 8 more routed copies, each with its input (2h; not its output: Megatron-Core weights by the routing
    # probability inside the activation) and gate, up, product (3 x 2 x 768)
    assert two - one == 8 * (2 * m.hidden + 6 * m.moe_ffn)


def test_output_layer_keeps_its_inputs_and_the_logits_are_their_own_line():
    m = get_model("llama-3.1-8B")
    assert head_activation_bytes(m, seq_len=1000, micro_batch=2, tp=4) == 2000 * 4 * m.hidden
    # 2,000 tokens x 128,256 / 4 vocabulary entries x RPEG's own path (rpeg/perf/logits.py): 10 bytes in a
    # log-prob pass, 12 in training
    assert logits_bytes(m, tokens=2000, tp=4) == 2000 * 32064 * 10 == 641_280_000
    assert logits_bytes(m, tokens=2000, tp=4, train=True) == 2000 * 32064 * 12
    assert logits_bytes(m, tokens=2000, tp=4, value_head=True) == 0


def test_long_multi_turn_logits_hand_worked():
    """slime #2253's case: an 11.6k-token micro-batch over Qwen3.5's 248,320 vocabulary holds "10.8 GB"
    (11.5e9 bytes, 10.7 GiB) in one fp32 copy. NeMo-RL's DistributedLogprob peaks at three fp32 copies,
    34.6 GB; verl's fused kernels (chunks of 512 tokens) keep 512 x 248,320 x 20 = 2.54 GB in training
    whatever the sequence."""
    m = get_model("qwen3-8B").replace(vocab=248_320)
    assert 11_600 * 248_320 * 4 == pytest.approx(10.8 * 2**30, rel=0.01)
    assert logits_bytes(m, tokens=11_600, path="distributed-logprob") == 11_600 * 248_320 * 12 == 34_566_144_000
    assert logits_bytes(m, tokens=11_600, path="fused-linear", train=True) == 512 * 248_320 * 20 == 2_542_796_800
    # in a training pass: the last stage's micro-batch, tp and cp dividing it
    mem = training_memory(m, Layout(tp=2, cp=2, logits="distributed-logprob"), seq_len=11_600, micro_batch=1)
    assert mem.logits == 11_600 / 2 * 248_320 / 2 * 12
    chunked = training_memory(m, Layout(tp=2, cp=2, logits="fused-linear"), seq_len=11_600, micro_batch=1)
    assert chunked.logits == 512 * 248_320 / 2 * 20
    assert mem.total - chunked.total == mem.logits - chunked.logits
    assert dict(mem.parts())["logits"] == mem.logits  # a line of the breakdown `rpeg predict` prints
    fwd = inference_memory(m, Layout(tp=2, cp=2, logits="fp32-ce"), seq_len=11_600, micro_batch=1)
    assert fwd.logits == 11_600 / 2 * 248_320 / 2 * 6  # OpenRLHF's log-prob pass: 6, its training 10


# ---- pipeline schedules -----------------------------------------------------------------------
def test_1f1b_first_stage_holds_pp_microbatches_interleaved_more():
    """Narayanan 2021: rank r of 1F1B holds pp - r micro-batches, so stage 0 holds all L layers'
    worth; interleaved with v chunks: L(1 + (pp-1)/(pp v)) (Korthikanti section 4.2.2)."""
    m = get_model("llama-3.1-70B")
    s, b = 4096, 1
    layer = activation_bytes_per_layer(m, seq_len=s, micro_batch=b)
    stages = training_memory_stages(m, Layout(pp=4), seq_len=s, micro_batch=b)
    assert [st.activations for st in stages[:3]] == pytest.approx([80 * layer, 60 * layer, 40 * layer], rel=1e-12)
    head = head_activation_bytes(m, seq_len=s, micro_batch=b)
    assert stages[3].activations == pytest.approx(20 * layer + head, rel=1e-12)
    vpp = training_memory_stages(m, Layout(pp=4, pp_interleave=2), seq_len=s, micro_batch=b)
    assert vpp[0].activations == pytest.approx(80 * (1 + 3 / 8) * layer, rel=1e-12)
    capped = training_memory_stages(m, Layout(pp=4), seq_len=s, micro_batch=b, microbatches_in_flight=2)
    assert capped[0].activations == pytest.approx(2 * 20 * layer, rel=1e-12)


def test_full_recomputation_keeps_inputs_plus_one_recomputed_layer():
    m = get_model("llama-3.1-8B")
    s, b = 4096, 1
    kept = activation_bytes_per_layer(m, seq_len=s, micro_batch=b, recompute="full")
    assert kept == 2 * s * b * m.hidden
    full = activation_bytes_per_layer(m, seq_len=s, micro_batch=b)
    mem = training_memory(m, Layout(recompute="full"), seq_len=s, micro_batch=b)
    assert mem.activations == pytest.approx(32 * kept + full + head_activation_bytes(m, seq_len=s, micro_batch=b))


def test_training_memory_returns_the_fullest_stage():
    m = get_model("llama-3.1-8B")
    stages = training_memory_stages(m, Layout(pp=4, dp=2, zero=1), seq_len=2048, micro_batch=1)
    assert training_memory(m, Layout(pp=4, dp=2, zero=1), seq_len=2048, micro_batch=1) == max(
        stages, key=lambda st: st.total)
    layer = activation_bytes_per_layer(m, seq_len=2048, micro_batch=1)
    assert [st.activations for st in stages[:3]] == pytest.approx([32 * layer, 24 * layer, 16 * layer])
    assert stages[3].activations == pytest.approx(8 * layer + head_activation_bytes(m, seq_len=2048, micro_batch=1))


# ---- does it fit ------------------------------------------------------------------------------------
def test_llama_70b_needs_many_devices():
    m = get_model("llama-3.1-70B")
    single = training_memory(m, Layout(), seq_len=4096, micro_batch=1)
    assert not single.fits(GPU_80GB)
    assert single.weights == 2 * m.params_total()  # 141 GB of weights alone
    sharded = training_memory(m, Layout(dp=2, tp=8, pp=4, zero=1, recompute="full"), seq_len=4096, micro_batch=1)
    assert sharded.fits(GPU_80GB), sharded.describe()
    assert sharded.total < 40e9
    assert not training_memory(m, Layout(dp=2, tp=8, pp=4), seq_len=4096, micro_batch=1).total < sharded.total


def test_inference_memory_is_weights_plus_one_layer():
    m = get_model("llama-3.1-8B")
    inf = inference_memory(m, Layout(tp=2), seq_len=4096, micro_batch=4)
    assert inf.weights == weight_bytes_per_device(m, Layout(tp=2))
    assert inf.gradients == inf.optimizer == inf.kv_cache == 0
    train = training_memory(m, Layout(tp=2), seq_len=4096, micro_batch=4)
    assert inf.activations < train.activations / 10
    # the logits of 16k tokens over 128k vocab, split over tp, are the larger transient here: 10 bytes each
    # on RPEG's own path (bf16 output, fp32 copy, fp32 log-softmax); beside them only the head's bf16 input
    assert inf.logits == 4 * 4096 * m.vocab / 2 * 10
    assert inf.activations == 4 * 4096 * 2 * m.hidden
    assert inference_memory(m, Layout(tp=2), seq_len=4096, micro_batch=4, value_head=True).logits == 0


# ---- KV cache ----------------------------------------------------------------------------------------
def test_kv_cache_per_token():
    m = get_model("llama-3.1-8B")
    assert kv_cache_bytes_per_token(m) == 32 * 2 * 8 * 128 * 2 == 131072
    assert [kv_cache_bytes_per_token(m, tp) for tp in (2, 4, 8, 16)] == [65536, 32768, 16384, 16384]
    ds = get_model("deepseek-v3")
    assert kv_cache_bytes_per_token(ds) == kv_cache_bytes_per_token(ds, tp=8) == 61 * (512 + 64) * 2


def test_kv_capacity():
    m = get_model("llama-3.1-8B")
    assert kv_capacity_tokens(m, Layout(), GPU_80GB) == (0.9 * 80e9 - 2 * m.params_total()) / 131072
    sizes = [kv_capacity_tokens(get_model(n), Layout(), GPU_80GB) for n in ("qwen3-0.6B", "qwen3-8B", "qwen3-32B")]
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] > 0
    big = get_model("llama-3.1-70B")
    by_tp = [kv_capacity_tokens(big, Layout(tp=tp), GPU_80GB) for tp in (1, 2, 4, 8)]
    assert by_tp[0] == 0 and by_tp == sorted(by_tp) and by_tp[1] > 0
    reserved = kv_capacity_tokens(m, Layout(), GPU_80GB, activation_reserve_bytes=4e9)
    assert reserved == pytest.approx(kv_capacity_tokens(m, Layout(), GPU_80GB) - 4e9 / 131072)
    # pipeline stages cache only their own layers
    assert kv_capacity_tokens(m, Layout(pp=2), GPU_80GB) > kv_capacity_tokens(m, Layout(), GPU_80GB)


# ---- the breakdown value -------------------------------------------------------------------------------
def test_breakdown_total_fits_add_describe():
    a = MemoryBreakdown(weights=10e9, gradients=20e9, activations=5e9)
    b = MemoryBreakdown(weights=1e9, kv_cache=2e9)
    assert a.total == 35e9 and a.fits(35e9) and not a.fits(34.9e9)
    assert (a + b) == MemoryBreakdown(weights=11e9, gradients=20e9, activations=5e9, kv_cache=2e9)
    assert a.parts() == (("weights", 10e9), ("gradients", 20e9), ("activations", 5e9))
    assert a.describe() == "35.0 GB per device (weights 10.0, gradients 20.0, activations 5.0)"


def test_bad_recompute_names_the_choices():
    with pytest.raises(RpegError, match="none, selective or full"):
        activation_bytes_per_layer(get_model("tiny-qwen2"), seq_len=8, micro_batch=1, recompute="some")
