"""An independent cross-check of our FLOPs and memory against llm-analysis 0.2.2 (Cheng Li,
https://github.com/cli99/llm-analysis, PyPI `llm-analysis`), built programmatically from its
ModelConfig / GPUConfig / ParallelismConfig dataclasses.

Two dense shapes: a GPT-3-175B-like one (MHA, 4h GELU MLP, tied embeddings, no biases - what
llm-analysis can express) and Llama-2-7B (MHA, SwiGLU 11008, untied), on tp 1/8 and ZeRO 0-3.
Where we agree the test asserts it to float precision; where we differ on purpose, it asserts the
difference is exactly what the stated reason predicts:

- FLOPs: llm-analysis counts the full s x s attention (24sh^2 + 4s^2h per layer); we count causal
  attention, s(s+1)/2 pairs. It assumes a 4h two-matrix MLP whatever ffn is; we use the real
  SwiGLU width. We count norm weights as 2 FLOPs each. It recomputes the output head under full
  recomputation; Megatron (and we) do not checkpoint it.
- Parameters: it counts one vocab x hidden matrix (tied); Llama-2's head is separate. It splits
  norm weights over tp; Megatron keeps them whole on every tensor-parallel rank.
- Activations: it keeps layer-norm inputs in fp32 (4 bytes, we 2 as Korthikanti does), always
  counts the attention-output dropout mask but never the MLP's, adds a 2sbh tensor and 4 bf16
  numbers per head and query under FlashAttention (we: one fp32 log-sum-exp), assumes sequence
  parallelism whenever tp > 1, and keeps bf16 logits (we: the logits path's bytes, rpeg/perf/logits.py).
- llm-analysis 0.2.2 counts the output layer's activations twice at micro-batch 1 (the `training`
  summary adds them to a total that already has them), so the comparisons use micro-batch 2.
"""

import logging

import pytest

from rpeg.graph import ModelSpec, get_model
from rpeg.graph import ParallelLayout as Layout
from rpeg.perf.flops import train_flops
from rpeg.perf.memory import (
    activation_bytes_per_layer,
    kv_cache_bytes_per_token,
    training_memory,
    training_memory_stages,
    weight_bytes_per_device,
)

analysis = pytest.importorskip("llm_analysis.analysis", reason="llm-analysis is in the dev extra")
from llm_analysis.config import GPUConfig, ModelConfig, ParallelismConfig  # noqa: E402

AR = analysis.ActivationRecomputation
RECOMPUTE = {"none": AR.NONE, "selective": AR.SELECTIVE, "full": AR.FULL}

GPT3_LIKE = ModelSpec(name="gpt3-like", layers=96, hidden=12288, heads=96, kv_heads=96, ffn=4 * 12288, vocab=51200,
                      ffn_act="gelu", attention="mha", tied_embeddings=True)
GPT3_CFG = ModelConfig(name="gpt3-like", num_layers=96, n_head=96, hidden_dim=12288, vocab_size=51200,
                       max_seq_len=2048)
LLAMA = get_model("llama-2-7B")
# SwiGLU's three h x ffn matrices hold as many weights (and, unrecomputed, as many activation bytes:
# 3 x 2 B x ffn against 2 x 2 B x 1.5 ffn) as a two-matrix MLP 1.5 ffn wide
LLAMA_CFG = ModelConfig(name="llama-2-7b", num_layers=32, n_head=32, hidden_dim=4096, vocab_size=32000,
                        max_seq_len=4096, ffn_embed_dim=16512, expansion_ratio=16512 / 4096)
# memory large enough that llm-analysis' batch-size search never rejects a configuration
UNBOUNDED_GPU = GPUConfig(name="unbounded", mem_per_GPU_in_GB=1e6, hbm_bandwidth_in_GB_per_sec=3350,
                          intra_node_bandwidth_in_GB_per_sec=450, intra_node_min_message_latency=8e-6,
                          peak_fp16_TFLOPS=989)
SHAPES = [(GPT3_LIKE, GPT3_CFG, 2048), (LLAMA, LLAMA_CFG, 4096)]


@pytest.fixture(autouse=True, scope="module")
def quiet_llm_analysis():
    log = logging.getLogger("__name__")  # llm-analysis' logger is literally named "__name__"
    level = log.level
    log.setLevel(logging.ERROR)
    yield
    log.setLevel(level)


def _theirs(cfg, *, tp=1, pp=1, dp=1):
    return analysis.LLMAnalysis(cfg, UNBOUNDED_GPU, parallelism_config=ParallelismConfig(tp_size=tp, pp_size=pp,
                                                                                          dp_size=dp))


def _train(cfg, *, seq, mb=2, tp=1, pp=1, dp=1, zero=0, recompute="none", flash=True, softmax_dropout=False):
    return _theirs(cfg, tp=tp, pp=pp, dp=dp).training(
        batch_size_per_gpu=mb, seq_len=seq, ds_zero=analysis.DSZeRO(zero),
        activation_recomputation=RECOMPUTE[recompute], flash_attn=flash, softmax_dropout=softmax_dropout)


