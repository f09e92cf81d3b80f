"""An engine behind `async generate(ids)`: the turns of many episodes, batched as they become ready.

Each episode (rpeg/tasks/episode.py) is a coroutine that asks for one reply at a time. Requests that
arrive while the engine is busy wait, and the next engine call takes up to `max_batch` of them
together: the `hf` engine's form of continuous batching. Concurrency is bounded per model request
(`max_batch`), not per episode: an episode waiting on a tool holds no engine slot. The engine runs on
a thread of its own, so the event loop keeps serving tools and environments while it decodes.

Every reply reports the weight version it was sampled with, so an episode's staleness is counted from
its first sampled token (`Trajectory.first_version`, `Episodes.versions`). Each engine call's span and
each episode's turns and tool calls come back too: the measured timeline draws them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from rpeg.errors import RpegError
from rpeg.tasks.episode import Sample


@dataclass
class BatchingLLM:
    engine: object  # generate(prompts, params, seed) -> (responses, logprobs); .version
    params: object  # the engine's SamplingParams, one per reply
    max_batch: int = 64
    seed: int = 0
    calls: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    spans: list[tuple[float, float, int]] = field(default_factory=list)  # per engine call: start, end, turns
    _queue: list = field(default_factory=list)
    _worker: asyncio.Task | None = None

    def __post_init__(self) -> None:
        if type(self.max_batch) is not int or self.max_batch < 1:
            raise RpegError(f"max_batch must be a positive integer, got {self.max_batch!r}")

    async def generate(self, ids: list[int]) -> Sample:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((list(ids), fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # let every episode that is ready now put its turn in
        while self._queue:
            batch, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
            version = getattr(self.engine, "version", 0)
            seed = self.seed + 7919 * self.calls
            self.calls += 1
            self.batch_sizes.append(len(batch))
            start = time.time()
            try:
                out, lps = await asyncio.to_thread(self.engine.generate, [ids for ids, _ in batch], self.params, seed)
            except Exception as e:  # every episode in the batch sees the engine's failure
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            finally:
                self.spans.append((start, time.time(), len(batch)))
            for (_, fut), o, lp in zip(batch, out, lps):
                if not fut.done():
                    fut.set_result(Sample(list(o), list(lp), version))
            await asyncio.sleep(0)  # the episodes just answered may queue their next turn at once


@dataclass(frozen=True)
class EnvSpec:
    """What a worker needs to build an episode's environment: its registered name, the task, options."""

    name: str
    task: object
    options: tuple = ()  # sorted (key, value) pairs

    def factory(self):
        from rpeg.tasks import get_environment

        return get_environment(self.name, self.task, **dict(self.options))


@dataclass(frozen=True)
class Episodes:
    """A worker's episodes, one per problem: each opening (prompt) and what followed it, per token."""

    openings: list[list[int]]
    responses: list[list[int]]  # everything after the opening: sampled and observation tokens
    logprobs: list[list[float]]  # per response token (0.0 on observation tokens)
    loss_masks: list[list[int]]  # per response token: 1 where sampled
    rewards: list[float]  # each episode's total (turn rewards and outcome)
    outcomes: list[float]  # the reward of the step that ended it (0 when cut by max_turns)
    turns: list[int]
    tool_calls: list[int]
    versions: list[int]  # the weights of each episode's first sampled token: its staleness counts from them
    # the timeline (wall clock): per episode its (generate | tool | environment, start, end) events; the engine's
    # calls as (start, end, turns batched)
    events: list[list[tuple[str, float, float]]] = field(default_factory=list)
    engine_calls: list[tuple[float, float, int]] = field(default_factory=list)


def episodes_on(engine, tok, problems: list, spec: EnvSpec, params, seed: int, max_batch: int = 256) -> Episodes:
    """Run one episode per problem on `engine` (all at once, their turns batched); tools on threads."""
    from rpeg.tasks.episode import HFCodec, run_episodes

    llm = BatchingLLM(engine, params, max_batch=max_batch, seed=seed)
    trajs = asyncio.run(run_episodes(spec.factory(), problems, llm, HFCodec(tok)))
    for t in trajs:
        t.check()
    return Episodes([t.ids[:t.prompt_len] for t in trajs], [t.ids[t.prompt_len:] for t in trajs],
                    [t.logprobs[t.prompt_len:] for t in trajs], [t.loss_mask[t.prompt_len:] for t in trajs],
                    [t.reward for t in trajs], [t.outcome for t in trajs], [t.turns for t in trajs],
                    [t.tool_calls for t in trajs], [t.first_version for t in trajs], [list(t.events) for t in trajs],
                    list(llm.spans))
