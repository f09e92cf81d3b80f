"""Each pass on its own: what it changes, what it keeps, and how it refuses (with every factor)."""

from __future__ import annotations

import pytest
import yaml

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import DeviceGroup, Job, Kind, LengthDistribution, ModelSpec, ParallelLayout, get_model, verify
from rpeg.passes import (
    PassCall, PassPipeline, bound_asynchrony, colocate, fuse, parallelize, place, share_actor_critic, stream,
    unstreamable,
)

TINY = get_model("tiny-qwen2")  # 4 layers, 4 heads, 2 kv heads
H12 = ModelSpec(name="h12", layers=4, hidden=768, heads=12, kv_heads=6, ffn=2048, vocab=1000)
H12_KV4 = H12.replace(name="h12-kv4", kv_heads=4)
MOE = ModelSpec(name="moe6", layers=4, hidden=256, heads=4, kv_heads=4, ffn=0, vocab=1000, experts=6,
                experts_per_token=2, moe_ffn=128)
JOB = Job(prompts=8, samples_per_prompt=4, prompt_len=64, response=LengthDistribution.fixed(128))


def build(algorithm="grpo", actor=TINY, job=JOB, **config):
    return build_graph(algorithm, job, Models(actor=actor), **config)


def relations(g):
    return {(e.src, e.dst, e.fields) for e in g.data_edges()}


# ---- share_actor_critic ---------------------------------------------------------------------------
def test_share_actor_critic():
    g = build("ppo")
    h = share_actor_critic(g)
    assert verify(h) is h
    assert not h.has_model("critic")
    assert "critic_values" not in h.stage_names and "critic_update" not in h.stage_names
    assert h.model("actor").heads == ("lm", "value")
    logprobs, update = h.stage("actor_logprobs"), h.stage("actor_update")
    assert logprobs.writes == ("old_logprobs", "values")
    assert set(update.reads) == {"prompt_ids", "response_ids", "old_logprobs", "advantages", "values", "returns"}
    assert update.kind is Kind.TRAIN and update.model == "actor"
    assert [s for s in h.stages if s.kind is Kind.TRAIN] == [update]
    assert {f.name for f in h.fields} == {f.name for f in g.fields}  # the same data, fewer stages
    assert ("actor_logprobs", "advantages") in {(e.src, e.dst) for e in h.data_edges()}
    assert h.history == ("share_actor_critic()",)
    assert g.has_model("critic")  # the input graph is untouched


def test_share_actor_critic_refusals():
    with pytest.raises(RpegError, match=r"share_actor_critic\(\) refused: grpo has no critic to share"):
        share_actor_critic(build("grpo"))
    fused = fuse(build("ppo"), ["actor_update", "critic_update"])
    with pytest.raises(RpegError, match="apply structure passes .* before execution passes"):
        share_actor_critic(fused)


# ---- parallelize --------------------------------------------------------------------------------
def placed(actor=TINY, devices=8, algorithm="grpo", **kw):
    return colocate(build(algorithm, actor=actor, **kw), devices)


def refusal(graph, stage="actor_update", **layout) -> str:
    with pytest.raises(RpegError) as err:
        parallelize(graph, stage, **layout)
    text = str(err.value)
    assert text.startswith(f"parallelize(stage={stage!r}") and " refused: " in text
    return text


def test_parallelize_sets_the_layout():
    g = parallelize(placed(), "actor_update", dp=2, tp=2, pp=2, zero=3, recompute="selective")
    assert g.stage("actor_update").layout == ParallelLayout(dp=2, tp=2, pp=2, zero=3, recompute="selective")
    assert g.history[-1].startswith("parallelize(stage='actor_update', dp=2, tp=2, pp=2")
    assert verify(g) is g


def test_parallelize_product_prints_every_factor():
    text = refusal(placed(actor=H12), dp=2, tp=3, pp=2)
    assert "dp*tp*pp*cp = 2*3*2*1 = 12 != 8 devices of group 'all'" in text


