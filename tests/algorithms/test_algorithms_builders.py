"""Algorithm builders: each builds a verified graph with the stages, models and fields its paper
calls for."""

from __future__ import annotations

import pytest

from rpeg.algorithms import ALGORITHMS, Models, build_graph, get_algorithm
from rpeg.algorithms.common import FIELDS
from rpeg.errors import RpegError
from rpeg.graph import Job, Kind, LengthDistribution, get_model, verify
from rpeg.graph.verify import violations

TINY = get_model("tiny-qwen2")
RM = get_model("qwen2.5-0.5B")
JOB = Job(prompts=8, samples_per_prompt=4, prompt_len=64, response=LengthDistribution.fixed(128), ppo_epochs=2)

GROUP_ALGORITHMS = ["grpo", "rloo", "dapo", "dr_grpo", "reinforce_pp_baseline"]
WITH_REFERENCE = [name for name, a in ALGORITHMS.items() if a.default.kl_coef > 0]


def build(algorithm, job=JOB, models=Models(actor=TINY), **config):
    return build_graph(algorithm, job, models, **config)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_builds_and_verifies(algorithm):
    g = build(algorithm)
    assert g.algorithm == algorithm
    assert violations(g) == [] and verify(g) is g
    assert g.config == ALGORITHMS[algorithm].default
    kinds = {s.kind for s in g.stages}
    assert {Kind.GENERATE, Kind.REWARD, Kind.INFER, Kind.COMPUTE, Kind.TRAIN, Kind.SYNC} <= kinds
    assert g.stage("actor_update").passes == JOB.ppo_epochs
    assert g.model("actor").trainable
    # every declared field is the catalogue's and is used by some stage
    used = {f for s in g.stages for f in s.reads + s.writes}
    assert {f.name for f in g.fields} == used
    assert all(f == FIELDS[f.name] for f in g.fields)
    assert g.inputs == ("prompt_ids",) and g.history == () and g.async_bound == 0


def test_ppo_has_a_critic_and_gae():
    g = build("ppo")
    critic = g.model("critic")
    assert critic.trainable and critic.heads == ("value",) and critic.spec == TINY
    assert g.config.adv_estimator == "gae" and g.config.lam == 0.95
    assert g.stage("critic_values").kind is Kind.INFER and g.stage("critic_values").model == "critic"
    assert g.stage("critic_update").kind is Kind.TRAIN and g.stage("critic_update").model == "critic"
    assert g.stage("advantages").writes == ("advantages", "returns")
    assert "values" in g.stage("advantages").reads
    assert g.stage("advantages").granularity == "batch"  # GAE advantages are whitened over the batch
    custom = build("ppo", models=Models(actor=TINY, critic=RM))
    assert custom.model("critic").spec == RM


@pytest.mark.parametrize("algorithm", sorted(set(ALGORITHMS) - {"ppo"}))
def test_only_ppo_has_a_critic(algorithm):
    g = build(algorithm)
    assert not g.has_model("critic")
    assert all(s.model != "critic" for s in g.stages)


@pytest.mark.parametrize("algorithm", GROUP_ALGORITHMS)
def test_group_baselines_refuse_one_sample_per_prompt(algorithm):
    with pytest.raises(RpegError, match=f"{algorithm} needs samples_per_prompt >= 2.*got 1"):
        build(algorithm, job=JOB.replace(samples_per_prompt=1))


@pytest.mark.parametrize("algorithm", ["ppo", "reinforce_pp", "remax"])
def test_other_algorithms_take_one_sample_per_prompt(algorithm):
    assert verify(build(algorithm, job=JOB.replace(samples_per_prompt=1)))


def test_dapo_oversamples_and_filters():
    g = build("dapo")
    assert g.config.oversample == 1.5 and g.config.clip_high == 0.28 and g.config.clip_low == 0.2
    gen = g.stage("generate")
    assert gen.sequences == "gen_batch"
    assert g.stage_sequences(gen) == 1.5 * JOB.sequences
    assert g.stage_sequences(g.stage("reward")) == 1.5 * JOB.sequences
    ds = g.stage("dynamic_sampling")
    assert ds.kind is Kind.COMPUTE and ds.granularity == "group"
    assert set(ds.reads) == {"sampled_ids", "sampled_scores"} and set(ds.writes) == {"response_ids", "scores"}
    assert g.stage_sequences(g.stage("actor_update")) == JOB.sequences
    assert g.field("sampled_ids").shape[0] == "gen_batch"
    assert build("dapo", oversample=2.0).stage_sequences(gen) == 2 * JOB.sequences
    with pytest.raises(RpegError, match="dynamic sampling needs oversample > 1"):
        build("dapo", oversample=1.0)


