"""Hugging Face `config.json` -> ModelSpec, for the model families RL post-training uses.

Pure Python (json only): the architecture keys of a model's config are all RPEG needs to plan it.
`read_config(data, name, where)` reads a parsed config; `load_config(path)` a file or a model folder.
Each family below reads its keys as the Hugging Face implementation builds its modules, so the
parameter count comes out weight by weight (the catalogue's test holds every entry within 1% of its
model card). What a reader does not count, and why:

- multi-token-prediction layers (DeepSeek-V3 `num_nextn_predict_layers`, GLM-4.5, Qwen3-Next
  `mtp_num_hidden_layers`): a draft module for speculative decoding, not part of the model an RL
  step trains or samples from (as the deepseek-v3 preset);
- the routers' score-correction bias of aux-loss-free balancing (DeepSeek-V3, GLM-4.5
  `e_score_correction_bias`, one per routed expert and MoE layer): a routing buffer moved by a rule,
  never by a gradient (14,848 values in DeepSeek-V3's 671B);
- activation functions: Gemma's GeGLU reads as `swiglu` (a gated MLP of three matrices: the
  planner sees shapes, not the nonlinearity).

A config of a model_type not read here is read as a Llama-shaped decoder when it has the standard
keys (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size); the
assumptions are returned with the spec. Otherwise: an RpegError naming the model_type.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from rpeg.errors import RpegError
from rpeg.graph.model import ModelSpec

_MISSING = object()


class _Config:
    """One config mapping and where it came from: typed lookups whose errors name the key and the file."""

    def __init__(self, data: Any, where: str, model_type: str):
        if not isinstance(data, dict):
            raise RpegError(f"{where}: expected a JSON object (a Hugging Face config.json), got {type(data).__name__}")
        self.data, self.where, self.model_type = data, where, model_type

    def int(self, key: str, default: Any = _MISSING, *, positive: bool = True) -> int:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise RpegError(f"{self.where}: missing {key!r} (a {self.model_type} config.json has it)")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            if not (isinstance(value, float) and value.is_integer()):
                raise RpegError(f"{self.where}: {key} = {value!r} must be a whole number")
            value = int(value)
        if value < 0 or (positive and value == 0):
            raise RpegError(f"{self.where}: {key} = {value} must be {'positive' if positive else 'at least 0'}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise RpegError(f"{self.where}: {key} = {value!r} must be true or false")
        return value

    def list(self, key: str) -> list | None:
        value = self.data.get(key)
        if value is not None and not isinstance(value, list):
            raise RpegError(f"{self.where}: {key} = {value!r} must be a list")
        return value

    def sub(self, key: str) -> _Config:
        return _Config(self.data[key], f"{self.where}: {key}", self.data[key].get("model_type", self.model_type)
                       if isinstance(self.data[key], dict) else self.model_type)


# ---- the shared parts -----------------------------------------------------------------------------

def _dense(c: _Config, name: str, **kw) -> dict[str, Any]:
    """The keys every decoder of these families has (Llama's names)."""
    heads = c.int("num_attention_heads")
    out = dict(name=name, layers=c.int("num_hidden_layers"), hidden=c.int("hidden_size"), heads=heads,
               kv_heads=c.int("num_key_value_heads", heads), ffn=c.int("intermediate_size"),
               vocab=c.int("vocab_size"), head_dim=c.int("head_dim", 0, positive=False),
               tied_embeddings=c.bool("tie_word_embeddings", kw.pop("tied_default", False)))
    out["attention"] = "gqa" if out["kv_heads"] < heads else "mha"
    out.update(kw)
    return out


def _layer_types(c: _Config, layers: int, default: Callable[[int], str]) -> tuple[str, ...]:
    """The config's `layer_types` (Hugging Face names), else `default(index)` for each layer."""
    names = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear",
             "chunked_attention": "sliding"}
    given = c.list("layer_types")
    if given is None:
        return tuple(default(i) for i in range(layers))
    bad = [t for t in given if t not in names]
    if bad:
        raise RpegError(f"{c.where}: layer_types: {bad[0]!r} is not one of {', '.join(names)}")
    if len(given) != layers:
        raise RpegError(f"{c.where}: layer_types has {len(given)} entries for num_hidden_layers = {layers}")
    return tuple(names[t] for t in given)