# ---- parameters and FLOPs ---------------------------------------------------------------------------
def test_parameter_counts():
    assert GPT3_LIKE.params_total() == _theirs(GPT3_CFG).total_num_params
    # they count one embedding matrix (tied); Llama-2 has a separate output head
    assert LLAMA.params_total() - _theirs(LLAMA_CFG).total_num_params == LLAMA.vocab * LLAMA.hidden


@pytest.mark.parametrize("spec, cfg, seq", SHAPES, ids=["gpt3-like", "llama-2-7B"])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_training_flops(spec, cfg, seq, recompute):
    b, s, h, L = 2, seq, spec.hidden, spec.layers
    ours = b * train_flops(spec, s, recompute)
    theirs = _train(cfg, seq=s, mb=b, recompute=recompute)["num_flops_total_per_micro_batch"]
    # per forward: full s^2 attention (4s^2h per layer) vs causal s(s+1)/2 pairs (2hs(s+1));
    # their 16sh^2 MLP vs 2 x our MLP weights; our norm weights at 2 FLOPs each
    fwd_gap = b * L * (2 * h * s * (s - 1) + s * (16 * h * h - 2 * spec.mlp_params(spec.ffn))
                       - 2 * s * spec.norm_params())
    expected_gap = {"none": 3 * fwd_gap,
                    "selective": 3 * fwd_gap + b * L * 2 * h * s * (s - 1),  # the recomputed core, again full
                    "full": 4 * fwd_gap + 2 * b * s * h * spec.vocab}[recompute]  # they recompute the head too
    assert theirs - ours == pytest.approx(expected_gap, rel=1e-9)
    assert abs(theirs / ours - 1) < 0.1  # mostly the non-causal attention: s/(6h) of the total, ~8% at s = h


# ---- weights, gradients, optimizer ----------------------------------------------------------------------
@pytest.mark.parametrize("spec, cfg, seq", SHAPES, ids=["gpt3-like", "llama-2-7B"])
@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_weights_gradients_optimizer(spec, cfg, seq, tp, zero):
    dp = 8
    ours = training_memory(spec, Layout(dp=dp, tp=tp, zero=zero, sequence_parallel=tp > 1), seq_len=seq,
                           micro_batch=2)
    theirs = _train(cfg, seq=seq, tp=tp, dp=dp, zero=zero)
    untied = 0 if spec.tied_embeddings else spec.vocab * spec.hidden / tp
    norms = (spec.layers * spec.norm_params() + spec.hidden) * (1 - 1 / tp)  # whole on each rank, not / tp
    extra_params = untied + norms

    def shard(stage):
        return dp if zero >= stage else 1

    assert ours.weights - theirs["weight_memory_per_gpu"] == pytest.approx(2 * extra_params / shard(3), rel=1e-9)
    assert ours.gradients - theirs["gradient_memory_per_gpu"] == pytest.approx(4 * extra_params / shard(2), rel=1e-9)
    assert ours.optimizer - theirs["optimizer_state_memory_per_gpu"] == pytest.approx(
        12 * extra_params / shard(1), rel=1e-9)
    if spec.tied_embeddings and tp == 1:
        assert (ours.weights, ours.gradients, ours.optimizer) == pytest.approx(
            (theirs["weight_memory_per_gpu"], theirs["gradient_memory_per_gpu"],
             theirs["optimizer_state_memory_per_gpu"]), rel=1e-12)


def test_pipeline_stage_weights_agree():
    """Tied GPT-3-like, pp 4: they put the embedding on every stage; we put it on the first and a
    copy on the last (Megatron's tied head) with the final norm, which they put on every stage."""
    theirs = _train(GPT3_CFG, seq=2048, pp=4)
    assert weight_bytes_per_device(GPT3_LIKE, Layout(pp=4)) == theirs["weight_memory_per_gpu"]


# ---- activations --------------------------------------------------------------------------------
def _their_layer(cfg, *, seq, mb, tp, recompute, flash, softmax_dropout):
    return _theirs(cfg, tp=tp).get_activation_memory_per_layer(
        mb, seq, is_inference=False, activation_recomputation=RECOMPUTE[recompute], flash_attn=flash,
        softmax_dropout=softmax_dropout)


@pytest.mark.parametrize("spec, cfg, seq", SHAPES, ids=["gpt3-like", "llama-2-7B"])
@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_layer_activations_korthikanti_setting(spec, cfg, seq, tp, recompute):
    """Dropout everywhere, no FlashAttention (Korthikanti's setting), SP with TP: they keep the two
    norm inputs in fp32 (+2 x 2sbh) and drop the MLP's dropout mask (-sbh)."""
    b, s, h = 2, seq, spec.hidden
    ours = activation_bytes_per_layer(spec, seq_len=s, micro_batch=b, tp=tp, sequence_parallel=tp > 1,
                                      recompute=recompute, flash_attention=False, dropout=True)
    theirs = _their_layer(cfg, seq=s, mb=b, tp=tp, recompute=recompute, flash=False, softmax_dropout=True)
    assert theirs - ours == pytest.approx(s * b * h * (4 - 1) / tp, rel=1e-9)


