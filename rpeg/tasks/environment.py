"""Environments: one instance per episode, `reset(problem)` then `step(reply)` until done.

    reset(problem) -> the opening messages
    step(reply)    -> Step(observation messages | None, reward, done)

`step` may be a coroutine (`async def`); a plain one runs on the episode's thread pool, off the event
loop. An episode ends when `step` says done or after `max_turns` replies, whichever comes first.

`ToolEnvironment` is the common case: a task with tools. A reply that calls tools gets their results
as the observation (each call on the thread pool, with its timeout; a bad call or a failing tool is
an `error: ...` observation, never a crashed run); a reply that calls none is the answer, scored by
the task's verifiable reward. `tool_reward` is added per successful call (0 by default: outcome
reward only).
"""

from __future__ import annotations

import asyncio
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from rpeg.errors import RpegError
from rpeg.tasks.base import Problem, Task
from rpeg.tasks.chat import ChatFormat, Message, PlainFormat
from rpeg.tasks.tools import Tool, call


@dataclass(frozen=True, slots=True)
class Step:
    observation: list[Message] | None
    reward: float = 0.0
    done: bool = False


class Environment(ABC):
    """What an agent task provides. Subclasses set `tools`, `max_turns` and `format`."""

    tools: tuple[Tool, ...] = ()
    max_turns: int = 4
    format: ChatFormat = PlainFormat()
    pool: Executor | None = None  # the episode runner sets its thread pool here before reset

    @abstractmethod
    def reset(self, problem: Problem) -> list[Message]:
        """The opening messages of an episode on `problem`."""

    @abstractmethod
    def step(self, reply: str) -> Step:
        """The environment's answer to the model's `reply` (may be `async def`)."""

    def demonstration(self, problem: Problem, rng: random.Random) -> list[tuple[str | None, bool]]:
        """A supervised warm-up's example episode after the opening: (text, trained) segments, text None
        for the end token; untrained segments are observations. Default: the bare answer."""
        return [(problem.answer, True), (None, True)]


@dataclass
class ToolEnvironment(Environment):
    """A task whose model may call `tools` before it answers."""

    task: Task
    tools: tuple[Tool, ...] = ()
    max_turns: int = 4
    format: ChatFormat = field(default_factory=PlainFormat)
    system: str | None = None  # a system message (instruct models), e.g. how to call the tools
    tool_reward: float = 0.0
    # the warm-up's demonstrations: this share calls a tool (`demo_call(problem)` -> (the tool's name, its
    # arguments, its result), written as `format` writes a call) and then answers; the rest answer directly
    warmup_tool_share: float = 0.0
    demo_call: Callable[[Problem], tuple[str, dict, str]] | None = None
    problem: Problem | None = None
    calls: int = 0  # successful tool calls this episode
    failed_calls: int = 0

    def __post_init__(self) -> None:
        if type(self.max_turns) is not int or self.max_turns < 1:
            raise RpegError(f"max_turns must be a positive integer, got {self.max_turns!r}")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise RpegError(f"two tools share a name: {sorted(n for n in names if names.count(n) > 1)[0]!r}")
        self.tools = tuple(self.tools)
        if not 0.0 <= self.warmup_tool_share <= 1.0:
            raise RpegError(f"warmup_tool_share must be in [0, 1], got {self.warmup_tool_share!r}")
        if self.warmup_tool_share and self.demo_call is None:
            raise RpegError("warmup_tool_share > 0 needs demo_call: how a demonstration calls the tool")

    def demonstration(self, problem: Problem, rng: random.Random) -> list[tuple[str | None, bool]]:
        if self.demo_call is None or rng.random() >= self.warmup_tool_share:
            return super().demonstration(problem, rng)
        name, arguments, result = self.demo_call(problem)
        call_text = self.format.call(name, arguments)
        observation = self.format.observation([{"role": "tool", "name": name, "content": result}])
        return [(call_text, True), (None, True), (observation, False), (problem.answer, True), (None, True)]

    def reset(self, problem: Problem) -> list[Message]:
        self.problem, self.calls, self.failed_calls = problem, 0, 0
        opening = [{"role": "user", "content": problem.prompt}]
        return ([{"role": "system", "content": self.system}] if self.system else []) + opening

    async def step(self, reply: str) -> Step:
        if self.problem is None:
            raise RpegError("step() before reset(): an environment serves one episode, reset it first")
        wanted = self.format.tool_calls(reply, self.tools)
        if not wanted:
            return Step(None, self.task.reward(self.problem, reply), True)
        by_name = {t.name: t for t in self.tools}

        async def one(c) -> tuple[str, bool]:
            if c.error:
                return f"error: {c.error}", False
            return await call(by_name[c.name], c.arguments, self.pool)

        results = await asyncio.gather(*(one(c) for c in wanted))
        ok = sum(good for _, good in results)
        self.calls += ok
        self.failed_calls += len(results) - ok
        return Step([{"role": "tool", "name": c.name, "content": text} for c, (text, _) in zip(wanted, results)],
                    self.tool_reward * ok, False)