def test_parallelize_shape_refusals():
    assert "tp = 3 does not divide the 4 attention heads of tiny-qwen2" in refusal(build(), tp=3)
    assert "tp = 6 neither divides nor is a multiple of the 4 kv heads of h12-kv4" in refusal(
        build(actor=H12_KV4), tp=6)
    assert "pp = 3 does not divide the 4 layers of tiny-qwen2" in refusal(build(), pp=3)
    assert "pp*pp_interleave = 2*4 exceeds the 4 layers" in refusal(build(), pp=2, pp_interleave=4)
    uneven = parallelize(build(), "actor_update", pp=3, pp_uneven=True)  # Megatron's unequal stages
    assert uneven.stage("actor_update").layout.layers_per_stage(4) == 2
    assert "ep = 2 but tiny-qwen2 has no experts" in refusal(build(), dp=2, ep=2)
    assert "ep = 4 does not divide the 6 experts of moe6" in refusal(build(actor=MOE), dp=4, ep=4)
    assert "ep = 3 does not divide dp*cp*tp = 2*1*1 = 2" in refusal(build(actor=MOE), dp=2, ep=3)
    assert verify(parallelize(build(actor=MOE), "actor_update", dp=2, tp=2, ep=2))


def test_parallelize_kind_refusals():
    assert "zero = 3 shards optimizer state or gradients, which a generate stage does not have" in refusal(
        build(), "generate", zero=3)
    assert "recompute = full applies to training only" in refusal(build(), "actor_logprobs", recompute="full")
    assert "cp = 2: generation decodes one token at a time" in refusal(build(), "generate", cp=2)
    assert "dp = 64 exceeds the 32 sequences" in refusal(build(), dp=64)
    assert "runs no model" in refusal(build(), "advantages", dp=2)
    assert "no stage 'trainer'" in refusal(build(), "trainer", dp=2)
    assert "parallel layout: dp = 0 must be >= 1" in refusal(build(), dp=0)


def test_parallelize_lists_every_problem():
    text = refusal(placed(), tp=3, pp=3)
    assert "dp*tp*pp*cp = 1*3*3*1 = 9 != 8" in text and "tp = 3" in text and "pp = 3" in text
    assert text.count("; ") >= 2


# ---- fuse ---------------------------------------------------------------------------------------
def test_fuse_legal_groups():
    g = build()
    f = fuse(g, ["generate", "reward"])
    assert f.fusion == (("generate", "reward"),)
    assert f.stages == g.stages and relations(f) == relations(g)
    assert f.history == ("fuse(stages=['generate', 'reward'])",)
    ppo = fuse(build("ppo"), ["actor_update", "critic_update"])
    assert ppo.fusion_group_of("critic_update") == ("actor_update", "critic_update")
    assert ppo.fusion_group_of("generate") is None
    assert fuse(build(), ["generate", "actor_logprobs"]).fusion  # one engine returns the logprobs


@pytest.mark.parametrize("algorithm, group, words", [
    ("grpo", ["actor_update", "advantages"], "train stages can only fuse with other train stages; 'advantages'"),
    ("grpo", ["actor_logprobs", "ref_logprobs"], "the stages run different models (actor, ref)"),
    ("grpo", ["reward", "advantages"], "'advantages' needs its whole group"),
    ("reinforce_pp", ["reward", "advantages"], "'advantages' needs its whole batch"),
    ("remax", ["generate", "advantages"], "lies between members of the group"),
    ("grpo", ["actor_update", "actor_sync"], "'actor_sync' is a weight sync"),
    ("grpo", ["generate"], "fusion needs at least two stages"),
    ("grpo", ["generate", "generate"], "a stage is listed twice"),
    ("grpo", ["generate", "rollout"], "no stage 'rollout'"),
])
def test_fuse_refusals(algorithm, group, words):
    with pytest.raises(RpegError, match=r"^fuse\(stages=.*\) refused: ") as err:
        fuse(build(algorithm), group)
    assert words in str(err.value)


