"""Generation reached in serial calls of a few sequences (Graph.call_sequences, rpeg/passes/calls.py,
rpeg/perf/calls.py): OpenRLHF v0.2's per-rank generate calls, one at a time per engine.

Qwen3-0.6B on H100s with fixed response lengths, so that calls of c sequences are c-sequence waves,
one after another, each costed by the same continuous-batching engine."""

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import PassRefused, RpegError
from rpeg.graph import Job, get_model, verify
from rpeg.graph import LengthDistribution as Dist
from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import Graph
from rpeg.graph.serde import from_data, to_data
from rpeg.hardware import load_cluster
from rpeg.passes import bound_asynchrony, partial_rollout, serial_calls
from rpeg.perf.calls import TIME_PARTS, serial_calls_s, with_serial_calls
from rpeg.perf.generation import GenWorkload, generation_cost, simulate_instance
from rpeg.search.baselines import BASELINES
from rpeg.search.baselines.openrlhf import micro_rollout_batch
from rpeg.search.layouts import LayoutCache

SMALL = get_model("qwen3-0.6B")
PROMPT, LENGTH, N = 128, 300, 64


@pytest.fixture(scope="module")
def dgx():
    return load_cluster("dgx-h100", 8)


def work(n=N):
    return GenWorkload(sequences=n, prompt_len=PROMPT, response=Dist.fixed(LENGTH))


def test_serial_calls_are_waves_one_after_another(dgx):
    whole = generation_cost("g", SMALL, Layout(), dgx, work())
    one_call = simulate_instance(SMALL, Layout(), dgx, n=4, prompt=PROMPT, lengths=[LENGTH] * 4,
                                 capacity_tokens=float("inf"))
    expected = N // 4 * sum(one_call[k] for k in TIME_PARTS)
    assert serial_calls_s(SMALL, Layout(), dgx, work(), 4) == pytest.approx(expected, rel=1e-6)
    assert expected > 3 * whole.seconds  # 16 waves of 4 against one of 64: weights read 16x as often


def test_the_extra_time_is_its_own_line_and_the_rest_is_untouched(dgx):
    whole = generation_cost("g", SMALL, Layout(), dgx, work())
    calls = with_serial_calls(whole, SMALL, Layout(), dgx, work(), 4)
    label, extra = calls.parts[-1]
    assert label == "generate calls of 4 sequences, one at a time" and extra > 0
    assert calls.parts[:-1] == whole.parts
    assert calls.seconds == pytest.approx(serial_calls_s(SMALL, Layout(), dgx, work(), 4))
    assert sum(v for _, v in calls.parts) == pytest.approx(calls.seconds)
    # a call as large as the engine's share is the engine given the share at once
    assert with_serial_calls(whole, SMALL, Layout(), dgx, work(), N).seconds == pytest.approx(whole.seconds, rel=1e-6)


def graph():
    return build_graph("ppo", Job(prompts=64, prompt_len=PROMPT, response=Dist.fixed(LENGTH)),
                       Models(actor=SMALL, critic=SMALL, reference=SMALL))


def test_pass_records_the_call_size_and_round_trips():
    g = serial_calls(graph(), 2)
    assert g.call_sequences == 2 and "serial_calls(sequences=2)" in g.history[-1]
    assert from_data(Graph, to_data(g)).call_sequences == 2


def test_pass_refuses_bad_sizes_and_engines_that_never_drain():
    with pytest.raises(PassRefused, match="whole number >= 1"):
        serial_calls(graph(), 0)
    with pytest.raises(PassRefused, match="partial rollout"):
        serial_calls(partial_rollout(bound_asynchrony(graph(), 1)), 2)
    with pytest.raises(RpegError, match="call-sequences|generate calls"):
        verify(partial_rollout(bound_asynchrony(graph(), 1)).replace(call_sequences=2), "test")


def test_openrlhf_v02_uses_its_scripts_micro_batch_and_is_slower():
    from rpeg.perf.step import predict_step
    cluster = load_cluster("dgx-h100", 16)
    g = graph()
    assert micro_rollout_batch(g) == 16
    cache = LayoutCache()
    old = BASELINES["openrlhf-v0.2"].build(g, cluster, 16, cache)
    new = BASELINES["openrlhf"].build(g, cluster, 16, cache)
    assert old.call_sequences == 16 and new.call_sequences == 0
    assert predict_step(old, cluster).step_s > predict_step(new, cluster).step_s
