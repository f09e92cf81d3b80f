"""rpeg.runtime.algos against numbers worked out by hand on tiny tensors."""

import math
import re
from pathlib import Path

import pytest
import torch

from rpeg.algorithms import ALGORITHMS
from rpeg.errors import RpegError
from rpeg.graph import config as graph_config
from rpeg.graph.config import AlgoConfig
from rpeg.runtime.algos import (
    ADVANTAGES,
    KL,
    LOSS_AGG,
    aggregate,
    compute_advantages,
    discounted_returns,
    gae_advantages,
    kl_reward,
    policy_loss,
    token_rewards,
    value_loss,
)
from rpeg.runtime.losses import LOG_RATIO_GUARD, OFF_POLICY, POLICY_LOSSES, correction

NAN = float("nan")


def cfg(name="grpo", **kw):
    return AlgoConfig(adv_estimator=name, **kw)


def t(x):
    return torch.tensor(x, dtype=torch.float32)


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=0)


def adv(name, config=None, **inputs):
    return compute_advantages(name, config=config or cfg(name), **inputs)


# ---- registries -------------------------------------------------------------------------------

def test_registries_cover_every_builtin_algorithm():
    assert set(ADVANTAGES) == {"gae", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax", "dr_grpo"}
    for a in ALGORITHMS.values():
        assert a.default.adv_estimator in ADVANTAGES and a.default.loss_agg in LOSS_AGG
        assert a.default.kl_estimator in KL


def test_registered_functions_document_shapes_and_papers():
    for fn in ADVANTAGES.values():
        assert "(B, T)" in fn.__doc__ and "arXiv" in fn.__doc__, fn.__name__
    for fn in [*KL.values(), *LOSS_AGG.values()]:
        assert "(B, T)" in fn.__doc__ and ("arXiv" in fn.__doc__ or "Schulman 2020" in fn.__doc__), fn.__name__


def test_policy_losses_and_corrections_match_the_planners_names_and_cite_a_source():
    assert tuple(POLICY_LOSSES) == graph_config.POLICY_LOSSES
    assert tuple(OFF_POLICY) == graph_config.OFF_POLICY
    for fn in [*POLICY_LOSSES.values(), *OFF_POLICY.values()]:
        assert fn.__doc__ and (fn is OFF_POLICY["none"] or "20" in fn.__doc__), fn.__name__


@pytest.mark.parametrize("bad, match", [({"dual_clip": 0.5}, "dual_clip"), ({"is_low": 1.0}, "is_low"),
                                        ({"is_cap": 0.9}, "is_cap"), ({"off_policy": "tis2"}, "off_policy"),
                                        ({"policy_loss": "grpo"}, "policy_loss")])
def test_bad_loss_options_are_refused_by_name(bad, match):
    with pytest.raises(RpegError, match=match):
        cfg(**bad)


def test_unknown_names_raise():
    mask = torch.ones(2, 3)
    with pytest.raises(RpegError, match="unknown advantage estimator 'ppo'.*known: gae"):
        compute_advantages("ppo", scores=t([1, 0]), mask=mask, config=cfg())
    with pytest.raises(RpegError, match="unknown loss aggregation"):
        aggregate("token-sum", torch.ones(2, 3), mask)
    with pytest.raises(RpegError, match="unknown loss aggregation"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), mask, cfg(loss_agg="sum"))
    with pytest.raises(RpegError, match="unknown KL estimator 'k2'"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), mask,
                    cfg(kl_coef=0.1, kl_in="loss", kl_estimator="k2"), ref_logprobs=torch.zeros(2, 3))


def test_missing_inputs_raise():
    mask = torch.ones(2, 2)
    with pytest.raises(RpegError, match="'grpo' needs group_index"):
        adv("grpo", scores=t([1, 0]), mask=mask)
    with pytest.raises(RpegError, match="'gae' needs values"):
        adv("gae", scores=t([1, 0]), mask=mask)
    with pytest.raises(RpegError, match="needs old_logprobs and ref_logprobs"):
        adv("rloo", cfg("rloo", kl_coef=0.1), scores=t([1, 0]), mask=mask, group_index=torch.tensor([0, 0]))
    with pytest.raises(RpegError, match=">= 2 samples"):
        adv("rloo", scores=t([1, 0]), mask=mask, group_index=torch.tensor([0, 1]))
    with pytest.raises(RpegError, match="needs ref_logprobs"):
        policy_loss(torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2, 2), mask, cfg(kl_coef=0.1, kl_in="loss"))


# ---- group estimators -------------------------------------------------------------------------

