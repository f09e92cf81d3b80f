"""Megatron-Core recipe options (rpeg/perf/recipe_options.py) in the memory and time models: hand-computed
cases, and defaults that change nothing."""

from __future__ import annotations

import pytest

from rpeg.errors import RpegError
from rpeg.graph import ParallelLayout, get_model
from rpeg.perf import memory, recipe_options
from rpeg.perf.memory import activation_bytes_per_layer, device_params, training_memory

QWEN8 = get_model("qwen3-8B")  # h 4096, 32 heads x 128, 8 kv heads, ffn 12288, swiglu, q/k norms
QWEN30 = get_model("qwen3-30B-A3B")  # h 2048, 32 heads, 4 kv heads, 128 experts of 768, top-8
DSV3 = get_model("deepseek-v3")


def test_defaults_change_nothing():
    lay = ParallelLayout(dp=8, tp=1, zero=1)
    assert (lay.recompute_modules, lay.recompute_layers, lay.offload_activation_layers, lay.grad_dtype,
            lay.optimizer_moments, lay.pp_embedding_loss_slots) == ((), 0, 0, "fp32", "fp32", False)
    assert recipe_options.selective_modules(lay.replace(recompute="selective")) == ("core_attn",)
    assert recipe_options.optimizer_bytes_per_param(lay) == memory.ADAM_BYTES_PER_PARAM == 12
    assert recipe_options.grad_bytes(lay) == 4 and recipe_options.step_grad_copy_bytes_per_param(lay) == 0


def test_layernorm_recompute_drops_both_norm_outputs():
    """2 bytes x h for each of the two norms' outputs, split over tp under SP: 2 x 2 x 4096 / 2."""
    sel = dict(seq_len=4096, micro_batch=1, tp=2, sequence_parallel=True, recompute="selective")
    plain = activation_bytes_per_layer(QWEN8, **sel)
    # through the layout path: the stored bytes of one layer per token, with and without layernorm
    kw = dict(seq_len=4096, tp=2, sp=True, flash=True, dropout=False, recompute="selective")
    core = memory._layer_bytes_per_token(QWEN8, 0, modules=("core_attn",), **kw)
    both = memory._layer_bytes_per_token(QWEN8, 0, modules=("core_attn", "layernorm"), **kw)
    assert core * 4096 == plain and core - both == 2 * 2 * 4096 / 2


def test_moe_act_drops_each_routed_copys_activation_output():
    """8 routed copies x 768 x 2 bytes, no tp: 12,288 bytes per token of an MoE layer."""
    kw = dict(seq_len=4096, tp=1, sp=False, flash=True, dropout=False, recompute="selective")
    core = memory._layer_bytes_per_token(QWEN30, 47, modules=("core_attn",), **kw)
    act = memory._layer_bytes_per_token(QWEN30, 47, modules=("core_attn", "moe_act"), **kw)
    assert core - act == 8 * 768 * 2


def test_mla_up_proj_drops_q_k_v():
    """DeepSeek-V3, tp 1: 128 heads x (192 + 192 + 128) x 2 bytes per token."""
    assert recipe_options.dropped_bytes_per_token(DSV3, 10, ("mla_up_proj",), tp=1, sp=False) == 128 * 512 * 2
    assert recipe_options.dropped_bytes_per_token(QWEN8, 0, ("mla_up_proj",), tp=1, sp=False) == 0  # no MLA


def test_mlp_recompute_is_for_dense_layers_only():
    dense = recipe_options.dropped_bytes_per_token(QWEN8, 0, ("mlp",), tp=4, sp=False)
    assert dense == 2 * 3 * 12288 / 4  # gate, up and product
    assert recipe_options.dropped_bytes_per_token(QWEN30, 10, ("mlp",), tp=1, sp=False) == 0  # an MoE layer


def test_fp8_linear_layers_save_their_inputs_in_one_byte():
    """Qwen3-8B, tp 1: GEMM inputs QKV (4096), output projection (32 x 128), fc1 (4096), fc2 (12288) per
    token, each at 1 + 1/32 bytes instead of 2."""
    kw = dict(seq_len=4096, tp=1, sp=False, flash=True, dropout=False, recompute="none")
    bf16 = memory._layer_bytes_per_token(QWEN8, 0, **kw)
    fp8 = memory._layer_bytes_per_token(QWEN8, 0, dtype="fp8", **kw)
    assert bf16 - fp8 == pytest.approx((2 - 1 - 1 / 32) * (4096 + 4096 + 4096 + 12288))
    full = dict(kw, recompute="full")
    assert memory._layer_bytes_per_token(QWEN8, 0, dtype="fp8", **full) == memory._layer_bytes_per_token(
        QWEN8, 0, **full)  # only the layer input: no GEMM input kept


def test_full_recompute_of_some_layers_keeps_the_others_whole():
    """36 layers, 9 recomputed: a quarter store only the 2h input, three quarters everything; plus the
    layer being recomputed once."""
    base = ParallelLayout(dp=8, zero=1)
    none = training_memory(QWEN8, base, seq_len=4096, micro_batch=1).activations
    part = training_memory(QWEN8, base.replace(recompute="full", recompute_layers=9), seq_len=4096,
                           micro_batch=1).activations
    head = memory.head_activation_bytes(QWEN8, seq_len=4096, micro_batch=1)
    layer = (none - head) / 36
    assert part - head == pytest.approx(27 * layer + 9 * 4096 * 2 * 4096 + layer)


