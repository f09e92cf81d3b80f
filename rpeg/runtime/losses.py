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

- `POLICY_LOSSES`: the importance ratio the clipped surrogate takes, per token (PPO, Schulman
  2017, arXiv 1707.06347) or per sequence (GSPO, Zheng 2025, arXiv 2507.18071).
- `OFF_POLICY`: corrections for samples drawn by the engine's policy (stale weights under bounded
  asynchrony, other numerics) rather than the policy whose logprobs the trainer computed for them:
  truncated importance sampling per token or sequence (TIS), rejection of tokens or sequences, and
  AReaL's decoupled objective (see `OFF_POLICY`'s functions).

Guards: every log-ratio that is exponentiated (the policy ratio, the importance weights and k3's
log r) is clamped to +-LOG_RATIO_GUARD (20, as verl clamps the policy's log-ratio), so one bad
logprob gives a weight of e^20 ~ 4.9e8 at most, never inf. This departs from the formulas (k3 of
a token with |log r| > 20 is capped at e^20 - 21 and its gradient is 0): such a token's estimate is
already useless, and without the guard k3 reaches 1e23 at |log r| = 53 and inf at 89 in float32.
A sequence's log-ratio (GSPO's mean, tis-seq's sum, mask-seq's mean) is guarded as a whole, after
its tokens are combined: clamping each token first would change it (log rho 25 and -22 sum to 3,
clamped tokens to 0).

Departures from verl's core_algos: sequence-mean aggregations average over sequences that have
at least one response token (one with every token masked is not counted).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rpeg.errors import RpegError
from rpeg.graph.config import AlgoConfig

LOG_RATIO_GUARD = 20.0  # verl clamps log(pi / pi_old) to [-20, 20] (core_algos.compute_policy_loss)


def guarded(log_ratio: Tensor) -> Tensor:
    """A log-ratio clamped to +-LOG_RATIO_GUARD before it is exponentiated (module docstring)."""
    return log_ratio.clamp(-LOG_RATIO_GUARD, LOG_RATIO_GUARD)


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
    Schulman 2020, "Approximating KL Divergence"; GRPO's KL term (arXiv 2402.03300, eq. 4).
    log r is clamped to +-LOG_RATIO_GUARD first (module docstring): at most e^20 - 21 per token."""
    log_r = guarded(ref_logprobs - logprobs)
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


# ---- the policy's importance ratio ------------------------------------------------------------

def token_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log pi_theta(a|s) / pi_old(a|s) per token (B, T), 0 at padding, guarded.
    PPO (Schulman 2017, arXiv 1707.06347, eq. 6)."""
    m = mask.bool()
    return guarded(torch.where(m, logprobs - old_logprobs, torch.zeros_like(logprobs)))


def sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GSPO's ratio on every token (B, T): log s_i = mean over sequence i's tokens of the token
    log-ratios (the length-normalized sequence likelihood ratio), written as GSPO-token does,
    sg[log s_i] + log pi_theta(a_t) - sg[log pi_theta(a_t)]: equal to log s_i in value, and its
    gradient is s_i's spread evenly over the sequence's tokens. Zheng et al. 2025, GSPO
    (arXiv 2507.18071), eqs. 5-7 and 11-12. Its clip range is far narrower than PPO's (the paper
    uses 3e-4 and 4e-4), and its aggregation is seq-mean-token-mean."""
    m = mask.bool()
    zero = torch.zeros_like(logprobs)
    seq = masked_mean(torch.where(m, logprobs - old_logprobs, zero), m, dim=1).detach()  # (B,)
    return guarded(torch.where(m, seq[:, None] + logprobs - logprobs.detach(), zero))


POLICY_LOSSES: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "ppo": token_log_ratio,
    "gspo": sequence_log_ratio,
}


# ---- off-policy correction --------------------------------------------------------------------
#
# The trainer's old logprobs are the *proximal* policy's (the weights at the step's start, which
# the PPO ratio is clipped against); the engine's logprobs of the same tokens are the *behaviour*
# policy's, which really sampled them: older weights under bounded asynchrony, and other kernels
# (bf16, another engine) even when the weights are the same. rho = pi_prox / pi_behav per token
# corrects the samples' distribution. Each correction maps (proximal, behaviour, mask) to the weight
# each token's surrogate is multiplied by (a constant: no gradient flows through it) and the tokens
# kept in the policy loss (masked ones leave its denominator too, as slime #657 and verl do).

@dataclass(frozen=True, slots=True)
class Correction:
    weight: Tensor  # (B, T) each token's importance weight in the surrogate (1: none)
    keep: Tensor  # (B, T) bool: the tokens the policy loss keeps (a subset of the mask)
    truncated: Tensor  # (B, T) bool: kept tokens whose weight was cut (tis, tis-seq) or zeroed (decoupled)


def _log_rho(proximal: Tensor, behaviour: Tensor, mask: Tensor) -> Tensor:
    """log rho = log pi_prox - log pi_behav per token (B, T), not guarded; 0 at padding. A sequence's
    sum or mean of it is guarded once it is formed (module docstring)."""
    return torch.where(mask.bool(), proximal - behaviour, torch.zeros_like(proximal))


def _rho(proximal: Tensor, behaviour: Tensor, mask: Tensor) -> Tensor:
    """rho = pi_prox / pi_behav per token (B, T), guarded; 1 at padding."""
    return torch.exp(guarded(_log_rho(proximal, behaviour, mask)))


def no_correction(proximal: Tensor, behaviour: Tensor, mask: Tensor, config: AlgoConfig) -> Correction:
    """Every token weighs 1: on-policy PPO, or the engine's logprobs taken as the old ones."""
    m = mask.bool()
    return Correction(torch.ones_like(proximal), m, torch.zeros_like(m))


def tis_token(proximal: Tensor, behaviour: Tensor, mask: Tensor, config: AlgoConfig) -> Correction:
    """Truncated importance sampling per token: weight min(rho_t, is_cap), every token in the
    denominator. Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training" (fengyao.notion.site), cap 2. The same weight as verl 0.9.1's rollout_is = token with
    one threshold (Token-TIS), ms-swift's token_truncate and OpenRLHF's token clip with the lower
    bound 0."""
    m = mask.bool()
    rho = _rho(proximal, behaviour, m)
    return Correction(rho.clamp(max=config.is_cap), m, m & (rho > config.is_cap))


def tis_sequence(proximal: Tensor, behaviour: Tensor, mask: Tensor, config: AlgoConfig) -> Correction:
    """Truncated importance sampling per sequence: every token of sequence i weighs
    min(prod_t rho_t, is_cap), the sequence's own likelihood ratio: unbiased for a sequence-level
    reward, with a variance that grows with length (hence the cap). Computed as
    exp(min(clamp(sum_t log rho_t, -20, 20), log is_cap)): the guard (LOG_RATIO_GUARD) acts on the
    sum, so a sequence weighs e^-20 at least and one token with |log rho_t| > 20 still counts in
    full (log rho 25 and -22, cap 2: weight 2). Liu et al. 2025, "When Speed Kills Stability"
    (Seq-TIS); verl 0.9.1's rollout_is = sequence, which clamps the sum the same way
    (rollout_corr_helper.compute_rollout_correction_weights)."""
    m = mask.bool()
    log_seq = masked_sum(_log_rho(proximal, behaviour, m), m, dim=1)  # (B,)
    cut = log_seq > math.log(config.is_cap)
    w = torch.exp(guarded(log_seq).clamp(max=math.log(config.is_cap)))
    return Correction(torch.where(m, w[:, None].expand(m.shape), torch.ones_like(proximal)), m, m & cut[:, None])


