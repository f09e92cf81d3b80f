"""reference_on_host(): NeMo-RL's reference weights wait on the host and are swapped in; the swap
is costed as its own line of the reference pass, three copies of the actor's per-device weights."""

from __future__ import annotations

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import PassRefused
from rpeg.graph import Job, LengthDistribution, get_model
from rpeg.graph.verify import violations
from rpeg.hardware import load_cluster
from rpeg.passes import colocate, parallelize, place, reference_on_host
from rpeg.perf.efficiency import HOST_LINK_BYTES_PER_S
from rpeg.perf.memory import params_per_device
from rpeg.perf.step import predict_step

JOB = Job(prompts=8, samples_per_prompt=4, prompt_len=64, response=LengthDistribution.fixed(64))
SPEC = get_model("qwen3-8B")
SWAP_LINE = "reference weights swapped through the host"


def _planned(graph, gpus=8):
    g = colocate(graph, gpus)
    for s in g.stages:
        if s.kind.value in ("generate", "infer", "train"):
            g = parallelize(g, s.name, dp=gpus // 2, tp=2, zero=1 if s.kind.value == "train" else 0)
    return g


def test_the_swap_is_three_copies_of_the_actors_weights_over_the_host_link():
    g = _planned(build_graph("grpo", JOB, Models(actor=SPEC), kl_coef=0.01))
    cluster = load_cluster("dgx-h100", 8)
    before = predict_step(g, cluster)
    after = predict_step(reference_on_host(g), cluster)
    layout = g.stage("actor_update").layout
    swap = 3 * 2 * params_per_device(SPEC, layout) / HOST_LINK_BYTES_PER_S.value
    ref = dict(after.stages["ref_logprobs"].parts)
    assert ref[SWAP_LINE] == pytest.approx(swap)
    assert after.stages["ref_logprobs"].seconds == pytest.approx(before.stages["ref_logprobs"].seconds + swap)
    assert SWAP_LINE not in dict(after.stages["actor_logprobs"].parts)
    assert after.step_s > before.step_s


def test_no_reference_or_a_reference_elsewhere_is_refused():
    with pytest.raises(PassRefused, match="runs no reference model"):
        reference_on_host(build_graph("grpo", JOB, Models(actor=SPEC), kl_coef=0.0))  # no reference
    g = build_graph("grpo", JOB, Models(actor=SPEC), kl_coef=0.01)
    split = place(g, {"a": 4, "b": 4}, assign={"ref_logprobs": "b"}, default="a")
    with pytest.raises(PassRefused, match="not on the actor's training devices"):
        reference_on_host(split)


def test_a_loaded_graph_that_claims_it_without_a_reference_fails_verification():
    g = build_graph("grpo", JOB, Models(actor=SPEC), kl_coef=0.0).replace(reference_on_host=True)
    assert any(v.rule == "reference-on-host" for v in violations(g))
