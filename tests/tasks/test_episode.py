"""Episodes: token-in/token-out trajectories, masks, the prefix invariant, tools off the event loop."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest

from rpeg.errors import RpegError
from rpeg.tasks import Problem
from rpeg.tasks.calculator import calculator_env
from rpeg.tasks.environment import ToolEnvironment
from rpeg.tasks.episode import EpisodeLLM, Sample, Trajectory, run_episode, run_episodes, run_rollout
from rpeg.tasks.tools import tool


class Chars:
    """A character codec: one token per character."""

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


class Scripted:
    """An engine that calls the calculator once, then answers with what it read; logprob -0.5 per token.
    `version` may change between calls (new weights mid-episode)."""

    def __init__(self, delay=0.0, answer=None):
        self.delay, self.answer, self.version, self.calls = delay, answer, 0, []

    async def generate(self, ids):
        text = Chars().decode(ids)
        self.calls.append((time.perf_counter(), text))
        await asyncio.sleep(self.delay)
        seen = re.findall(r"> (\S+)\n", text)
        if seen:
            reply = (self.answer or seen[-1]) + "#"
        else:
            reply = "calc(" + text.rstrip("=").split("\n")[0] + ")#"
        return Sample(Chars().encode(reply), [-0.5] * len(reply), self.version)


PROBLEM = Problem("347*58=", "20126")


def test_a_calculator_episode_keeps_sampled_tokens_and_masks_everything_else():
    traj = asyncio.run(run_episode(calculator_env(), PROBLEM, Scripted(), Chars()))
    text = Chars().decode(traj.ids)
    assert text == "347*58=calc(347*58)#\n> 20126\n20126#"
    assert traj.turns == 2 and not traj.truncated and traj.prompt_len == 7
    masked_in = "".join(c for c, m in zip(text, traj.loss_mask) if m)
    assert masked_in == "calc(347*58)#20126#"  # no prompt or observation token enters the loss
    assert all(lp == (-0.5 if m else 0.0) for lp, m in zip(traj.logprobs, traj.loss_mask))
    assert traj.reward == 1.0 and traj.rewards[-1] == 1.0 and sum(traj.rewards[:-1]) == 0.0
    traj.check()


def test_turn_rewards_land_on_each_turns_last_token_and_a_wrong_answer_scores_zero():
    env = calculator_env(tool_reward=0.1)
    traj = asyncio.run(run_episode(env, PROBLEM, Scripted(answer="1"), Chars()))
    end_of_first = Chars().decode(traj.ids).index("#")
    assert traj.rewards[end_of_first] == pytest.approx(0.1) and traj.rewards[-1] == 0.0
    assert env.calls == 1 and env.failed_calls == 0


def test_max_turns_truncates_and_a_bad_call_is_an_observation():
    class Loops(Scripted):
        async def generate(self, ids):
            return Sample(Chars().encode("calc(1+)#"), [-1.0] * 9, 0)

    traj = asyncio.run(run_episode(calculator_env(max_turns=2), PROBLEM, Loops(), Chars()))
    assert traj.truncated and traj.turns == 2
    assert "> error: calc: ValueError: cannot read '1+'\n" in Chars().decode(traj.ids)


def test_the_staleness_of_an_episode_counts_from_its_first_sampled_token():
    llm = Scripted()

    class Step(ToolEnvironment):
        async def step(self, reply):
            llm.version += 1  # new weights arrive while the tool runs
            return await super().step(reply)

    env = calculator_env()
    env.__class__ = Step
    traj = asyncio.run(run_episode(env, PROBLEM, llm, Chars()))
    assert sorted({v for v, m in zip(traj.versions, traj.loss_mask) if m}) == [0, 1]
    assert traj.first_version == 0 and traj.staleness(consumer_version=2) == 2


def test_a_slow_tool_does_not_hold_other_episodes():
    """Episode A's tool blocks until episode B's second turn reaches the engine: A's tool only returns
    its result if B's turns ran while it was busy (else it gives up after 10 s and says so)."""
    release = threading.Event()

    @tool(timeout_s=20.0)
    def slow(x: str) -> str:
        """Slow."""
        return "9" if release.wait(10.0) else "never released"

    @tool
    def fast(x: str) -> str:
        """Fast."""
        return "9"

    class Engine(Scripted):
        async def generate(self, ids):
            text = Chars().decode(ids)
            if text.startswith("b") and "> " in text:
                release.set()  # B's second turn is at the engine while A's tool still waits
            name = "slow" if text.startswith("a") else "fast"
            reply = "9#" if "> " in text else f"{name}(1)#"
            return Sample(Chars().encode(reply), [-0.1] * len(reply), 0)

    envs = iter([ToolEnvironment(task=calculator_env().task, tools=(slow, fast)) for _ in range(2)])
    a, b = asyncio.run(run_episodes(lambda: next(envs), [Problem("a=", "9"), Problem("b=", "9")], Engine(), Chars()))
    assert "\n> 9\n" in Chars().decode(a.ids) and a.reward == 1.0 and b.reward == 1.0
    tool_a = next((s, e) for k, s, e in a.events if k == "tool")
    inside = [(s, e) for k, s, e in b.events if k == "generate" and s >= tool_a[0] and e <= tool_a[1]]
    assert inside and b.events[-1][2] <= tool_a[1]  # B's turns ran, and B ended, while A's call was busy


