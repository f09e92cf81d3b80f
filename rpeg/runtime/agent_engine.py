"""An engine behind `async generate(ids)`: the turns of many episodes, batched as they become ready.

Each episode (rpeg/tasks/episode.py) is a coroutine that asks for one reply at a time. Requests that
arrive while the engine is busy wait, and the next engine call takes up to `max_batch` of them
together: the `hf` engine's form of continuous batching. The hf engine decodes a call until its
longest reply ends, so every call costs a whole tail: a call waits for the episodes still running
(`run_episodes` reports them through `live`) to queue their turns, at most BATCH_WINDOW of the mean
engine call so far, rather than start with the first few whose tools came back (measured on the agent
demo: 2.6 calls a step for 2 turns without the wait). Concurrency is bounded per model request
(`max_batch`), not per episode: an episode waiting on a tool holds no engine slot. The engine runs on
a thread apart from the event loop, so the loop keeps serving tools and environments while it decodes:
by default a thread of its own; in a worker (`episodes_on`) the worker's own thread, with the event
loop on another (`OwnerThread` says why).

Every reply reports the weight version it was sampled with, so an episode's staleness is counted from
its first sampled token (`Trajectory.first_version`, `Episodes.versions`). Each engine call's span and
each episode's turns and tool calls come back too: the measured timeline draws them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rpeg.errors import RpegError
from rpeg.tasks.episode import Sample


# the longest a call waits for running episodes to queue their turns, as a share of the mean engine call
BATCH_WINDOW = 0.05


@dataclass
class BatchingLLM:
    engine: object  # generate(prompts, params, seed) -> (responses, logprobs); .version
    params: object  # the engine's SamplingParams, one per reply
    max_batch: int = 64
    seed: int = 0
    calls: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    # per engine call: start, end, the turns it batched, its longest reply (the hf engine decodes until it ends)
    spans: list[tuple[float, float, int, int]] = field(default_factory=list)
    # how a call reaches the engine: None, a thread of its own (asyncio.to_thread); else an async function
    # (prompts, params, seed) -> (responses, logprobs), e.g. OwnerThread.generate
    call: Callable | None = None
    _queue: list = field(default_factory=list)
    _worker: asyncio.Task | None = None
    _live: int = 0  # episodes running (run_episodes says): each either queued here or in its environment

    def live(self, change: int) -> None:
        self._live = max(0, self._live + change)

    def __post_init__(self) -> None:
        if type(self.max_batch) is not int or self.max_batch < 1:
            raise RpegError(f"max_batch must be a positive integer, got {self.max_batch!r}")

    async def generate(self, ids: list[int]) -> Sample:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((list(ids), fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await fut

    async def _gather(self) -> None:
        """Wait, at most BATCH_WINDOW of a mean call, until every running episode has queued its turn (or
        the queue fills a call): the episodes whose tools are still running would otherwise need a call of
        their own, a whole tail more."""
        if not self.spans:
            return
        deadline = time.time() + BATCH_WINDOW * sum(e - s for s, e, _, _ in self.spans) / len(self.spans)
        while len(self._queue) < min(self._live, self.max_batch) and time.time() < deadline:
            await asyncio.sleep(0.0005)

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # let every episode that is ready now put its turn in
        while self._queue:
            await self._gather()
            batch, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
            version = getattr(self.engine, "version", 0)
            seed = self.seed + 7919 * self.calls
            self.calls += 1
            self.batch_sizes.append(len(batch))
            start = time.time()
            try:
                prompts = [ids for ids, _ in batch]
                got = await (self.call(prompts, self.params, seed) if self.call is not None else
                             asyncio.to_thread(self.engine.generate, prompts, self.params, seed))
                out, lps = got[0], got[1]
                if len(got) > 2:  # the version the engine held when it served the call (OwnerThread)
                    version = got[2]
            except Exception as e:  # every episode in the batch sees the engine's failure
                self.spans.append((start, time.time(), len(batch), 0))
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            self.spans.append((start, time.time(), len(batch), max(map(len, out), default=0)))
            for (_, fut), o, lp in zip(batch, out, lps):
                if not fut.done():
                    fut.set_result(Sample(list(o), list(lp), version))
            await asyncio.sleep(0)  # the episodes just answered may queue their next turn at once


class OwnerThread:
    """Engine calls run on the thread that serves them (`serve`), the episodes' event loop elsewhere.

    Torch on a CPU runs its ops on an OpenMP team that belongs to the thread that first used it: the
    worker's main thread, which also trains. The same engine called from another thread gets a team of
    its own, and on 2 cores the two teams' spinning threads fight: measured on this machine, one hf
    call of 128 rows x 16 tokens of the tiny model took 0.083 s on the main thread, 0.16 s on a plain
    second thread and 0.26 s through asyncio.to_thread. So the loop goes to a thread and the engine stays."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls: queue.Queue = queue.Queue()

    async def generate(self, prompts, params, seed):
        """(responses, logprobs, the engine's weight version when it served the call)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.calls.put((prompts, params, seed, fut))
        return await asyncio.wrap_future(fut)

    def serve(self) -> None:
        """Run the calls as they come, on this thread, until `stop`."""
        while (item := self.calls.get()) is not None:
            self.serve_one(item)

    def serve_one(self, item) -> tuple[float, float, int, int] | None:
        """One queued call, on this thread: its span, rows and longest reply (None if it was cancelled)."""
        prompts, params, seed, fut = item
        if not fut.set_running_or_notify_cancel():
            return None
        start = time.time()
        try:
            version = getattr(self.engine, "version", 0)
            out, lps = self.engine.generate(prompts, params, seed)
            fut.set_result((out, lps, version))
        except BaseException as e:  # the episodes waiting on this call see the engine's failure
            fut.set_exception(e)
            return None
        return start, time.time(), len(prompts), max(map(len, out), default=0)

    def stop(self) -> None:
        self.calls.put(None)

    def run(self, coroutine):
        """`asyncio.run(coroutine)` on a thread of its own while this thread serves its engine calls."""
        result: dict = {}

        def loop() -> None:
            try:
                result["value"] = asyncio.run(coroutine)
            except BaseException as e:
                result["error"] = e
            finally:
                self.stop()

        thread = threading.Thread(target=loop, name="rpeg-episodes", daemon=True)
        thread.start()
        self.serve()
        thread.join()
        if "error" in result:
            raise result["error"]
        return result["value"]


@dataclass(frozen=True)
class EnvSpec:
    """What a worker needs to build an episode's environment: its registered name, the task, options."""

    name: str
    task: object
    options: tuple = ()  # sorted (key, value) pairs
    chat: bool = False  # runtime.chat: episodes in the tokenizer's chat template (TemplateFormat)

    def factory(self, tokenizer=None):
        """Fresh environments; with `chat` and a tokenizer, each renders its episode in the tokenizer's chat
        template and reads Qwen/Hermes `<tool_call>` JSON (without a tokenizer: to check the options only)."""
        from rpeg.tasks import get_environment

        make = get_environment(self.name, self.task, **dict(self.options))
        if not (self.chat and tokenizer is not None):
            return make
        from rpeg.tasks.chat import TemplateFormat

        fmt = TemplateFormat(tokenizer)

        def chat_env():
            env = make()
            env.format = fmt
            return env

        return chat_env


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
    # calls as (start, end, turns batched, longest reply)
    events: list[list[tuple[str, float, float]]] = field(default_factory=list)
    engine_calls: list[tuple[float, float, int, int]] = field(default_factory=list)
    # per response token, the rewards earned there: each turn's on its last sampled token, the outcome on the last
    token_rewards: list[list[float]] = field(default_factory=list)


