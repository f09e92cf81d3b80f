"""ModelSpec: a decoder-only transformer's architecture and the parameter counts derived from it.

Covers dense models (MHA or GQA attention, SwiGLU or GELU MLP, optional QKV bias and q/k norm),
mixture-of-experts models (routed experts, experts per token, shared experts, leading dense
layers) and DeepSeek's multi-head latent attention (MLA). Counts follow the Hugging Face
implementations weight by weight (norm weights included), so they can be checked against a
model card: Llama-3.1-8B gives 8.030B, Qwen3-30B-A3B 30.53B total, DeepSeek-V3 671.0B.

"Active" parameters are those a token touches: every weight except the routed experts it is not
sent to. Published active counts are truncated (Qwen3-30B-A3B: 3.353B here, "3.3B" on the card;
DeepSeek-V3: 37.55B here, "37B" in the report).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from rpeg.errors import RpegError
from rpeg.graph.bounds import problem
from rpeg.graph.bounds import problems as bounded

FfnAct = Literal["swiglu", "gelu"]
Attention = Literal["mha", "gqa", "mla"]


# Upper bounds on a model's dimensions, far above any model built (the deepest have 126-160 layers,
# hidden up to ~3e4, vocab ~3e5, 256 experts): they keep the planner's work and memory bounded.
# The layer bound is the tightest: pipeline splits are searched layer by layer, and `rpeg plan`
# takes 1.9 s at 126 layers and 9 s at 2,048 on 8 GPUs (measured here).
_SIZE_BOUNDS = (("layers", 2_048, "the deepest models built have about 160; the plan search works per layer"),
                ("hidden", 1_048_576, ""), ("heads", 65_536, ""), ("kv_heads", 65_536, ""), ("head_dim", 65_536, ""),
                ("v_head_dim", 65_536, ""),
                ("ffn", 16_777_216, ""), ("vocab", 16_777_216, ""), ("experts", 1_048_576, ""),
                ("experts_per_token", 1_048_576, ""), ("moe_ffn", 16_777_216, ""), ("shared_experts", 65_536, ""),
                ("kv_lora_rank", 1_048_576, ""), ("q_lora_rank", 1_048_576, ""), ("rope_head_dim", 65_536, ""),
                ("dense_layers", 2_048, ""),
                ("position_embeddings", 16_777_216, "a learned table longer than the longest context shipped (10 Mi)"))


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int  # dense MLP width (also the width of the leading dense layers of an MoE model)
    vocab: int
    ffn_act: FfnAct = "swiglu"
    head_dim: int = 0  # 0: hidden // heads
    attention: Attention = "gqa"
    qkv_bias: bool = False  # biases on q, k, v only (Qwen2/2.5)
    linear_bias: bool = False  # biases on every linear layer (GPT-2/3, Megatron GPT)
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    tied_embeddings: bool = False
    position_embeddings: int = 0  # rows of a learned absolute position table (GPT-3); 0 = RoPE
    # mixture of experts
    experts: int = 0
    experts_per_token: int = 0
    moe_ffn: int = 0  # per-expert MLP width
    shared_experts: int = 0
    dense_layers: int = 0  # leading layers that use the dense `ffn` instead of experts
    # multi-head latent attention (DeepSeek-V2/V3)
    q_lora_rank: int = 0  # 0: queries projected directly
    kv_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0  # 0: head_dim
    # derived once on construction (a planner asks for them millions of times)
    _counts: tuple[int, int, int] = field(default=(0, 0, 0), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // max(self.heads, 1))
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if not isinstance(self.name, str) or not self.name.strip():
            raise RpegError(f"name = {self.name!r}: a model needs a name (it labels the plan and its files)")
        problems = []
        for f in ("layers", "hidden", "heads", "kv_heads", "vocab"):
            if getattr(self, f) <= 0:
                problems.append(f"{f} = {getattr(self, f)} must be positive")
        problems += bounded([problem(f, getattr(self, f), minimum=0, maximum=hi, why=why)
                             for f, hi, why in _SIZE_BOUNDS])
        if self.ffn_act not in ("swiglu", "gelu"):
            problems.append(f"ffn_act = {self.ffn_act!r} must be 'swiglu' or 'gelu'")
        if self.norm not in ("rmsnorm", "layernorm"):
            problems.append(f"norm = {self.norm!r} must be 'rmsnorm' or 'layernorm'")
        if self.attention not in ("mha", "gqa", "mla"):
            problems.append(f"attention = {self.attention!r} must be 'mha', 'gqa' or 'mla'")
        if self.kv_heads > 0 and self.heads % self.kv_heads:
            problems.append(f"heads = {self.heads} is not a multiple of kv_heads = {self.kv_heads}")
        if self.attention == "mla" and (self.kv_lora_rank <= 0 or self.rope_head_dim <= 0):
            problems.append("attention = 'mla' needs kv_lora_rank > 0 and rope_head_dim > 0")
        if self.experts:
            if not 0 < self.experts_per_token <= self.experts:
                problems.append(f"experts_per_token = {self.experts_per_token} must be in 1..experts = {self.experts}")
            if self.moe_ffn <= 0:
                problems.append("an MoE model needs moe_ffn (per-expert ffn width) > 0")
            if not 0 <= self.dense_layers <= self.layers:
                problems.append(f"dense_layers = {self.dense_layers} must be in 0..layers = {self.layers}")
        elif self.experts_per_token or self.shared_experts or self.dense_layers:
            problems.append("experts_per_token, shared_experts and dense_layers need experts > 0")
        if self.ffn <= 0 and (not self.experts or self.dense_layers):
            problems.append(f"ffn = {self.ffn} must be positive")
        if problems:
            raise RpegError(f"model {self.name!r}: " + "; ".join(problems))
        layers = [self.layer_params(i) for i in range(self.layers)]
        active = [self.layer_params(i, active=True) for i in range(self.layers)]
        emb = self.embedding_params()
        object.__setattr__(self, "_counts", (emb + sum(layers), emb + sum(active),
                                             self.vocab * self.hidden + sum(active)))

    def replace(self, **changes) -> ModelSpec:
        return dataclasses.replace(self, **changes)

    # ---- shape facts -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def q_head_dim(self) -> int:
        """Width of one query/key head (MLA: the non-rotary part plus the rotary part)."""
        return self.head_dim + self.rope_head_dim if self.attention == "mla" else self.head_dim

    # ---- parameter counts --------------------------------------------------------------------
    def attention_params(self) -> int:
        """Parameters of one attention block (projections, biases, q/k norms)."""
        h, nh, kvh, hd = self.hidden, self.heads, self.kv_heads, self.head_dim
        if self.attention == "mla":
            qd = self.q_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nh * qd
            else:
                q = h * nh * qd
            kv = (h * (self.kv_lora_rank + self.rope_head_dim) + self.kv_lora_rank
                  + self.kv_lora_rank * nh * (self.head_dim + self.v_head_dim))
            return q + kv + nh * self.v_head_dim * h
        params = h * nh * hd + 2 * h * kvh * hd + nh * hd * h
        if self.qkv_bias or self.linear_bias:
            params += nh * hd + 2 * kvh * hd
        if self.linear_bias:
            params += h
        if self.qk_norm:
            params += 2 * hd
        return params

    def mlp_params(self, width: int) -> int:
        """Parameters of one MLP of the given intermediate width."""
        params = (3 if self.ffn_act == "swiglu" else 2) * self.hidden * width
        if self.linear_bias:
            params += (2 if self.ffn_act == "swiglu" else 1) * width + self.hidden
        return params

    def _norm_width(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" else 1)  # LayerNorm has a bias

    def norm_params(self) -> int:
        """Two norms per layer."""
        return 2 * self._norm_width()

    def router_params(self) -> int:
        return self.hidden * self.experts

    def layer_params(self, index: int, *, active: bool = False) -> int:
        """Parameters of decoder layer `index` (0-based); `active`: only what one token uses."""
        base = self.attention_params() + self.norm_params()
        if not self.is_moe or index < self.dense_layers:
            return base + self.mlp_params(self.ffn)
        routed = self.experts_per_token if active else self.experts
        return base + self.router_params() + (routed + self.shared_experts) * self.mlp_params(self.moe_ffn)

    def embedding_params(self) -> int:
        """Input embedding, output head (unless tied), position table and the final norm."""
        emb = self.vocab * self.hidden
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return emb + head + self.position_embeddings * self.hidden + self._norm_width()

    def params_total(self) -> int:
        return self._counts[0]

    def params_active(self) -> int:
        return self._counts[1]

    def params_matmul_active(self) -> int:
        """Weights multiplied per token in a forward pass: active layers and the output head
        (the input embedding is a lookup, not a matmul). 2 x this = FLOPs per token, less attention."""
        return self._counts[2]

    # ---- per-token state ---------------------------------------------------------------------
    def kv_elements_per_token(self) -> int:
        """Elements of KV cache one token keeps across all layers (MLA caches the latent)."""
        if self.attention == "mla":
            return self.layers * (self.kv_lora_rank + self.rope_head_dim)
        return self.layers * 2 * self.kv_heads * self.head_dim

    def summary(self) -> str:
        total, active = self.params_total(), self.params_active()
        moe = f", {self.experts} experts top-{self.experts_per_token}" if self.is_moe else ""
        act = f" ({active / 1e9:.2f}B active)" if self.is_moe else ""
        return (f"{self.name}: {total / 1e9:.2f}B params{act}, {self.layers} layers, hidden {self.hidden}, "
                f"{self.heads} heads / {self.kv_heads} kv ({self.attention}){moe}")