def test_fuse_refuses_refusing_twice_and_mixed_versions_and_groups():
    g = fuse(build(), ["generate", "reward"])
    with pytest.raises(RpegError, match="'reward' is already fused with \\(generate, reward\\)"):
        fuse(g, ["reward", "actor_logprobs"])
    with pytest.raises(RpegError, match="different weight versions"):
        fuse(bound_asynchrony(build(), 1), ["generate", "actor_logprobs"])
    split = place(build(), {"gen": 4, "train": 4}, assign={"generate": "gen"}, default="train")
    with pytest.raises(RpegError, match="placed on different device groups"):
        fuse(split, ["generate", "reward"])


# ---- stream -------------------------------------------------------------------------------------
def test_stream_every_edge_that_can():
    g = build()  # mini_batches = 1: nothing streams into the update
    s = stream(g, 4)
    pairs = {(st.producer, st.consumer) for st in s.streams}
    assert ("generate", "reward") in pairs and ("reward", "advantages") in pairs
    assert not any(c == "actor_update" for _, c in pairs)
    assert {(p, c) for p, c, _ in unstreamable(g, 4)} == {(e.src, e.dst) for e in g.data_edges()} - pairs
    assert all(st.microbatches == 4 for st in s.streams)
    assert s.stage("generate").microbatches == 4 and s.stage("actor_update").microbatches == 1
    assert relations(s) == relations(g)
    assert s.history == ("stream(microbatches=4)",)


def test_stream_chosen_edges_and_restream():
    g = build(job=JOB.replace(mini_batches=2))
    s = stream(g, 4, edges=[["generate", "reward"]])
    assert [(st.producer, st.consumer, st.microbatches) for st in s.streams] == [("generate", "reward", 4)]
    s = stream(s, 8, edges=[("generate", "reward"), ("advantages", "actor_update")])
    assert [(st.producer, st.consumer, st.microbatches) for st in s.streams] == [
        ("generate", "reward", 8), ("advantages", "actor_update", 8)]


@pytest.mark.parametrize("algorithm, mini_batches, m, edge, words", [
    ("reinforce_pp", 1, 4, ["reward", "advantages"], "needs the whole batch"),
    ("grpo", 1, 4, ["advantages", "actor_update"], "mini_batches = 1"),
    ("grpo", 4, 6, ["advantages", "actor_update"], "6 micro-batches do not split evenly into the 4 mini-batches"),
    ("grpo", 1, 16, ["reward", "advantages"], "needs all 4 samples of a prompt together"),
    ("grpo", 1, 64, ["generate", "reward"], "64 micro-batches exceed the 32 sequences"),
    ("grpo", 1, 4, ["reward", "actor_update"], "reads nothing that 'reward' writes"),
    ("grpo", 1, 4, ["generate", "judge"], "no stage 'judge'"),
    ("grpo", 1, 4, ["generate", "reward", "advantages"], "an edge is a [producer, consumer] pair"),
])
def test_stream_refusals(algorithm, mini_batches, m, edge, words):
    g = build(algorithm, job=JOB.replace(mini_batches=mini_batches))
    with pytest.raises(RpegError, match=rf"^stream\(microbatches={m}.*\) refused: ") as err:
        stream(g, m, edges=[edge])
    assert words in str(err.value)


def test_stream_refuses_bad_counts():
    for m in (1, 0, True, 2.5):
        with pytest.raises(RpegError, match="microbatches must be a whole number >= 2"):
            stream(build(), m)
    with pytest.raises(RpegError, match="no producer -> consumer edge of this graph can stream"):
        stream(build(), 1000)


# ---- bound_asynchrony -----------------------------------------------------------------------------
def test_bound_asynchrony():
    g = build("remax")
    a = bound_asynchrony(g, 2)
    assert a.async_bound == 2
    assert {s.name: s.lag for s in a.stages if s.lag} == {"generate": 2, "generate_greedy": 2}
    assert relations(a) == relations(g)
    dist = {e.dst: e.distance for e in a.weight_edges()}
    assert dist["generate"] == dist["generate_greedy"] == 3 and dist["actor_logprobs"] == 1
    assert a.history == ("bound_asynchrony(k=2)",)
    back = bound_asynchrony(a, 0)
    assert back.replace(history=()) == g


