"""The verifier: each rule, broken on purpose in a built graph, fires and names the stage, the
field and the rule."""

from __future__ import annotations

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import (
    DeviceGroup, Field, Job, Kind, LengthDistribution, ModelRole, ParallelLayout, Stage, Stream,
    VerificationError, get_model, verify,
)
from rpeg.graph.verify import violations

TINY = get_model("tiny-qwen2")
JOB = Job(prompts=8, samples_per_prompt=4, prompt_len=64, response=LengthDistribution.fixed(128), mini_batches=2)


def build(algorithm="grpo", **config):
    return build_graph(algorithm, JOB, Models(actor=TINY), **config)


def edit(graph, name, **changes):
    return graph.with_stages([graph.stage(name).replace(**changes)])


def assert_fires(graph, rule, stage=None, field=None, words=""):
    """`rule` is among the graph's violations, naming `stage` and `field`; verify() raises it."""
    found = [v for v in violations(graph) if v.rule == rule and v.stage == stage and v.field == field]
    assert found, f"no {rule!r} at stage {stage!r} field {field!r} in {[str(v) for v in violations(graph)]}"
    text = str(found[0])
    assert f"rule {rule!r}" in text
    if stage:
        assert f"stage {stage!r}" in text
    if field:
        assert f"field {field!r}" in text
    assert words in text
    with pytest.raises(VerificationError) as err:
        verify(graph)
    assert isinstance(err.value, RpegError)
    assert found[0] in err.value.violations
    assert f"graph {graph.algorithm!r}" in str(err.value)
    return found[0]


@pytest.mark.parametrize("algorithm", ["ppo", "grpo", "reinforce_pp", "remax", "dapo"])
def test_built_graphs_have_no_violations(algorithm):
    g = build(algorithm)
    assert violations(g) == []
    assert verify(g) is g


def test_violation_message_format():
    g = build()
    v = assert_fires(edit(g, "actor_update", reads=g.stage("actor_update").reads + ("bogus",)),
                     "declared-field", "actor_update", "bogus")
    assert str(v).startswith("stage 'actor_update', field 'bogus': rule 'declared-field': ")


def test_verification_error_counts_the_rest():
    g = build()
    g = edit(g, "generate", model=None)
    g = edit(g, "actor_logprobs", lag=1)
    with pytest.raises(VerificationError, match=r"\(and \d+ more\)") as err:
        verify(g, "my context")
    assert str(err.value).startswith("my context: ")
    assert len(err.value.violations) >= 2


# ---- structure -----------------------------------------------------------------------------------
def test_unique_stage():
    g = build()
    assert_fires(g.replace(stages=g.stages + (g.stage("reward"),)), "unique-stage", "reward")


def test_unique_field_and_model():
    g = build()
    assert_fires(g.replace(fields=g.fields + (g.field("scores"),)), "unique-field", field="scores")
    assert_fires(g.replace(models=g.models + (g.model("ref"),)), "unique-model", words="'ref'")


def test_field_dtype_and_shape():
    g = build()
    bad = Field(name="scores", dtype="fp8", shape=("batch", "tokens"))
    g = g.replace(fields=tuple(bad if f.name == "scores" else f for f in g.fields))
    assert_fires(g, "field-dtype", field="scores", words="'fp8'")
    assert_fires(g, "field-shape", field="scores", words="'tokens'")


def test_declared_field():
    g = build()
    assert_fires(edit(g, "reward", writes=("scores", "extra")), "declared-field", "reward", "extra")
    assert_fires(g.replace(outputs=("nothing",)), "declared-field", field="nothing")


def test_read_has_producer():
    g = build()
    g = g.replace(stages=tuple(s for s in g.stages if s.name != "reward"))
    assert_fires(g, "read-has-producer", "advantages", "scores")


def test_single_producer():
    g = build()
    assert_fires(edit(g, "actor_logprobs", writes=("old_logprobs", "scores")), "single-producer",
                 "actor_logprobs", "scores", words="also written by stage 'reward'")
    assert_fires(edit(g, "reward", writes=("scores", "prompt_ids")), "single-producer", "reward", "prompt_ids",
                 words="graph input")


