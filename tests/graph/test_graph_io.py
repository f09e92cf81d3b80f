"""YAML/JSON round trip of graphs (exact, after passes too) and the errors a bad file gives."""

from __future__ import annotations

import json

import pytest
import yaml

from rpeg.algorithms import ALGORITHMS, Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import Job, LengthDistribution, ModelSpec, VerificationError, get_model
from rpeg.graph.io import graph_from_text, graph_to_json, graph_to_yaml
from rpeg.graph.serde import from_data, read_yaml_file, to_data
from rpeg.passes import bound_asynchrony, colocate, fuse, parallelize, place, share_actor_critic, stream

LLAMA = get_model("llama-3.1-8B")
JOB = Job(prompts=16, samples_per_prompt=4, prompt_len=256, response=LengthDistribution.fixed(512), mini_batches=4)

CUSTOM_MLA_MOE = ModelSpec(name="custom-mla-moe", layers=8, hidden=1024, heads=16, kv_heads=16, head_dim=64, ffn=2816,
                           vocab=32000, attention="mla", q_lora_rank=256, kv_lora_rank=128, rope_head_dim=32,
                           v_head_dim=64, experts=16, experts_per_token=2, moe_ffn=512, shared_experts=1,
                           dense_layers=1)
CUSTOM_GPT = ModelSpec(name="custom-gpt", layers=6, hidden=512, heads=8, kv_heads=8, ffn=2048, vocab=50257,
                       ffn_act="gelu", attention="mha", norm="layernorm", linear_bias=True, tied_embeddings=True,
                       position_embeddings=1024)
CUSTOM_RM = ModelSpec(name="custom-rm", layers=4, hidden=256, heads=4, kv_heads=1, ffn=704, vocab=32000,
                      qk_norm=True, head_dim=128)

DISTRIBUTIONS = [
    LengthDistribution.fixed(777),
    LengthDistribution(kind="fixed", mean=12.5),
    LengthDistribution(kind="uniform", min=3, max=4000),
    LengthDistribution(kind="lognormal", mean=1234.5, max=16384, sigma=1.3),
    LengthDistribution(kind="empirical", points=(5, 900, 77, 77, 3000)),
]


def assert_round_trips(g):
    from_yaml = graph_from_text(graph_to_yaml(g))
    from_json = graph_from_text(graph_to_json(g))
    assert from_yaml == g
    assert from_json == g
    again = graph_to_yaml(from_yaml)
    assert graph_to_yaml(graph_from_text(again)) == again  # a loaded graph's text is stable


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_round_trips(algorithm):
    assert_round_trips(build_graph(algorithm, JOB, Models(actor=LLAMA)))


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=lambda d: d.kind)
def test_every_length_distribution_round_trips(dist):
    g = build_graph("grpo", JOB.replace(response=dist), Models(actor=LLAMA))
    assert_round_trips(g)
    assert graph_from_text(graph_to_yaml(g)).job.response == dist


def test_custom_model_specs_round_trip():
    models = Models(actor=CUSTOM_MLA_MOE, critic=CUSTOM_GPT, reference=CUSTOM_MLA_MOE.replace(name="ref-moe"),
                    reward=CUSTOM_RM)
    g = build_graph("ppo", JOB, models, kl_coef=0.02, gamma=0.99, lam=0.9)
    assert {m.name: m.spec.name for m in g.models} == {
        "actor": "custom-mla-moe", "critic": "custom-gpt", "ref": "ref-moe", "reward": "custom-rm"}
    assert_round_trips(g)


def test_small_and_large_floats_round_trip_through_json():
    # json writes 1e-05 and 1e+16; YAML 1.1 would read both as strings.
    g = build_graph("ppo", JOB, Models(actor=LLAMA), kl_coef=1e-5, entropy_coef=1e-7, oversample=1e16)
    assert_round_trips(g)
    assert graph_from_text(graph_to_json(g)).config.kl_coef == 1e-5


def test_graphs_after_passes_round_trip():
    g = build_graph("ppo", JOB, Models(actor=LLAMA))
    g = share_actor_critic(g)
    g = bound_asynchrony(g, 1)
    g = fuse(g, ["generate", "reward"])
    g = stream(g, 4)
    g = place(g, {"gen": 8, "train": (8, 16)}, assign={"generate": "gen", "reward": "gen"}, default="train")
    g = parallelize(g, "generate", tp=4, dp=2)
    g = parallelize(g, "actor_update", dp=4, tp=2, pp=2, zero=3, recompute="full", sequence_parallel=True,
                    pp_interleave=2)
    assert g.fusion and g.streams and g.groups and g.async_bound == 1 and len(g.history) == 7
    assert_round_trips(g)


def test_colocated_fused_training_round_trips():
    g = build_graph("ppo", JOB, Models(actor=LLAMA, reward=CUSTOM_RM))
    g = fuse(g, ["actor_update", "critic_update"])
    g = colocate(g, 8)
    g = parallelize(g, "critic_update", dp=8, zero=2)
    assert_round_trips(g)


def test_yaml_header_and_defaults_left_out():
    text = graph_to_yaml(build_graph("grpo", JOB, Models(actor=LLAMA)))
    assert text.startswith("# rpeg-graph/1\n")
    data = yaml.safe_load(text)
    assert "lag" not in data["stages"][0]  # defaults are not written
    assert data["stages"][0]["kind"] == "generate"
    assert json.loads(graph_to_json(build_graph("grpo", JOB, Models(actor=LLAMA)))) == data


