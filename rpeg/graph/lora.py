"""Low-rank adapters (LoRA, Hu et al. 2021) on a trained model: what the job says, and what they add.

A job file's `lora:` section trains adapters instead of the whole model:

    lora: {rank: 32, alpha: 64, targets: [q, k, v, o, gate, up, down], dropout: 0.0, critic: false,
           sync: adapters}

Each targeted linear layer W (in x out) keeps its weights frozen and learns B A, A: in x r and B: r x out,
scaled by alpha / r; r (in + out) parameters per layer. `targets` name the decoder layer's projections as
peft's "all-linear" does on Llama/Qwen models (q_proj ... down_proj), the embedding and output head left
out; on an MoE layer `gate`, `up` and `down` are each routed and shared expert's (peft reaches the experts
of models whose experts are Linear modules; the router stays frozen). The actor trains adapters; the
critic too with `critic: true`. `sync`: what a weight sync sends the engines, the adapters alone
(`adapters`: an engine that loads them) or the merged weights (`merged`: an engine that cannot; RPEG's
vLLM engine takes these whatever the job says, docs/runtime.md).

The peers' settings: verl `actor_rollout_ref.model.lora_rank`, `lora_alpha`, `target_modules`; OpenRLHF
`--lora_rank`, `--lora_alpha`, `--target_modules`; TRL and the others through peft's LoraConfig.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rpeg.errors import RpegError
from rpeg.graph.model import ModelSpec

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # peft's all-linear on a decoder layer
# ... as Llama/Qwen-style Hugging Face models name them (peft's target_modules)
MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
           "down": "down_proj"}
ATTENTION = ("q", "k", "v", "o")
MLP = ("gate", "up", "down")


@dataclass(frozen=True, kw_only=True, slots=True)
class LoRA:
    rank: int = 32
    alpha: float = 64.0
    targets: tuple[str, ...] = TARGETS
    dropout: float = 0.0
    critic: bool = False  # the critic trains adapters too (else in full)
    sync: Literal["adapters", "merged"] = "adapters"

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 1 <= self.rank <= 65_536:
            raise RpegError(f"lora: rank = {self.rank!r} must be a whole number in [1, 65536]")
        if not 0 < float(self.alpha) <= 1e6:
            raise RpegError(f"lora: alpha = {self.alpha!r} must be in (0, 1e6]")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise RpegError(f"lora: dropout = {self.dropout!r} must be in [0, 1)")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise RpegError(f"lora: target {unknown[0] if unknown else '(none)'!r} is not a projection of a decoder "
                            f"layer (known: {', '.join(TARGETS)})")
        if self.sync not in ("adapters", "merged"):
            raise RpegError(f"lora: sync = {self.sync!r} must be adapters or merged")

    def check(self, spec: ModelSpec) -> None:
        """One line if the adapters' shapes on `spec` are not modelled: MLA's low-rank projections and
        linear-attention layers have projections of their own that the targets do not name."""
        if spec.attention == "mla" and set(self.targets) & set(ATTENTION):
            raise RpegError(f"lora on {spec.name}: adapters on multi-head latent attention's projections are not "
                            "modelled; target only the MLP (targets: [gate, up, down])")
        if spec.linear_layers and set(self.targets) & set(ATTENTION):
            raise RpegError(f"lora on {spec.name}: adapters on its linear-attention layers are not modelled; target "
                            "only the MLP (targets: [gate, up, down])")

    def _shapes(self, spec: ModelSpec, index: int) -> list[tuple[int, int, int]]:
        """(in, out, how many) of each targeted linear layer of decoder layer `index`."""
        h, hd = spec.hidden, spec.head_dim
        vd = spec.v_head_dim or hd
        q_out = spec.heads * hd * (2 if spec.attention_gate else 1)
        shapes = {"q": (h, q_out, 1), "k": (h, spec.kv_heads * hd, 1), "v": (h, spec.kv_heads * vd, 1),
                  "o": (spec.heads * vd, h, 1)}
        if not spec.is_moe or index < spec.dense_layers:
            widths = [(spec.ffn, 1)]
        else:
            widths = [(spec.moe_ffn, spec.experts)] + ([(spec.shared_ffn or spec.moe_ffn, spec.shared_experts)]
                                                       if spec.shared_experts else [])
        out = [shapes[t] for t in self.targets if t in shapes]
        for width, count in widths:
            mlp = {"gate": (h, width, count), "up": (h, width, count), "down": (width, h, count)}
            if spec.ffn_act != "swiglu":
                mlp.pop("gate")
            out += [mlp[t] for t in self.targets if t in mlp]
        return out

    def layer_params(self, spec: ModelSpec, index: int) -> int:
        """Adapter parameters of decoder layer `index`: r (in + out) per targeted linear layer."""
        return sum(self.rank * (i + o) * n for i, o, n in self._shapes(spec, index))

    def params(self, spec: ModelSpec) -> int:
        """Every adapter parameter of the model."""
        return sum(self.layer_params(spec, i) for i in range(spec.layers))

    def tensors(self, spec: ModelSpec) -> int:
        """Adapter tensors (an A and a B per targeted linear layer): what a sync of the adapters sends."""
        return sum(2 * n for i in range(spec.layers) for _, _, n in self._shapes(spec, i))

    def flops_per_token(self, spec: ModelSpec, index: int) -> float:
        """Forward FLOPs of decoder layer `index`'s adapters per token: x A then (x A) B, 2 r (in + out) per
        targeted layer; an MoE layer's routed experts counted for the experts a token is routed to."""
        total = 0.0
        for i, o, n in self._shapes(spec, index):
            if spec.is_moe and index >= spec.dense_layers and n == spec.experts:
                n = spec.experts_per_token
            total += 2.0 * self.rank * (i + o) * n
        return total

    def describe(self) -> str:
        return (f"LoRA rank {self.rank}, alpha {self.alpha:g} on {', '.join(self.targets)}"
                + (", critic too" if self.critic else "") + f"; syncs {self.sync}")
