"""Importers read the peers' multi-turn settings into Job.episode, and say what they assumed."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpeg.interop import areal as ra
from rpeg.interop import verl_read

DATA = Path(__file__).parent.parent / "data" / "peers"
VERL = """python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\
    data.train_batch_size=256 data.max_prompt_length=1024 data.max_response_length=3072 \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct actor_rollout_ref.actor.ppo_mini_batch_size=64 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \\
    actor_rollout_ref.rollout.n=8 trainer.n_gpus_per_node=8 trainer.nnodes=1 {extra}
"""
MT = "actor_rollout_ref.rollout.multi_turn."


def verl(extra: str):
    return verl_read.read(VERL.format(extra=extra), "run.sh")


def test_verl_multi_turn_becomes_an_episode_with_its_caps():
    im = verl(f"{MT}enable=True {MT}max_assistant_turns=5 {MT}max_tool_response_length=300 "
              f"{MT}tool_config_path=tools.yaml")
    ep = im.view.job.episode
    assert (ep.turns, ep.max_turns, ep.observation_tokens, ep.tool_latency_s) == (2.0, 5, 300.0, 0.0)
    said = "assumes 2 replies (one tool call or observation between them), 300 observation tokens each"
    assert any(said in a for a in im.assumed)
    assert any(u.startswith(f"{MT}tool_config_path = tools.yaml: the tools themselves") for u in im.unmapped)
    assert not any("max_assistant_turns" in u for u in im.unmapped)


def test_verl_defaults_no_limit_to_a_third_of_the_length_and_caps_observations():
    ep = verl(f"{MT}enable=True").view.job.episode
    # verl: max_assistant_turns null = max_length // 3; observations at most half the response's mean (1,024)
    assert ep.max_turns == (1024 + 3072) // 3 and ep.observation_tokens == 256.0
    ep = verl(f"{MT}enable=True {MT}max_tool_response_length=4096").view.job.episode
    assert ep.observation_tokens == 512.0
    assert verl(f"{MT}enable=False {MT}max_assistant_turns=5").view.job.episode is None
    assert verl("").view.job.episode is None


@pytest.mark.parametrize("where", ["max_turns: 32\n", "agent:\n  max_turns: 32\n"])
def test_areal_max_turns_becomes_an_episode(where):
    text = (DATA / "areal" / "gsm8k_grpo.yaml").read_text() + where
    im = ra.read(text, "search_agent.yaml")
    ep = im.view.job.episode
    assert (ep.turns, ep.max_turns) == (2.0, 32)
    assert not any("max_turns" in u for u in im.unmapped)
    assert any("multi-turn episodes of at most 32 replies" in a for a in im.assumed)
