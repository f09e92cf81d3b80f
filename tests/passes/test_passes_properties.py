"""Property tests over random jobs and every algorithm: built graphs verify and round trip
exactly; legal passes keep every producer -> consumer relation; bounded asynchrony changes
only weight versions; illegal passes are refused."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpeg.algorithms import ALGORITHMS, Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import Job, Kind, LengthDistribution, get_model, verify
from rpeg.graph.io import graph_from_text, graph_to_json, graph_to_yaml
from rpeg.graph.verify import stream_problem
from rpeg.passes import bound_asynchrony, colocate, fuse, parallelize, share_actor_critic, stream, unstreamable

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ACTORS = [get_model(n) for n in ("tiny-qwen2", "qwen3-0.6B", "llama-3.1-8B", "qwen3-30B-A3B", "deepseek-v3")]
REWARD_MODELS = [None, None, get_model("qwen2.5-0.5B")]  # mostly rule rewards
ALGOS = sorted(ALGORITHMS)


@st.composite
def distributions(draw):
    kind = draw(st.sampled_from(["fixed", "uniform", "lognormal", "empirical"]))
    lengths = st.integers(1, 8192)
    if kind == "fixed":
        return LengthDistribution(kind="fixed", mean=draw(st.floats(1.0, 8192.0)))
    if kind == "uniform":
        lo, hi = sorted((draw(lengths), draw(lengths)))
        return LengthDistribution(kind="uniform", min=lo, max=hi)
    if kind == "lognormal":
        cap = draw(st.integers(1, 32768))
        return LengthDistribution(kind="lognormal", mean=draw(st.floats(1.0, float(cap))), max=cap,
                                  sigma=draw(st.floats(0.01, 3.0)))
    return LengthDistribution(kind="empirical", points=tuple(draw(st.lists(lengths, min_size=1, max_size=20))))


@st.composite
def jobs(draw):
    prompts = draw(st.integers(1, 64))
    samples = draw(st.integers(2, 16))
    return Job(prompts=prompts, samples_per_prompt=samples, prompt_len=draw(st.integers(1, 4096)),
               response=draw(distributions()), ppo_epochs=draw(st.integers(1, 4)),
               mini_batches=draw(st.integers(1, min(8, prompts * samples))))


@st.composite
def graphs(draw, algorithms=tuple(ALGOS)):
    algorithm = draw(st.sampled_from(algorithms))
    models = Models(actor=draw(st.sampled_from(ACTORS)), reward=draw(st.sampled_from(REWARD_MODELS)))
    config = {}
    kl = draw(st.one_of(st.none(), st.sampled_from([0.0, 1e-5, 0.04]), st.floats(0.0, 1.0)))
    if kl is not None:
        config["kl_coef"] = kl
    if algorithm == "dapo":
        config["oversample"] = draw(st.sampled_from([1.25, 1.5, 2.0, 3.0]))
    return build_graph(algorithm, draw(jobs()), models, **config)


def relations(g):
    return {(e.src, e.dst, e.fields) for e in g.data_edges()}


def legal_fusions(g):
    """Groups the fusion rules allow in every built graph of this algorithm and models."""
    groups = []
    if g.stage("reward").model is None:  # a rule reward scores each sample inside generation
        groups.append(["generate", "reward"])
        if "generate_greedy" in g.stage_names:
            groups.append(["generate_greedy", "reward_greedy"])
    if g.has_model("critic"):
        groups.append(["actor_update", "critic_update"])
    return groups


# ---- build, verify, round trip --------------------------------------------------------------------
@SETTINGS
@given(g=graphs())
def test_built_graphs_verify_and_round_trip(g):
    assert verify(g) is g
    assert graph_from_text(graph_to_yaml(g)) == g
    assert graph_from_text(graph_to_json(g)) == g


# ---- fusion and streaming keep producer -> consumer relations -------------------------------------
@SETTINGS
@given(g=graphs(), m=st.integers(2, 16))
def test_fusion_and_streaming_keep_relations(g, m):
    before = relations(g)
    fused = g
    for group in legal_fusions(g):
        fused = fuse(fused, group)
        assert relations(fused) == before
        assert tuple(group) in fused.fusion
    assert fused.stages == g.stages
    cannot = {(p, c) for p, c, _ in unstreamable(fused, m)}
    can = {(e.src, e.dst) for e in fused.data_edges()} - cannot
    if not can:
        with pytest.raises(RpegError, match="no producer -> consumer edge"):
            stream(fused, m)
        return
    streamed = stream(fused, m)
    assert relations(streamed) == before
    assert {(s.producer, s.consumer) for s in streamed.streams} == can
    assert all(stream_problem(streamed, s) is None for s in streamed.streams)
    assert all(streamed.stage(n).microbatches == m for pair in can for n in pair)
    assert graph_from_text(graph_to_yaml(streamed)) == streamed


# ---- bounded asynchrony changes only weight versions ----------------------------------------------
@SETTINGS
@given(g=graphs(), k=st.integers(0, 8))
def test_bound_asynchrony_changes_only_weight_versions(g, k):
    a = bound_asynchrony(g, k)
    assert a.async_bound == k
    assert relations(a) == relations(g)
    assert a.stage_names == g.stage_names and a.fields == g.fields and a.models == g.models
    for old, new in zip(g.stages, a.stages):
        if old.kind is Kind.GENERATE:
            assert new.lag == k and new.replace(lag=old.lag) == old
        else:
            assert new == old
    before = {(e.src, e.dst): e for e in g.weight_edges()}
    after = {(e.src, e.dst): e for e in a.weight_edges()}
    assert before.keys() == after.keys()
    for key, e in after.items():
        if a.stage(e.dst).kind is Kind.GENERATE:
            assert e.distance == 1 + k
        else:
            assert e == before[key]
    assert a.replace(async_bound=g.async_bound, stages=g.stages, history=g.history) == g


# ---- illegal passes are refused -------------------------------------------------------------------
@SETTINGS
@given(g=graphs(), m=st.integers(2, 16), k=st.integers(-8, -1))
def test_illegal_passes_are_refused(g, m, k):
    spec = g.model("actor").spec

    def refused(fn, *args, **kwargs):
        with pytest.raises(RpegError, match="refused"):
            fn(*args, **kwargs)

    refused(fuse, g, ["actor_update", "advantages"])  # train with non-train
    refused(fuse, g, ["generate", "actor_update"])
    if g.has_model("ref"):
        refused(fuse, g, ["actor_logprobs", "ref_logprobs"])  # two models
    if g.stage("reward").model is not None:
        refused(fuse, g, ["generate", "reward"])
    if g.stage("advantages").granularity == "batch":
        refused(stream, g, m, edges=[["reward", "advantages"]])
    if g.job.mini_batches == 1:
        refused(stream, g, m, edges=[["advantages", "actor_update"]])
    placed = colocate(g, 8)
    with pytest.raises(RpegError, match=r"dp\*tp\*pp\*cp = 2\*1\*1\*1 = 2 != 8 devices"):
        parallelize(placed, "actor_update", dp=2)
    with pytest.raises(RpegError, match=f"tp = {spec.heads + 1} does not divide the {spec.heads} attention heads"):
        parallelize(g, "actor_update", tp=spec.heads + 1)
    with pytest.raises(RpegError, match=f"pp\\*pp_interleave = {spec.layers + 1}\\*1 exceeds the {spec.layers} layers"):
        parallelize(g, "actor_update", pp=spec.layers + 1)
    if spec.layers > 2:
        with pytest.raises(RpegError, match=f"pp = {spec.layers - 1} does not divide the {spec.layers} layers"):
            parallelize(g, "actor_update", pp=spec.layers - 1)
        assert verify(parallelize(g, "actor_update", pp=spec.layers - 1, pp_uneven=True))
    if not spec.is_moe:
        with pytest.raises(RpegError, match="ep = 2 but .* has no experts"):
            parallelize(g, "actor_update", dp=2, ep=2)
    if not g.has_model("critic"):
        refused(share_actor_critic, g)
    refused(bound_asynchrony, g, k)


@SETTINGS
@given(g=graphs(algorithms=("ppo",)), k=st.integers(0, 3))
def test_shared_actor_critic_keeps_the_data(g, k):
    shared = share_actor_critic(bound_asynchrony(g, k))
    assert {f.name for f in shared.fields} == {f.name for f in g.fields}
    producers = shared.producers()
    assert producers["values"] == "actor_logprobs"
    assert {(p, c) for p, c, _ in relations(shared)} <= {
        (p.replace("critic_values", "actor_logprobs"), c.replace("critic_values", "actor_logprobs")
         .replace("critic_update", "actor_update")) for p, c, _ in relations(g)}
    assert graph_from_text(graph_to_json(shared)) == shared