def test_bound_asynchrony_refusals():
    for k in (-1, True, 1.5, "1"):
        with pytest.raises(RpegError, match=r"bound_asynchrony\(k=.*\) refused: k must be a whole number"):
            bound_asynchrony(build(), k)
    engine = fuse(build(), ["generate", "actor_logprobs"])
    assert bound_asynchrony(engine, 0).async_bound == 0
    with pytest.raises(RpegError, match="would read different weight versions"):
        bound_asynchrony(engine, 1)
    assert bound_asynchrony(fuse(build(), ["generate", "reward"]), 3).async_bound == 3  # a rule reward has no weights


# ---- place / colocate -----------------------------------------------------------------------------
def test_place_disaggregated():
    g = place(build(), {"gen": 4, "train": 12}, assign={"generate": "gen", "reward": "gen"}, default="train")
    assert g.groups == (DeviceGroup(name="gen", first=0, count=4), DeviceGroup(name="train", first=4, count=12))
    assert g.stage("generate").group == "gen" and g.stage("actor_update").group == "train"
    assert not g.group("gen").overlaps(g.group("train"))
    assert verify(g) is g


def test_place_overlapping_groups_colocate():
    g = place(build(), {"gen": (0, 8), "train": (4, 8)}, assign={"generate": "gen"}, default="train")
    assert g.group("gen").overlaps(g.group("train"))
    assert list(g.group("train").devices) == list(range(4, 12))
    g = parallelize(g, "actor_update", dp=4, tp=2)
    assert verify(g) is g


def test_place_leaves_sync_unassigned_without_default():
    g = build()
    assign = {s.name: "all" for s in g.stages if s.kind is not Kind.SYNC}
    p = place(g, {"all": 8}, assign=assign)
    assert p.stage("actor_sync").group is None and p.stage("generate").group == "all"
    assert verify(p) is p


@pytest.mark.parametrize("groups, assign, default, words", [
    ({"gen": 4}, {"rollout": "gen"}, "gen", "no stage 'rollout'"),
    ({"gen": 4}, {"generate": "train"}, "gen", "generate -> group 'train', which is not defined"),
    ({"gen": 4}, {}, "train", "default -> group 'train'"),
    ({"gen": 4}, {"generate": "gen"}, None, "stage 'reward' is assigned to no group and there is no default"),
    ({"gen": 0}, {}, "gen", "bad device group"),
    ({"gen": (-1, 4)}, {}, "gen", "bad device group"),
])
def test_place_refusals(groups, assign, default, words):
    with pytest.raises(RpegError, match=r"^place\(.*\) refused: ") as err:
        place(build(), groups, assign=assign, default=default)
    assert words in str(err.value)


def test_colocate():
    g = colocate(build("ppo"), 8)
    assert g.groups == (DeviceGroup(name="all", first=0, count=8),)
    assert {s.group for s in g.stages} == {"all"}
    assert g.history == ("place(groups={'all': 8}, default='all')",)
    assert fuse(g, ["generate", "reward"]).fusion


# ---- PassPipeline --------------------------------------------------------------------------------
PIPELINE_YAML = """
passes:
  - bound_asynchrony: {k: 1}
  - share_actor_critic
  - fuse: {stages: [generate, reward]}
  - stream: {microbatches: 4}
  - colocate: {devices: 8}
  - parallelize: {stage: actor_update, dp: 4, tp: 2, zero: 3}
"""


def test_pipeline_from_yaml():
    pipeline = PassPipeline.from_data(yaml.safe_load(PIPELINE_YAML)["passes"])
    assert len(pipeline) == 6
    assert [c.name for c in pipeline] == ["bound_asynchrony", "share_actor_critic", "fuse", "stream", "colocate",
                                          "parallelize"]
    g = build("ppo", job=JOB.replace(mini_batches=2))
    out = pipeline.apply(g)
    manual = share_actor_critic(bound_asynchrony(g, 1))
    manual = colocate(stream(fuse(manual, ["generate", "reward"]), 4), 8)
    manual = parallelize(manual, "actor_update", dp=4, tp=2, zero=3)
    assert out == manual
    assert len(out.history) == 6