def test_field_consumed():
    g = build()
    reads = tuple(f for f in g.stage("actor_update").reads if f != "ref_logprobs")
    assert_fires(edit(g, "actor_update", reads=reads), "field-consumed", "ref_logprobs", "ref_logprobs")
    assert violations(edit(g, "actor_update", reads=reads).replace(outputs=("ref_logprobs",))) == []


def test_acyclic_self_read():
    g = build()
    assert_fires(edit(g, "advantages", reads=g.stage("advantages").reads + ("advantages",)),
                 "acyclic", "advantages", "advantages")


def test_acyclic_cycle():
    g = build()
    # generate -> reward -> advantages -> generate
    v = assert_fires(edit(g, "generate", reads=("prompt_ids", "advantages")), "acyclic")
    for name in ("generate", "reward", "advantages"):
        assert name in v.message


def test_stage_model():
    g = build()
    assert_fires(edit(g, "generate", model=None), "stage-model", "generate", words="must name the model")
    assert_fires(edit(g, "advantages", model="actor"), "stage-model", "advantages", words="runs no model")
    assert_fires(edit(g, "actor_logprobs", model="policy"), "stage-model", "actor_logprobs", words="'policy'")


def test_stage_annotations():
    g = build()
    assert_fires(edit(g, "reward", sequences="tokens"), "stage-sequences", "reward")
    assert_fires(edit(g, "reward", granularity="token"), "stage-granularity", "reward")
    assert_fires(edit(g, "reward", microbatches=0), "stage-counts", "reward")
    assert_fires(edit(g, "actor_logprobs", greedy=True), "stage-greedy", "actor_logprobs")


def test_model_used():
    g = build()
    extra = ModelRole(name="judge", spec=TINY, trainable=False)
    assert_fires(g.replace(models=g.models + (extra,)), "model-used", words="'judge'")


# ---- weights -------------------------------------------------------------------------------------
def test_one_writer_per_model_two_writers():
    g = build()
    twin = g.stage("actor_update").replace(name="actor_update_2")
    v = assert_fires(g.replace(stages=g.stages + (twin,)), "one-writer-per-model")
    assert "found 2 (actor_update, actor_update_2)" in v.message


def test_one_writer_per_model_no_writer():
    g = build()
    g = g.replace(stages=tuple(s for s in g.stages if s.name not in ("actor_update", "actor_sync")),
                  outputs=("advantages", "old_logprobs", "ref_logprobs"))
    assert_fires(g, "one-writer-per-model", words="found 0 (none)")


def test_frozen_model():
    g = build()
    g = g.replace(models=tuple(m.replace(trainable=False) if m.name == "actor" else m for m in g.models))
    assert_fires(g, "frozen-model", "actor_update", words="'actor' is frozen")


def test_weight_version_generation_lag_beyond_bound():
    g = build().replace(async_bound=1)
    assert violations(edit(g, "generate", lag=1)) == []
    assert_fires(edit(g, "generate", lag=2), "weight-version", "generate", words="async bound k = 1")


def test_weight_version_non_generate_lag():
    g = build().replace(async_bound=2)
    assert_fires(edit(g, "actor_logprobs", lag=1), "weight-version", "actor_logprobs",
                 words="only generation may read stale weights")
    assert_fires(edit(g, "generate", lag=-1), "weight-version", "generate", words="lag = -1")


def test_async_bound_negative():
    assert_fires(build().replace(async_bound=-1), "async-bound")


def test_sync_rules():
    g = build()
    assert_fires(edit(g, "actor_sync", model="ref"), "sync-trained", "actor_sync")
    assert_fires(edit(g, "actor_sync", reads=("scores",)), "sync-fields", "actor_sync")


