"""Reading Hugging Face config.json files: each family's counts against hand counts of its modules, the
parts the extended ModelSpec carries (layer kinds, sinks, biases, shared-expert gate, vision tower), and
the errors a bad config gets. The hand counts walk the transformers modules; they do not call ModelSpec."""

from __future__ import annotations

import json

import pytest

from rpeg.errors import RpegError
from rpeg.graph import get_model
from rpeg.graph.catalogue import catalogue
from rpeg.graph.hfconfig import load_config, read_config


def cfg(id_):
    return dict(catalogue()[id_].config)


def test_qwen2_moe_counts_the_shared_expert_with_its_width_and_gate():
    h, L, v = 2048, 24, 151936
    attn = 4 * h * h + 3 * h  # MHA (16 kv heads of 128), q/k/v biases
    router, gate = 60 * h, h  # mlp.gate, mlp.shared_expert_gate (hidden -> 1)
    experts, shared = 60 * 3 * h * 1408, 3 * h * 5632
    hand = L * (attn + 2 * h + router + gate + experts + shared) + 2 * v * h + h
    spec, notes = read_config(cfg("Qwen/Qwen1.5-MoE-A2.7B"), "m")
    assert spec.params_total() == hand and not notes
    assert spec.params_active() == hand - L * 56 * 3 * h * 1408


def test_gpt_oss_counts_sinks_and_biases_and_matches_the_published_exact_totals():
    spec, _ = read_config(cfg("openai/gpt-oss-20b"), "m")
    h, E, w, L = 2880, 32, 2880, 24
    attn = h * 64 * 64 + 2 * h * 8 * 64 + 64 * 64 * h + (64 * 64 + 2 * 8 * 64) + h + 64  # q,k,v,o + biases + sinks
    moe = E * h + E + E * (3 * h * w + 2 * w + h)  # router with bias; experts' gate_up and down with biases
    assert spec.params_total() == L * (attn + 2 * h + moe) + 2 * 201088 * h + h
    assert round(spec.params_total() / 1e9, 2) == 20.91  # gpt-oss model card: 20.91B total
    big, _ = read_config(cfg("openai/gpt-oss-120b"), "m")
    assert round(big.params_total() / 1e9, 2) == 116.83
    # active less the input embedding: the card's 3.61B and 5.13B
    assert round((spec.params_active() - 201088 * h) / 1e9, 2) == 3.61
    assert round((big.params_active() - 201088 * h) / 1e9, 2) == 5.13
    assert spec.layer_types[:2] == ("sliding", "full") and spec.sliding_window == 128


def test_sliding_windows_cap_the_kv_cache_of_long_sequences():
    g = get_model("google/gemma-2-9b-it")  # 21 sliding (4096) + 21 full layers
    per_layer = 2 * 8 * 256
    assert g.kv_elements_per_token() == 42 * per_layer  # no context given: every token counted
    assert g.kv_elements_per_token(2048) == 42 * per_layer  # within the window
    assert g.kv_elements_per_token(32768) == pytest.approx(21 * per_layer + 21 * per_layer * 4096 / 32768)
    assert get_model("qwen3-8B").kv_elements_per_token(32768) == get_model("qwen3-8B").kv_elements_per_token()


def test_qwen3_next_linear_layers_keep_no_kv_cache_and_count_their_deltanet_weights():
    spec = get_model("Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert spec.linear_layers == 36 and spec.attention_layers == 12 and spec.layer_type(3) == "full"
    assert spec.kv_elements_per_token() == 12 * 2 * 2 * 256
    h, kd, vd, vh = 2048, 16 * 128, 32 * 128, 32
    deltanet = h * (2 * kd + 2 * vd) + h * 2 * vh + (2 * kd + vd) * 4 + 2 * vh + 128 + vd * h
    assert spec.linear_attention_params() == deltanet
    gated = h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h + 2 * 256  # q_proj doubled (gate), k, v, o, q/k norms
    assert spec.attention_params() == gated
    assert spec.linear_state_elements() == 36 * (vh * 128 * 128 + (2 * kd + vd) * 3)


def test_a_vlm_counts_its_vision_tower_and_says_how_it_is_planned():
    vl = get_model("Qwen/Qwen2.5-VL-7B-Instruct")
    text = get_model("qwen2.5-7B")
    assert vl.params_total() == text.params_total() + vl.vision_params and vl.params_active() == text.params_active()
    assert round(vl.params_total() / 1e9, 2) == 8.29  # the model page's safetensors total
    assert "vision tower" in vl.summary() and "no compute" in vl.vision_note()
    gemma = get_model("google/gemma-3-4b-it")
    assert gemma.params_total() == 4_300_079_472  # google/gemma-3-4b-it safetensors total


def test_a_wrapper_names_a_text_model_and_defaults_are_said():
    data = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
            "num_hidden_layers": 34, "intermediate_size": 10240, "sliding_window": 1024}}
    spec, notes = read_config(data, "m")
    assert spec.heads == 8 and spec.vocab == 262208 and any("Hugging Face default" in n for n in notes)