def episodes_on(engine, tok, problems: list, spec: EnvSpec, params, seed: int, max_batch: int = 256) -> Episodes:
    """Run one episode per problem on `engine` (all at once, their turns batched); tools on threads."""
    from rpeg.tasks.episode import HFCodec, run_episodes

    owner = OwnerThread(engine)  # the engine runs here, on the worker's own thread; the episodes' loop beside it
    llm = BatchingLLM(engine, params, max_batch=max_batch, seed=seed, call=owner.generate)
    trajs = owner.run(run_episodes(spec.factory(tok), problems, llm, HFCodec(tok)))
    return _packed(trajs, list(llm.spans))


def _packed(trajs: list, calls: list) -> Episodes:
    for t in trajs:
        t.check()
    return Episodes([t.ids[:t.prompt_len] for t in trajs], [t.ids[t.prompt_len:] for t in trajs],
                    [t.logprobs[t.prompt_len:] for t in trajs], [t.loss_mask[t.prompt_len:] for t in trajs],
                    [t.reward for t in trajs], [t.outcome for t in trajs], [t.turns for t in trajs],
                    [t.tool_calls for t in trajs], [t.first_version for t in trajs], [list(t.events) for t in trajs],
                    calls, [t.rewards[t.prompt_len:] for t in trajs])