def _moe_layers(c: _Config, layers: int, first_dense_key: str | None = None) -> int:
    """Leading dense layers of an MoE model; a config whose dense layers are not all leading is refused."""
    dense = c.int(first_dense_key, 0, positive=False) if first_dense_key else 0
    step = c.int("decoder_sparse_step", 1) if "decoder_sparse_step" in c.data else c.int("moe_layer_freq", 1)
    only = c.list("mlp_only_layers") or []
    if step != 1 or (only and sorted(only) != list(range(len(only)))):
        raise RpegError(f"{c.where}: MoE layers interleaved with dense ones (decoder_sparse_step / moe_layer_freq = "
                        f"{step}, mlp_only_layers = {only}): RPEG models leading dense layers only")
    return max(dense, len(only))


def _sliding_all(c: _Config, spec: dict[str, Any]) -> dict[str, Any]:
    """Mistral and Phi-3: a `sliding_window` applies to every layer (null: none)."""
    window = c.int("sliding_window", 0, positive=False)
    if window and c.bool("use_sliding_window", True):
        spec.update(layer_types=("sliding",) * spec["layers"], sliding_window=window)
    return spec


# ---- the families ---------------------------------------------------------------------------------

def _llama(c: _Config, name: str) -> dict[str, Any]:
    """Llama 2/3.x, deepseek-llm, Mistral, Phi-3/Phi-4: q/k/v/o and the MLP with biases where
    `attention_bias` / `mlp_bias` say so (Llama's attention_bias covers o_proj too)."""
    spec = _dense(c, name)
    if c.bool("attention_bias", False):
        spec.update(qkv_bias=True, out_bias=True)
    if c.bool("mlp_bias", False):
        raise RpegError(f"{c.where}: mlp_bias = true: biases on a gated MLP are not modelled")
    return _sliding_all(c, spec) if c.model_type in ("mistral", "phi3") else spec


def _qwen2(c: _Config, name: str) -> dict[str, Any]:
    return _dense(c, name, qkv_bias=True)  # use_sliding_window is false in every Qwen2/2.5 release


def _qwen2_moe(c: _Config, name: str) -> dict[str, Any]:
    """Qwen1.5-MoE / Qwen2-MoE: routed experts plus one shared expert of its own width behind a
    sigmoid gate (hidden -> 1)."""
    spec = _dense(c, name, qkv_bias=True)
    shared = c.int("shared_expert_intermediate_size", 0, positive=False)
    spec.update(experts=c.int("num_experts"), experts_per_token=c.int("num_experts_per_tok"),
                moe_ffn=c.int("moe_intermediate_size"), dense_layers=_moe_layers(c, spec["layers"]))
    if shared:
        spec.update(shared_experts=1, shared_ffn=shared, shared_expert_gate=True)
    return spec


def _qwen3(c: _Config, name: str) -> dict[str, Any]:
    spec = _dense(c, name, qk_norm=True)
    if c.bool("attention_bias", False):
        spec.update(qkv_bias=True, out_bias=True)
    if c.model_type.startswith("qwen3_moe"):
        spec.update(experts=c.int("num_experts"), experts_per_token=c.int("num_experts_per_tok"),
                    moe_ffn=c.int("moe_intermediate_size"), dense_layers=_moe_layers(c, spec["layers"]))
    return spec


