"""Multi-turn episodes, token in and token out: what the model sampled is what the trainer scores.

An episode alternates the model's replies with the environment's observations. Its `Trajectory`
is one token sequence with, per token:

    loss_mask  1 where the engine sampled the token, 0 on the opening and on every observation token
    logprobs   the behaviour logprob of a sampled token (0.0 elsewhere)
    versions   the weight version that sampled it (-1 elsewhere): an episode's staleness is counted
               from its first sampled token's version, as partial rollout keeps them
    rewards    a turn's reward on that turn's last sampled token; the outcome on the last one

The sampled ids are kept verbatim; an observation is tokenized alone and appended, and earlier turns
are never rendered again, so the chat-history drift of re-tokenizing (verl #6854, slime #2263) cannot
happen. Every call to the engine is checked against the prefix invariant: its input must be the
episode so far plus new (observation) tokens. A custom `rollout(llm, problem)` that breaks it starts
a new training sample at that call (`on_broken_prefix="split"`) or fails with the first differing
position (`"fail"`); tokens that drifted are never trained on.

    trajectories = asyncio.run(run_episodes(make_env, problems, llm, codec))

`llm` is any object with `async generate(ids) -> Sample` (runtime/agent_engine.py batches an engine's
ready turns behind it; an `llm` with `live(change)` is told how many episodes are running); `codec`
has `encode(text) -> ids` and `decode(ids) -> text`.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from rpeg.errors import RpegError
from rpeg.tasks.base import Problem
from rpeg.tasks.environment import Environment, Step


@dataclass(frozen=True, slots=True)
class Sample:
    ids: list[int]
    logprobs: list[float]
    version: int  # the weights that sampled them (an engine updated mid-reply reports per token: see `versions`)
    versions: list[int] | None = None


class AsyncLLM(Protocol):
    async def generate(self, ids: list[int]) -> Sample: ...


class Codec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class HFCodec:
    """A Hugging Face tokenizer as a codec: no special tokens added, special tokens kept on decode."""

    tokenizer: Any

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)


@dataclass
class Trajectory:
    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    prompt_len: int = 0  # the opening's tokens
    turns: int = 0  # replies sampled
    truncated: bool = False  # ended by max_turns or max_context rather than by the environment
    outcome: float = 0.0  # the reward of the step that ended the episode (0 when truncated): accuracy reads it
    tool_calls: int = 0  # the environment's count of successful tool calls, where it keeps one
    events: list[tuple[str, float, float]] = field(default_factory=list)  # (generate | tool | environment, start, end)

    def add(self, ids: Sequence[int], *, logprobs: Sequence[float] | None = None,
            versions: Sequence[int] | None = None) -> None:
        """Append `ids`: sampled ones when `logprobs` is given, else opening or observation tokens."""
        ids = list(ids)
        sampled = logprobs is not None
        if sampled and (len(logprobs) != len(ids) or versions is None or len(versions) != len(ids)):
            raise RpegError(f"a sample of {len(ids)} tokens came with {len(logprobs)} logprobs and "
                            f"{None if versions is None else len(versions)} versions")
        self.ids += ids
        self.loss_mask += [int(sampled)] * len(ids)
        self.logprobs += list(logprobs) if sampled else [0.0] * len(ids)
        self.versions += list(versions) if sampled else [-1] * len(ids)
        self.rewards += [0.0] * len(ids)

    def reward_last(self, reward: float) -> None:
        """Add `reward` on the last sampled token (a turn's reward, or the outcome at the end)."""
        last = max((i for i, m in enumerate(self.loss_mask) if m), default=None)
        if last is None:
            raise RpegError("a reward arrived before the model sampled any token")
        self.rewards[last] += float(reward)

    @property
    def reward(self) -> float:
        return sum(self.rewards)

    @property
    def first_version(self) -> int:
        """The weights of the first sampled token: the episode's staleness counts from it."""
        return next((v for v, m in zip(self.versions, self.loss_mask) if m), -1)

    def staleness(self, consumer_version: int) -> int:
        return consumer_version - self.first_version

    def check(self) -> None:
        """The per-token lists agree, and no token outside a sample carries a logprob or version."""
        n = len(self.ids)
        lengths = {len(x) for x in (self.loss_mask, self.logprobs, self.versions, self.rewards)}
        if lengths != {n}:
            raise RpegError(f"trajectory of {n} tokens has per-token lists of lengths {sorted(lengths)}")
        for i, (m, lp, v) in enumerate(zip(self.loss_mask, self.logprobs, self.versions)):
            if m not in (0, 1) or (not m and (lp != 0.0 or v != -1)) or (m and v < 0):
                raise RpegError(f"token {i}: loss_mask {m}, logprob {lp}, version {v} (an unsampled token "
                                f"carries no logprob or version; a sampled one has a version >= 0)")
        if any(self.loss_mask[:self.prompt_len]):
            raise RpegError(f"the opening's {self.prompt_len} tokens are masked in: prompts never enter the loss")


class EpisodeLLM:
    """One episode's handle on the shared engine: records every call, checks the prefix invariant."""

    def __init__(self, llm: AsyncLLM, *, max_context: int | None = None, on_broken_prefix: str = "split"):
        if on_broken_prefix not in ("split", "fail"):
            raise RpegError(f"on_broken_prefix must be 'split' or 'fail', got {on_broken_prefix!r}")
        self.llm, self.max_context, self.on_broken_prefix = llm, max_context, on_broken_prefix
        self.finished: list[Trajectory] = []  # samples closed by a broken prefix
        self.current = Trajectory()

    async def generate(self, ids: Sequence[int]) -> Sample:
        ids = list(ids)
        t = self.current
        if not t.ids:
            t.add(ids)
            t.prompt_len = len(ids)
        elif ids[:len(t.ids)] == t.ids:
            t.add(ids[len(t.ids):])  # the observation since the last reply
        else:
            at = next((i for i, (a, b) in enumerate(zip(ids, t.ids)) if a != b), min(len(ids), len(t.ids)))
            why = (f"the engine was called with a context that is not the episode so far plus new tokens: they "
                   f"differ at token {at} of {len(t.ids)} (had {t.ids[at:at + 4]}, got {ids[at:at + 4]})")
            if self.on_broken_prefix == "fail":
                raise RpegError(why + "; re-rendering earlier turns changed their tokens (keep the sampled ids)")
            self.finished.append(t)
            self.current = t = Trajectory()
            t.add(ids)
            t.prompt_len = len(ids)
        start = time.time()  # wall clock: the measured timeline sets these beside the driver's records
        s = await self.llm.generate(t.ids)
        t.events.append(("generate", start, time.time()))
        t.add(s.ids, logprobs=s.logprobs, versions=s.versions or [s.version] * len(s.ids))
        t.turns += 1
        return s

    @property
    def full(self) -> bool:
        return self.max_context is not None and len(self.current.ids) >= self.max_context

    def trajectories(self) -> list[Trajectory]:
        return [t for t in self.finished + [self.current] if any(t.loss_mask)]


async def _step(env: Environment, reply: str, pool) -> Step:
    if inspect.iscoroutinefunction(env.step):
        out = await env.step(reply)
    else:
        out = await asyncio.get_running_loop().run_in_executor(pool, env.step, reply)
    if not isinstance(out, Step):
        raise RpegError(f"{type(env).__name__}.step returned {type(out).__name__}, expected "
                        f"Step(observation, reward, done)")
    return out


def _tried(env: Environment) -> int:
    """The tool calls an environment has run this episode, successful or not (0 where it counts none)."""
    return getattr(env, "calls", 0) + getattr(env, "failed_calls", 0)


async def run_episode(env: Environment, problem: Problem, llm: AsyncLLM, codec: Codec, *,
                      pool=None, max_context: int | None = None) -> Trajectory:
    """One episode of `env` on `problem`: reply, observe, until done, `max_turns` or `max_context`."""
    env.pool = pool
    handle = EpisodeLLM(llm, max_context=max_context, on_broken_prefix="fail")
    messages = env.reset(problem)
    context = codec.encode(env.format.opening(messages, env.tools))
    traj = handle.current
    for turn in range(env.max_turns):
        sample = await handle.generate(context)
        start, tried = time.time(), _tried(env)
        step = await _step(env, codec.decode(sample.ids), pool)
        traj.tool_calls = getattr(env, "calls", 0)
        # a step that ran a tool (the environment counts its calls) is drawn as a tool call
        traj.events.append(("tool" if _tried(env) > tried else "environment", start, time.time()))
        traj.reward_last(step.reward)
        if step.done:
            traj.outcome = step.reward
            return traj
        if turn == env.max_turns - 1 or handle.full:
            break
        context = traj.ids + codec.encode(env.format.observation(step.observation or []))
    traj.truncated = True
    return traj


async def run_rollout(rollout: Callable[[EpisodeLLM, Problem], Awaitable[Any]], problem: Problem,
                      llm: AsyncLLM, **handle) -> list[Trajectory]:
    """A user's `async rollout(llm, problem)`: the samples its calls recorded, with the reward it
    returns (a number: the outcome, on the last sample's last token) or the trajectory it returns,
    checked against what the engine sampled."""
    h = EpisodeLLM(llm, **handle)
    out = await rollout(h, problem)
    recorded = h.trajectories()
    if not recorded:
        raise RpegError(f"rollout {getattr(rollout, '__name__', rollout)!r} never called llm.generate")
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        recorded[-1].reward_last(out)
    elif isinstance(out, Trajectory):
        mine = recorded[-1]
        sampled = [(i, x, lp) for i, (x, m, lp) in enumerate(zip(mine.ids, mine.loss_mask, mine.logprobs)) if m]
        theirs = [(i, x, lp) for i, (x, m, lp) in enumerate(zip(out.ids, out.loss_mask, out.logprobs)) if m]
        if out.ids[:len(mine.ids)] != mine.ids or sampled != theirs:
            raise RpegError("the trajectory the rollout returned is not what the engine sampled (its ids, loss mask "
                            "or logprobs differ); return the reward instead and RPEG keeps the tokens")
        out.check()
        recorded[-1] = out
    else:
        raise RpegError(f"rollout returned {type(out).__name__}; expected a reward (number) or a Trajectory")
    for t in recorded:
        t.check()
    return recorded


async def run_episodes(make_env: Callable[[], Environment], problems: Sequence[Problem], llm: AsyncLLM,
                       codec: Codec, *, tool_threads: int = 8, max_context: int | None = None) -> list[Trajectory]:
    """Every problem's episode at once, each its own coroutine; tools and plain `step`s on a shared pool
    of `tool_threads` threads, so one episode's slow tool holds no other episode's turn."""
    pool = ThreadPoolExecutor(tool_threads, thread_name_prefix="rpeg-tool")
    live = getattr(llm, "live", None)  # an engine that batches turns may wait for the episodes it knows still run

    async def one(p: Problem) -> Trajectory:
        try:
            return await run_episode(make_env(), p, llm, codec, pool=pool, max_context=max_context)
        finally:
            if live is not None:
                live(-1)

    if live is not None:
        live(len(problems))
    try:
        return list(await asyncio.gather(*(one(p) for p in problems)))
    finally:  # a timed-out tool's thread may still run: do not wait for it
        pool.shutdown(wait=False, cancel_futures=True)