def test_activation_offload_keeps_the_other_layers_and_one_in_flight():
    base = ParallelLayout(dp=8, zero=1)
    none = training_memory(QWEN8, base, seq_len=4096, micro_batch=1).activations
    head = memory.head_activation_bytes(QWEN8, seq_len=4096, micro_batch=1)
    half = training_memory(QWEN8, base.replace(offload_activation_layers=18), seq_len=4096,
                           micro_batch=1).activations
    layer = (none - head) / 36
    assert half - head == pytest.approx(18 * layer + layer)


def test_bf16_gradients_and_moments():
    """Qwen3-8B on 8 ranks, ZeRO-1: bf16 buffer 2 bytes per parameter; bf16 moments 8 bytes per owned one;
    and the optimizer step's fp32 copy of the owned gradients (4 bytes / 8 ranks) when that phase is the
    peak (a tiny micro-batch)."""
    lay = ParallelLayout(dp=8, zero=1)
    p = device_params(QWEN8, lay).total
    fp32 = training_memory(QWEN8, lay, seq_len=4096, micro_batch=1)
    bf16 = training_memory(QWEN8, lay.replace(grad_dtype="bf16"), seq_len=4096, micro_batch=1)
    assert fp32.gradients == 4 * p and bf16.gradients == 2 * p and bf16.activations == fp32.activations
    small = training_memory(QWEN8, lay.replace(grad_dtype="bf16"), seq_len=1, micro_batch=1)
    assert small.activations == 0 and small.gradients == pytest.approx(2 * p + 4 * p / 8)
    moments = training_memory(QWEN8, lay.replace(optimizer_moments="bf16", grad_dtype="bf16"), seq_len=1,
                              micro_batch=1)
    assert moments.optimizer == pytest.approx(8 * p / 8) and moments.gradients == 2 * p  # reads the bf16 shard


def test_the_embedding_and_the_loss_take_pipeline_slots():
    """DeepSeek-V3's 61 layers and 2 slots over 8 stages: Megatron-Bridge's "Et|(tt|)*30mL" puts 7
    decoder layers on the first rank and 6 on the last."""
    slots = [len(r) for r in recipe_options.pipeline_slots(61, 8)]
    assert slots == [7, 8, 8, 8, 8, 8, 8, 6] and sum(slots) == 61
    lay = ParallelLayout(dp=1, pp=8, pp_uneven=True, pp_embedding_loss_slots=True)
    assert [len(r) for r in memory.stage_layers(DSV3, 8, embedding_loss_slots=True)] == slots
    even = lay.replace(pp_embedding_loss_slots=False)
    assert [len(r) for r in memory.stage_layers(DSV3, 8)][-1] == 8
    assert device_params(DSV3, lay, stage=7).total < device_params(DSV3, even, stage=7).total


def test_a_pipeline_rank_holds_no_more_micro_batches_than_the_step_has():
    """1F1B's first rank holds pp micro-batches at its peak, or all of the step's when there are fewer."""
    lay = ParallelLayout(dp=1, pp=6, pp_uneven=True)
    four = training_memory(QWEN8, lay, seq_len=4096, micro_batch=1, microbatches_in_flight=4)
    six = training_memory(QWEN8, lay, seq_len=4096, micro_batch=1)
    first = memory.training_memory_stages(QWEN8, lay, seq_len=4096, micro_batch=1)[0]
    assert four.total < six.total and first.activations / 6 * 4 == pytest.approx(
        memory.training_memory_stages(QWEN8, lay, seq_len=4096, micro_batch=1, microbatches_in_flight=4)[0].activations)


@pytest.mark.parametrize("changes, needle", [
    (dict(recompute_modules=("moe_act",)), "recompute_modules = ['moe_act'] needs recompute = selective"),
    (dict(recompute="selective", recompute_modules=("attention",)), "must list some of core_attn, layernorm"),
    (dict(recompute="selective", recompute_layers=2), "recompute_layers = 2 needs recompute = full"),
    (dict(recompute="full", recompute_layers=-1), "recompute_layers = -1 must be a whole number >= 0"),
    (dict(pp=2, offload_activation_layers=4), "offload_activation_layers = 4 needs pp = 1, not 2"),
    (dict(grad_dtype="fp16"), "grad_dtype = 'fp16' must be fp32 or bf16"),
    (dict(optimizer_moments="fp8"), "optimizer_moments = 'fp8' must be fp32 or bf16"),
    (dict(pp_embedding_loss_slots=True), "pp_embedding_loss_slots needs pp > 1"),
])
def test_bad_recipe_options_are_refused_in_one_line(changes, needle):
    with pytest.raises(RpegError) as info:
        ParallelLayout(dp=1, **changes)
    assert needle in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_recompute_layers_count_per_model_chunk():
    """pp 2 with 2 virtual stages: a rank's 18 layers are 2 chunks of 9; 3 layers recomputed per chunk is 6
    of 18, a third of what full recomputation of every layer re-runs."""
    from rpeg.hardware import load_cluster
    from rpeg.perf.training import PassWorkload, pass_cost

    cluster = load_cluster("dgx-h100", 16)
    work = PassWorkload(sequences=64, seq_len=4096, attention_context=2048.5, dtype="bf16")
    lay = ParallelLayout(dp=8, pp=2, pp_interleave=2, zero=1)
    assert recipe_options.recomputed_fraction(lay.replace(recompute="full", recompute_layers=3), 18) == 6 / 18
    none, full, part = (pass_cost("t", QWEN8, x, cluster, work).seconds for x in (
        lay, lay.replace(recompute="full"), lay.replace(recompute="full", recompute_layers=3)))
    assert part - none == pytest.approx((full - none) / 3, rel=1e-9)