def _qwen3_next(c: _Config, name: str) -> dict[str, Any]:
    """Qwen3-Next and Qwen3.5 text models: Gated DeltaNet layers with a full gated-attention layer every
    `full_attention_interval`; Qwen3-Next and Qwen3.5-MoE route experts with a gated shared expert."""
    spec = _dense(c, name, qk_norm=True, attention_gate=c.bool("attn_output_gate", True))
    interval = c.int("full_attention_interval", 4)
    spec.update(layer_types=_layer_types(c, spec["layers"], lambda i: "full" if (i + 1) % interval == 0 else "linear"),
                linear_key_heads=c.int("linear_num_key_heads"), linear_value_heads=c.int("linear_num_value_heads"),
                linear_key_dim=c.int("linear_key_head_dim"), linear_value_dim=c.int("linear_value_head_dim"),
                linear_conv_kernel=c.int("linear_conv_kernel_dim"))
    if "num_experts" in c.data and c.data["num_experts"]:
        spec.update(experts=c.int("num_experts"), experts_per_token=c.int("num_experts_per_tok"),
                    moe_ffn=c.int("moe_intermediate_size"), dense_layers=_moe_layers(c, spec["layers"]))
        shared = c.int("shared_expert_intermediate_size", 0, positive=False)
        if shared:
            spec.update(shared_experts=1, shared_ffn=shared, shared_expert_gate=True)
    return spec


def _mixtral(c: _Config, name: str) -> dict[str, Any]:
    spec = _sliding_all(c, _dense(c, name))
    width = spec["ffn"]
    return {**spec, "experts": c.int("num_local_experts"), "experts_per_token": c.int("num_experts_per_tok"),
            "moe_ffn": width}


def _deepseek(c: _Config, name: str) -> dict[str, Any]:
    """DeepSeek-V2/V3 (R1): multi-head latent attention, routed + shared experts, the first
    `first_k_dense_replace` layers dense. V2-Lite projects queries directly (q_lora_rank null)."""
    heads = c.int("num_attention_heads")
    return dict(name=name, layers=c.int("num_hidden_layers"), hidden=c.int("hidden_size"), heads=heads,
                kv_heads=heads, head_dim=c.int("qk_nope_head_dim"), ffn=c.int("intermediate_size"),
                vocab=c.int("vocab_size"), attention="mla", q_lora_rank=c.int("q_lora_rank", 0, positive=False),
                kv_lora_rank=c.int("kv_lora_rank"), rope_head_dim=c.int("qk_rope_head_dim"),
                v_head_dim=c.int("v_head_dim"), experts=c.int("n_routed_experts"),
                experts_per_token=c.int("num_experts_per_tok"), moe_ffn=c.int("moe_intermediate_size"),
                shared_experts=c.int("n_shared_experts", 0, positive=False),
                dense_layers=_moe_layers(c, c.int("num_hidden_layers"), "first_k_dense_replace"),
                tied_embeddings=c.bool("tie_word_embeddings", False), **_expert_groups(c))


def _expert_groups(c: _Config) -> dict[str, int]:
    """DeepSeek's node-limited routing: `n_group` groups of experts, each token's experts taken from its best
    `topk_group` of them (topk_method group_limited_greedy in V2, noaux_tc in V3); none with topk_method
    greedy (V2-Lite) or a single group."""
    groups = c.int("n_group", 0, positive=False)
    if c.data.get("topk_method", "greedy") == "greedy" or groups <= 1:
        return {}
    return {"expert_groups": groups, "groups_per_token": c.int("topk_group")}


def _gpt_oss(c: _Config, name: str) -> dict[str, Any]:
    """gpt-oss: sliding (128) and full attention alternating, biases on q/k/v/o, a sink logit per head,
    experts and router with biases."""
    spec = _dense(c, name)
    spec.update(qkv_bias=True, out_bias=True, attention_sinks=True, router_bias=True, expert_bias=True,
                experts=c.int("num_local_experts"),
                experts_per_token=c.int("num_experts_per_tok" if "num_experts_per_tok" in c.data
                                        else "experts_per_token"),
                moe_ffn=spec["ffn"], sliding_window=c.int("sliding_window"),
                layer_types=_layer_types(c, spec["layers"], lambda i: "sliding" if i % 2 == 0 else "full"))
    return spec


def _glm4(c: _Config, name: str) -> dict[str, Any]:
    """GLM-4-0414 (glm4): biases on q/k/v (not o), four norms per layer (after attention and after
    the MLP too). GLM-4.5 (glm4_moe): two norms, optional q/k norm, routed + shared experts."""
    spec = _dense(c, name, qkv_bias=c.bool("attention_bias", True))
    if c.model_type == "glm4":
        return {**spec, "norms_per_layer": 4}
    return {**spec, "qk_norm": c.bool("use_qk_norm", False), "experts": c.int("n_routed_experts"),
            "experts_per_token": c.int("num_experts_per_tok"), "moe_ffn": c.int("moe_intermediate_size"),
            "shared_experts": c.int("n_shared_experts", 0, positive=False),
            "dense_layers": _moe_layers(c, spec["layers"], "first_k_dense_replace")}