def test_an_unknown_family_with_llama_keys_is_read_with_what_was_assumed():
    data = {**cfg("Qwen/Qwen2.5-3B-Instruct"), "model_type": "brand_new"}
    spec, notes = read_config(data, "m")
    assert spec.layers == 36 and "read as a Llama-shaped decoder" in notes[0] and "brand_new" in notes[0]


@pytest.mark.parametrize("data, words", [
    ({"model_type": "mamba", "d_model": 768}, "model_type 'mamba' is not one RPEG reads"),
    ({"hidden_size": 8}, "missing 'model_type'"),
    ({**cfg("Qwen/Qwen3-8B"), "num_hidden_layers": None}, "missing 'num_hidden_layers'"),
    ({**cfg("Qwen/Qwen3-8B"), "hidden_size": "big"}, "hidden_size = 'big' must be a whole number"),
    ({**cfg("Qwen/Qwen3-8B"), "num_attention_heads": 0}, "num_attention_heads = 0 must be positive"),
    ({**cfg("Qwen/Qwen3-8B"), "num_key_value_heads": 5}, "not a multiple of kv_heads = 5"),
    ({**cfg("Qwen/Qwen3-30B-A3B"), "decoder_sparse_step": 2}, "interleaved with dense ones"),
    ({**cfg("openai/gpt-oss-20b"), "layer_types": ["full_attention"]}, "layer_types has 1 entries"),
    ({**cfg("openai/gpt-oss-20b"), "layer_types": ["odd"] * 24}, "'odd' is not one of"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_configs_name_the_key_and_the_file(data, words):
    with pytest.raises(RpegError) as err:
        read_config(data, "m", "/x/config.json")
    assert words in str(err.value) and "/x/config.json" in str(err.value) and "\n" not in str(err.value)


def test_a_file_that_is_not_json_is_one_line(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{ nope")
    with pytest.raises(RpegError, match="not valid JSON"):
        load_config(str(tmp_path))
    bad.write_text(json.dumps(cfg("Qwen/Qwen3-4B")))
    assert load_config(str(tmp_path))[0].name == str(tmp_path)


def test_node_limited_routing_is_read_from_deepseek_configs():
    """DeepSeek-V3's n_group 8 / topk_group 4 (topk_method noaux_tc) and V2's 8 / 3 (group_limited_greedy)
    limit each token's experts to a few groups; topk_method greedy (V2-Lite, VL2) ignores the groups."""
    v3 = catalogue()["deepseek-ai/DeepSeek-V3"].config
    spec, _ = read_config(dict(v3), "v3")
    assert (spec.expert_groups, spec.groups_per_token) == (8, 4)
    assert spec == get_model("deepseek-v3").replace(name="v3")
    spec, _ = read_config({**v3, "topk_method": "greedy"}, "greedy")
    assert (spec.expert_groups, spec.groups_per_token) == (0, 0)
    v2, _ = read_config(dict(catalogue()["deepseek-ai/DeepSeek-V2"].config), "v2")
    assert (v2.expert_groups, v2.groups_per_token) == (8, 3)


@pytest.mark.parametrize("fields, needle", [
    (dict(expert_groups=8, groups_per_token=0), "expert_groups = 8 and groups_per_token = 0: set both"),
    (dict(expert_groups=7, groups_per_token=4), "expert_groups = 7 does not divide experts = 256"),
    (dict(expert_groups=8, groups_per_token=9), "groups_per_token = 9 exceeds expert_groups = 8"),
    (dict(expert_groups=64, groups_per_token=1), "groups_per_token = 1 groups of 4 experts hold fewer than"),
])
def test_expert_groups_are_checked(fields, needle):
    with pytest.raises(RpegError) as info:
        get_model("deepseek-v3").replace(**fields)
    assert needle in str(info.value) and "\n" not in str(info.value)
