"""ModelSpec: a decoder-only transformer's architecture and the parameter counts derived from it.

Covers dense models (MHA or GQA attention, SwiGLU or GELU MLP, optional QKV bias and q/k norm),
mixture-of-experts models (routed experts, experts per token, shared experts with their own width
and gate, leading dense layers, expert and router biases), DeepSeek's multi-head latent attention
(MLA), layers of other kinds (`layer_types`: sliding-window attention as in Gemma 2/3 and gpt-oss,
Gated DeltaNet linear attention as in Qwen3-Next / Qwen3.5), gated attention outputs, attention
sinks, extra norms per layer (Gemma, GLM-4) and a vision tower's parameter count. Counts follow the Hugging Face
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

FfnAct = Literal["swiglu", "gelu"]  # swiglu: any gated MLP of three matrices (SwiGLU, GeGLU)
Attention = Literal["mha", "gqa", "mla"]
LAYER_TYPES = ("full", "sliding", "linear")  # global attention, sliding-window attention, Gated DeltaNet


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
                ("dense_layers", 2_048, ""), ("expert_groups", 1_048_576, ""), ("groups_per_token", 1_048_576, ""),
                ("sliding_window", 16_777_216, ""), ("linear_key_heads", 65_536, ""),
                ("linear_value_heads", 65_536, ""), ("linear_key_dim", 65_536, ""), ("linear_value_dim", 65_536, ""),
                ("linear_conv_kernel", 1_024, ""), ("norms_per_layer", 16, ""), ("shared_ffn", 16_777_216, ""),
                ("vision_params", 10**12, "a vision tower of a trillion parameters"),
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
    # node-limited routing (DeepSeek-V3's n_group / topk_group): the routed experts in `expert_groups` equal
    # groups, each token's experts taken from its best `groups_per_token` groups only; 0: no such limit
    expert_groups: int = 0
    groups_per_token: int = 0
    # multi-head latent attention (DeepSeek-V2/V3)
    q_lora_rank: int = 0  # 0: queries projected directly
    kv_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0  # 0: head_dim
    # layers of other kinds: one entry per layer, each of LAYER_TYPES; () = every layer full attention
    layer_types: tuple[str, ...] = ()
    sliding_window: int = 0  # tokens a "sliding" layer attends to, and so keeps in its KV cache
    # Gated DeltaNet ("linear" layers, Qwen3-Next / Qwen3.5): heads and head widths of keys and values,
    # and the width of the short causal convolution over q, k and v
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    linear_conv_kernel: int = 0
    attention_gate: bool = False  # q_proj also yields a sigmoid gate per head on the output (Qwen3-Next)
    out_bias: bool = False  # a bias on the attention output projection (gpt-oss)
    attention_sinks: bool = False  # a learned sink logit per head and layer (gpt-oss)
    norms_per_layer: int = 2  # Gemma 2/3 and GLM-4 add norms after attention and after the MLP: 4
    router_bias: bool = False  # a bias on the router (gpt-oss)
    expert_bias: bool = False  # biases on every expert's projections (gpt-oss)
    shared_ffn: int = 0  # width of each shared expert (0: moe_ffn); Qwen2-MoE / Qwen3-Next set their own
    shared_expert_gate: bool = False  # a sigmoid gate (hidden -> 1) on the shared expert's output (Qwen2-MoE)
    vision_params: int = 0  # a VLM's vision tower and projector (see vision_note)
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
            problems += self._group_problems()
        elif self.experts_per_token or self.shared_experts or self.dense_layers or self.expert_groups:
            problems.append("experts_per_token, shared_experts, dense_layers and expert_groups need experts > 0")
        if self.ffn <= 0 and (not self.experts or self.dense_layers):
            problems.append(f"ffn = {self.ffn} must be positive")
        problems += self._layer_type_problems()
        if self.norms_per_layer < 1:
            problems.append(f"norms_per_layer = {self.norms_per_layer} must be positive")
        if (self.shared_ffn or self.shared_expert_gate) and not self.shared_experts:
            problems.append("shared_ffn and shared_expert_gate need shared_experts > 0")
        if (self.router_bias or self.expert_bias) and not self.experts:
            problems.append("router_bias and expert_bias need experts > 0")
        if problems:
            raise RpegError(f"model {self.name!r}: " + "; ".join(problems))
        layers = [self.layer_params(i) for i in range(self.layers)]
        active = [self.layer_params(i, active=True) for i in range(self.layers)]
        emb = self.embedding_params()
        object.__setattr__(self, "_counts", (emb + sum(layers), emb + sum(active),
                                             self.vocab * self.hidden + sum(active)))

    def _group_problems(self) -> list[str]:
        g, k = self.expert_groups, self.groups_per_token
        if not g and not k:
            return []
        if g <= 0 or k <= 0:
            return [f"expert_groups = {g} and groups_per_token = {k}: set both (node-limited routing) or neither"]
        out = []
        if self.experts % g:
            out.append(f"expert_groups = {g} does not divide experts = {self.experts}")
        if k > g:
            out.append(f"groups_per_token = {k} exceeds expert_groups = {g}")
        elif k * (self.experts // g) < self.experts_per_token:
            out.append(f"groups_per_token = {k} groups of {self.experts // g} experts hold fewer than "
                       f"experts_per_token = {self.experts_per_token}")
        return out

    def _layer_type_problems(self) -> list[str]:
        if not self.layer_types:
            return ["sliding_window needs layer_types with 'sliding' layers"] if self.sliding_window else []
        out = []
        if len(self.layer_types) != self.layers:
            out.append(f"layer_types has {len(self.layer_types)} entries for layers = {self.layers}")
        bad = sorted({t for t in self.layer_types if t not in LAYER_TYPES})
        if bad:
            out.append(f"layer_types: {', '.join(map(repr, bad))} is not one of {', '.join(LAYER_TYPES)}")
        if "sliding" in self.layer_types and self.sliding_window <= 0:
            out.append("'sliding' layers need sliding_window > 0")
        linear = (self.linear_key_heads, self.linear_value_heads, self.linear_key_dim, self.linear_value_dim,
                  self.linear_conv_kernel)
        if "linear" in self.layer_types and min(linear) <= 0:
            out.append("'linear' layers need linear_key_heads, linear_value_heads, linear_key_dim, "
                       "linear_value_dim and linear_conv_kernel > 0")
        if "linear" in self.layer_types and self.linear_value_heads % max(self.linear_key_heads, 1):
            out.append(f"linear_value_heads = {self.linear_value_heads} is not a multiple of linear_key_heads = "
                       f"{self.linear_key_heads}")
        if self.attention == "mla" and set(self.layer_types) != {"full"}:
            out.append("attention = 'mla' has full-attention layers only")
        return out

    def replace(self, **changes) -> ModelSpec:
        return dataclasses.replace(self, **changes)

    # ---- shape facts -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    def layer_type(self, index: int) -> str:
        """'full', 'sliding' or 'linear': what kind of token mixing layer `index` does."""
        return self.layer_types[index] if self.layer_types else "full"

    @property
    def sliding_layers(self) -> int:
        return self.layer_types.count("sliding")

    @property
    def linear_layers(self) -> int:
        return self.layer_types.count("linear")

    @property
    def attention_layers(self) -> int:
        """Layers with softmax attention (full or sliding): those that keep a KV cache."""
        return self.layers - self.linear_layers

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
        if self.linear_bias or self.out_bias:
            params += h
        if self.qk_norm:
            params += 2 * hd
        if self.attention_gate:  # q_proj's second half: the gate, nh x hd more outputs (and biases)
            params += h * nh * hd + (nh * hd if self.qkv_bias or self.linear_bias else 0)
        if self.attention_sinks:
            params += nh
        return params

    def linear_attention_params(self) -> int:
        """Parameters of one Gated DeltaNet block (Hugging Face Qwen3NextGatedDeltaNet): the q, k, v and
        output-gate projections, the per-head beta and decay projections, the depthwise convolution over
        q, k and v, the decay's dt_bias and A_log per value head, the gated norm and the output projection."""
        h, vh = self.hidden, self.linear_value_heads
        kd, vd = self.linear_key_heads * self.linear_key_dim, vh * self.linear_value_dim
        return (h * (2 * kd + 2 * vd) + h * 2 * vh + (2 * kd + vd) * self.linear_conv_kernel + 2 * vh
                + self.linear_value_dim + vd * h)

    def mlp_params(self, width: int) -> int:
        """Parameters of one MLP of the given intermediate width."""
        params = (3 if self.ffn_act == "swiglu" else 2) * self.hidden * width
        if self.linear_bias:
            params += (2 if self.ffn_act == "swiglu" else 1) * width + self.hidden
        return params

    def expert_params(self) -> int:
        """Parameters of one routed expert (its biases too, where it has them)."""
        return self.mlp_params(self.moe_ffn) + ((2 * self.moe_ffn + self.hidden) if self.expert_bias else 0)

    def shared_expert_params(self) -> int:
        """Parameters of one shared expert."""
        return self.mlp_params(self.shared_ffn or self.moe_ffn)

    def norm_width(self) -> int:
        """Parameters of one norm."""
        return self.hidden * (2 if self.norm == "layernorm" else 1)  # LayerNorm has a bias

    def norm_params(self) -> int:
        """The norms of one layer (two, or `norms_per_layer`)."""
        return self.norms_per_layer * self.norm_width()

    def router_params(self) -> int:
        """The router of one MoE layer (its bias, and the shared expert's gate, where there are ones)."""
        return (self.hidden * self.experts + (self.experts if self.router_bias else 0)
                + (self.hidden if self.shared_expert_gate else 0))

    def layer_params(self, index: int, *, active: bool = False) -> int:
        """Parameters of decoder layer `index` (0-based); `active`: only what one token uses."""
        mixer = self.linear_attention_params() if self.layer_type(index) == "linear" else self.attention_params()
        base = mixer + self.norm_params()
        if not self.is_moe or index < self.dense_layers:
            return base + self.mlp_params(self.ffn)
        routed = self.experts_per_token if active else self.experts
        if not (self.expert_bias or self.shared_ffn):
            return base + self.router_params() + (routed + self.shared_experts) * self.mlp_params(self.moe_ffn)
        return (base + self.router_params() + routed * self.expert_params()
                + self.shared_experts * self.shared_expert_params())

    def embedding_params(self) -> int:
        """Input embedding, output head (unless tied), position table and the final norm."""
        emb = self.vocab * self.hidden
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return emb + head + self.position_embeddings * self.hidden + self.norm_width()

    def params_total(self) -> int:
        """Every weight: the language model's, and a vision tower's (`vision_params`) where there is one."""
        return self._counts[0] + self.vision_params

    def params_active(self) -> int:
        """Weights one text token touches (a vision tower is not among them)."""
        return self._counts[1]

    def params_matmul_active(self) -> int:
        """Weights multiplied per token in a forward pass: active layers and the output head
        (the input embedding is a lookup, not a matmul). 2 x this = FLOPs per token, less attention."""
        return self._counts[2]

    # ---- per-token state ---------------------------------------------------------------------
    def kv_elements_per_token(self, context: float = 0.0) -> float:
        """Elements of KV cache one token keeps across all layers (MLA caches the latent).

        Linear-attention layers keep no KV cache (a fixed state per sequence: `linear_state_elements`).
        Sliding-window layers keep only the last `sliding_window` tokens: for sequences of `context`
        tokens they hold min(window, context) / context elements per token on average; without a
        context (0) every token is counted, the bound for sequences no longer than the window."""
        if self.attention == "mla":
            return self.layers * (self.kv_lora_rank + self.rope_head_dim)
        per_layer = 2 * self.kv_heads * self.head_dim
        if not self.layer_types:
            return self.layers * per_layer
        sliding = self.sliding_layers
        share = min(1.0, self.sliding_window / context) if context > 0 else 1.0
        return (self.attention_layers - sliding) * per_layer + sliding * per_layer * share

    def linear_state_elements(self) -> int:
        """Elements of recurrent state one sequence keeps across the linear-attention layers: the
        Gated DeltaNet state (key dim x value dim per value head) and the convolution's last inputs."""
        vh, kd, vd = self.linear_value_heads, self.linear_key_dim, self.linear_value_dim
        conv = (2 * self.linear_key_heads * kd + vh * vd) * max(self.linear_conv_kernel - 1, 0)
        return self.linear_layers * (vh * kd * vd + conv)

    def vision_note(self) -> str:
        """How the planner treats a vision tower (empty without one)."""
        if not self.vision_params:
            return ""
        return (f"vision tower {self.vision_params / 1e9:.2f}B params: planned as weights beside the embedding "
                "(memory, optimizer state and weight sync of the first pipeline stage), with no compute (the "
                "jobs RPEG plans are text prompts)")

    def summary(self) -> str:
        total, active = self.params_total(), self.params_active()
        moe = f", {self.experts} experts top-{self.experts_per_token}" if self.is_moe else ""
        act = f" ({active / 1e9:.2f}B active)" if self.is_moe else ""
        kinds = ""
        if self.layer_types:
            kinds = ", " + ", ".join(f"{self.layer_types.count(t)} {t}" for t in LAYER_TYPES if t in self.layer_types)
            kinds += f" (window {self.sliding_window})" if self.sliding_layers else ""
        vision = f"; {self.vision_note()}" if self.vision_params else ""
        return (f"{self.name}: {total / 1e9:.2f}B params{act}, {self.layers} layers{kinds}, hidden {self.hidden}, "
                f"{self.heads} heads / {self.kv_heads} kv ({self.attention}){moe}{vision}")