# two prompts with ids 7 and 3, interleaved; the last sequence has one padding token
GROUP = torch.tensor([7, 7, 3, 7, 3, 7])
SCORES = t([1, 0, 3, 0, 1, 1])
MASK = t([[1, 1], [1, 1], [1, 1], [1, 1], [1, 1], [1, 0]])


def test_grpo_group_normalized():
    a, returns = adv("grpo", scores=SCORES, mask=MASK, group_index=GROUP)
    assert returns is None
    # prompt 7: [1, 0, 0, 1], mean 1/2, unbiased std sqrt(1/3): +-0.5 / 0.57735 = +-0.866025
    # prompt 3: [3, 1], mean 2, std sqrt(2): +-1 / 1.414214 = +-0.707107
    s = math.sqrt(3) / 2
    close(a, [[s, s], [-s, -s], [0.707107, 0.707107], [-s, -s], [-0.707107, -0.707107], [s, 0]])


def test_grpo_without_std_and_dr_grpo_subtract_the_mean_only():
    want = [[0.5, 0.5], [-0.5, -0.5], [1, 1], [-0.5, -0.5], [-1, -1], [0.5, 0]]
    a, _ = adv("grpo", cfg(norm_adv_by_std=False), scores=SCORES, mask=MASK, group_index=GROUP)
    close(a, want)
    a, _ = adv("dr_grpo", cfg("dr_grpo", norm_adv_by_std=True), scores=SCORES, mask=MASK, group_index=GROUP)
    close(a, want)


def test_grpo_constant_group_and_singleton_get_zero():
    a, _ = adv("grpo", scores=t([1, 1, 5]), mask=torch.ones(3, 2), group_index=torch.tensor([0, 0, 1]))
    close(a, torch.zeros(3, 2))


def test_rloo_leave_one_out():
    a, _ = adv("rloo", scores=SCORES, mask=MASK, group_index=GROUP)
    # prompt 7: 1 - (0+0+1)/3 = 2/3, 0 - 2/3 = -2/3; prompt 3: 3 - 1 = 2, 1 - 3 = -2
    w = 2 / 3
    close(a, [[w, w], [-w, -w], [2, 2], [-w, -w], [-2, -2], [w, 0]])


def test_rloo_with_kl_in_the_reward():
    # k1 per token = old - ref; penalty -0.1 * k1 summed over the sequence's response tokens
    old = t([[-1.0, -2.0], [-1.0, NAN]])
    ref = t([[-1.5, -1.0], [-2.0, NAN]])
    config = cfg("rloo", kl_coef=0.1, kl_estimator="k1", kl_in="reward")
    a, _ = adv("rloo", config, scores=t([1, 1]), mask=t([[1, 1], [1, 0]]), group_index=torch.tensor([0, 0]),
               old_logprobs=old, ref_logprobs=ref)
    # rewards: 1 - 0.1 * (0.5 - 1.0) = 1.05; 1 - 0.1 * 1.0 = 0.9 -> 1.05 - 0.9 = 0.15
    close(a, [[0.15, 0.15], [-0.15, 0]])


def test_remax_subtracts_the_greedy_score_of_the_same_prompt():
    a, _ = adv("remax", cfg("remax", kl_coef=0.0), scores=t([1, 0, 0.5]), mask=t([[1, 1], [1, 1], [1, 0]]),
               group_index=torch.tensor([0, 0, 1]), greedy_scores=t([0.5, 1.0]))
    close(a, [[0.5, 0.5], [-0.5, -0.5], [-0.5, 0]])
    with pytest.raises(RpegError, match="greedy_scores rows"):
        adv("remax", cfg("remax"), scores=t([1]), mask=torch.ones(1, 2), group_index=torch.tensor([2]),
            greedy_scores=t([0.5, 1.0]))


def test_remax_with_kl_in_the_reward_gives_each_token_its_reward_to_go():
    # k1 of old vs ref per token: 0.1, 0.2, 0.3; kl_coef 1 -> token rewards -0.1, -0.2, 1 - 0.3
    # reward-to-go: 0.4, 0.5, 0.7; minus the greedy score 0.5 -> -0.1, 0.0, 0.2 (whole-sequence sum
    # would be 0.4 - 0.5 = -0.1 on every token)
    old, ref = t([[-1.0, -1.0, -1.0, 0.0]]), t([[-1.1, -1.2, -1.3, 0.0]])
    config = cfg("remax", kl_coef=1.0, kl_estimator="k1", kl_in="reward")
    a, _ = adv("remax", config, scores=t([1.0]), mask=t([[1, 1, 1, 0]]), group_index=torch.tensor([0]),
               greedy_scores=t([0.5]), old_logprobs=old, ref_logprobs=ref)
    close(a, [[-0.1, 0.0, 0.2, 0.0]])