def _gemma(c: _Config, name: str) -> dict[str, Any]:
    """Gemma 2 and 3: tied embeddings, four norms per layer, sliding-window layers (Gemma 2: every other
    one from the first; Gemma 3: five of every `sliding_window_pattern` = 6), q/k norms in Gemma 3."""
    spec = _dense(c, name, tied_default=True, norms_per_layer=4)
    if c.bool("attention_bias", False):
        spec.update(qkv_bias=True, out_bias=True)
    gemma2, pattern = c.model_type == "gemma2", c.int("sliding_window_pattern", 6)
    spec["qk_norm"] = not gemma2

    def default(i: int) -> str:  # Gemma 2: layers 0, 2, 4, ... slide; Gemma 3: all but every `pattern`-th
        if gemma2:
            return "sliding" if i % 2 == 0 else "full"
        return "sliding" if (i + 1) % pattern else "full"

    spec.update(sliding_window=c.int("sliding_window"), layer_types=_layer_types(c, spec["layers"], default))
    return spec


FAMILIES: dict[str, Callable[[_Config, str], dict[str, Any]]] = {
    "llama": _llama, "mistral": _llama, "phi3": _llama, "qwen2": _qwen2, "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3, "qwen3_moe": _qwen3, "qwen3_next": _qwen3_next, "qwen3_5_text": _qwen3_next,
    "qwen3_5_moe_text": _qwen3_next, "mixtral": _mixtral, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
    "gpt_oss": _gpt_oss, "glm4": _glm4, "glm4_moe": _glm4, "gemma2": _gemma, "gemma3_text": _gemma,
}
# multimodal wrappers: the language model sits in `text_config`, the vision tower in `vision_config`
_WRAPPERS = {"gemma3": "gemma3_text", "qwen2_5_vl": "qwen2", "qwen2_vl": "qwen2", "qwen3_5": "qwen3_5_text",
             "qwen3_5_moe": "qwen3_5_moe_text"}
# keys a family's published configs may leave out, at the Hugging Face config class's default
# (transformers Gemma3TextConfig: google/gemma-3-4b-it's text_config omits these)
_DEFAULTS = {"gemma3_text": {"vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4,
                             "head_dim": 256}}
_LLAMA_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def families() -> list[str]:
    """The model_types read (language models and their multimodal wrappers)."""
    return sorted([*FAMILIES, *_WRAPPERS])


# ---- vision towers --------------------------------------------------------------------------------

