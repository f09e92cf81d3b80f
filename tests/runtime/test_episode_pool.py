"""Partial rollout with episodes (agent_engine.EpisodePool): the episodes of several launched steps on one
event loop, their turns served one engine call per turn of the worker's queue, a weight update between
two calls taken by the replies that come after it."""

from __future__ import annotations

import threading

from rpeg.runtime.agent_engine import EnvSpec, EpisodePool
from rpeg.runtime.models import build_tiny, load
from rpeg.runtime.rollout import SamplingParams
from rpeg.tasks.arithmetic import Arithmetic
from rpeg.tasks.base import Problem

SPEC = EnvSpec("calculator", Arithmetic(level=1, ops=("mul",)), (("max_turns", 2),))


class Scripted:
    """Calls the calculator first, then answers what it said; records each call's rows and thread."""

    def __init__(self, tok):
        self.tok, self.version, self.rows, self.threads = tok, 0, [], set()

    def generate(self, prompts, params, seed):
        self.rows.append(len(prompts))
        self.threads.add(threading.get_ident())
        out = [self.tok.encode("calc(2*3)" if ">" not in self.tok.decode(p) else "6") + [self.tok.eos_token_id]
               for p in prompts]
        return out, [[-0.5] * len(o) for o in out]


def test_two_steps_episodes_share_the_pool_and_later_replies_take_newer_weights(tmp_path):
    _, tok = load(build_tiny(str(tmp_path / "tiny")))
    engine = Scripted(tok)
    pool = EpisodePool(engine, tok)
    params = SamplingParams(max_new_tokens=12)
    first = pool.add([Problem("2*3=", "6")] * 3, SPEC, params, seed=0)
    second = pool.add([Problem("2*3=", "6")] * 2, SPEC, params, seed=1)
    done: dict[int, tuple] = {}
    turns = 0
    while len(done) < 2:  # the worker's queue: the two steps' turns alternate, a weight update after each
        for key in (first, second):
            if key not in done and (got := pool.turn(key, wait_s=1.0)) is not None:
                done[key] = got
            engine.version += 1
        turns += 1
        assert turns < 20
    assert sum(engine.rows) == 5 * 2 and engine.threads == {threading.get_ident()}  # served here, every turn
    for key, n in ((first, 3), (second, 2)):
        ep, versions, _ = done[key]
        assert ep.turns == [2] * n and ep.outcomes == [1.0] * n and ep.tool_calls == [1] * n
        calls = len(tok.encode("calc(2*3)")) + 1
        for v, mask, start in zip(versions, ep.loss_masks, ep.versions):
            # the call's tokens on the weights of its call, the answer's on the newer ones of a later call
            assert len(v) == sum(mask) and v[:calls] == [start] * calls
            assert len(set(v[calls:])) == 1 and v[-1] > start  # staleness counts from the first token, the older
    assert not pool.flights