def mask_token(proximal: Tensor, behaviour: Tensor, mask: Tensor, config: AlgoConfig) -> Correction:
    """Token rejection: a token whose rho_t lies outside [is_low, is_cap] leaves the loss and its
    denominator; every kept token weighs 1 (no importance weight). verl 0.9.1's rejection sampling
    rollout_rs = token_k1 (rollout_corr_helper.compute_rollout_rejection_mask, which bounds -log
    rho_t: its threshold "a_b" keeps rho_t in [1/b, 1/a], "0.5_2" for the defaults 0.5 and 2).
    It is not IcePop (Ling Team 2025, arXiv 2510.18855), which keeps each kept token's weight rho_t
    and every token in the denominator: that is `decoupled` with a lower bound."""
    m = mask.bool()
    rho = _rho(proximal, behaviour, m)
    keep = m & (rho >= config.is_low) & (rho <= config.is_cap)
    return Correction(torch.ones_like(proximal), keep, torch.zeros_like(m))


def mask_sequence(proximal: Tensor, behaviour: Tensor, mask: Tensor, config: AlgoConfig) -> Correction:
    """Sequence rejection: a sequence whose geometric-mean rho (exp of the mean log rho over its
    tokens: a length-free measure of how far apart the two policies are on it) lies outside
    [is_low, is_cap] leaves the loss and its denominator whole; every kept token weighs 1. The mean
    is guarded (LOG_RATIO_GUARD, +-20) after it is taken, not token by token. Liu et al. 2025,
    "When Speed Kills Stability" (Geo-RS); verl 0.9.1's rollout_rs = seq_mean_k1, whose threshold
    "a_b" keeps the geometric mean in [1/b, 1/a] like token_k1's, and which clamps each token's log
    rho to +-20 before the mean."""
    m = mask.bool()
    geo = torch.exp(guarded(masked_mean(_log_rho(proximal, behaviour, m), m, dim=1)))  # (B,)
    ok = (geo >= config.is_low) & (geo <= config.is_cap)
    return Correction(torch.ones_like(proximal), m & ok[:, None], torch.zeros_like(m))


def decoupled(proximal: Tensor, behaviour: Tensor, mask: Tensor, config: AlgoConfig) -> Correction:
    """AReaL's decoupled PPO objective: the ratio is clipped against the proximal policy (the
    trainer's old logprobs, as the surrogate already does) and each token weighs rho_t = pi_prox /
    pi_behav; a token with rho_t > is_cap gets weight 0 but stays in the denominator.
    Fu et al. 2025, AReaL (arXiv 2505.24298), eq. 5 and `behav_imp_weight_cap`. It differs from tis
    at the cap only: tis keeps such a token at weight is_cap, decoupled drops its gradient. The same
    weights as ms-swift's token_mask, and IcePop (Ling Team 2025, arXiv 2510.18855: weight rho_t in
    [alpha, beta], 0 outside, every token in the denominator) with alpha = 0; IcePop's alpha > 0,
    as in verl 0.9.1's rollout_is = token with a "lower_upper" threshold and OpenRLHF's token mask,
    also zeroes the tokens with rho_t < alpha."""
    m = mask.bool()
    rho = _rho(proximal, behaviour, m)
    over = rho > config.is_cap
    return Correction(torch.where(over, torch.zeros_like(rho), rho), m, m & over)


OFF_POLICY: dict[str, Callable[[Tensor, Tensor, Tensor, AlgoConfig], Correction]] = {
    "none": no_correction,
    "tis": tis_token,
    "tis-seq": tis_sequence,
    "mask-token": mask_token,
    "mask-seq": mask_sequence,
    "decoupled": decoupled,
}


def correction(old_logprobs: Tensor, behaviour_logprobs: Tensor | None, mask: Tensor,
               config: AlgoConfig) -> Correction:
    """OFF_POLICY[config.off_policy] of the proximal (old) and behaviour (engine) logprobs, (B, T) each;
    no behaviour logprobs with a correction configured is an RpegError."""
    fn = lookup(OFF_POLICY, config.off_policy, "off-policy correction")
    if behaviour_logprobs is None:
        if config.off_policy != "none":
            raise RpegError(f"off_policy = {config.off_policy!r} needs the engine's (behaviour) logprobs")
        behaviour_logprobs = old_logprobs
    with torch.no_grad():
        return fn(old_logprobs.detach(), behaviour_logprobs.detach(), mask, config)


