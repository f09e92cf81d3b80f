"""Advantage estimators as pure torch functions, registered by `AlgoConfig.adv_estimator`.

Every estimator takes the same keyword arguments and returns (advantages (B, T), returns
(B, T) or None); returns are value targets, so only the critic's estimator (gae) gives them:

    scores (B,)             outcome reward of each sequence
    mask (B, T)             response mask; nonzero = response token (left, right or inner padding)
    group_index (B,) long   prompt id of each sequence (any ids; group estimators need it)
    values (B, T)           critic V(s) per token (gae)
    old_logprobs (B, T)     log pi_old per token (KL in the reward)
    ref_logprobs (B, T)     log pi_ref per token (KL in the reward)
    greedy_scores (P,)      reward of each prompt's greedy response, indexed by group_index (remax)
    token_scores (B, T)     rewards where they were earned, or None: a multi-turn episode's turn rewards
                            on each turn's last sampled token and its outcome on the last; each row sums
                            to its score. Token-level estimators (gae, reinforce_pp, remax) read them in
                            place of the score on the last token; outcome estimators read the score
    config                  AlgoConfig

KL in the reward: when config.kl_in == "reward" and kl_coef > 0 every estimator penalizes
each response token by -kl_coef * KL[kl_estimator](old, ref). Token-level estimators (gae,
reinforce_pp) add it to the token rewards; remax gives each token its reward-to-go (the score plus
the penalties from that token on); the other outcome estimators add its sum over the sequence to
the score, as verl does (its outcome estimators read token_level_rewards.sum(-1)). This matches
the graph, whose advantage stage reads old/ref logprobs exactly when the KL is in the reward.

Use `compute_advantages(name, **inputs)`: it looks the estimator up (RpegError if unknown)
and runs it under torch.no_grad(). Advantages are 0 at padding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rpeg.errors import RpegError
from rpeg.graph.config import AlgoConfig
from rpeg.runtime.losses import KL, lookup, masked_sum, masked_whiten

GROUP_EPS = 1e-6  # GRPO's std guard, as in verl


# ---- building blocks --------------------------------------------------------------------------

def _need(estimator: str, **inputs: Tensor | None) -> None:
    missing = [k for k, v in inputs.items() if v is None]
    if missing:
        raise RpegError(f"advantage estimator {estimator!r} needs {', '.join(missing)}")


def kl_reward(mask: Tensor, old_logprobs: Tensor | None, ref_logprobs: Tensor | None,
              config: AlgoConfig) -> Tensor:
    """Per-token KL penalty (B, T): -kl_coef * KL[kl_estimator](old, ref) on response tokens
    when the KL is in the reward (InstructGPT, Ouyang 2022, arXiv 2203.02155, eq. 2), else 0."""
    m = mask.bool()
    if config.kl_in != "reward" or config.kl_coef == 0:
        return torch.zeros(m.shape, device=m.device)
    if old_logprobs is None or ref_logprobs is None:
        raise RpegError(f"kl_in = 'reward' with kl_coef = {config.kl_coef} needs old_logprobs and ref_logprobs")
    kl = lookup(KL, config.kl_estimator, "KL estimator")(old_logprobs, ref_logprobs)
    return torch.where(m, -config.kl_coef * kl, torch.zeros_like(kl))


def token_rewards(scores: Tensor, mask: Tensor, kl: Tensor, token_scores: Tensor | None = None) -> Tensor:
    """Token rewards (B, T): the KL penalty kl (B, T) plus each score (B,) on its sequence's
    last response token, or with `token_scores` (B, T) those rewards where they were earned."""
    m = mask.bool()
    if token_scores is not None:
        if token_scores.shape != m.shape:
            raise RpegError(f"token_scores has shape {tuple(token_scores.shape)}, expected {tuple(m.shape)}")
        return torch.where(m, kl + token_scores.to(kl.dtype), torch.zeros_like(kl))
    pos = torch.arange(m.shape[1], device=m.device)
    last = torch.where(m, pos, -1).max(dim=1).values  # (B,), -1 for an empty row
    at_last = (pos == last[:, None]) & m
    return torch.where(m, kl, torch.zeros_like(kl)) + at_last * scores[:, None].to(kl.dtype)


def sequence_rewards(scores: Tensor, mask: Tensor, kl: Tensor) -> Tensor:
    """Outcome reward (B,) with the KL penalty kl (B, T) summed over the sequence."""
    return scores.to(kl.dtype) + masked_sum(kl, mask, dim=1)


def gae_advantages(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> Tensor:
    """Generalized advantage estimation over response tokens, before whitening: (B, T).
    delta_t = r_t + gamma V_next - V_t; A_t = delta_t + gamma lam A_next; V after the last token
    is 0; padding is skipped (carries V_next and A_next through) and gets 0.
    Schulman et al. 2016 (arXiv 1506.02438, eq. 16)."""
    m = mask.bool()
    adv = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[1])):
        a = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * next_adv
        adv[:, t] = torch.where(m[:, t], a, 0.0)
        next_value = torch.where(m[:, t], values[:, t], next_value)
        next_adv = torch.where(m[:, t], a, next_adv)
    return adv


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma G_next over response tokens (padding skipped, 0): (B, T).
    REINFORCE (Williams 1992); with V = 0 and lam = 1 this is GAE."""
    return gae_advantages(rewards, torch.zeros_like(rewards), mask, gamma, 1.0)


