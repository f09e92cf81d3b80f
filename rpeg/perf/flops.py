"""FLOPs of decoder-only transformers, dense and MoE, per token and per sequence.

A forward pass over one token costs 2 FLOPs per active matmul weight (Kaplan et al. 2020,
arXiv 2001.08361, eq. 2.2) plus causal attention: at context length c every layer computes
QK^T (2 * heads * qk_dim * c) and AV (2 * heads * v_dim * c). A whole causal sequence of S
tokens sums c = 1..S, i.e. S(S + 1)/2 — the same whether the tokens come from one prefill or
from KV-cached decoding, which is why generation FLOPs are those of a forward pass over the
prompt and the response. MLA attention is counted in its unabsorbed form (per-head q/k of
head_dim + rope_head_dim, v of v_head_dim). Backward costs twice the forward (Narayanan et al.
2021, arXiv 2104.04473); full recomputation adds one more forward of the decoder layers (the
output head is not checkpointed, as in Megatron), selective recomputation re-runs only the
attention core (Korthikanti et al. 2022, arXiv 2205.05198).

Layers of other kinds (`ModelSpec.layer_types`): a sliding-window layer's token attends to at most
the last `sliding_window` positions (itself included), so a causal sequence of S > W tokens costs it
W(W+1)/2 + (S - W)W (query, key) pairs, not S(S+1)/2 (gpt-oss: 128-token windows on every other
layer; Gemma 2/3, Mistral); a linear-attention layer (Gated DeltaNet) has no quadratic core (its
recurrent state update is not counted here). `attended_pairs` and `attended_keys` are the means over
the layers, so the attention FLOPs stay `attention_flops_per_context_token` (all layers) times them.
"""

from __future__ import annotations

from rpeg.graph.model import ModelSpec


def attention_flops_per_context_token(spec: ModelSpec) -> float:
    """Attention-core FLOPs per (query token, key token) pair, all layers: QK^T and AV."""
    return 2.0 * spec.layers * spec.heads * (spec.q_head_dim + spec.v_head_dim)


def _kinds(spec: ModelSpec) -> tuple[float, float]:
    """(share of full-attention layers, share of sliding-window layers) of all layers."""
    if not spec.layer_types:
        return 1.0, 0.0
    sliding = spec.sliding_layers / spec.layers
    return spec.attention_layers / spec.layers - sliding, sliding


def _window_pairs(window: float, seq_len: float) -> float:
    if seq_len <= window:
        return seq_len * (seq_len + 1) / 2
    return window * (window + 1) / 2 + (seq_len - window) * window


def attended_pairs(spec: ModelSpec, seq_len: float) -> float:
    """(query, key) pairs of a causal pass over `seq_len` tokens, the mean over the layers: S(S+1)/2
    for full attention, the window's for a sliding layer, none for a linear one (module docstring)."""
    full, sliding = _kinds(spec)
    out = full * seq_len * (seq_len + 1) / 2
    return out + sliding * _window_pairs(spec.sliding_window, seq_len) if sliding else out


def attended_keys(spec: ModelSpec, position: float) -> float:
    """Keys the token at `position` (1-based: the context it sees, itself included) attends to, the
    mean over the layers: what one decode step's attention reads per sequence."""
    full, sliding = _kinds(spec)
    return full * position + (sliding * min(position, spec.sliding_window) if sliding else 0.0)


def expected_attended_pairs(spec: ModelSpec, prompt: float, response) -> float:
    """E[attended_pairs(prompt + r)] for r ~ `response`: exact from the first two moments for full
    layers; for sliding ones exact where every sequence is longer than the window (prompt >= W: the
    pairs are then linear in the length), else taken at the mean length."""
    e_r, e_r2 = response.moments()
    e_s = prompt + e_r
    e_s2 = prompt * prompt + 2 * prompt * e_r + e_r2
    full, sliding = _kinds(spec)
    out = full * (e_s2 + e_s) / 2
    if sliding:
        w = spec.sliding_window
        out += sliding * (e_s * w - w * (w - 1) / 2 if prompt >= w else _window_pairs(w, e_s))
    return out


def forward_flops_per_token(spec: ModelSpec, context: float) -> float:
    """Forward FLOPs of one token that attends to `context` tokens (itself included)."""
    return 2.0 * spec.params_matmul_active() + attention_flops_per_context_token(spec) * context