def _siglip(v: _Config) -> int:
    """SigLIP vision encoder (Gemma 3): patch conv with bias, learned positions, pre-norm layers with
    LayerNorm, biased q/k/v/o and a GELU MLP, a final LayerNorm; no pooling head."""
    h, inter, patch = v.int("hidden_size"), v.int("intermediate_size"), v.int("patch_size")
    positions = (v.int("image_size") // patch) ** 2
    layer = 2 * 2 * h + 4 * (h * h + h) + (h * inter + inter) + (inter * h + h)
    return 3 * patch * patch * h + h + positions * h + v.int("num_hidden_layers") * layer + 2 * h


def _qwen2_5_vl_vision(v: _Config) -> int:
    """Qwen2.5-VL's vision transformer: a 3-D patch conv without bias, RMSNorm layers with biased qkv /
    proj and a gated MLP with biases, and the merger (RMSNorm, then two biased linears over 2x2 patches)."""
    h, inter, patch = v.int("hidden_size"), v.int("intermediate_size"), v.int("patch_size")
    merged = h * v.int("spatial_merge_size", 2) ** 2
    layer = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * (h * inter + inter) + (inter * h + h)
    patch_embed = v.int("in_chans", 3) * v.int("temporal_patch_size", 2) * patch * patch * h
    merger = h + (merged * merged + merged) + (merged * v.int("out_hidden_size") + v.int("out_hidden_size"))
    return patch_embed + v.int("depth") * layer + merger


def _vision_params(c: _Config, model_type: str, text_hidden: int) -> tuple[int, str]:
    """(the vision tower's parameters, a note when they are not counted)."""
    if "vision_config" not in c.data:
        return 0, ""
    v = c.sub("vision_config")
    if model_type == "gemma3":
        return _siglip(v) + v.int("hidden_size") * text_hidden + v.int("hidden_size"), ""  # projector and its norm
    if model_type == "qwen2_5_vl":
        return _qwen2_5_vl_vision(v), ""
    return 0, (f"the vision tower of this {model_type} model is not counted: its weights are not pinned here (towers "
               "read: gemma3, qwen2_5_vl); the language model is planned alone")


# ---- reading ----------------------------------------------------------------------------------------

def read_config(data: Any, name: str, where: str = "config.json") -> tuple[ModelSpec, list[str]]:
    """(the ModelSpec of a parsed Hugging Face config, the assumptions made reading it)."""
    if not isinstance(data, dict):
        raise RpegError(f"{where}: expected a JSON object (a Hugging Face config.json), got {type(data).__name__}")
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise RpegError(f"{where}: missing 'model_type' (every Hugging Face config.json names its family)")
    notes: list[str] = []
    outer = _Config(data, where, model_type)
    text = outer
    if model_type in _WRAPPERS:
        inner = _WRAPPERS[model_type]
        if "text_config" in data and isinstance(data["text_config"], dict) and "hidden_size" in data["text_config"]:
            text = outer.sub("text_config")
        text = _Config(text.data, text.where, inner)
    defaults = {k: v for k, v in _DEFAULTS.get(text.model_type, {}).items() if k not in text.data}
    if defaults:
        text = _Config({**defaults, **text.data}, text.where, text.model_type)
        notes.append(f"{text.model_type}: {', '.join(f'{k} = {v}' for k, v in defaults.items())} not in the config: "
                     "the Hugging Face default")
    reader = FAMILIES.get(text.model_type)
    if reader is None:
        missing = [k for k in _LLAMA_KEYS if k not in data]
        if missing:
            raise RpegError(f"{where}: model_type {model_type!r} is not one RPEG reads ({', '.join(families())}), and "
                            f"its config lacks {', '.join(missing)} to read it as a Llama-shaped decoder")
        reader = _llama
        text = _Config(data, where, "llama")
        notes.append(f"model_type {model_type!r} is not one RPEG reads: read as a Llama-shaped decoder (gated MLP, "
                     "RMSNorm, two norms per layer, no biases unless attention_bias; no experts, no sliding windows)")
    fields = reader(text, name)
    if fields.get("experts") and not fields.get("dense_layers"):
        fields["ffn"] = 0  # no dense layer: intermediate_size is unused (or the expert width), as in the presets
    fields["vision_params"], note = _vision_params(outer, model_type, fields["hidden"])
    notes += [note] if note else []
    try:
        return ModelSpec(**fields), notes
    except RpegError as e:
        raise RpegError(f"{where}: {e}") from None


def config_path(path: str) -> str | None:
    """The config.json a path names: the file itself, or a model folder's config.json; None if neither."""
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(full):
        inside = os.path.join(full, "config.json")
        return inside if os.path.isfile(inside) else None
    return full if os.path.isfile(full) and full.endswith(".json") else None


def load_config(path: str, name: str | None = None) -> tuple[ModelSpec, list[str]]:
    """(ModelSpec, assumptions) of a config.json file or a model folder holding one; named `name`, else
    by the absolute path given (so a job file naming it loads from any working directory)."""
    found = config_path(path)
    if found is None:
        raise RpegError(f"{path}: no config.json there (a model folder holds one; or name the .json file)")
    try:
        with open(found, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError) as e:
        raise RpegError(f"{found}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise RpegError(f"{found}: not valid JSON (line {e.lineno}: {e.msg})") from None
    folder = os.path.dirname(found) if os.path.basename(found) == "config.json" else found
    return read_config(data, name or folder, found)