def _groups(group_index: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """(inverse (B,) into 0..G-1, counts (G,)) for any prompt ids."""
    if group_index.shape != (n,):
        raise RpegError(f"group_index has shape {tuple(group_index.shape)}, expected ({n},)")
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    return inverse, counts


def group_mean_std(x: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each sample's group mean, unbiased group std (0 for a group of one) and group size: (B,) each."""
    inverse, counts = _groups(group_index, x.shape[0])
    n = counts.to(x.dtype)
    mean = torch.zeros_like(n).index_add(0, inverse, x) / n
    sq = torch.zeros_like(n).index_add(0, inverse, (x - mean[inverse]) ** 2)
    std = torch.sqrt(sq / (n - 1).clamp(min=1))
    return mean[inverse], std[inverse], counts[inverse]


def _broadcast(adv: Tensor, mask: Tensor) -> Tensor:
    """A per-sequence advantage (B,) on every response token: (B, T)."""
    m = mask.bool()
    return torch.where(m, adv[:, None].expand(m.shape), adv.new_zeros(m.shape))


def _outcome(scores: Tensor, mask: Tensor, old_logprobs: Tensor | None, ref_logprobs: Tensor | None,
             config: AlgoConfig) -> Tensor:
    return sequence_rewards(scores, mask, kl_reward(mask, old_logprobs, ref_logprobs, config))


# ---- estimators -------------------------------------------------------------------------------

def gae(*, scores: Tensor, mask: Tensor, group_index: Tensor | None = None, values: Tensor | None = None,
        old_logprobs: Tensor | None = None, ref_logprobs: Tensor | None = None,
        greedy_scores: Tensor | None = None, token_scores: Tensor | None = None,
        config: AlgoConfig) -> tuple[Tensor, Tensor]:
    """PPO's advantages: GAE(gamma, lam) over token rewards (KL penalty per token, score on the
    last token, or the token_scores where given) and critic values (B, T); returns = raw advantages
    + values (B, T); advantages whitened over the batch's response tokens. Schulman et al. 2016 (arXiv 1506.02438);
    the RLHF reward from Ouyang et al. 2022 (arXiv 2203.02155)."""
    _need("gae", values=values)
    rewards = token_rewards(scores, mask, kl_reward(mask, old_logprobs, ref_logprobs, config), token_scores)
    adv = gae_advantages(rewards, values.to(rewards.dtype), mask, config.gamma, config.lam)
    returns = torch.where(mask.bool(), adv + values, torch.zeros_like(adv))
    return masked_whiten(adv, mask), returns


def grpo(*, scores: Tensor, mask: Tensor, group_index: Tensor | None = None, values: Tensor | None = None,
         old_logprobs: Tensor | None = None, ref_logprobs: Tensor | None = None,
         greedy_scores: Tensor | None = None,
        token_scores: Tensor | None = None, config: AlgoConfig) -> tuple[Tensor, None]:
    """(score - group mean) / (group std + 1e-6), or score - group mean when not
    config.norm_adv_by_std, on every token (B, T). Std is unbiased; a group of one gets 0.
    Shao et al. 2024, DeepSeekMath (arXiv 2402.03300), section 4.1.2."""
    _need("grpo", group_index=group_index)
    r = _outcome(scores, mask, old_logprobs, ref_logprobs, config)
    mean, std, _ = group_mean_std(r, group_index)
    adv = (r - mean) / (std + GROUP_EPS) if config.norm_adv_by_std else r - mean
    return _broadcast(adv, mask), None


def dr_grpo(*, scores: Tensor, mask: Tensor, group_index: Tensor | None = None, values: Tensor | None = None,
            old_logprobs: Tensor | None = None, ref_logprobs: Tensor | None = None,
            greedy_scores: Tensor | None = None,
        token_scores: Tensor | None = None, config: AlgoConfig) -> tuple[Tensor, None]:
    """score - group mean on every token (B, T); never divided by the std (whatever
    norm_adv_by_std says). Liu et al. 2025, Dr. GRPO (arXiv 2503.20783), section 3.1."""
    _need("dr_grpo", group_index=group_index)
    r = _outcome(scores, mask, old_logprobs, ref_logprobs, config)
    mean, _, _ = group_mean_std(r, group_index)
    return _broadcast(r - mean, mask), None


def rloo(*, scores: Tensor, mask: Tensor, group_index: Tensor | None = None, values: Tensor | None = None,
         old_logprobs: Tensor | None = None, ref_logprobs: Tensor | None = None,
         greedy_scores: Tensor | None = None,
        token_scores: Tensor | None = None, config: AlgoConfig) -> tuple[Tensor, None]:
    """score - mean of the group's other k - 1 scores, on every token (B, T); the score
    includes the summed KL penalty when the KL is in the reward. Needs k >= 2.
    Ahmadian et al. 2024 (arXiv 2402.14740), eq. 7; Kool et al. 2019."""
    _need("rloo", group_index=group_index)
    r = _outcome(scores, mask, old_logprobs, ref_logprobs, config)
    mean, _, k = group_mean_std(r, group_index)
    if (k < 2).any():
        raise RpegError(f"rloo needs >= 2 samples per prompt; a group has {int(k.min())}")
    k = k.to(r.dtype)
    others = (mean * k - r) / (k - 1)
    return _broadcast(r - others, mask), None


def reinforce_pp(*, scores: Tensor, mask: Tensor, group_index: Tensor | None = None,
                 values: Tensor | None = None, old_logprobs: Tensor | None = None,
                 ref_logprobs: Tensor | None = None, greedy_scores: Tensor | None = None,
                 token_scores: Tensor | None = None, config: AlgoConfig) -> tuple[Tensor, None]:
    """Discounted (gamma) returns of the token rewards (KL penalty per token, score on the last
    token, or the token_scores where given), whitened over all response tokens of the batch: (B, T).
    Hu 2025, REINFORCE++ (arXiv 2501.03262), section 3."""
    rewards = token_rewards(scores, mask, kl_reward(mask, old_logprobs, ref_logprobs, config), token_scores)
    return masked_whiten(discounted_returns(rewards, mask, config.gamma), mask), None


def reinforce_pp_baseline(*, scores: Tensor, mask: Tensor, group_index: Tensor | None = None,
                          values: Tensor | None = None, old_logprobs: Tensor | None = None,
                          ref_logprobs: Tensor | None = None, greedy_scores: Tensor | None = None,
                          token_scores: Tensor | None = None, config: AlgoConfig) -> tuple[Tensor, None]:
    """score - group mean on every token, then whitened over all response tokens of the batch
    (so longer sequences weigh more in the statistics): (B, T). The KL usually goes in the loss.
    Hu 2025, REINFORCE++ (arXiv 2501.03262), the group-baseline variant."""
    _need("reinforce_pp_baseline", group_index=group_index)
    r = _outcome(scores, mask, old_logprobs, ref_logprobs, config)
    mean, _, _ = group_mean_std(r, group_index)
    return masked_whiten(_broadcast(r - mean, mask), mask), None


def remax(*, scores: Tensor, mask: Tensor, group_index: Tensor | None = None, values: Tensor | None = None,
          old_logprobs: Tensor | None = None, ref_logprobs: Tensor | None = None,
          greedy_scores: Tensor | None = None,
        token_scores: Tensor | None = None, config: AlgoConfig) -> tuple[Tensor, None]:
    """Each token's reward-to-go minus greedy_scores[group_index] (the greedy response's reward for
    the same prompt): (B, T). Without a KL penalty in the reward, the reward-to-go is the score on
    every token. With one, token t gets the score plus the penalties of tokens t.. T only (the
    undiscounted return from t), not the whole sequence's sum: a token's action cannot change the
    penalties already paid before it, so those only add variance; the reward-to-go has the same
    expected gradient (the policy-gradient theorem's causality) with less variance. verl's ReMax
    advantage is the same (a reversed cumulative sum of the token rewards). The baseline is the
    greedy response's score alone, as in the paper. Li et al. 2023, ReMax (arXiv 2310.10505),
    algorithm 1."""
    _need("remax", group_index=group_index, greedy_scores=greedy_scores)
    if group_index.min() < 0 or group_index.max() >= greedy_scores.shape[0]:
        raise RpegError(f"remax: group_index must lie in [0, {greedy_scores.shape[0]}), the greedy_scores rows")
    rewards = token_rewards(scores, mask, kl_reward(mask, old_logprobs, ref_logprobs, config), token_scores)
    to_go = discounted_returns(rewards, mask, 1.0)
    baseline = greedy_scores[group_index].to(to_go.dtype)
    return torch.where(mask.bool(), to_go - baseline[:, None], torch.zeros_like(to_go)), None


Estimator = Callable[..., tuple[Tensor, Tensor | None]]

ADVANTAGES: dict[str, Estimator] = {
    "gae": gae,
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
    "remax": remax,
}


def compute_advantages(name: str, **inputs) -> tuple[Tensor, Tensor | None]:
    """ADVANTAGES[name](**inputs) under torch.no_grad(): (advantages (B, T), returns (B, T) | None).
    RpegError for an unknown estimator."""
    estimator = lookup(ADVANTAGES, name, "advantage estimator")
    with torch.no_grad():
        return estimator(**inputs)
