"""The batching engine behind episodes: ready turns go together, failures reach every episode, and the
tiny model runs calculator episodes end to end with correct masks."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rpeg.runtime.agent_engine import BatchingLLM
from rpeg.runtime.models import build_tiny, load
from rpeg.runtime.rollout import HFEngine, SamplingParams
from rpeg.tasks import Problem
from rpeg.tasks.calculator import calculator_env
from rpeg.tasks.episode import HFCodec, run_episodes


class Echo:
    """A synchronous engine: replies with its prompt's last token, records each batch and its thread."""

    version = 3

    def __init__(self, fail=False):
        self.batches, self.threads, self.fail = [], set(), fail

    def generate(self, prompts, params, seed):
        self.batches.append(len(prompts))
        self.threads.add(threading.get_ident())
        time.sleep(0.02)
        if self.fail:
            raise RuntimeError("device lost")
        return [[p[-1]] for p in prompts], [[-1.0] for _ in prompts]


def test_ready_turns_are_batched_up_to_max_batch_off_the_event_loop():
    engine = Echo()
    llm = BatchingLLM(engine, SamplingParams(), max_batch=4)

    async def go():
        return await asyncio.gather(*(llm.generate([i, i + 1]) for i in range(10)))

    out = asyncio.run(go())
    assert [s.ids for s in out] == [[i + 1] for i in range(10)] and {s.version for s in out} == {3}
    assert engine.batches == [4, 4, 2] and threading.get_ident() not in engine.threads


def test_an_engine_failure_reaches_every_waiting_episode():
    llm = BatchingLLM(Echo(fail=True), SamplingParams(), max_batch=8)

    async def go():
        return await asyncio.gather(*(llm.generate([1]) for _ in range(3)), return_exceptions=True)

    assert [str(e) for e in asyncio.run(go())] == ["device lost"] * 3
    with pytest.raises(Exception, match="max_batch must be a positive integer"):
        BatchingLLM(Echo(), SamplingParams(), max_batch=0)


def test_tiny_model_runs_calculator_episodes_token_in_token_out(tmp_path):
    model, tok = load(build_tiny(str(tmp_path / "tiny")))
    engine = HFEngine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    llm = BatchingLLM(engine, SamplingParams(max_new_tokens=12), max_batch=8, seed=1)
    codec = HFCodec(tok)
    problems = [Problem(f"{a}*{b}=", str(a * b)) for a, b in ((347, 58), (12, 910), (555, 3), (70, 71))]
    trajs = asyncio.run(run_episodes(calculator_env, problems, llm, codec))
    assert llm.batch_sizes[0] == 4  # the four openings went to the engine together
    for p, t in zip(problems, trajs):
        t.check()
        assert codec.decode(t.ids[:t.prompt_len]) == p.prompt and not any(t.loss_mask[:t.prompt_len])
        assert 1 <= t.turns <= 3 and sum(t.loss_mask) >= t.turns
        assert all(v == 0 for v, m in zip(t.versions, t.loss_mask) if m)


def test_an_episode_counts_its_staleness_from_its_first_sampled_token(tmp_path):
    """Weights that change between an episode's turns leave its version at its first reply's."""
    from rpeg.runtime.agent_engine import EnvSpec, episodes_on
    from rpeg.tasks.arithmetic import Arithmetic

    _, tok = load(build_tiny(str(tmp_path / "tiny")))

    class Updating(Echo):
        """Calls the tool first, then answers; its weights move on after every call."""

        version = 5

        def generate(self, prompts, params, seed):
            self.batches.append(len(prompts))
            self.version += 1
            out = [tok.encode("calc(2*3)" if ">" not in tok.decode(p) else "6") + [tok.eos_token_id] for p in prompts]
            return out, [[-0.5] * len(o) for o in out]

    engine = Updating()
    spec = EnvSpec("calculator", Arithmetic(level=1, ops=("mul",)), (("max_turns", 2),))
    ep = episodes_on(engine, tok, [Problem("2*3=", "6")] * 3, spec, SamplingParams(max_new_tokens=8), seed=0)
    assert engine.batches == [3, 3] and engine.version == 7  # two calls, three episodes each
    assert ep.versions == [5, 5, 5] and ep.turns == [2, 2, 2] and ep.tool_calls == [1, 1, 1]
    assert [[k for k, _, _ in e] for e in ep.events] == [["generate", "tool", "generate", "environment"]] * 3
    assert [(n, longest) for _, _, n, longest in ep.engine_calls] == [(3, 10), (3, 2)]  # calc(2*3) + eos; 6 + eos
    assert all(s <= e for s, e, _, _ in ep.engine_calls)


def test_a_call_waits_briefly_for_running_episodes_to_queue_their_turns():
    """After the first call, a turn that arrives within BATCH_WINDOW of a mean call joins the next call
    instead of needing one of its own; one that arrives later does not hold the call."""

    class Slow(Echo):
        def generate(self, prompts, params, seed):
            time.sleep(0.2)
            return super().generate(prompts, params, seed)

    async def episodes(llm, delays):
        async def one(i, delay):
            await llm.generate([i])
            await asyncio.sleep(delay)  # its tool
            await llm.generate([i, i])

        llm.live(len(delays))
        await asyncio.gather(*(one(i, d) for i, d in enumerate(delays)))

    prompt = Slow()
    asyncio.run(episodes(BatchingLLM(prompt, SamplingParams()), [0.0, 0.003]))
    late = Slow()
    asyncio.run(episodes(BatchingLLM(late, SamplingParams()), [0.0, 0.5]))
    assert prompt.batches == [2, 2] and late.batches == [2, 1, 1]