# ---- errors --------------------------------------------------------------------------------------
def _data():
    return to_data(build_graph("grpo", JOB, Models(actor=LLAMA)))


def _load(data):
    return graph_from_text(yaml.safe_dump(data))


def test_malformed_yaml_names_the_line():
    text = "algorithm: ppo\njob:\n  prompts: 4\n   samples_per_prompt: 2\n"
    with pytest.raises(RpegError, match=r"^job\.yaml:4:\d+: malformed YAML"):
        graph_from_text(text, "job.yaml")
    with pytest.raises(RpegError, match=r"^<string>:2:\d+: malformed YAML"):
        graph_from_text("stages: [a, b\nc: d\n")


def test_broken_json_names_the_line():
    text = graph_to_json(build_graph("grpo", JOB, Models(actor=LLAMA)))
    broken = text.replace('"job": {', '"job": {{', 1)
    line = text[:text.index('"job": {')].count("\n") + 1
    with pytest.raises(RpegError, match=rf"^g\.json:{line}:\d+: malformed JSON: Expecting property name"):
        graph_from_text(broken, "g.json")


def test_flow_style_yaml_is_still_yaml():
    g = build_graph("grpo", JOB, Models(actor=LLAMA))
    flow = yaml.safe_dump(to_data(g), default_flow_style=True)  # starts with "{" but is not JSON
    assert flow.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(flow)
    assert graph_from_text(flow) == g


def test_not_a_mapping():
    with pytest.raises(RpegError, match="expected a graph mapping, got list"):
        graph_from_text("- a\n- b\n")


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d["job"].update(prompt=5), "job.prompt: unknown key for Job"),
    (lambda d: d.update(extra=1), "extra: unknown key for Graph"),
    (lambda d: d["job"].update(prompts="many"), "job.prompts: expected an integer, got 'many'"),
    (lambda d: d["job"].update(prompts=2.5), "job.prompts: expected an integer, got 2.5"),
    (lambda d: d["job"]["response"].update(max="long"), "job.response.max: expected an integer, got 'long'"),
    (lambda d: d["job"]["response"].update(kind="gamma"), "job.response.kind: 'gamma' is not one of"),
    (lambda d: d["config"].update(kl_coef="lots"), "config.kl_coef: expected a number, got 'lots'"),
    (lambda d: d["config"].update(kl_coef=True), "config.kl_coef: expected a number, got True"),
    (lambda d: d["stages"][2].update(kind="bogus"), "stages[2].kind: 'bogus' is not one of generate"),
    (lambda d: d["stages"][0].update(greedy=3), "stages[0].greedy: expected true or false, got 3"),
    (lambda d: d["stages"][0].update(reads="prompt_ids"), "stages[0].reads: expected a list, got 'prompt_ids'"),
    (lambda d: d["stages"][0].update(reads=[1]), "stages[0].reads[0]: expected a string, got 1"),
    (lambda d: d["models"][0]["spec"].update(kv_heads=5), "models[0].spec: model 'llama-3.1-8B': heads = 32"),
    (lambda d: d["job"].update(prompts=0), "job: prompts = 0 must be positive"),
    (lambda d: d.pop("algorithm"), "algorithm: missing (required by Graph)"),
    (lambda d: d.update(job=[1, 2]), "job: expected a mapping for Job, got [1, 2]"),
    (lambda d: d.update(fusion=[["generate", 3]]), "fusion[0][1]: expected a string, got 3"),
])
def test_bad_values_name_the_path(mutate, words):
    data = _data()
    mutate(data)
    with pytest.raises(RpegError) as err:
        _load(data)
    assert words in str(err.value)
    place = words.split(":")[0]
    assert f"{place}: {place}:" not in str(err.value)  # a place is named once
    assert not isinstance(err.value, VerificationError)


def test_loaded_graphs_are_verified():
    data = _data()
    data["stages"][0]["lag"] = 2  # generation staler than the async bound 0
    with pytest.raises(VerificationError, match=r"^graph\.yaml: stage 'generate': rule 'weight-version'"):
        graph_from_text(yaml.safe_dump(data), "graph.yaml")


def test_loaded_graph_with_unknown_dtype_is_a_violation_not_a_crash():
    data = _data()
    data["fields"][0]["dtype"] = "fp8"
    data["fields"][1]["shape"] = ["batch", "tokens"]
    with pytest.raises(VerificationError) as err:
        _load(data)
    assert {v.rule for v in err.value.violations} >= {"field-dtype", "field-shape"}


def test_read_yaml_file(tmp_path):
    g = build_graph("rloo", JOB, Models(actor=LLAMA))
    path = tmp_path / "g.yaml"
    path.write_text(graph_to_yaml(g))
    assert from_data(type(g), read_yaml_file(str(path))) == g
    with pytest.raises(RpegError, match="cannot read .*missing.yaml"):
        read_yaml_file(str(tmp_path / "missing.yaml"))


def test_yaml_text_is_stable_across_a_load_and_dump():
    """A file written, read and written again is the same text (ints given for float fields are
    normalized on construction, so `mean: 512` never turns into `mean: 512.0` on the way back)."""
    from rpeg.algorithms import Models, build_graph
    from rpeg.graph import Job, LengthDistribution, get_model
    from rpeg.graph.io import graph_from_text, graph_to_yaml

    g = build_graph("ppo", Job(response=LengthDistribution.fixed(512)), Models(actor=get_model("qwen3-8B")))
    text = graph_to_yaml(g)
    assert graph_to_yaml(graph_from_text(text)) == text