def test_pipeline_str_numbers_the_passes():
    pipeline = PassPipeline.from_data(yaml.safe_load(PIPELINE_YAML)["passes"])
    lines = str(pipeline).splitlines()
    assert len(lines) == 6
    assert lines[0].startswith(" 1. bound_asynchrony(k=1)")
    assert lines[1].startswith(" 2. share_actor_critic()")
    assert lines[2].startswith(" 3. fuse(stages=['generate', 'reward'])")
    assert lines[5].startswith(" 6. parallelize(stage='actor_update', dp=4, tp=2, zero=3)")
    assert all("  # " in line for line in lines)  # each with what it does
    assert len({line.index("#") for line in lines}) == 1  # comments aligned
    assert str(PassPipeline()) == "(no passes)"
    assert str(PassPipeline.from_data(None)) == "(no passes)"


def test_pipeline_of_and_then():
    p = PassPipeline.of(PassCall("bound_asynchrony", {"k": 2})).then(PassCall("colocate", {"devices": 4}))
    assert [str(c) for c in p] == ["bound_asynchrony(k=2)", "colocate(devices=4)"]
    g = p.apply(build())
    assert g.async_bound == 2 and g.groups[0].count == 4


@pytest.mark.parametrize("data, words", [
    ({"fuse": {}}, "passes: expected a list of passes, got dict"),
    (["bound_asynchrony", "fuse_all"], "passes[1]: unknown pass 'fuse_all' (known: bound_asynchrony"),
    ([{"fuse": {"stage": ["generate"]}}], "passes[0]: pass fuse: unknown argument 'stage' (takes: stages)"),
    ([{"share_actor_critic": {"x": 1}}], "unknown argument 'x' (takes: nothing)"),
    ([{"fuse": {"graph": 1}}], "unknown argument 'graph'"),
    ([{"stream": 4}], "passes[0].stream: arguments must be a mapping, got 4"),
    ([3], "passes[0]: expected a pass name or {name: {args}}, got 3"),
    ([{"fuse": {}, "stream": {}}], "passes[0]: expected a pass name"),
])
def test_pipeline_refuses_bad_data(data, words):
    with pytest.raises(RpegError) as err:
        PassPipeline.from_data(data)
    assert words in str(err.value)


def test_pipeline_errors_at_apply():
    with pytest.raises(RpegError, match="pass fuse: .*stages"):
        PassPipeline.from_data(["fuse"]).apply(build())  # a required argument is missing
    with pytest.raises(RpegError, match="share_actor_critic\\(\\) refused"):
        PassPipeline.from_data(["share_actor_critic"]).apply(build("grpo"))
    with pytest.raises(RpegError, match="unknown pass 'nope'"):
        PassCall("nope")


def test_every_layout_field_passes_back_through_parallelize():
    """The planner hands a stage's layout back to the pass field by field (search/default.py after
    memfit trades layouts): every ParallelLayout field is a parallelize argument, the Megatron-Core
    recipe options included, and the layout comes out equal."""
    import dataclasses

    from rpeg.algorithms import Models, build_graph
    from rpeg.graph import Job, ParallelLayout, get_model
    from rpeg.passes import colocate, parallelize
    g = colocate(build_graph("grpo", Job(), Models(actor=get_model("qwen3-0.6B"))), 8)
    lay = ParallelLayout(dp=4, pp=2, recompute="selective", recompute_modules=("core_attn", "mlp"),
                         grad_dtype="bf16", optimizer_moments="bf16", pp_embedding_loss_slots=True)
    out = parallelize(g, "actor_update", **{f.name: getattr(lay, f.name) for f in dataclasses.fields(lay)})
    assert out.stage("actor_update").layout == lay
