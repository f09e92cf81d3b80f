"""ModelSpec parameter counts against counts derived by hand from each Hugging Face config.json,
the presets' lookup, and ModelSpec's validation.

The hand counts below walk the Hugging Face modules weight by weight (q/k/v/o projections, their
biases, q/k norms, gate/up/down MLP, two RMSNorms per layer, router, embeddings, lm_head, final
norm); they do not call ModelSpec, so a wrong formula there shows up as a mismatch here.
"""

from __future__ import annotations

import math

import pytest

from rpeg.errors import RpegError
from rpeg.graph import ModelSpec, get_model, model_names


# ---- hand counts from config.json ----------------------------------------------------------------
def _gqa_attention(hidden, heads, kv_heads, head_dim, qkv_bias=False, qk_norm=False):
    q_proj = hidden * heads * head_dim
    k_proj = v_proj = hidden * kv_heads * head_dim
    o_proj = heads * head_dim * hidden
    bias = (heads * head_dim + 2 * kv_heads * head_dim) if qkv_bias else 0
    norms = 2 * head_dim if qk_norm else 0  # Qwen3 q_norm, k_norm over head_dim
    return q_proj + k_proj + v_proj + o_proj + bias + norms


def _swiglu(hidden, width):
    return 3 * hidden * width  # gate_proj, up_proj, down_proj


def _embeddings(vocab, hidden, tied):
    return vocab * hidden * (1 if tied else 2) + hidden  # embed_tokens (+ lm_head) + final norm


def hand_dense(*, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, tied=False, qkv_bias=False,
               qk_norm=False):
    layer = (_gqa_attention(hidden, heads, kv_heads, head_dim, qkv_bias, qk_norm)
             + _swiglu(hidden, ffn) + 2 * hidden)  # input_layernorm, post_attention_layernorm
    return layers * layer + _embeddings(vocab, hidden, tied)


def hand_qwen3_moe(*, layers, hidden, heads, kv_heads, head_dim, moe_ffn, experts, top_k, vocab):
    """Qwen3MoE: every layer sparse, router `gate` (experts x hidden, no bias), no shared expert."""
    base = _gqa_attention(hidden, heads, kv_heads, head_dim, qk_norm=True) + 2 * hidden + experts * hidden
    total = layers * (base + experts * _swiglu(hidden, moe_ffn)) + _embeddings(vocab, hidden, False)
    active = layers * (base + top_k * _swiglu(hidden, moe_ffn)) + _embeddings(vocab, hidden, False)
    return total, active


def hand_deepseek_v3():
    """deepseek-ai/DeepSeek-V3 config.json: hidden 7168, 61 layers, 128 heads, q_lora_rank 1536,
    kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128,
    intermediate_size 18432, moe_intermediate_size 2048, 256 routed + 1 shared experts, 8 per
    token, first_k_dense_replace 3, vocab 129280, untied; MTP layer not counted."""
    h, nh = 7168, 128
    q = h * 1536 + 1536 + 1536 * nh * (128 + 64)  # q_a_proj, q_a_layernorm, q_b_proj
    kv = h * (512 + 64) + 512 + 512 * nh * (128 + 128)  # kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
    o = nh * 128 * h
    base = q + kv + o + 2 * h
    dense_layer = base + _swiglu(h, 18432)
    router = 256 * h + 256  # gate.weight + gate.e_score_correction_bias (in the checkpoint)
    expert = _swiglu(h, 2048)
    total = 3 * dense_layer + 58 * (base + router + (256 + 1) * expert) + _embeddings(129280, h, False)
    active = 3 * dense_layer + 58 * (base + router + (8 + 1) * expert) + _embeddings(129280, h, False)
    return total, active


LLAMA_8B = hand_dense(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256)
LLAMA_70B = hand_dense(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672, vocab=128256)
QWEN25_7B = hand_dense(layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, ffn=18944, vocab=152064,
                       qkv_bias=True)
QWEN3_32B = hand_dense(layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, ffn=25600, vocab=151936,
                       qk_norm=True)
QWEN3_30B_A3B = hand_qwen3_moe(layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, moe_ffn=768,
                               experts=128, top_k=8, vocab=151936)
QWEN3_235B_A22B = hand_qwen3_moe(layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, moe_ffn=1536,
                                 experts=128, top_k=8, vocab=151936)
DEEPSEEK_V3 = hand_deepseek_v3()


def test_hand_counts_are_the_known_exact_figures():
    # Guards the helpers above: these are the exact weight counts of the released checkpoints
    # (DeepSeek-V3 less its multi-token-prediction module).
    assert LLAMA_8B == 8_030_261_248
    assert QWEN3_32B == 32_762_123_264
    assert QWEN3_30B_A3B == (30_532_122_624, 3_353_032_704)
    assert DEEPSEEK_V3[0] == 671_026_404_352 + 58 * 256
    assert DEEPSEEK_V3[1] == 37_552_282_624 + 58 * 256


@pytest.mark.parametrize("name, total, active", [
    ("llama-3.1-8B", LLAMA_8B, LLAMA_8B),
    ("qwen3-32B", QWEN3_32B, QWEN3_32B),
    ("qwen3-30B-A3B", *QWEN3_30B_A3B),
    ("deepseek-v3", *DEEPSEEK_V3),
    ("llama-3.1-70B", LLAMA_70B, LLAMA_70B),
    ("qwen2.5-7B", QWEN25_7B, QWEN25_7B),
    ("qwen3-235B-A22B", *QWEN3_235B_A22B),
])
def test_parameter_counts_match_hand_counts(name, total, active):
    spec = get_model(name)
    assert spec.params_total() == pytest.approx(total, rel=0.01)
    assert spec.params_active() == pytest.approx(active, rel=0.01)