def sequence_forward_flops(spec: ModelSpec, seq_len: float) -> float:
    """Forward FLOPs of a causal pass over `seq_len` tokens (prefill, or prefill + decode)."""
    return 2.0 * spec.params_matmul_active() * seq_len + attention_flops_per_context_token(spec) * attended_pairs(
        spec, seq_len)


def decode_flops(spec: ModelSpec, prompt_len: float, response_len: float) -> float:
    """FLOPs of generating `response_len` tokens after a `prompt_len` prefill (decode part only)."""
    return sequence_forward_flops(spec, prompt_len + response_len) - sequence_forward_flops(spec, prompt_len)


def head_flops_per_token(spec: ModelSpec) -> float:
    """The output projection to the vocabulary."""
    return 2.0 * spec.vocab * spec.hidden


def scalar_head_saving_per_token(spec: ModelSpec) -> float:
    """What a critic's value head or a reward model's score head (hidden x 1) saves per token
    against the vocabulary head `params_matmul_active` counts."""
    return 2.0 * (spec.vocab - 1) * spec.hidden


def layers_forward_flops(spec: ModelSpec, seq_len: float) -> float:
    """Forward FLOPs of the decoder layers alone (no output head) over a causal sequence."""
    return sequence_forward_flops(spec, seq_len) - head_flops_per_token(spec) * seq_len


def attention_core_flops(spec: ModelSpec, seq_len: float) -> float:
    """QK^T and AV over a causal sequence: what selective recomputation re-runs."""
    return attention_flops_per_context_token(spec) * attended_pairs(spec, seq_len)


def recompute_flops(spec: ModelSpec, seq_len: float, recompute: str) -> float:
    """Extra forward work of activation recomputation over one sequence."""
    if recompute == "full":
        return layers_forward_flops(spec, seq_len)
    if recompute == "selective":
        return attention_core_flops(spec, seq_len)
    if recompute == "none":
        return 0.0
    raise ValueError(f"recompute must be none, selective or full, not {recompute!r}")


def train_flops(spec: ModelSpec, seq_len: float, recompute: str = "none") -> float:
    """FLOPs of a training pass over one sequence: forward, backward (2x), recomputation."""
    return 3.0 * sequence_forward_flops(spec, seq_len) + recompute_flops(spec, seq_len, recompute)


def expected_forward_flops(spec: ModelSpec, prompt: float, response, *, value_head: bool = False) -> float:
    """E[sequence_forward_flops(prompt + r)] for r ~ `response` (a LengthDistribution), exactly:
    the cost is quadratic in the length, so the first two moments suffice. `value_head`: a critic's
    or reward model's scalar head in place of the vocabulary head."""
    e_s = prompt + response.moments()[0]
    head = scalar_head_saving_per_token(spec) * e_s if value_head else 0.0
    return (2.0 * spec.params_matmul_active() * e_s
            + attention_flops_per_context_token(spec) * expected_attended_pairs(spec, prompt, response) - head)


def expected_generation_flops(spec: ModelSpec, prompt: float, response) -> float:
    """E[FLOPs] of generating r ~ `response` tokens after a `prompt`-token prompt with a KV cache.

    The prefill runs the decoder layers over the prompt and the vocabulary head over its last token
    only (vLLM computes logits at the positions it samples from); that samples the first response
    token, and each of the r - 1 decode steps feeds one token in and samples the next. So the layers
    see prompt + r - 1 tokens (the last sampled token is never fed in) and the head r: a forward
    pass over prompt + r tokens, less the head over the prompt and one whole token's layers, which
    attends to all prompt + r positions."""
    e_r, _ = response.moments()
    layers_per_token = 2.0 * spec.params_matmul_active() - head_flops_per_token(spec)
    last = layers_per_token + attention_flops_per_context_token(spec) * attended_keys(spec, prompt + e_r)
    return expected_forward_flops(spec, prompt, response) - head_flops_per_token(spec) * prompt - last


def expected_train_flops(spec: ModelSpec, prompt: float, response, recompute: str = "none", *,
                         value_head: bool = False) -> float:
    """E[train_flops(prompt + r)] in closed form, as expected_forward_flops."""
    e_s = prompt + response.moments()[0]
    fwd = expected_forward_flops(spec, prompt, response, value_head=value_head)
    attn = attention_flops_per_context_token(spec) * expected_attended_pairs(spec, prompt, response)
    head = 2.0 * spec.hidden if value_head else head_flops_per_token(spec)
    extra = {"none": 0.0, "selective": attn, "full": fwd - head * e_s}[recompute]
    return 3.0 * fwd + extra
