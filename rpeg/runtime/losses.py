"""Per-token divergences, masked reductions and the actor/critic losses, as pure torch functions.

Shapes: B sequences, T response tokens (padded). `mask` (B, T) is the response mask; any
nonzero entry is a response token. At padding the constant inputs (old/ref logprobs,
advantages, returns, old values) may hold anything, NaN included: they are replaced before
use and every reduction selects with `torch.where`, so padding reaches neither the loss nor
its gradient.

Registries, looked up by the config's strings (never branched on by a trainer):
- `KL`: k1 and k3 estimators (Schulman 2020, "Approximating KL Divergence",
  http://joschu.net/blog/kl-approx.html).
- `LOSS_AGG`: token-mean (DAPO, arXiv 2503.14476), seq-mean-token-mean (GRPO,
  arXiv 2402.03300), seq-mean-token-sum-norm (Dr. GRPO, arXiv 2503.20783).

Departures from verl's core_algos: k3 is not clamped (a clamp silently zeroes the gradient of
the tokens that diverge most; the trainer sees them in `kl_loss` instead), and sequence-mean
aggregations average over sequences that have at least one response token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rpeg.errors import RpegError
from rpeg.graph.config import AlgoConfig


def lookup(registry: dict[str, Callable], name: str, what: str) -> Callable:
    """registry[name], or an RpegError that lists the known names."""
    if name not in registry:
        raise RpegError(f"unknown {what} {name!r} (known: {', '.join(registry)})")
    return registry[name]


# ---- masked reductions ------------------------------------------------------------------------

def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of x (B, T) over mask's response tokens: a scalar, or (B,) with dim=1."""
    x = torch.where(mask.bool(), x, torch.zeros_like(x))
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of x (B, T) over response tokens: a scalar, or (B,) with dim=1; 0 where none."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over all response tokens of x (B, T); 0 at padding.

    The variance is unbiased (n - 1), as in verl's `masked_whiten` and torch.std.
    """
    m = mask.bool()
    mean = masked_mean(x, m)
    n = m.sum().clamp(min=2).to(x.dtype)
    var = masked_sum((x - mean) ** 2, m) / (n - 1)
    return torch.where(m, (x - mean) * torch.rsqrt(var + eps), torch.zeros_like(x))


# ---- KL estimators (Schulman 2020) ------------------------------------------------------------

def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = log pi(a|s) - log pi_ref(a|s), per token (B, T). Unbiased for KL(pi || pi_ref) on
    samples from pi; can be negative. Schulman 2020, "Approximating KL Divergence"."""
    return logprobs - ref_logprobs


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = r - 1 - log r with r = pi_ref(a|s) / pi(a|s), per token (B, T). Unbiased for
    KL(pi || pi_ref) on samples from pi and never negative (log r <= r - 1).
    Schulman 2020, "Approximating KL Divergence"; GRPO's KL term (arXiv 2402.03300, eq. 4)."""
    log_r = ref_logprobs - logprobs
    return torch.exp(log_r) - 1 - log_r


KL: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"k1": kl_k1, "k3": kl_k3}


# ---- loss aggregation -------------------------------------------------------------------------

def token_mean(x: Tensor, mask: Tensor, *, norm_len: int | None = None) -> Tensor:
    """Mean of per-token losses x (B, T) over every response token of the batch -> scalar.
    Long sequences weigh more. DAPO (Yu 2025, arXiv 2503.14476, eq. 12)."""
    return masked_mean(x, mask)


def _seq_mean(per_seq: Tensor, mask: Tensor) -> Tensor:
    """Mean of per_seq (B,) over sequences with at least one response token."""
    has = mask.bool().any(dim=1)
    return masked_mean(per_seq, has)


def seq_mean_token_mean(x: Tensor, mask: Tensor, *, norm_len: int | None = None) -> Tensor:
    """Mean over each sequence's tokens, then over sequences: x (B, T) -> scalar.
    Every sequence weighs the same. GRPO (Shao 2024, arXiv 2402.03300, eq. 3)."""
    return _seq_mean(masked_mean(x, mask, dim=1), mask)


def seq_mean_token_sum_norm(x: Tensor, mask: Tensor, *, norm_len: int | None = None) -> Tensor:
    """Sum over each sequence's tokens divided by a constant (norm_len, default T, the max
    response length), then mean over sequences: x (B, T) -> scalar. No length bias.
    Dr. GRPO (Liu 2025, arXiv 2503.20783, section 3.1)."""
    return _seq_mean(masked_sum(x, mask, dim=1) / (norm_len or x.shape[1]), mask)


LOSS_AGG: dict[str, Callable[..., Tensor]] = {
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}


def aggregate(name: str, x: Tensor, mask: Tensor, *, norm_len: int | None = None) -> Tensor:
    """LOSS_AGG[name](x (B, T), mask (B, T)) -> scalar; RpegError for an unknown name."""
    return lookup(LOSS_AGG, name, "loss aggregation")(x, mask, norm_len=norm_len)


