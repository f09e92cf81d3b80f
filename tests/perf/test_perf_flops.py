"""FLOP counts against hand-worked formulas (Megatron's, Kaplan's)."""

import pytest

from rpeg.graph import get_model
from rpeg.perf.flops import decode_flops, forward_flops_per_token, sequence_forward_flops, train_flops


def test_forward_per_token_is_two_flops_per_weight_plus_attention():
    m = get_model("llama-3.1-8B")
    matmul = 2 * (m.params_total() - m.vocab * m.hidden - m.hidden)  # no input embedding, no final norm
    # norms are not matmuls but are a tiny part: within 0.01%
    attn = 2 * m.layers * m.heads * (2 * m.head_dim) * 100
    assert forward_flops_per_token(m, 100) == pytest.approx(matmul + attn, rel=1e-4)


def test_gpt3_training_flops_match_megatron_formula_with_causal_attention():
    """Narayanan et al. 2021 eq. (3), per sequence with full recomputation:
    96 s l h^2 (1 + s/(6h) + V/(16 l h)). It counts the full s x s attention score matrix; a
    causal model computes half of it (s(s+1)/2 pairs), so s/(6h) becomes s/(12h)."""
    m = get_model("gpt3-175B")
    s, l, h, v = 2048, m.layers, m.hidden, m.vocab
    expected = 96 * s * l * h * h * (1 + s / (12 * h) + v / (16 * l * h))
    # our count also has biases and the causal diagonal (s/2 more pairs): both < 0.1%
    assert train_flops(m, s, recompute="full") == pytest.approx(expected, rel=1e-3)
    no_recompute = 72 * s * l * h * h * (1 + s / (12 * h) + v / (12 * l * h))
    assert train_flops(m, s) == pytest.approx(no_recompute, rel=1e-3)


def test_recomputation_costs():
    m = get_model("tiny-qwen2")
    fwd = sequence_forward_flops(m, 64)
    assert train_flops(m, 64) == pytest.approx(3 * fwd)
    assert train_flops(m, 64, "none") < train_flops(m, 64, "selective") < train_flops(m, 64, "full")
    assert train_flops(m, 64, "full") == pytest.approx(4 * fwd - 2 * m.vocab * m.hidden * 64)


def test_decode_plus_prefill_is_one_forward_pass():
    m = get_model("qwen3-8B")
    assert sequence_forward_flops(m, 512) + decode_flops(m, 512, 1024) == pytest.approx(
        sequence_forward_flops(m, 1536))


def test_moe_counts_only_active_experts():
    moe = get_model("qwen3-30B-A3B")
    per_token = forward_flops_per_token(moe, 0)
    assert per_token == pytest.approx(2 * moe.params_matmul_active())
    assert per_token < 2 * 0.15 * moe.params_total()  # ~3.3B active of 30.5B


def test_generation_flops_are_the_layers_over_prompt_plus_r_minus_one_and_the_head_over_r():
    """Hand count for fixed lengths: a prompt of p tokens and a response of r. The prefill runs the
    layers over p tokens and the head over the last one (sampling token 1); r - 1 decode steps each
    run the layers over one token (attending to p + 1 ... p + r - 1 positions) and the head. So the
    layers see p + r - 1 tokens, attention sums c = 1 .. p + r - 1, and the head runs r times."""
    from rpeg.graph import LengthDistribution
    from rpeg.perf.flops import attention_flops_per_context_token, expected_generation_flops, head_flops_per_token
    spec = get_model("qwen3-0.6B")
    p, r = 100, 40
    s = p + r - 1
    layers = 2.0 * spec.params_matmul_active() - head_flops_per_token(spec)
    attn = attention_flops_per_context_token(spec) * s * (s + 1) / 2
    hand = layers * s + attn + head_flops_per_token(spec) * r
    got = expected_generation_flops(spec, p, LengthDistribution.fixed(r))
    assert got == pytest.approx(hand, rel=1e-12)
    assert got < sequence_forward_flops(spec, p + r)


def test_sliding_window_layers_attend_to_their_window_only():
    """gpt-oss-120b: 36 layers, every other one a 128-token window. A causal pass over 4,096 tokens:
    a full layer 4,096 x 4,097 / 2 = 8,390,656 (query, key) pairs, a sliding one 128 x 129 / 2 +
    (4,096 - 128) x 128 = 516,160; the mean over the layers 4,453,408. A decode step at position
    1,000 reads 1,000 keys in a full layer and 128 in a sliding one: 564 on average. A dense model is
    unchanged: S(S + 1) / 2 and S."""
    from rpeg.graph import LengthDistribution
    from rpeg.perf.compute import layer_forward
    from rpeg.perf.flops import (attention_flops_per_context_token, attended_keys, attended_pairs,
                                 expected_attended_pairs, expected_forward_flops)
    from rpeg.hardware import load_cluster

    oss, llama = get_model("gpt-oss-120b"), get_model("llama-3.1-8B")
    assert attended_pairs(oss, 4096) == (18 * 8_390_656 + 18 * 516_160) / 36 == 4_453_408
    assert attended_pairs(oss, 100) == 100 * 101 / 2  # shorter than the window: as full attention
    assert attended_keys(oss, 1000) == (1000 + 128) / 2 == 564
    assert attended_pairs(llama, 4096) == 8_390_656 and attended_keys(llama, 1000) == 1000
    assert sequence_forward_flops(oss, 4096) == pytest.approx(
        2 * oss.params_matmul_active() * 4096 + attention_flops_per_context_token(oss) * 4_453_408)
    # the expectation over a length distribution: every sequence longer than the window, exact
    fixed = LengthDistribution.fixed(3584)
    assert expected_attended_pairs(oss, 512, fixed) == pytest.approx(4_453_408)
    assert expected_forward_flops(oss, 512, fixed) == pytest.approx(sequence_forward_flops(oss, 4096))
    # the time model attends over the same keys: a pass's mean context (S + 1) / 2 becomes 4,453,408 / 4,096
    h100 = load_cluster("dgx-h100", 8).device
    t = layer_forward(oss, h100, tokens=4096, context=4097 / 2)
    one_key = layer_forward(oss, h100, tokens=4096, context=1.0)  # S = 1: one key per token in every layer
    assert t.flops - one_key.flops == pytest.approx(2 * 4096 * (4_453_408 / 4096 - 1) * 64 * (64 + 64), rel=1e-9)