class EpisodePool:
    """Partial rollout with episodes: the episodes of every step launched on a worker run on one event loop
    that lives as long as the worker (a thread of its own); their turns, of whichever step, are batched
    by one BatchingLLM per sampling setting; the engine serves one call per turn of the worker's queue,
    on the worker's own thread (OwnerThread says why), so a weight update enters between two calls and an
    episode's later replies are sampled by the newer weights. The request-level pool of
    rollout.SegmentPool, for episodes."""

    def __init__(self, engine, tok, max_batch: int = 256) -> None:
        self.engine, self.tok, self.max_batch = engine, tok, max_batch
        self.owner = OwnerThread(engine)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="rpeg-episode-pool", daemon=True).start()
        self.llms: dict[tuple, BatchingLLM] = {}
        # key -> (the episodes' future, the engine calls its turns served, when it started)
        self.flights: dict[int, tuple[concurrent.futures.Future, list, float]] = {}
        self._keys = itertools.count()

    def add(self, problems: list, spec: EnvSpec, params, seed: int) -> int:
        """Start one episode per problem on the pool's loop: the flight's key."""
        from rpeg.tasks.episode import HFCodec, run_episodes

        kind = (params.max_new_tokens, params.temperature, params.greedy)
        llm = self.llms.get(kind)
        if llm is None:
            llm = self.llms[kind] = BatchingLLM(self.engine, params, max_batch=self.max_batch, seed=seed,
                                                call=self.owner.generate)
        coroutine = run_episodes(spec.factory(self.tok), problems, llm, HFCodec(self.tok))
        key = next(self._keys)
        self.flights[key] = (asyncio.run_coroutine_threadsafe(coroutine, self.loop), [], time.time())
        return key

    def turn(self, key: int, wait_s: float = 0.05) -> tuple[Episodes, list[list[int]], float] | None:
        """Flight `key`'s turn: unless its episodes are done, serve the first engine call the loop queues
        within `wait_s` (any step's turns; none when every episode waits on a tool). Then, taken out of the
        pool if they are done, the flight's episodes, each sampled token's version and when the flight
        started; else None."""
        done, calls, started = self.flights[key]
        if not done.done():
            try:
                item = self.owner.calls.get(timeout=wait_s)
            except queue.Empty:
                item = None
            span = self.owner.serve_one(item) if item is not None else None
            if span is not None:
                calls.append(span)
        if not done.done():
            return None
        del self.flights[key]
        trajs = done.result()  # an episode's error is the flight's
        versions = [[v for v, m in zip(t.versions, t.loss_mask) if m] for t in trajs]  # sampled tokens only
        return _packed(trajs, calls), versions, started