# ---- losses -----------------------------------------------------------------------------------

def policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                config: AlgoConfig, *, ref_logprobs: Tensor | None = None,
                entropy: Tensor | None = None, norm_len: int | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, plus the reference KL and an entropy bonus when configured.

    logprobs (B, T): log pi_theta(a|s), with grad. old_logprobs, advantages (B, T): constants.
    ref_logprobs (B, T): log pi_ref, needed when config.kl_in == "loss" and kl_coef > 0.
    entropy (B, T): per-token policy entropy, needed when config.entropy_coef > 0.
    Returns (scalar loss, metrics of detached scalars).

    per token: max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) with r = pi_theta / pi_old
    (Schulman 2017, arXiv 1707.06347, eq. 7; asymmetric "clip-higher" from DAPO,
    arXiv 2503.14476) + kl_coef * KL[kl_estimator](pi_theta, pi_ref) - entropy_coef * H,
    each aggregated by LOSS_AGG[config.loss_agg].
    """
    m = mask.bool()
    agg = lookup(LOSS_AGG, config.loss_agg, "loss aggregation")
    zero = torch.zeros_like(logprobs)
    advantages = torch.where(m, advantages, zero)
    log_ratio = torch.where(m, logprobs - old_logprobs, zero)  # (B, T); exp(0) at padding
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    pg = agg(torch.maximum(unclipped, clipped), m, norm_len=norm_len)
    loss = pg
    metrics = {
        "pg_loss": pg,
        "clipfrac": masked_mean((clipped > unclipped).to(ratio.dtype), m),
        "clipfrac_high": masked_mean(((ratio > 1 + config.clip_high) & (advantages > 0)).to(ratio.dtype), m),
        "clipfrac_low": masked_mean(((ratio < 1 - config.clip_low) & (advantages < 0)).to(ratio.dtype), m),
        "approx_kl": masked_mean(ratio - 1 - log_ratio, m),  # k3 of KL(pi_old || pi_theta)
        "ratio_mean": masked_mean(ratio, m),
        "ratio_max": torch.where(m, ratio, zero).max(),
    }
    if config.kl_in == "loss" and config.kl_coef > 0:
        if ref_logprobs is None:
            raise RpegError(f"policy_loss: kl_in = 'loss' with kl_coef = {config.kl_coef} needs ref_logprobs")
        estimator = lookup(KL, config.kl_estimator, "KL estimator")
        ref = torch.where(m, ref_logprobs, logprobs.detach())  # padding: KL 0, no NaN
        kl = agg(estimator(logprobs, ref), m, norm_len=norm_len)
        loss = loss + config.kl_coef * kl
        metrics["kl_loss"] = kl
    if config.entropy_coef > 0:
        if entropy is None:
            raise RpegError(f"policy_loss: entropy_coef = {config.entropy_coef} needs the per-token entropy")
        ent = agg(entropy, m, norm_len=norm_len)
        loss = loss - config.entropy_coef * ent
        metrics["entropy"] = ent
    metrics["loss"] = loss
    return loss, {k: v.detach() for k, v in metrics.items()}


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor,
               config: AlgoConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """Critic loss 0.5 * max((V - R)^2, (V_clip - R)^2), token-mean over response tokens.

    values (B, T): V_theta(s), with grad. old_values, returns (B, T): constants.
    V_clip = clip(V, old - value_clip, old + value_clip) when config.value_clip > 0, else no
    clipping. PPO's value clipping (Schulman 2017, arXiv 1707.06347; as in OpenAI baselines).
    Written as a clamp of V itself, not old + clip(V - old): inside the range the clamp returns V
    exactly, where the difference-and-sum can land one float step away, and `vf_clipfrac` (tokens
    whose clipped error exceeds the unclipped one: the loss's own comparison) would count such a
    token as clipped (V -0.10230965, old 0.16493313, R 0.11656806, clip 0.5 counted 1.0).
    Returns (scalar loss, metrics of detached scalars).
    """
    m = mask.bool()
    returns = torch.where(m, returns, torch.zeros_like(values))
    old_values = torch.where(m, old_values, torch.zeros_like(values))
    err = (values - returns) ** 2  # (B, T)
    if config.value_clip > 0:
        v_clip = values.clamp(old_values - config.value_clip, old_values + config.value_clip)
        err_clip = (v_clip - returns) ** 2
        clipfrac = masked_mean((err_clip > err).to(values.dtype), m)
        err = torch.maximum(err, err_clip)
    else:
        clipfrac = values.new_zeros(())
    loss = 0.5 * masked_mean(err, m)
    metrics = {"vf_loss": loss, "vf_clipfrac": clipfrac, "vpred_mean": masked_mean(values, m)}
    return loss, {k: v.detach() for k, v in metrics.items()}