def test_remax_has_a_greedy_rollout():
    g = build("remax")
    greedy = g.stage("generate_greedy")
    assert greedy.kind is Kind.GENERATE and greedy.greedy and greedy.model == "actor"
    assert g.stage_sequences(greedy) == JOB.prompts
    assert not g.stage("generate").greedy
    assert g.stage("reward_greedy").reads == ("prompt_ids", "greedy_ids")
    assert "greedy_scores" in g.stage("advantages").reads
    assert [s.name for s in g.stages if s.greedy] == ["generate_greedy"]


@pytest.mark.parametrize("algorithm", WITH_REFERENCE)
def test_kl_coef_zero_removes_the_reference(algorithm):
    assert build(algorithm).has_model("ref")
    g = build(algorithm, kl_coef=0.0)
    assert verify(g)
    assert not g.has_model("ref")
    assert all(s.model != "ref" for s in g.stages)
    assert "ref_logprobs" not in {f.name for f in g.fields}


def test_kl_coef_adds_a_reference_where_default_has_none():
    g = build("dapo", kl_coef=0.01)
    assert g.has_model("ref") and not g.model("ref").trainable
    assert g.stage("ref_logprobs").model == "ref"


def test_kl_placement():
    # in the loss: the actor update reads the reference logprobs; in the reward: the advantages do
    assert "ref_logprobs" in build("grpo").stage("actor_update").reads
    assert "ref_logprobs" not in build("grpo").stage("advantages").reads
    assert "ref_logprobs" in build("grpo", kl_in="reward").stage("advantages").reads
    assert "ref_logprobs" in build("ppo").stage("advantages").reads
    assert "ref_logprobs" not in build("ppo").stage("actor_update").reads


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_reward_model_adds_a_reward_role(algorithm):
    assert not build(algorithm).has_model("reward")
    assert build(algorithm).stage("reward").model is None
    g = build(algorithm, models=Models(actor=TINY, reward=RM))
    role = g.model("reward")
    assert role.spec == RM and not role.trainable and role.heads == ("score",)
    assert all(s.model == "reward" for s in g.stages if s.kind is Kind.REWARD)


def test_advantage_granularity():
    assert build("reinforce_pp").stage("advantages").granularity == "batch"
    assert build("reinforce_pp_baseline").stage("advantages").granularity == "batch"
    assert build("ppo").stage("advantages").granularity == "batch"  # GAE, then whitened over the batch
    for algorithm in ("grpo", "rloo", "dapo", "dr_grpo"):
        assert build(algorithm).stage("advantages").granularity == "group"
    assert build("remax").stage("advantages").granularity == "sample"


def test_config_overrides_and_unknown_options():
    g = build("grpo", kl_coef=0.1, clip_high=0.3)
    assert g.config.kl_coef == 0.1 and g.config.clip_high == 0.3
    assert g.config.adv_estimator == "grpo"
    with pytest.raises(RpegError, match="unknown algorithm option 'klcoef'"):
        build("grpo", klcoef=0.1)
    with pytest.raises(RpegError, match="kl_coef = -1"):
        build("grpo", kl_coef=-1.0)


def test_algorithm_names():
    assert get_algorithm("GRPO").name == "grpo"
    assert get_algorithm("REINFORCE++").name == "reinforce_pp"
    assert get_algorithm("reinforce++-baseline").name == "reinforce_pp_baseline"
    assert get_algorithm("Dr.GRPO").name == "dr_grpo"
    assert get_algorithm("dr-grpo").name == "dr_grpo"
    with pytest.raises(RpegError, match="unknown algorithm 'trpo' .*ppo"):
        get_algorithm("trpo")
    assert all(a.summary for a in ALGORITHMS.values())


def test_weights_sync_to_generation():
    for algorithm in ALGORITHMS:
        g = build(algorithm)
        sync = g.stage("actor_sync")
        assert sync.kind is Kind.SYNC and sync.reads == () and sync.writes == ()
        into_gen = [e for e in g.weight_edges() if g.stage(e.dst).kind is Kind.GENERATE]
        assert into_gen and all(e.src == "actor_sync" and e.distance == 1 for e in into_gen)
