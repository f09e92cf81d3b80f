"""Partial rollout's request pool (runtime/rollout.py SegmentPool): one engine call advances the running
sequences of every step in flight on the engine, each within its own budget, on the weights of the moment."""

from __future__ import annotations

from rpeg.runtime.rollout import InFlight, SamplingParams, SegmentPool

EOS = 0


class Scripted:
    """An engine whose row r samples r + 1 tokens (1, 2, ...) then <eos>: a sequence's length is fixed by its
    first token; every call is recorded (its prompts, max_new_tokens and seed)."""

    eos_id = EOS

    def __init__(self):
        self.version = 0
        self.calls: list[tuple[list[list[int]], int, int]] = []

    def generate(self, prompts, params, seed):
        self.calls.append((prompts, params.max_new_tokens, seed))
        out = []
        for p in prompts:
            length = p[0]  # the prompt says how long the response is
            have = len(p) - 1
            toks = [7] * max(0, length - have - 1) + [EOS]
            out.append(toks[:params.max_new_tokens])
        return out, [[-0.5] * len(t) for t in out]


def _flight(lengths: list[int], max_new: int = 8, segment: int = 2, seed: int = 0) -> InFlight:
    return InFlight([[n] for n in lengths], SamplingParams(max_new_tokens=max_new), seed, segment)


def test_one_call_advances_every_step_in_flight_and_each_keeps_its_own_budget():
    engine, pool = Scripted(), SegmentPool()
    first = pool.add(_flight([2, 6], segment=2))
    second = pool.add(_flight([3, 3, 3], max_new=1, segment=2))  # a budget of one token
    assert pool.advance(first, engine) is None  # the first's turn: both steps' five rows in one call
    (prompts, n, seed), = engine.calls
    assert len(prompts) == 5 and n == 2 and seed == 0  # the longest budget; the first flight's stream
    done = pool.advance(second, engine)  # its sequences reached max_new_tokens in that call: no call now
    assert len(engine.calls) == 1 and done is not None
    assert done.tokens == [[7], [7], [7]] and done.finished
    assert second not in pool.flights


def test_a_flight_continues_with_the_weights_of_each_call_and_records_its_calls():
    engine, pool = Scripted(), SegmentPool()
    key = pool.add(_flight([2, 6], segment=2))
    assert pool.advance(key, engine) is None
    engine.version = 1  # a weight update between two calls
    while (done := pool.advance(key, engine)) is None:
        pass
    assert done.tokens == [[7, EOS], [7] * 5 + [EOS]]
    assert done.versions == [[0, 0], [0, 0, 1, 1, 1, 1]]
    assert done.start_version == 0 and [c[2] for c in done.calls] == [2, 1, 1]  # rows of each call it led


def test_flights_that_sample_differently_are_not_batched_together():
    engine, pool = Scripted(), SegmentPool()
    sampled = pool.add(_flight([4]))
    pool.add(InFlight([[4]], SamplingParams(max_new_tokens=8, greedy=True), 0, 2))
    pool.advance(sampled, engine)
    assert len(engine.calls[0][0]) == 1