def test_a_hung_tool_times_out_into_an_observation():
    finish, returned = threading.Event(), threading.Event()

    @tool(timeout_s=0.2)
    def hang(x: str) -> str:
        """Never answers in time."""
        finish.wait(30.0)
        returned.set()
        return "late"

    class Engine(Scripted):
        async def generate(self, ids):
            reply = "ok#" if "> " in Chars().decode(ids) else "hang(1)#"
            return Sample(Chars().encode(reply), [-0.1] * len(reply), 0)

    try:
        [t] = asyncio.run(run_episodes(lambda: ToolEnvironment(task=calculator_env().task, tools=(hang,)),
                                       [PROBLEM], Engine(), Chars()))
        assert not returned.is_set()  # the episode ended while the tool's thread still waited
        assert "> error: hang timed out after 0.2 s\n" in Chars().decode(t.ids)
    finally:
        finish.set()


def test_a_custom_rollout_that_re_renders_history_is_split_or_refused():
    async def drifting(llm, problem):
        first = await llm.generate(Chars().encode(problem.prompt))
        history = problem.prompt + Chars().decode(first.ids).replace("#", "")  # drops the sampled end token
        await llm.generate(Chars().encode(history + "\n> 20126\n"))
        return 1.0

    parts = asyncio.run(run_rollout(drifting, PROBLEM, Scripted()))
    assert len(parts) == 2 and parts[-1].reward == 1.0 and parts[0].reward == 0.0
    assert Chars().decode(parts[1].ids[:parts[1].prompt_len]).endswith("> 20126\n")
    with pytest.raises(RpegError, match=r"differ at token 19 of 20"):
        asyncio.run(run_rollout(drifting, PROBLEM, Scripted(), on_broken_prefix="fail"))


def test_a_custom_rollout_is_checked_against_what_the_engine_sampled():
    async def honest(llm, problem):
        s = await llm.generate(Chars().encode(problem.prompt))
        t = Trajectory()
        t.add(Chars().encode(problem.prompt))
        t.prompt_len = 7
        t.add(s.ids, logprobs=s.logprobs, versions=[0] * len(s.ids))
        t.reward_last(0.5)
        return t

    async def forged(llm, problem):
        t = await honest(llm, problem)
        t.logprobs[-1] = -0.1
        return t

    [t] = asyncio.run(run_rollout(honest, PROBLEM, Scripted()))
    assert t.reward == 0.5
    with pytest.raises(RpegError, match="not what the engine sampled"):
        asyncio.run(run_rollout(forged, PROBLEM, Scripted()))
    async def wordy(llm, problem):
        await llm.generate(Chars().encode(problem.prompt))
        return "correct"

    with pytest.raises(RpegError, match="returned str; expected a reward"):
        asyncio.run(run_rollout(wordy, PROBLEM, Scripted()))
    with pytest.raises(RpegError, match="never called llm.generate"):
        asyncio.run(run_rollout(lambda llm, p: asyncio.sleep(0, 1.0), PROBLEM, Scripted()))


def test_trajectory_check_names_the_bad_token():
    t = Trajectory()
    t.add([1, 2])
    t.logprobs[1] = -1.0
    with pytest.raises(RpegError, match="token 1: loss_mask 0, logprob -1.0"):
        t.check()
    with pytest.raises(RpegError, match="before the model sampled"):
        Trajectory().reward_last(1.0)
    with pytest.raises(RpegError, match="'split' or 'fail'"):
        EpisodeLLM(Scripted(), on_broken_prefix="retry")