@pytest.mark.parametrize("name, total_b, active_b", [
    ("llama-3.1-8B", 8.03, 8.03),
    ("qwen3-32B", 32.8, 32.8),
    ("qwen3-30B-A3B", 30.5, 3.35),
    ("deepseek-v3", 671.0, 37.55),
    ("llama-3.1-70B", 70.55, 70.55),
    ("qwen2.5-7B", 7.62, 7.62),
    ("qwen3-235B-A22B", 235.1, 22.2),
])
def test_parameter_counts_match_published_figures(name, total_b, active_b):
    spec = get_model(name)
    assert spec.params_total() / 1e9 == pytest.approx(total_b, rel=0.01)
    assert spec.params_active() / 1e9 == pytest.approx(active_b, rel=0.01)


def test_published_active_counts_are_truncations():
    # The model card's "3.3B" and the DeepSeek-V3 report's "37B" active parameters truncate
    # 3.353B and 37.55B; they are not roundings (37.55B rounds to 38B), so compare by truncation.
    qwen = get_model("qwen3-30B-A3B").params_active()
    deepseek = get_model("deepseek-v3").params_active()
    assert math.floor(qwen / 1e8) / 10 == 3.3
    assert math.floor(deepseek / 1e9) == 37
    assert math.floor(get_model("deepseek-v3").params_total() / 1e9) == 671


def test_dense_models_have_active_equal_total():
    for name in ("llama-3.1-8B", "qwen3-32B", "qwen2.5-7B", "tiny-qwen2"):
        spec = get_model(name)
        assert not spec.is_moe
        assert spec.params_active() == spec.params_total()


def test_matmul_weights_exclude_only_the_input_embedding_and_final_norm():
    spec = get_model("llama-3.1-8B")
    assert spec.params_matmul_active() == spec.params_total() - spec.vocab * spec.hidden - spec.hidden


def test_kv_cache_elements_per_token():
    assert get_model("llama-3.1-8B").kv_elements_per_token() == 32 * 2 * 8 * 128
    assert get_model("deepseek-v3").kv_elements_per_token() == 61 * (512 + 64)  # MLA caches the latent


def test_lookup_is_case_insensitive():
    assert get_model("QWEN3-32b") == get_model("qwen3-32B") == get_model("Qwen3-32B")
    assert get_model("LLAMA-3.1-8b").name == "llama-3.1-8B"
    for name in model_names():
        assert get_model(name.upper()).name == name


def test_unknown_model_is_named_in_the_error():
    with pytest.raises(RpegError, match="nonexistent-7B"):
        get_model("nonexistent-7B")


def test_derived_head_dims():
    spec = ModelSpec(name="m", layers=2, hidden=256, heads=8, kv_heads=2, ffn=512, vocab=100)
    assert spec.head_dim == 32 and spec.v_head_dim == 32
    assert spec.replace(head_dim=64).head_dim == 64


def _spec(**changes):
    base = dict(name="bad-model", layers=4, hidden=256, heads=8, kv_heads=4, ffn=512, vocab=1000)
    return ModelSpec(**{**base, **changes})


@pytest.mark.parametrize("changes, words", [
    (dict(kv_heads=3), "heads = 8 is not a multiple of kv_heads = 3"),
    (dict(layers=0), "layers = 0 must be positive"),
    (dict(vocab=-1), "vocab = -1 must be positive"),
    (dict(ffn=0), "ffn = 0 must be positive"),
    (dict(ffn_act="relu"), "ffn_act = 'relu'"),
    (dict(norm="batchnorm"), "norm = 'batchnorm'"),
    (dict(attention="sparse"), "attention = 'sparse'"),
    (dict(attention="mla"), "needs kv_lora_rank > 0 and rope_head_dim > 0"),
    (dict(experts=8, experts_per_token=2), "needs moe_ffn"),
    (dict(experts=8, experts_per_token=9, moe_ffn=64), "experts_per_token = 9 must be in 1..experts = 8"),
    (dict(experts=8, experts_per_token=0, moe_ffn=64), "experts_per_token = 0"),
    (dict(experts=8, experts_per_token=2, moe_ffn=64, dense_layers=5), "dense_layers = 5 must be in 0..layers = 4"),
    (dict(experts_per_token=2), "need experts > 0"),
    (dict(shared_experts=1), "need experts > 0"),
    (dict(experts=8, experts_per_token=2, moe_ffn=64, dense_layers=1, ffn=0), "ffn = 0 must be positive"),
])
def test_model_spec_validation(changes, words):
    with pytest.raises(RpegError) as err:
        _spec(**changes)
    assert words in str(err.value)
    assert "'bad-model'" in str(err.value)


def test_model_spec_reports_every_problem_at_once():
    with pytest.raises(RpegError) as err:
        _spec(layers=0, kv_heads=3)
    assert "layers = 0" in str(err.value) and "kv_heads = 3" in str(err.value)


def test_moe_without_dense_ffn_is_valid():
    spec = _spec(ffn=0, experts=8, experts_per_token=2, moe_ffn=64)
    assert spec.is_moe and spec.moe_layers == 4
    assert spec.params_active() < spec.params_total()