def test_reinforce_pp_baseline_whitens_over_tokens():
    # group means remove 0.5 and 2: [0.5, -0.5] on 2 tokens each, [1, -1] on 1 token each
    # 6 tokens [.5, .5, -.5, -.5, 1, -1]: mean 0, unbiased var (4 * 0.25 + 2) / 5 = 0.6
    a, _ = adv("reinforce_pp_baseline", scores=t([1, 0, 3, 1]), mask=t([[1, 1], [1, 1], [1, 0], [0, 1]]),
               group_index=torch.tensor([0, 0, 1, 1]))
    s = math.sqrt(0.6)
    close(a, [[0.5 / s, 0.5 / s], [-0.5 / s, -0.5 / s], [1 / s, 0], [0, -1 / s]])


# ---- token-level estimators -------------------------------------------------------------------

def test_token_rewards_put_the_score_on_the_last_response_token():
    mask = t([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    kl = t([[0.1, 0.2, 9.0], [9.0, 0.3, 0.4], [9.0, 9.0, 9.0]])
    close(token_rewards(t([1, 2, 3]), mask, kl), [[0.1, 1.2, 0], [0, 0.3, 2.4], [0, 0, 0]])


def test_gae_three_tokens_by_hand():
    # row 0: V = .5 everywhere, score 1 on the last token; gamma 1, lam .95
    #   deltas [0, 0, .5] -> A2 = .5, A1 = .95 * .5 = .475, A0 = .95 * .475 = .45125
    # row 1: two tokens then padding (V garbage there), score 0
    #   delta1 = 0 + 0 - .4 = -.4, delta0 = 0 + .4 - .2 = .2 -> A1 = -.4, A0 = .2 - .95 * .4 = -.18
    values = t([[0.5, 0.5, 0.5], [0.2, 0.4, NAN]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    config = cfg("gae", gamma=1.0, lam=0.95)
    raw = gae_advantages(token_rewards(t([1, 0]), mask, torch.zeros(2, 3)), values, mask, 1.0, 0.95)
    close(raw, [[0.45125, 0.475, 0.5], [-0.18, -0.4, 0]])
    a, returns = adv("gae", config, scores=t([1, 0]), mask=mask, values=values)
    close(returns, [[0.95125, 0.975, 1.0], [0.02, 0.0, 0]])
    # whitened over the 5 response tokens: mean 0.84625 / 5 = 0.16925, unbiased var 0.1821059375
    s = math.sqrt(0.1821059375)
    close(a, [[(0.45125 - 0.16925) / s, (0.475 - 0.16925) / s, (0.5 - 0.16925) / s],
              [(-0.18 - 0.16925) / s, (-0.4 - 0.16925) / s, 0]])


def test_gae_left_padding_matches_right_padding():
    config = cfg("gae", gamma=0.9, lam=0.8)
    right, r_ret = adv("gae", config, scores=t([1, 2]), mask=t([[1, 1, 0], [1, 1, 1]]),
                       values=t([[0.1, 0.2, 5.0], [0.3, 0.1, 0.2]]))
    left, l_ret = adv("gae", config, scores=t([1, 2]), mask=t([[0, 1, 1], [1, 1, 1]]),
                      values=t([[5.0, 0.1, 0.2], [0.3, 0.1, 0.2]]))
    close(left[0, 1:], right[0, :2])
    close(l_ret[0, 1:], r_ret[0, :2])
    close(left[1], right[1])
    assert left[0, 0] == 0 and right[0, 2] == 0


def test_gae_with_k3_kl_in_the_reward():
    # k3 of (old, ref) = (-1, -1.5): exp(-.5) + .5 - 1 = 0.106531; of (-2, -1): e - 2 = 0.718282
    # rewards = -0.1 * k3 + score on the last token = [-0.0106531, 1 - 0.0718282]
    # gamma = lam = 1, V = 0: A = [0.917519, 0.928172] before whitening = returns
    config = cfg("gae", kl_coef=0.1, kl_estimator="k3", kl_in="reward")
    _, returns = adv("gae", config, scores=t([1]), mask=torch.ones(1, 2), values=torch.zeros(1, 2),
                     old_logprobs=t([[-1.0, -2.0]]), ref_logprobs=t([[-1.5, -1.0]]))
    close(returns, [[0.917519, 0.928172]])


def test_reinforce_pp_discounted_then_whitened():
    # k1 = old - ref = [.5, -1, 0] -> penalty -0.1 * k1 = [-.05, .1, 0]; score 1 on the last token
    # gamma .5: G2 = 1, G1 = .1 + .5 = .6, G0 = -.05 + .3 = .25
    # whitened: mean 1.85 / 3 = 0.616667, unbiased var 0.140833
    mask = t([[1, 1, 1, 0]])
    old = t([[-1.0, -2.0, -0.5, NAN]])
    ref = t([[-1.5, -1.0, -0.5, NAN]])
    config = cfg("reinforce_pp", kl_coef=0.1, kl_estimator="k1", kl_in="reward", gamma=0.5)
    rewards = token_rewards(t([1]), mask, kl_reward(mask, old, ref, config))
    close(rewards, [[-0.05, 0.1, 1.0, 0]])
    close(discounted_returns(rewards, mask, 0.5), [[0.25, 0.6, 1.0, 0]])
    a, _ = adv("reinforce_pp", config, scores=t([1]), mask=mask, old_logprobs=old, ref_logprobs=ref)
    close(a, [[-0.977054, -0.044412, 1.021466, 0]])


def test_reinforce_pp_unequal_lengths():
    # returns [1, 1] and [0, 0, 0] (gamma 1, no KL): 5 tokens, mean .4, unbiased var 0.3
    a, _ = adv("reinforce_pp", cfg("reinforce_pp"), scores=t([1, 0]), mask=t([[1, 1, 0], [1, 1, 1]]))
    close(a, [[0.6 / math.sqrt(0.3), 0.6 / math.sqrt(0.3), 0], [-0.4 / math.sqrt(0.3)] * 3])


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_padding_is_zero_and_does_not_change_response_tokens(name):
    gen = torch.Generator().manual_seed(0)
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]])
    inputs = dict(scores=t([1, 0, 0.5, 2]), group_index=torch.tensor([0, 0, 1, 1]), greedy_scores=t([0.2, 0.7]),
                  values=torch.randn(4, 4, generator=gen), old_logprobs=-torch.rand(4, 4, generator=gen),
                  ref_logprobs=-torch.rand(4, 4, generator=gen))
    config = cfg(name, kl_coef=0.05, kl_in="reward", gamma=0.9, lam=0.95)
    clean, clean_ret = adv(name, config, mask=mask, **inputs)
    dirty = {k: torch.where(mask.bool(), v, NAN) if k in ("values", "old_logprobs", "ref_logprobs") else v
             for k, v in inputs.items()}
    a, ret = adv(name, config, mask=mask.bool(), **dirty)
    close(a, clean)
    assert (a[mask == 0] == 0).all() and a[mask == 1].abs().sum() > 0
    if clean_ret is not None:
        close(ret, clean_ret)


# ---- KL estimators ----------------------------------------------------------------------------

def test_k1_and_k3_by_hand():
    logp, ref = t([-1.0, -2.0, -0.7]), t([-1.5, -1.0, -0.7])
    close(KL["k1"](logp, ref), [0.5, -1.0, 0.0])
    # r = exp(ref - logp): exp(-.5) - 1 + .5 = 0.106531; e - 1 - 1 = 0.718282; 0 when equal
    close(KL["k3"](logp, ref), [0.106531, 0.718282, 0.0])


def test_k3_is_never_negative():
    gen = torch.Generator().manual_seed(1)
    logp, ref = -5 * torch.rand(64, 32, generator=gen), -5 * torch.rand(64, 32, generator=gen)
    assert (KL["k3"](logp, ref) >= 0).all()
    assert (KL["k1"](logp, ref) < 0).any()


def test_k3_is_guarded_so_a_diverged_token_stays_finite():
    # log r = 40 and 100: the formula gives e^40 ~ 2.4e17 and inf; the guard caps log r at 20
    logp = torch.tensor([-41.0, -101.0, -1.0], requires_grad=True)
    k3 = KL["k3"](logp, t([-1.0, -1.0, -1.5]))
    cap = math.exp(LOG_RATIO_GUARD) - 1 - LOG_RATIO_GUARD
    close(k3[:2], [cap, cap], tol=cap * 1e-6)  # float32 at 4.9e8: 32 apart
    close(k3[2], math.exp(-0.5) - 1 + 0.5)  # inside the guard: the formula
    k3.sum().backward()
    assert torch.isfinite(logp.grad).all() and (logp.grad[:2] == 0).all() and logp.grad[2] != 0


# ---- aggregation ------------------------------------------------------------------------------

X = t([[1, 2, 3], [4, NAN, NAN]])
XMASK = t([[1, 1, 1], [1, 0, 0]])


def test_token_mean():
    close(aggregate("token-mean", X, XMASK), (1 + 2 + 3 + 4) / 4)


def test_seq_mean_token_mean():
    close(aggregate("seq-mean-token-mean", X, XMASK), (6 / 3 + 4 / 1) / 2)


def test_seq_mean_token_sum_norm():
    close(aggregate("seq-mean-token-sum-norm", X, XMASK), (6 / 3 + 4 / 3) / 2)  # constant = T = 3
    close(aggregate("seq-mean-token-sum-norm", X, XMASK, norm_len=4), (6 / 4 + 4 / 4) / 2)


def test_sequence_means_skip_empty_rows():
    x, mask = t([[1, 2, 3], [7, 7, 7]]), t([[1, 1, 1], [0, 0, 0]])
    close(aggregate("seq-mean-token-mean", x, mask), 2.0)
    close(aggregate("token-mean", x, torch.zeros(2, 3)), 0.0)


# ---- policy loss ------------------------------------------------------------------------------

def _ppo(ratios, advantages, config, **kw):
    old = torch.full((1, len(ratios)), -1.0)
    logp = (old + torch.log(t([ratios]))).requires_grad_()
    loss, metrics = policy_loss(logp, old, t([advantages]), torch.ones(1, len(ratios)), config, **kw)
    loss.backward()
    return loss, metrics, logp.grad[0]


def test_clipped_surrogate_by_hand():
    config = cfg(clip_low=0.2, clip_high=0.28)
    # r 1.5, A 1: max(-1.5, -1.28) = -1.28 (clipped: no gradient)
    # r 0.5, A -1: max(0.5, 0.8) = 0.8 (clipped below: no gradient)
    # r 1.1, A 1: -1.1 (inside the range); d/dlogp (-A r) / 3 = -1.1 / 3
    # r 1.5, A -1: max(1.5, 1.28) = 1.5 (above the range but A < 0: not clipped); grad 1.5 / 4
    loss, m, grad = _ppo([1.5, 0.5, 1.1, 1.5], [1, -1, 1, -1], config)
    close(loss, (-1.28 + 0.8 - 1.1 + 1.5) / 4)
    close(grad, [0.0, 0.0, -1.1 / 4, 1.5 / 4])
    close(m["clipfrac"], 0.5)
    close(m["clipfrac_high"], 0.25)
    close(m["clipfrac_low"], 0.25)
    close(m["ratio_mean"], (1.5 + 0.5 + 1.1 + 1.5) / 4)
    close(m["ratio_max"], 1.5)
    assert not m["pg_loss"].requires_grad


def test_clip_higher_is_asymmetric():
    # ratio 1.25, A 1: inside [0.8, 1.28] with clip-higher, clipped at 1.2 without it
    _, _, grad = _ppo([1.25], [1], cfg(clip_low=0.2, clip_high=0.28))
    close(grad, [-1.25])
    loss, _, grad = _ppo([1.25], [1], cfg(clip_low=0.2, clip_high=0.2))
    close(loss, -1.2)
    close(grad, [0.0])
    # ratio 0.75, A -1: clip_low 0.2 clips at 0.8 whatever clip_high is
    loss, _, grad = _ppo([0.75], [-1], cfg(clip_low=0.2, clip_high=0.28))
    close(loss, 0.8)
    close(grad, [0.0])


def test_dual_clip_bounds_a_negative_advantage_token_by_hand():
    config = cfg(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    # r 4, A -1: max(4, 1.28) = 4 > c = 3 -> 3, no gradient; r 2.5, A -1: 2.5 < 3 stays, grad 2.5 / 3
    # r 4, A 1: clipped above at 1.28 (dual clipping is for A < 0 only)
    loss, m, grad = _ppo([4.0, 2.5, 4.0], [-1, -1, 1], config)
    close(loss, (3.0 + 2.5 - 1.28) / 3)
    close(grad, [0.0, 2.5 / 3, 0.0])
    close(m["clipfrac_dual"], 1 / 3)
    loss, m, grad = _ppo([4.0, 2.5, 4.0], [-1, -1, 1], cfg(clip_low=0.2, clip_high=0.28, dual_clip=0.0))
    close(loss, (4.0 + 2.5 - 1.28) / 3)
    close(grad, [4.0 / 3, 2.5 / 3, 0.0])
    assert "clipfrac_dual" not in m


def test_the_log_ratio_guard_keeps_the_loss_finite():
    # log r = 50 with A = -1 and no dual clip: exp(50) ~ 5e21 unguarded; the guard gives e^20, no gradient
    old = torch.full((1, 2), -60.0)
    logp = t([[-10.0, -60.0]]).requires_grad_()
    loss, m = policy_loss(logp, old, t([[-1.0, -1.0]]), torch.ones(1, 2), cfg(dual_clip=0.0))
    loss.backward()
    close(loss, (math.exp(LOG_RATIO_GUARD) + 1.0) / 2, tol=1.0)
    close(logp.grad, [[0.0, 0.5]])
    close(m["ratio_max"], math.exp(LOG_RATIO_GUARD), tol=1.0)


def test_gspo_clips_one_ratio_per_sequence_by_hand():
    # token log-ratios 0.5, -0.3: s = exp(mean) = exp(0.1) = 1.105171, inside [0.8, 1.2]: both tokens
    # get -A s (loss -1.105171) and the gradient s / 2 each; PPO clips token 1 (r 1.6487 > 1.2, no
    # gradient) and keeps token 2 (r 0.7408 with A > 0: -0.7408 / 2)
    old = torch.full((1, 2), -1.0)
    config = cfg(clip_low=0.2, clip_high=0.2, loss_agg="seq-mean-token-mean")
    for loss_name, want_loss, want_grad in [
            ("gspo", -math.exp(0.1), [-math.exp(0.1) / 2, -math.exp(0.1) / 2]),
            ("ppo", -(1.2 + math.exp(-0.3)) / 2, [0.0, -math.exp(-0.3) / 2])]:
        logp = (old + t([[0.5, -0.3]])).requires_grad_()
        loss, _ = policy_loss(logp, old, torch.ones(1, 2), torch.ones(1, 2), config.replace(policy_loss=loss_name))
        loss.backward()
        close(loss, want_loss)
        close(logp.grad, [want_grad])
    # s = exp(0.4) = 1.4918 > 1.2 with A = 1: the whole sequence is clipped, at -1.2, no gradient
    logp = (old + t([[0.5, 0.3]])).requires_grad_()
    loss, m = policy_loss(logp, old, torch.ones(1, 2), torch.ones(1, 2), config.replace(policy_loss="gspo"))
    loss.backward()
    close(loss, -1.2)
    close(logp.grad, [[0.0, 0.0]])
    close(m["clipfrac"], 1.0)


def test_gspo_padding_and_sequence_lengths():
    # sequence 2 has one token (log-ratio 0.1) and padding holding NaN: its s is exp(0.1), not NaN
    old = t([[-1.0, -1.0], [-1.0, NAN]])
    logp = t([[-0.9, -1.1], [-0.9, 0.0]]).requires_grad_()
    loss, _ = policy_loss(logp, old, torch.ones(2, 2), t([[1, 1], [1, 0]]),
                          cfg(policy_loss="gspo", loss_agg="seq-mean-token-mean"))
    loss.backward()
    close(loss, -(1.0 + math.exp(0.1)) / 2)  # sequence 1: mean log-ratio 0 -> s = 1
    assert torch.isfinite(logp.grad).all() and logp.grad[1, 1] == 0


# rho = pi_old / pi_behav per token: 3, 0.5, 1 on sequence 1 (product 1.5, geometric mean 1.1447)
BEHAVIOUR = t([[-1.0 - math.log(3.0), -1.0 + math.log(2.0), -1.0]])


@pytest.mark.parametrize("mode, weights, kept, loss, truncated, masked", [
    ("none", [1, 1, 1], [1, 1, 1], -1.0, 0, 0),
    ("tis", [2, 0.5, 1], [1, 1, 1], -3.5 / 3, 1 / 3, 0),  # 3 is cut to the cap 2
    ("tis-seq", [1.5, 1.5, 1.5], [1, 1, 1], -1.5, 0, 0),  # the product 1.5 < 2
    ("mask-token", [1, 1, 1], [0, 1, 1], -1.0, 0, 1 / 3),  # 3 > 2 leaves the loss (and its denominator)
    ("mask-seq", [1, 1, 1], [1, 1, 1], -1.0, 0, 0),  # 1.1447 in [0.5, 2]: kept
    ("decoupled", [0, 0.5, 1], [1, 1, 1], -0.5, 1 / 3, 0),  # 3 > 2 weighs 0 but stays in the denominator
])
def test_off_policy_corrections_by_hand(mode, weights, kept, loss, truncated, masked):
    # ratio pi_theta / pi_old = 1 and A = 1: each kept token's surrogate is -w, its gradient -w / kept tokens
    old = torch.full((1, 3), -1.0)
    logp = old.clone().requires_grad_()
    config = cfg(off_policy=mode, is_cap=2.0, is_low=0.5)
    out, m = policy_loss(logp, old, torch.ones(1, 3), torch.ones(1, 3), config, behaviour_logprobs=BEHAVIOUR)
    out.backward()
    w, k = t([weights]), t([kept])
    close(out, loss)
    close(logp.grad, -w * k / k.sum())
    close(m["is_ratio_max"], 3.0)
    close(m["is_ratio_mean"], 4.5 / 3)
    if mode != "none":
        close(m["is_truncated_frac"], truncated)
        close(m["is_masked_frac"], masked)
        close(m["is_weight_max"], max(x for x, y in zip(weights, kept) if y))


def test_sequence_corrections_act_on_whole_sequences():
    # sequence 2's rho is 4 on both tokens: product 16 (cut to 2 by tis-seq), geometric mean 4 (masked by mask-seq)
    old = torch.full((2, 3), -1.0)
    behaviour = torch.cat([BEHAVIOUR, t([[-1.0 - math.log(4.0)] * 2 + [0.0]])])
    mask = t([[1, 1, 1], [1, 1, 0]])
    fix = correction(old, behaviour, mask, cfg(off_policy="tis-seq"))
    close(fix.weight * mask, [[1.5, 1.5, 1.5], [2.0, 2.0, 0.0]])
    assert fix.truncated.tolist() == [[False] * 3, [True, True, False]]
    fix = correction(old, behaviour, mask, cfg(off_policy="mask-seq"))
    assert fix.keep.tolist() == [[True] * 3, [False] * 3]
    with pytest.raises(RpegError, match="behaviour"):
        correction(old, None, mask, cfg(off_policy="tis"))


def test_sequence_corrections_guard_the_sequences_log_ratio_not_each_token():
    # the worked example: per-token log rho 25 and -22, cap 2. The formula min(prod rho, cap) = min(e^3, 2) = 2 on
    # both tokens; clamping each token's log rho to +-20 before the sum gave 20 - 20 = 0 -> weight 1
    fix = correction(t([[-1.0, -30.0]]), t([[-26.0, -8.0]]), torch.ones(1, 2), cfg(off_policy="tis-seq", is_cap=2.0))
    close(fix.weight, [[2.0, 2.0]])
    # per-token log rho 25 and -22 (sequence 1, then one padding token) and 30, -28, -3 (sequence 2)
    log_rho = t([[25.0, -22.0, 0.0], [30.0, -28.0, -3.0]])
    old = t([[-1.0, -30.0, NAN], [-1.0, -40.0, -5.0]])
    behaviour = torch.where(torch.isnan(old), old, old - log_rho)
    mask = t([[1, 1, 0], [1, 1, 1]])
    # tis-seq, cap 2: sequence 1's prod rho = e^3, so min(e^3, 2) = 2 on both tokens (each token clamped to
    # +-20 first gave e^0 = 1); sequence 2's e^-1 (clamped tokens gave e^-3)
    fix = correction(old, behaviour, mask, cfg(off_policy="tis-seq", is_cap=2.0))
    close(fix.weight * mask, [[2.0, 2.0, 0.0], [math.exp(-1.0)] * 3])
    assert fix.truncated.tolist() == [[True, True, False], [False] * 3]
    # mask-seq, [0.5, 2]: sequence 1's geometric mean e^1.5 = 4.48 leaves (clamped tokens gave e^0: kept);
    # sequence 2's e^(-1/3) = 0.72 stays (clamped tokens gave e^-1 = 0.37: rejected)
    fix = correction(old, behaviour, mask, cfg(off_policy="mask-seq", is_cap=2.0, is_low=0.5))
    assert fix.keep.tolist() == [[False] * 3, [True] * 3]
    # the guard is on the sum: log rho -25 and -20 sum to -45, clamped to -20 before the exp
    low = correction(t([[-1.0, -1.0]]), t([[24.0, 19.0]]), torch.ones(1, 2), cfg(off_policy="tis-seq"))
    close(low.weight, [[math.exp(-LOG_RATIO_GUARD)] * 2], tol=1e-12)


def test_mask_token_is_token_rejection_as_documented():
    # rho = 3, 0.5, 1.5 and bounds [0.6, 2]: only the third token is kept. Ratio 1 and A = 1, 2, 4: a kept
    # token's surrogate is -A w. Rejection (verl's token_k1): the kept token weighs 1 and is alone in the
    # denominator, -4. IcePop would weigh it rho = 1.5 over all three tokens (-2); decoupled gives -7/3.
    behaviour = t([[-1.0 - math.log(3.0), -1.0 + math.log(2.0), -1.0 - math.log(1.5)]])
    old = torch.full((1, 3), -1.0)
    logp = old.clone().requires_grad_()
    config = cfg(off_policy="mask-token", is_cap=2.0, is_low=0.6)
    out, m = policy_loss(logp, old, t([[1.0, 2.0, 4.0]]), torch.ones(1, 3), config, behaviour_logprobs=behaviour)
    out.backward()
    close(out, -4.0)
    close(logp.grad, [[0.0, 0.0, -4.0]])
    close(m["is_weight_max"], 1.0)
    close(m["is_masked_frac"], 2 / 3)
    out, _ = policy_loss(old, old, t([[1.0, 2.0, 4.0]]), torch.ones(1, 3), cfg(off_policy="decoupled", is_cap=2.0),
                         behaviour_logprobs=behaviour)
    close(out, -7 / 3)
    # what the docstring, the options table and the help text say mask-token computes
    doc = " ".join(OFF_POLICY["mask-token"].__doc__.split())
    assert "every kept token weighs 1" in doc and "leaves the loss and its denominator" in doc
    assert "rollout_rs = token_k1" in doc and "It is not IcePop" in doc
    assert "IcePop" in OFF_POLICY["decoupled"].__doc__
    table = (Path(__file__).parents[2] / "docs" / "runtime.md").read_text()
    row = re.search(r"`mask-token`: ([^;|]*)", table).group(1)
    assert "rejection" in row and "weigh 1" in row and "denominator" in row and "IcePop" not in row
    assert "IcePop" in re.search(r"`decoupled`: ([^;|]*)", table).group(1)
    assert "rejection of tokens or sequences (mask-token, mask-seq)" in graph_config.OPTIONS["off_policy"]


def test_policy_loss_kl_in_loss_and_entropy():
    # ratio 1, A 0: the surrogate is 0; k3 by hand 0.106531 and 0.718282, mean 0.412406
    logp, ref = t([[-1.0, -2.0]]), t([[-1.5, -1.0]])
    config = cfg(kl_coef=0.1, kl_estimator="k3", kl_in="loss", entropy_coef=0.01)
    loss, m = policy_loss(logp, logp, torch.zeros(1, 2), torch.ones(1, 2), config,
                          ref_logprobs=ref, entropy=t([[1.0, 3.0]]))
    close(m["kl_loss"], 0.412406)
    close(m["entropy"], 2.0)
    close(loss, 0.1 * 0.412406 - 0.01 * 2.0)
    # kl_in reward: no KL term in the loss
    loss, m = policy_loss(logp, logp, torch.zeros(1, 2), torch.ones(1, 2), cfg(kl_coef=0.1, kl_in="reward"))
    assert "kl_loss" not in m and loss == 0


def test_policy_loss_aggregations_and_padding_gradients():
    # per-token -A r with r = 1: x = -A = [[1, 2, 3], [4, pad, pad]]; NaN at padding stays out
    logp = torch.zeros(2, 3, requires_grad=True)
    old = t([[0, 0, 0], [0, NAN, NAN]])
    advantages = t([[-1, -2, -3], [-4, NAN, NAN]])
    for agg, want in [("token-mean", 2.5), ("seq-mean-token-mean", 3.0), ("seq-mean-token-sum-norm", 5 / 3)]:
        logp.grad = None
        loss, _ = policy_loss(logp, old, advantages, XMASK, cfg(loss_agg=agg))
        loss.backward()
        close(loss, want)
        assert torch.isfinite(logp.grad).all() and (logp.grad[1, 1:] == 0).all()


# ---- value loss -------------------------------------------------------------------------------

def test_value_loss_clipping_by_hand():
    # token 0: V .9, old .5, R 1: unclipped (.1)^2 = .01, clipped V .7 -> (.3)^2 = .09 -> .09, no grad
    # token 1: V 1, old .5, R 0: unclipped 1, clipped V .7 -> .49 -> 1, grad (V - R) / 2 = .5
    old, returns, mask = t([[0.5, 0.5, NAN]]), t([[1.0, 0.0, NAN]]), t([[1, 1, 0]])
    values = t([[0.9, 1.0, 3.0]]).requires_grad_()
    loss, m = value_loss(values, old, returns, mask, cfg("gae", value_clip=0.2))
    loss.backward()
    close(loss, 0.5 * (0.09 + 1.0) / 2)
    close(values.grad, [[0.0, 0.5, 0.0]])
    close(m["vf_clipfrac"], 0.5)
    close(m["vpred_mean"], 0.95)
    loss, m = value_loss(values, old, returns, mask, cfg("gae", value_clip=0.0))
    close(loss, 0.5 * (0.01 + 1.0) / 2)
    close(m["vf_clipfrac"], 0.0)


def test_a_value_inside_the_clip_range_is_not_counted_as_clipped():
    # old + clip(V - old) lands one float step from V here, and the token used to count as clipped
    values, old, returns, mask = t([[-0.10230965]]), t([[0.16493313]]), t([[0.11656806]]), t([[1]])
    assert float(old + (values - old).clamp(-0.5, 0.5)) != float(values)  # the float step the fix avoids
    loss, m = value_loss(values.requires_grad_(), old, returns, mask, cfg("gae", value_clip=0.5))
    assert float(m["vf_clipfrac"]) == 0.0
    close(loss, 0.5 * (-0.10230965 - 0.11656806) ** 2)
