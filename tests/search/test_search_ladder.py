"""ladder(): the job searched with its own structure, then one structural change at a time; allowed():
the plan with exactly the changes a user permits. PPO on Qwen3-0.6B (critic, reference, reward model)
and GRPO (no critic), 8 H100."""

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.graph import Job, get_model
from rpeg.graph import LengthDistribution as Dist
from rpeg.hardware import load_cluster
from rpeg.search import LayoutCache
from rpeg.search.ladder import Permit, Start, allowed, ladder

SMALL = get_model("qwen3-0.6B")
JOB = Job(prompts=16, samples_per_prompt=4, prompt_len=256, response=Dist.fixed(512))
PPO = build_graph("ppo", JOB, Models(actor=SMALL, critic=SMALL, reference=SMALL, reward=SMALL))
GRPO = build_graph("grpo", JOB, Models(actor=SMALL))


@pytest.fixture(scope="module")
def dgx8():
    return load_cluster("dgx-h100", 8)


@pytest.fixture(scope="module")
def cache():
    return LayoutCache()


@pytest.fixture(scope="module")
def ppo_rungs(dgx8, cache):
    return ladder(PPO, dgx8, 8, Start(), Permit(max_staleness=1), cache=cache)


def test_rungs_add_one_change_each_and_never_get_slower(ppo_rungs):
    assert [r.key for r in ppo_rungs] == ["none", "async", "partial", "share"]
    assert [r.allowed for r in ppo_rungs] == [True, True, True, False]
    steps = [r.step_s for r in ppo_rungs]
    assert all(a >= b - 1e-9 for a, b in zip(steps, steps[1:])), steps
    structures = [r.result.best.structure for r in ppo_rungs]
    assert structures[0].async_bound == 0 and not structures[0].partial and not structures[0].share
    assert not any(s.share for s in structures[:3])
    assert not structures[1].partial


def test_allowed_is_the_last_allowed_rung_when_they_form_a_prefix(dgx8, cache, ppo_rungs):
    result, why = allowed(PPO, dgx8, 8, Start(), Permit(max_staleness=1), ppo_rungs, cache=cache)
    assert result is ppo_rungs[2].result and why == ""
    permit = Permit(max_staleness=1, share=True)
    rungs = ladder(PPO, dgx8, 8, Start(), permit, cache=cache)
    shared, _ = allowed(PPO, dgx8, 8, Start(), permit, rungs, cache=cache)
    assert shared is rungs[3].result and shared.best.structure.share


def test_sharing_without_partial_rollout_is_searched_on_its_own(dgx8, cache, ppo_rungs):
    permit = Permit(max_staleness=1, partial=False, share=True)
    rungs = ladder(PPO, dgx8, 8, Start(), permit, cache=cache)
    assert [r.allowed for r in rungs] == [True, True, False, True]
    result, _ = allowed(PPO, dgx8, 8, Start(), permit, rungs, cache=cache)
    assert result is not rungs[-1].result
    assert not result.best.structure.partial
    assert result.best.step_s <= rungs[1].step_s + 1e-9


def test_a_job_that_is_already_asynchronous_starts_there(dgx8, cache):
    """A peer's one-step-off job: its own rung may use k = 1; no async rung when the permit adds nothing."""
    rungs = ladder(GRPO, dgx8, 8, Start(async_bound=1), Permit(max_staleness=1), cache=cache)
    assert [r.key for r in rungs] == ["none", "partial"]  # no critic: nothing to share
    rungs = ladder(GRPO, dgx8, 8, Start(), Permit(max_staleness=0), cache=cache)
    assert [r.key for r in rungs] == ["none"]
    assert rungs[0].result.best.structure.async_bound == 0