def test_read_before_update():
    g = build()
    # old_logprobs becomes a graph output nobody trains on: actor_logprobs reads the actor at
    # version t with no path to actor_update, which overwrites that version in the same step.
    reads = tuple(f for f in g.stage("actor_update").reads if f != "old_logprobs")
    g = edit(g, "actor_update", reads=reads).replace(outputs=("old_logprobs",))
    assert_fires(g, "read-before-update", "actor_logprobs", words="'actor_update'")
    # with stale weights (lag > 0) the read is of an older version and is allowed for generation
    assert not any(v.rule == "read-before-update" and v.stage == "generate" for v in violations(g))


# ---- execution annotations ----------------------------------------------------------------------
def test_fusion():
    g = build()
    assert_fires(g.replace(fusion=(("generate", "actor_update"),)), "fusion", "generate",
                 words="train stages can only fuse with other train stages")
    assert_fires(g.replace(fusion=(("actor_logprobs", "ref_logprobs"),)), "fusion", "actor_logprobs",
                 words="different models")
    assert_fires(g.replace(fusion=(("generate", "reward"), ("reward", "actor_logprobs"))), "fusion", "reward",
                 words="two fusion groups")
    assert violations(g.replace(fusion=(("generate", "reward"),))) == []


def test_stream():
    g = build("reinforce_pp")
    assert_fires(g.replace(streams=(Stream(producer="reward", consumer="advantages", microbatches=4),)),
                 "stream", "advantages", words="needs the whole batch")
    assert_fires(g.replace(streams=(Stream(producer="reward", consumer="actor_update", microbatches=4),)),
                 "stream", "actor_update", words="reads nothing")
    ok = g.replace(streams=(Stream(producer="generate", consumer="reward", microbatches=4),))
    assert violations(ok) == []


def test_placement():
    g = build()
    v = assert_fires(edit(g, "generate", group="nowhere"), "placement", "generate", words="'nowhere'")
    assert "not defined" in v.message
    assert_fires(edit(g, "generate", group="nowhere"), "placement", "reward",
                 words="some stages are placed and this one is not")
    grp = DeviceGroup(name="all", first=0, count=4)
    assert_fires(g.replace(groups=(grp, grp)), "placement", words="two device groups share a name")


def test_layout():
    g = build()
    assert_fires(edit(g, "generate", layout=ParallelLayout(tp=3)), "layout", "generate",
                 words="tp = 3 does not divide the 4 attention heads of tiny-qwen2")
    assert_fires(edit(g, "actor_update", layout=ParallelLayout(pp=3)), "layout", "actor_update",
                 words="pp = 3 does not divide the 4 layers")
    assert_fires(edit(g, "advantages", layout=ParallelLayout(dp=2)), "layout", "advantages", words="runs no model")
    assert_fires(edit(g, "actor_logprobs", layout=ParallelLayout(zero=1)), "layout", "actor_logprobs",
                 words="zero = 1")
    assert not violations(edit(g, "actor_logprobs", layout=ParallelLayout(zero=3)))  # FSDP-sharded forward
    assert_fires(edit(g, "generate", layout=ParallelLayout(cp=2)), "layout", "generate",
                 words="not context-parallel")
    assert_fires(edit(g, "actor_update", layout=ParallelLayout(ep=2)), "layout", "actor_update",
                 words="has no experts")
    placed = g.replace(groups=(DeviceGroup(name="all", first=0, count=8),),
                       stages=tuple(s.replace(group="all") for s in g.stages))
    assert violations(placed) == []
    assert_fires(edit(placed, "actor_update", layout=ParallelLayout(dp=2, tp=2)), "layout", "actor_update",
                 words="dp*tp*pp*cp = 2*2*1*1 = 4 != 8 devices of group 'all'")


def test_structure_errors_hide_execution_checks():
    # The execution rules assume a sound structure, so they are not run on a broken one.
    g = build().replace(fusion=(("generate", "actor_update"),))
    g = edit(g, "reward", writes=("scores", "extra"))
    rules = {v.rule for v in violations(g)}
    assert "declared-field" in rules and "fusion" not in rules


def test_kinds_are_strings():
    assert str(Kind.GENERATE) == "generate"
    assert Stage(name="s", kind=Kind.COMPUTE).replace(name="t").name == "t"