@pytest.mark.parametrize("spec, cfg, seq", SHAPES, ids=["gpt3-like", "llama-2-7B"])
@pytest.mark.parametrize("tp", [1, 8])
def test_layer_activations_flash_no_dropout(spec, cfg, seq, tp):
    """What RL trainers run: FlashAttention, no dropout. Beyond the fp32 norm inputs (+4sbh) they
    keep an attention-output dropout mask (+sbh), a 2sbh tensor (+4sbh) and 4 bf16 numbers per
    head and query (+8asb) where we keep one fp32 log-sum-exp (4asb)."""
    b, s, h, a = 2, seq, spec.hidden, spec.heads
    ours = activation_bytes_per_layer(spec, seq_len=s, micro_batch=b, tp=tp, sequence_parallel=tp > 1)
    theirs = _their_layer(cfg, seq=s, mb=b, tp=tp, recompute="none", flash=True, softmax_dropout=False)
    assert theirs - ours == pytest.approx((s * b * h * (4 + 1 + 4) + 4 * a * s * b) / tp, rel=1e-9)
    assert abs(theirs / ours - 1) < 0.3  # 9sbh on our 32sbh: 28%


@pytest.mark.parametrize("spec, cfg, seq", SHAPES, ids=["gpt3-like", "llama-2-7B"])
def test_full_recomputation_and_output_layer(spec, cfg, seq):
    """Full recomputation: both keep the 2sbh/t layer input. End to end (tp 8, pp 1) we add the one
    layer being recomputed and the final norm's and the head's inputs (4sbh/t), which they drop under
    full recomputation; their bf16 logits are in their activations, ours a line of their own
    (`logits`: on Megatron's cross-entropy path, 6 bytes per token and vocab/t entry, the bf16 output
    and its fp32 copy: rpeg/perf/logits.py)."""
    b, s, h, t = 2, seq, spec.hidden, 8
    layout = Layout(tp=t, sequence_parallel=True, recompute="full", logits="fused-ce")
    kept = activation_bytes_per_layer(spec, seq_len=s, micro_batch=b, tp=t, sequence_parallel=True, recompute="full")
    assert kept == _their_layer(cfg, seq=s, mb=b, tp=t, recompute="full", flash=True, softmax_dropout=False)
    theirs = _train(cfg, seq=s, mb=b, tp=t, recompute="full")
    mem = training_memory(spec, layout, seq_len=s, micro_batch=b)
    ours = mem.activations
    recomputed_layer = activation_bytes_per_layer(spec, seq_len=s, micro_batch=b, tp=t, sequence_parallel=True)
    their_logits = theirs["activation_memory_embedding_output_per_gpu"]
    assert their_logits == s * b * spec.vocab * 2 / t
    # their final norm input is 0 under full recomputation, our two 2sbh/t tensors are not
    assert ours - theirs["activation_memory_per_gpu"] == pytest.approx(
        recomputed_layer - their_logits + 4 * s * b * h / t, rel=1e-9)
    assert mem.logits == pytest.approx(3 * their_logits, rel=1e-12)  # 6 bytes where they keep 2
    # llm-analysis 0.2.2 adds the output layer twice at micro-batch 1
    one = _train(cfg, seq=s, mb=1, tp=t, recompute="full")
    assert one["activation_memory_per_gpu"] - one["activation_memory_batch_size_1"] == pytest.approx(
        one["activation_memory_embedding_output_per_gpu"], rel=1e-12)


def test_pipeline_first_stage_holds_all_layers():
    """Both say 1F1B's first stage holds pp micro-batches of L/pp layers: L layers in all."""
    s, b = 2048, 2
    per_layer = activation_bytes_per_layer(GPT3_LIKE, seq_len=s, micro_batch=b)
    first = training_memory_stages(GPT3_LIKE, Layout(pp=4), seq_len=s, micro_batch=b)[0].activations
    assert first == pytest.approx(GPT3_LIKE.layers * per_layer, rel=1e-12)
    theirs = _train(GPT3_CFG, seq=s, mb=b, pp=4)
    their_layers = (theirs["activation_memory_per_gpu"] - theirs["activation_memory_embedding_output_per_gpu"]
                    - 4 * s * b * GPT3_LIKE.hidden)
    assert their_layers == pytest.approx(GPT3_LIKE.layers * _their_layer(
        GPT3_CFG, seq=s, mb=b, tp=1, recompute="none", flash=True, softmax_dropout=False), rel=1e-12)


# ---- KV cache --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp", [1, 2, 8, 16])
def test_kv_cache_agrees(tp):
    """Same rule: kv heads split over tp, one whole head per rank past kv_heads."""
    m = get_model("llama-3.1-8B")
    cfg = ModelConfig(name="llama-3.1-8b", num_layers=32, n_head=32, hidden_dim=4096, vocab_size=128256,
                      num_key_value_heads=8, ffn_embed_dim=21504, expansion_ratio=21504 / 4096, max_seq_len=8192)
    theirs = m.layers * _theirs(cfg, tp=tp).get_memory_kv_cache_per_layer(batch_size=1, seq_len=1)
    assert kv_cache_bytes_per_token(m, tp) == theirs
