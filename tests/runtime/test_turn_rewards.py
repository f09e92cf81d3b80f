"""Turn rewards where they were earned: an episode's tool reward on its turn's last sampled token and the
outcome on the last, into the batch (extras["token_scores"]) and the token-level advantage estimators."""

from __future__ import annotations

import pytest
import torch

from rpeg.errors import RpegError
from rpeg.graph.config import AlgoConfig
from rpeg.runtime.algos import compute_advantages
from rpeg.runtime.batch import build_batch
from rpeg.runtime.models import build_tiny, load
from rpeg.runtime.rollout import SamplingParams
from rpeg.tasks.base import Problem

# a response of 5 tokens: turn 1 sampled (2 tokens, the tool's reward 0.5 on its last), an observation
# (1 token, masked), turn 2 sampled (2 tokens, the outcome 1.0 on its last)
MASK = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]])
EARNED = torch.tensor([[0.0, 0.5, 0.0, 0.0, 1.0]])
SCORES = torch.tensor([1.5])  # the episode's total


def _config(**kw) -> AlgoConfig:
    return AlgoConfig(**({"adv_estimator": "gae", "gamma": 1.0, "lam": 1.0, "kl_coef": 0.0} | kw))


def test_gae_returns_count_a_turns_reward_only_for_the_tokens_before_it():
    zeros = torch.zeros_like(MASK)
    _, returns = compute_advantages("gae", scores=SCORES, mask=MASK, values=zeros, token_scores=EARNED,
                                    config=_config())
    assert returns.tolist() == [[1.5, 1.5, 0.0, 1.0, 1.0]]  # turn 2's tokens did not earn the tool's reward
    _, whole = compute_advantages("gae", scores=SCORES, mask=MASK, values=zeros, config=_config())
    assert whole.tolist() == [[1.5, 1.5, 0.0, 1.5, 1.5]]  # the total on the last token: every token gets it


def test_remax_and_reinforce_pp_read_the_turn_rewards_and_outcome_estimators_the_total():
    cfg = _config(adv_estimator="remax")
    adv, _ = compute_advantages("remax", scores=SCORES, mask=MASK, group_index=torch.tensor([0]),
                                greedy_scores=torch.tensor([0.5]), token_scores=EARNED, config=cfg)
    assert adv.tolist() == [[1.0, 1.0, 0.0, 0.5, 0.5]]
    two = torch.cat([MASK, MASK])
    earned = torch.cat([EARNED, torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.5]])])  # the same total, all at the end
    pp, _ = compute_advantages("reinforce_pp", scores=torch.tensor([1.5, 1.5]), mask=two, token_scores=earned,
                               config=_config(adv_estimator="reinforce_pp"))
    assert pp[0, 3] < pp[1, 3] and pp[0, 0] == pytest.approx(pp[1, 0])  # only where they differ
    for name in ("grpo", "rloo", "dr_grpo"):
        kw = dict(scores=torch.tensor([1.5, 0.5]), mask=two, group_index=torch.tensor([0, 0]),
                  config=_config(adv_estimator=name))
        with_turns, _ = compute_advantages(name, token_scores=earned, **kw)
        assert torch.equal(with_turns, compute_advantages(name, **kw)[0])


def test_token_scores_of_another_shape_are_refused():
    with pytest.raises(RpegError, match="token_scores has shape"):
        compute_advantages("reinforce_pp", scores=SCORES, mask=MASK, token_scores=torch.zeros(1, 4),
                           config=_config(adv_estimator="reinforce_pp"))


def test_the_batch_places_each_reward_on_its_tokens_position():
    b = build_batch([[1, 2], [3]], [[5, 6, 7, 8], [9]], [[-1.0] * 4, [-1.0]], [0, 1], [0, 0], 0,
                    loss_masks=[[1, 1, 0, 1], [1]], token_rewards=[[0.0, 0.5, 0.0, 1.0], [2.0]])
    # prompt length 2: response token j is predicted at position 1 + j, as the mask
    assert b.extras["token_scores"].tolist() == [[0.0, 0.0, 0.5, 0.0, 1.0], [0.0, 2.0, 0.0, 0.0, 0.0]]
    assert "token_scores" not in build_batch([[1]], [[5]], [[-1.0]], [0], [0], 0).extras


def test_episodes_keep_the_tool_reward_on_the_calls_last_token(tmp_path):
    from rpeg.runtime.agent_engine import EnvSpec, episodes_on
    from rpeg.tasks.arithmetic import Arithmetic

    _, tok = load(build_tiny(str(tmp_path / "tiny")))

    class Scripted:
        version = 0

        def generate(self, prompts, params, seed):
            out = [tok.encode("calc(2*3)" if ">" not in tok.decode(p) else "6") + [tok.eos_token_id] for p in prompts]
            return out, [[-0.5] * len(o) for o in out]

    spec = EnvSpec("calculator", Arithmetic(level=1, ops=("mul",)), (("max_turns", 2), ("tool_reward", 0.25)))
    ep = episodes_on(Scripted(), tok, [Problem("2*3=", "6")], spec, SamplingParams(max_new_tokens=12), seed=0)
    earned, mask = ep.token_rewards[0], ep.loss_masks[0]
    assert len(earned) == len(mask) == len(ep.responses[0])
    call = len(tok.encode("calc(2*3)")) + 1  # the call and its end
    assert earned[call - 1] == 0.25 and earned[-1] == pytest.approx(1.0) and mask[-1] == 1
    assert sum(earned) == pytest.approx(ep.rewards[0]) and sum(x != 0 for x in earned) == 2
