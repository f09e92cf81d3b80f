"""RPEG's hf engine under partial rollout (perf/static_engine.py simulate_segmented): segment calls over the
sequences of every step in flight, each prefilling every context again, steps launched as the bound allows."""

from __future__ import annotations

import pytest

from rpeg.graph import LengthDistribution as Dist
from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import get_model
from rpeg.hardware import load_cluster
from rpeg.perf import static_engine
from rpeg.perf.generation import GenWorkload, engine_max_seqs, generation_cost, response_lengths
from rpeg.perf.static_engine import segment_tokens, simulate_segmented, simulate_static

SMALL = get_model("qwen2.5-1.5B")
H100 = load_cluster("dgx-h100")
STATIC = Layout(static_batch=True)


def _calls(monkeypatch) -> list[float]:
    """The rows of each simulated call (a wave each), recorded through its prefill."""
    seen: list[float] = []
    real = static_engine.prefill_s
    monkeypatch.setattr(static_engine, "prefill_s", lambda *a: seen.append(a[-1]) or real(*a))
    return seen


def test_the_second_step_joins_at_its_own_first_turn_and_the_pair_drains_together(monkeypatch):
    # the runtime's pattern, measured (benchmarks/partial_rollout_engine.py, 256 rows a step, k = 1): the
    # first step's turn alone, then both steps' rows, and the pair's tail; then the next pair the same way
    seen = _calls(monkeypatch)
    lengths = [2.0] * 6 + [8.0] * 2  # 8 sequences a step; segments of 2: the short ones end in one call
    simulate_simple = simulate_segmented(SMALL, STATIC, H100, n=8, prompt=100, lengths=lengths, segment=2, ahead=1,
                                         periods=1)
    # step 0 alone (8), step 1 joins (8 + step 0's 2 still running), the two long ones of each (4, 4); step 0's
    # turn finds it finished and returns without a call (step 2 launched); step 1's last 2 alone
    assert seen[:5] == [8, 10, 4, 4, 2]
    assert seen[5:10] == [8, 10, 4, 4, 2]  # steps 2 and 3, launched as 0 and 1 return
    assert simulate_simple["decode_steps"] == pytest.approx(5 / 2)  # 5 calls a pair, 1 decode step each


def test_every_call_after_the_first_recomputes_the_contexts_it_carries():
    lengths = [8.0] * 16
    coarse = simulate_segmented(SMALL, STATIC, H100, n=16, prompt=512, lengths=lengths, segment=8, ahead=0)
    fine = simulate_segmented(SMALL, STATIC, H100, n=16, prompt=512, lengths=lengths, segment=2, ahead=0)
    assert coarse["recompute carried KV cache"] == 0  # one call a step: nothing carried
    # four calls of 2: three of them prefill the prompt and the tokens so far again
    assert fine["recompute carried KV cache"] > 2.5 * fine["prefill"]
    assert fine["prefill"] == pytest.approx(coarse["prefill"])


def test_a_long_tail_costs_less_in_segments_than_drained_every_step():
    lengths = [4.0] * 255 + [64.0]
    drained = simulate_static(SMALL, STATIC, H100, n=256, prompt=100, lengths=lengths)
    segmented = simulate_segmented(SMALL, STATIC, H100, n=256, prompt=100, lengths=lengths, segment=16, ahead=1)
    total = lambda d: sum(v for k, v in d.items() if k not in ("decode_steps", "preemptions"))  # noqa: E731
    assert total(segmented) < 0.6 * total(drained)  # the tail's 63 steps, shared by two steps, with few rows
    # a pair: 256 rows, 257 (two waves of the engine's 256), 2, 2, 1; 15 decode steps a wave
    assert segmented["decode_steps"] == pytest.approx(6 * 15 / 2)


def test_generation_cost_prices_the_hf_engines_partial_rollout_in_segments():
    work = GenWorkload(sequences=256, prompt_len=100, response=Dist(kind="lognormal", mean=100, max=400),
                       partial=True, async_bound=1)
    assert segment_tokens(work) == 100  # a quarter of the longest response: the runtime's default
    hf = dict(generation_cost("g", SMALL, STATIC, H100, work).parts)
    alone = simulate_segmented(SMALL, STATIC, H100, n=256, prompt=100, segment=100, ahead=1,
                               lengths=response_lengths(work.response, 256),
                               max_seqs=engine_max_seqs(STATIC, H100.device))
    for part in ("prefill", "decode", "recompute carried KV cache"):
        assert hf[part] == pytest.approx(alone[part])
    # vLLM-class engines keep the KV cache across steps: recomputed once a step, at the weight update
    vllm = dict(generation_cost("g", SMALL, Layout(), H100, work).parts)
    assert vllm["recompute carried KV cache"] > 0 and vllm["decode"] < hf["decode"]
