"""A reward-model stage: a local Hugging Face sequence-classification folder (a tiny one built here)
scores each prompt + response on the devices the plan gives the stage, and its scores are the
rewards the step trains on; the task's rule still reports accuracy."""

from __future__ import annotations

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.passes import colocate, place
from rpeg.runtime.run import run
from tests.runtime.test_runtime_e2e import TINY, job, laid_out, rt

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`


def _graph():
    return build_graph("grpo", job(), Models(actor=TINY, reward=TINY), kl_coef=0.0)


def test_the_reward_models_scores_are_the_rewards(tmp_path):
    result = run(laid_out(colocate(_graph(), 1)), rt(tmp_path, steps=2, reward_model_path="tiny"), progress=False)
    rewards = [m["reward"] for m in result.metrics]
    assert all(r not in (0.0, 1.0) for r in rewards), rewards  # real-valued scores, not the task's 0/1 rule
    assert all(0.0 <= m["accuracy"] <= 1.0 for m in result.metrics)
    assert [r.unit for r in result.timeline.records].count("reward") == 2


def test_a_reward_model_on_its_own_devices_scores_there(tmp_path):
    g = place(_graph(), {"gen": 1, "reward": 1, "train": 1}, {"generate": "gen", "reward": "reward"}, default="train")
    result = run(laid_out(g), rt(tmp_path, steps=1, reward_model_path="tiny"), progress=False)
    rec = next(r for r in result.timeline.records if r.unit == "reward")
    assert rec.group == "reward" and rec.devices == (1, 1)


def test_a_plan_with_a_reward_model_needs_its_folder_before_anything_starts(tmp_path):
    with pytest.raises(RpegError, match="set runtime.reward_model_path") as e:
        run(laid_out(colocate(_graph(), 1)), rt(tmp_path, steps=1), progress=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run" / "warm-model").exists()  # refused before the model was prepared