# ---- losses -----------------------------------------------------------------------------------

def policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                config: AlgoConfig, *, ref_logprobs: Tensor | None = None,
                entropy: Tensor | None = None, norm_len: int | None = None,
                behaviour_logprobs: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (or GSPO's), with dual clipping and the off-policy correction as
    configured, plus the reference KL and an entropy bonus when configured.

    logprobs (B, T): log pi_theta(a|s), with grad. old_logprobs, advantages (B, T): constants.
    ref_logprobs (B, T): log pi_ref, needed when config.kl_in == "loss" and kl_coef > 0.
    entropy (B, T): per-token policy entropy, needed when config.entropy_coef > 0.
    behaviour_logprobs (B, T): the engine's logprobs of the sampled tokens; needed by a correction,
    and reported against old_logprobs (is_ratio_*) whenever given.
    Returns (scalar loss, metrics of detached scalars).

    per token: w * max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) with r = pi_theta / pi_old
    (POLICY_LOSSES[config.policy_loss]; Schulman 2017, arXiv 1707.06347, eq. 7; asymmetric
    "clip-higher" from DAPO, arXiv 2503.14476), at most -A c where A < 0 when config.dual_clip = c
    (Ye et al. 2020, arXiv 1912.09729, eq. 5), w and the kept tokens from OFF_POLICY[config.off_policy],
    aggregated by LOSS_AGG[config.loss_agg] over the kept tokens; + kl_coef * KL[kl_estimator](pi_theta,
    pi_ref) - entropy_coef * H, each aggregated over every response token.
    """
    m = mask.bool()
    agg = lookup(LOSS_AGG, config.loss_agg, "loss aggregation")
    ratio_of = lookup(POLICY_LOSSES, config.policy_loss, "policy loss")
    zero = torch.zeros_like(logprobs)
    advantages = torch.where(m, advantages, zero)
    log_ratio = ratio_of(logprobs, old_logprobs, m)  # (B, T); exp(0) at padding
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    per_token = torch.maximum(unclipped, clipped)
    metrics: dict[str, Tensor] = {}
    if config.dual_clip:
        bound = -advantages * config.dual_clip
        dual = (advantages < 0) & (per_token > bound)
        per_token = torch.where(dual, bound, per_token)
        metrics["clipfrac_dual"] = masked_mean(dual.to(ratio.dtype), m)
    fix = correction(old_logprobs, behaviour_logprobs, m, config)
    pg = agg(per_token * fix.weight, fix.keep, norm_len=norm_len)
    loss = pg
    metrics |= {
        "pg_loss": pg,
        "clipfrac": masked_mean((clipped > unclipped).to(ratio.dtype), m),
        "clipfrac_high": masked_mean(((ratio > 1 + config.clip_high) & (advantages > 0)).to(ratio.dtype), m),
        "clipfrac_low": masked_mean(((ratio < 1 - config.clip_low) & (advantages < 0)).to(ratio.dtype), m),
        "approx_kl": masked_mean(ratio - 1 - log_ratio, m),  # k3 of KL(pi_old || pi_theta)
        "ratio_mean": masked_mean(ratio, m),
        "ratio_max": torch.where(m, ratio, zero).max(),
    }
    if behaviour_logprobs is not None:  # how far the samples' policy is from the proximal one: pi_old / pi_behav
        rho = _rho(old_logprobs.detach(), behaviour_logprobs, m)
        metrics |= {"is_ratio_mean": masked_mean(rho, m), "is_ratio_max": torch.where(m, rho, zero).max()}
    if config.corrects_off_policy:
        metrics |= {"is_weight_mean": masked_mean(fix.weight, fix.keep),
                    "is_weight_max": torch.where(fix.keep, fix.weight, zero).max(),
                    "is_truncated_frac": masked_mean(fix.truncated.to(ratio.dtype), m),
                    "is_masked_frac": masked_mean((m & ~fix.keep).to(ratio.dtype), m)}
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
