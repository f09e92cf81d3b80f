"""The plan space: structure choices (async bound, sharing, fusion, streaming) and placements.

Graphs: GRPO on Qwen3-0.6B with a reference model, GRPO without one (kl_coef = 0: the actor is the
only model), PPO with critic, reference and reward model (one or two mini-batches)."""

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.graph import Job, Kind, get_model, verify
from rpeg.graph import LengthDistribution as Dist
from rpeg.search.space import SpaceOptions, Structure, apply_execution, apply_structure, placements, structures

SMALL = get_model("qwen3-0.6B")
JOB = Job(prompts=16, samples_per_prompt=4, prompt_len=256, response=Dist.fixed(512))
GRAPHS = {
    "grpo": build_graph("grpo", JOB, Models(actor=SMALL)),
    "grpo-no-ref": build_graph("grpo", JOB, Models(actor=SMALL), kl_coef=0.0),
    "ppo": build_graph("ppo", JOB, Models(actor=SMALL, critic=SMALL, reference=SMALL, reward=SMALL)),
    "ppo-2mb": build_graph("ppo", JOB.replace(mini_batches=2),
                           Models(actor=SMALL, critic=SMALL, reference=SMALL, reward=SMALL)),
}
ABLATIONS = [SpaceOptions(), SpaceOptions(share=False), SpaceOptions(fuse=False), SpaceOptions(stream=False),
             SpaceOptions(share=False, fuse=False, stream=False)]


# ---- structures ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("max_staleness", [0, 1, 3])
@pytest.mark.parametrize("space", ABLATIONS)
def test_structures_respect_the_bound_and_the_options(name, max_staleness, space):
    g = GRAPHS[name]
    found = list(structures(g, max_staleness, space))
    assert found and len(found) == len(set(found))
    assert {s.async_bound for s in found} == set(range(max_staleness + 1))
    critic = g.has_model("critic")
    for s in found:
        assert isinstance(s, Structure)
        assert not s.share or (critic and space.share)
        assert not s.fuse_logprobs or (s.async_bound == 0 and space.fuse)
        assert not s.fuse_train or (critic and not s.share and space.fuse)
        assert s.stream in ((0, 4, 16) if g.job.mini_batches >= 2 else (0, 4)) and (space.stream or s.stream == 0)
    # and what the options allow does appear
    assert any(s.share for s in found) == (critic and space.share)
    assert any(s.fuse_logprobs for s in found) == space.fuse
    assert any(s.fuse_train for s in found) == (critic and space.fuse)
    assert any(s.stream for s in found) == space.stream
    assert any(s.stream == 16 for s in found) == (space.stream and g.job.mini_batches >= 2)


def test_structures_apply_to_graphs_that_verify():
    g = GRAPHS["ppo"]
    for s in structures(g, 2):
        out = apply_structure(g, s)
        assert verify(out) is out
        assert out.async_bound == s.async_bound
        assert out.has_model("critic") != s.share  # sharing folds the critic into the actor


# ---- placements ---------------------------------------------------------------------------------------------
def check_cover(p, gpus, stages):
    """Groups are disjoint ranges that tile 0..gpus-1; every non-sync stage is assigned once."""
    groups = sorted(p.groups, key=lambda g: g[1])
    assert groups[0][1] == 0
    for (_, first, count), nxt in zip(groups, groups[1:] + [(None, gpus, 0)]):
        assert count >= 1 and first + count == nxt[1], p
    assert sum(c for _, _, c in groups) == gpus
    assert len({name for name, _, _ in groups}) == len(groups)
    names = [s for s, _ in p.assign]
    assert sorted(names) == sorted(stages) and len(names) == len(set(names))
    assert {grp for _, grp in p.assign} <= {name for name, _, _ in p.groups}


@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("gpus, node", [(1, 8), (4, 8), (8, 8), (12, 8), (16, 8), (32, 8), (8, 4), (32, 4)])
def test_every_placement_covers_every_device_once_and_assigns_every_stage(name, gpus, node):
    g = GRAPHS[name]
    stages = [s.name for s in g.stages if s.kind is not Kind.SYNC]
    found = list(placements(g, gpus, node))
    assert found[0].name == "colocated" and found[0].groups == (("all", 0, gpus),)
    assert len({p.name for p in found}) == len(found)
    for p in found:
        check_cover(p, gpus, stages)
    if gpus == 1:
        assert len(found) == 1  # nothing to split


@pytest.mark.parametrize("gpus, node", [(16, 8), (32, 8), (8, 4), (32, 4)])
def test_splits_are_whole_nodes_when_there_are_two_or_more(gpus, node):
    found = [p for p in placements(GRAPHS["ppo"], gpus, node) if p.name != "colocated"]
    assert found
    for p in found:
        assert all(count % node == 0 and first % node == 0 for _, first, count in p.groups), p.name


def test_a_single_node_splits_by_gpu():
    splits = [p for p in placements(GRAPHS["grpo"], 4, 8) if p.name.startswith("split")]
    assert sorted(p.groups[0][2] for p in splits) == [1, 2, 3]
    for p in splits:
        gen = dict(p.assign)
        assert gen["generate"] == "generation" and gen["actor_update"] == "training"


def test_per_model_placements_only_with_other_models():
    def per_model(g):
        return [p for p in placements(g, 16, 4) if p.name.startswith("per model")]

    assert per_model(GRAPHS["grpo-no-ref"]) == []
    assert per_model(GRAPHS["grpo"])  # the reference model gets its own group
    ppo = per_model(GRAPHS["ppo"])
    assert ppo
    for p in ppo:
        roles = dict(p.assign)
        assert [name for name, _, _ in p.groups] == ["actor", "critic", "frozen"]
        assert roles["generate"] == roles["actor_update"] == "actor"
        assert roles["critic_update"] == roles["critic_values"] == "critic"
        assert roles["ref_logprobs"] == "frozen"


@pytest.mark.parametrize("allowed", [("colocated",), ("split",), ("per-model",), ("split", "per-model")])
def test_space_options_limit_the_placements(allowed):
    found = list(placements(GRAPHS["ppo"], 32, 8, SpaceOptions(placements=allowed)))
    assert found
    kinds = {"colocated" if p.name == "colocated" else "split" if p.name.startswith("split") else "per-model"
             for p in found}
    assert kinds == set(allowed)


def test_placements_apply_to_graphs_that_verify():
    g = GRAPHS["ppo"]
    for p in placements(g, 16, 8):
        out = apply_execution(g, Structure(), p)
        assert verify(out) is out
        for stage, grp in p.assign:
            assert out.stage(stage).group == grp
