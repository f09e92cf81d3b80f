"""Graph lookups and the edges derived from fields (data) and from models (weights)."""

from __future__ import annotations

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import DataEdge, Job, LengthDistribution, WeightEdge, get_model

TINY = get_model("tiny-qwen2")
JOB = Job(prompts=8, samples_per_prompt=4, prompt_len=64, response=LengthDistribution.fixed(128))


def build(algorithm="grpo", **config):
    return build_graph(algorithm, JOB, Models(actor=TINY), **config)


def test_data_edges_carry_fields_and_bytes():
    g = build()
    edges = {(e.src, e.dst): e for e in g.data_edges()}
    assert edges[("generate", "reward")] == DataEdge("generate", "reward", ("response_ids",), 32 * 128 * 4)
    assert edges[("reward", "advantages")].bytes == 32 * 4  # one fp32 score per sequence
    assert ("generate", "actor_update") in edges and ("advantages", "actor_update") in edges
    assert all(e.src != "prompt_ids" for e in g.data_edges())  # graph inputs have no producer stage
    assert g.bytes_per_step() == sum(e.bytes for e in edges.values())


def test_topo_order_respects_edges():
    for algorithm in ("ppo", "remax", "dapo"):
        g = build(algorithm)
        order = g.topo_order()
        assert sorted(order) == sorted(g.stage_names)
        for e in g.data_edges():
            assert order.index(e.src) < order.index(e.dst)


def test_ancestors():
    g = build("ppo")
    assert g.ancestors("actor_update") == {"generate", "reward", "actor_logprobs", "ref_logprobs",
                                           "critic_values", "advantages"}
    assert g.ancestors("generate") == set()


def test_weight_edges():
    g = build("remax")
    edges = {e.dst: e for e in g.weight_edges()}
    assert edges["generate"] == WeightEdge("actor_sync", "generate", "actor", 1)
    assert edges["generate_greedy"] == WeightEdge("actor_sync", "generate_greedy", "actor", 1)
    assert edges["actor_sync"] == WeightEdge("actor_update", "actor_sync", "actor", 0)
    assert edges["actor_logprobs"] == WeightEdge("actor_update", "actor_logprobs", "actor", 1)
    assert "ref_logprobs" not in edges  # the reference is frozen: no version crosses steps
    stale = g.with_stages([g.stage("generate").replace(lag=3)])
    assert {e.dst: e for e in stale.weight_edges()}["generate"].distance == 4


def test_sizes():
    g = build("dapo", oversample=2.0)
    sizes = g.dim_sizes()
    assert sizes == {"prompts": 8, "batch": 32, "gen_batch": 64.0, "prompt": 64, "response": 128, "seq": 192}
    assert g.stage_sequences(g.stage("generate")) == 64
    assert g.field_bytes("sampled_ids") == 64 * 128 * 4
    remax = build("remax")
    assert remax.stage_sequences(remax.stage("generate_greedy")) == 8  # one greedy response per prompt


def test_lookups():
    g = build()
    assert g.stage("reward").name == "reward"
    with pytest.raises(RpegError, match="no stage 'nope' .*generate"):
        g.stage("nope")
    with pytest.raises(RpegError, match="no field 'nope'"):
        g.field("nope")
    with pytest.raises(RpegError, match="no model 'critic' .*actor"):
        g.model("critic")
    with pytest.raises(RpegError, match="no device group 'gpu'"):
        g.group("gpu")
    assert g.has_model("actor") and not g.has_model("critic")


def test_with_stages_keeps_order_and_is_pure():
    g = build()
    h = g.with_stages([g.stage("reward").replace(doc="changed")])
    assert h.stage_names == g.stage_names
    assert h.stage("reward").doc == "changed" and g.stage("reward").doc != "changed"
    assert h != g and h.replace(stages=g.stages) == g
