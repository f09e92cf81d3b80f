"""The peer systems' plans: each baseline reproduces its documented placement, asynchrony and layout
restrictions, verifies, costs and simulates, is deterministic, and says None (not an exception)
when the model fits nowhere.

Jobs: PPO with Llama-3.1-8B as actor, critic, reference and reward model; GRPO with Qwen3-8B (rule
reward, reference); on DGX H100 nodes of 8 GPUs, at 64 GPUs (8 nodes) and 8 GPUs (one node)."""

import importlib
import math

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import Job, Kind, get_model, verify
from rpeg.hardware import load_cluster
from rpeg.passes import colocate
from rpeg.perf.step import predict_step
from rpeg.search.baselines import BASELINES, Baseline, build_baselines
from rpeg.search.baselines.common import split
from rpeg.search.baselines.openrlhf import fallbacks
from rpeg.search.baselines.real import meshes
from rpeg.search.layouts import LayoutCache
from rpeg.sim import simulate

NAMES = ("verl", "verl-megatron", "verl-one-step-off", "verl-fully-async", "real", "openrlhf", "openrlhf-v0.2", "openrlhf-async", "areal", "nemo-rl",
         "nemo-rl-one-step-off", "deepspeed-chat")
K = {"verl": 0, "verl-megatron": 0, "verl-one-step-off": 1, "verl-fully-async": 1, "real": 0, "openrlhf": 0, "openrlhf-v0.2": 0, "openrlhf-async": 1, "areal": 4, "nemo-rl": 0,
     "nemo-rl-one-step-off": 1, "deepspeed-chat": 0}
COLOCATED = {"verl", "verl-megatron", "real", "nemo-rl", "deepspeed-chat"}  # generation shares devices with actor training
FSDP_LIKE = {"verl", "verl-one-step-off", "verl-fully-async", "openrlhf", "openrlhf-v0.2", "openrlhf-async", "areal", "deepspeed-chat"}  # ZeRO-3, tp 1, pp 1
MODULES = ("verl", "real", "openrlhf", "areal", "nemo_rl", "deepspeed_chat")

LLAMA = get_model("llama-3.1-8B")
# plans whose models, summed on the devices they share (rpeg/perf/residency.py), exceed them: on one
# node AReaL's two training GPUs would hold two trained 8B models' FSDP state and two frozen 8B models
# (~170 GB per GPU; for GRPO the actor's state and the reference, ~99 GB), and ReaL's ZeRO-1 meshes keep
# the critic's state beside the engine (~135 GB)
DOES_NOT_FIT = {("ppo", 8): {"real", "areal"}, ("grpo", 8): {"areal"}}
JOBS = {
    "ppo": build_graph("ppo", Job(), Models(actor=LLAMA, critic=LLAMA, reference=LLAMA, reward=LLAMA)),
    "grpo": build_graph("grpo", Job(), Models(actor=get_model("qwen3-8B"))),
}


@pytest.fixture(scope="module")
def dgx():
    return load_cluster("dgx-h100", 64)


@pytest.fixture(scope="module")
def plans(dgx):
    """(job, gpus) -> {baseline: plan}, built once with one shared cache."""
    cache = LayoutCache()
    return {(job, gpus): build_baselines(g, dgx, gpus, cache) for job, g in JOBS.items() for gpus in (64, 8)}


def sizes(plan):
    """stage -> devices of its group (weight syncs span groups and are left out)."""
    return {s.name: plan.group(s.group).count for s in plan.stages if s.group and s.kind is not Kind.SYNC}


def overlaps(plan, a, b):
    return plan.group(plan.stage(a).group).overlaps(plan.group(plan.stage(b).group))


# ---- the registry ------------------------------------------------------------------------------------------
def test_registry_names_systems_and_summaries():
    assert tuple(BASELINES) == NAMES
    for name, b in BASELINES.items():
        assert isinstance(b, Baseline) and b.name == name and callable(b.build)
        assert b.system and b.summary and "\n" not in b.summary


@pytest.mark.parametrize("module", MODULES)
def test_module_docstrings_cite_sources_and_say_what_is_left_out(module):
    doc = importlib.import_module(f"rpeg.search.baselines.{module}").__doc__
    assert "Sources:" in doc and "Left out:" in doc and "models" in doc
    assert "arXiv" in doc or "repository" in doc


# ---- structure and placement -------------------------------------------------------------------------------
@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("gpus", (64, 8))
def test_async_bound_and_colocation_as_documented(plans, job, gpus):
    for name, plan in plans[(job, gpus)].items():
        if name in DOES_NOT_FIT.get((job, gpus), ()):
            assert plan is None, name
            continue
        assert plan is not None, name
        assert plan.async_bound == K[name], name
        assert all(s.lag == K[name] for s in plan.stages if s.kind is Kind.GENERATE), name
        assert overlaps(plan, "generate", "actor_update") == (name in COLOCATED), name


def test_group_sizes_ppo_on_64_gpus(plans):
    p = plans[("ppo", 64)]
    everything = {s.name: 64 for s in JOBS["ppo"].stages if s.kind is not Kind.SYNC}
    for name in ("verl", "nemo-rl", "deepspeed-chat"):
        assert sizes(p[name]) == everything, name
        assert len(p[name].groups) == 1
    trainer = {n: 48 for n in everything} | {"generate": 16}
    assert sizes(p["verl-one-step-off"]) == trainer
    assert sizes(p["nemo-rl-one-step-off"]) == {n: 32 for n in everything}
    assert sizes(p["areal"]) == {n: 16 for n in everything} | {"generate": 48}
    assert sizes(p["real"]) == {"generate": 64, "reward": 16, "actor_logprobs": 16, "ref_logprobs": 16,
                                "critic_values": 16, "advantages": 64, "actor_update": 32, "critic_update": 32}
    for name in ("openrlhf", "openrlhf-v0.2", "openrlhf-async"):
        s = sizes(p[name])
        assert s == {"generate": 16, "reward": 8, "actor_logprobs": 16, "ref_logprobs": 8, "critic_values": 16,
                     "advantages": 16, "actor_update": 16, "critic_update": 16}
    for plan in p.values():  # whole nodes at 64 GPUs
        assert all(g.first % 8 == 0 and g.count % 8 == 0 for g in plan.groups)


def test_group_sizes_on_one_node(plans):
    ppo, grpo = plans[("ppo", 8)], plans[("grpo", 8)]
    assert (sizes(ppo["verl-one-step-off"])["generate"], sizes(ppo["verl-one-step-off"])["actor_update"]) == (2, 6)
    assert split(8, 8, (3, 1)) == (6, 2)  # AReaL's generation share on one node (its plans there: DOES_NOT_FIT)
    nemo = sizes(ppo["nemo-rl-one-step-off"])
    assert (nemo["generate"], nemo["actor_update"]) == (4, 4)
    s = sizes(ppo["openrlhf"])
    assert (s["generate"], s["actor_update"], s["critic_update"], s["ref_logprobs"], s["reward"]) == (2, 2, 2, 1, 1)
    s = sizes(grpo["openrlhf"])
    assert (s["generate"], s["actor_update"], s["ref_logprobs"]) == (4, 3, 1)
    s = sizes(grpo["real"])
    assert (s["actor_logprobs"], s["ref_logprobs"], s["actor_update"]) == (4, 4, 8)


def test_grpo_group_sizes_on_64_gpus(plans):
    s = sizes(plans[("grpo", 64)]["openrlhf"])
    assert (s["generate"], s["actor_update"], s["ref_logprobs"]) == (32, 24, 8)
    s = sizes(plans[("grpo", 64)]["real"])
    assert (s["actor_logprobs"], s["ref_logprobs"], s["actor_update"]) == (32, 32, 64)


@pytest.mark.parametrize("gpus", (64, 8))
def test_disaggregated_groups_do_not_overlap_and_real_calls_run_on_disjoint_meshes(plans, gpus):
    for name in ("openrlhf", "openrlhf-v0.2", "openrlhf-async"):
        groups = plans[("ppo", gpus)][name].groups
        assert len(groups) == 5
        assert not any(a.overlaps(b) for i, a in enumerate(groups) for b in groups[i + 1:]), name
    real = plans[("ppo", gpus)]["real"]
    if real is None:  # DOES_NOT_FIT on one node
        return
    infer = ["actor_logprobs", "ref_logprobs", "reward", "critic_values"]
    assert not any(overlaps(real, a, b) for i, a in enumerate(infer) for b in infer[i + 1:])
    assert not overlaps(real, "actor_update", "critic_update")
    # each trained model's inference mesh lies inside its training mesh
    for infer_stage, train_stage in (("actor_logprobs", "actor_update"), ("critic_values", "critic_update")):
        inner, outer = (real.group(real.stage(n).group) for n in (infer_stage, train_stage))
        assert set(inner.devices) <= set(outer.devices)


# ---- layouts -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("gpus", (64, 8))
def test_layouts_obey_each_systems_restrictions(plans, job, gpus):
    for name, plan in plans[(job, gpus)].items():
        for s in plan.stages if plan is not None else ():
            if s.model is None or s.kind is Kind.SYNC:
                assert s.layout is None
                continue
            lay = s.layout
            if s.kind is Kind.GENERATE:
                assert lay.tp <= 8 and lay.cp == 1, (name, s.name)
                assert lay.pp == 1 or name == "real", (name, s.name)
                # verl passes rollout.max_num_seqs (256 at v0.9) to vLLM; the others leave vLLM its default
                assert lay.max_seqs == (256 if name.startswith("verl") else 0), (name, s.name)
            elif name in FSDP_LIKE:  # a forward pass may be FSDP-sharded too (verl wraps its reference in FSDP)
                assert (lay.tp, lay.pp) == (1, 1), (name, s.name)
                assert lay.zero in ((3,) if s.kind is Kind.TRAIN else (0, 3)), (name, s.name)
            elif s.kind is Kind.TRAIN:  # nemo-rl, nemo-rl-one-step-off, real: Megatron-style ZeRO-1
                assert lay.zero == 1, (name, s.name)
            if name in ("real", "deepspeed-chat"):
                assert lay.cp == 1, (name, s.name)


def test_only_areal_streams(plans):
    for (job, gpus), ps in plans.items():
        for name, plan in ps.items():
            if plan is None:
                continue
            if name != "areal":
                assert plan.streams == () and all(s.microbatches == 1 for s in plan.stages), name
                continue
            pairs = {(st.producer, st.consumer) for st in plan.streams}
            assert ("generate", "actor_logprobs") in pairs and ("generate", "ref_logprobs") in pairs
            assert all(st.microbatches == 16 for st in plan.streams)
            assert not any(st.consumer == "actor_update" for st in plan.streams)  # one optimizer step per batch


# ---- the plans are usable ----------------------------------------------------------------------------------
def test_every_plan_verifies_costs_and_simulates(plans, dgx):
    for (job, gpus), ps in plans.items():
        for name, plan in ps.items():
            if plan is None:
                assert name in DOES_NOT_FIT.get((job, gpus), ()), (job, gpus, name)
                continue
            assert verify(plan) is plan
            pred = predict_step(plan, dgx)
            assert pred.fits and math.isfinite(pred.step_s) and pred.step_s > 0, (job, gpus, name)
            tl = simulate(plan, dgx, steps=4)
            assert math.isfinite(tl.step_s) and tl.step_s > 0
            assert tl.max_staleness <= K[name], (job, gpus, name)


def test_build_is_deterministic(dgx, plans):
    again = build_baselines(JOBS["grpo"], dgx, 64, LayoutCache())
    assert again == plans[("grpo", 64)]
    for name, b in BASELINES.items():
        assert b.build(JOBS["ppo"], dgx, 8, LayoutCache()) == plans[("ppo", 8)][name]


def test_a_model_too_large_gives_none_not_an_exception(dgx):
    huge = build_graph("grpo", Job(), Models(actor=get_model("llama-3.1-405B")))
    assert build_baselines(huge, dgx, 8, LayoutCache()) == {n: None for n in NAMES}


@pytest.mark.parametrize("gpus", (1, 2, 3))
def test_too_few_gpus_for_the_split_fall_back_without_empty_groups(dgx, gpus):
    small = build_graph("ppo", Job(prompts=8), Models(actor=get_model("qwen3-0.6B")))
    for name, plan in build_baselines(small, dgx, gpus, LayoutCache()).items():
        assert plan is not None, name
        assert max(g.first + g.count for g in plan.groups) <= gpus
        assert all(g.count >= 1 for g in plan.groups)
        if gpus == 1:
            assert [g.name for g in plan.groups] == ["all"], name


def test_refuses_a_planned_graph_or_a_bad_gpu_count(dgx):
    with pytest.raises(RpegError, match="already has device groups"):
        BASELINES["verl"].build(colocate(JOBS["grpo"], 8), dgx, 8, LayoutCache())
    with pytest.raises(RpegError, match="gpus must be"):
        BASELINES["areal"].build(JOBS["grpo"], dgx, 0, LayoutCache())
    with pytest.raises(RpegError, match="has 64"):
        BASELINES["real"].build(JOBS["grpo"], dgx, 128, LayoutCache())


# ---- the splitting rules -----------------------------------------------------------------------------------
def test_split_whole_nodes_where_possible():
    assert split(64, 8, (2, 2, 2, 1, 1)) == (16, 16, 16, 8, 8)
    assert split(8, 8, (2, 2, 2, 1, 1)) == (2, 2, 2, 1, 1)
    assert split(24, 8, (1, 3)) == (8, 16)  # a quarter is less than a node: still one node
    assert split(16, 8, (2, 2, 2, 1, 1)) == (4, 4, 4, 2, 2)  # 2 nodes for 5 groups: GPUs
    assert split(12, 8, (2, 3, 2, 1)) == (3, 5, 3, 1)  # not whole nodes; the tie goes to the earlier group
    assert split(4, 8, (2, 2, 2, 1, 1)) is None


def test_real_meshes_follow_its_mesh_rule():
    assert meshes(64, 8, 4) == (16, 16, 16, 16)
    assert meshes(64, 8, 3) == (24, 24, 16)
    assert meshes(8, 8, 3) == (4, 2, 2)  # power-of-two meshes inside a node
    assert meshes(24, 8, 4) == (8, 8, 4, 4)
    assert meshes(2, 8, 3) is None


def test_openrlhf_falls_back_through_its_colocation_flags():
    levels = [[r.name for r in rs] for rs in fallbacks(JOBS["ppo"])]
    assert levels == [["vllm", "actor", "critic", "ref", "reward"], ["vllm", "actor", "critic"], ["vllm", "models"]]
    paired = fallbacks(JOBS["ppo"])[1]
    assert "ref_logprobs" in paired[1].stages and "reward" in paired[2].stages


def test_verl_megatron_trains_3d_parallel_and_reshards_without_redundancy(plans, dgx):
    """HybridFlow's evaluated verl: Megatron training (ZeRO-1, tp/pp) and the 3D-HybridEngine's
    shard-only resharding, where verl's FSDP default gathers every tensor in full."""
    for (job, gpus), ps in plans.items():
        mega, fsdp = ps["verl-megatron"], ps["verl"]
        assert mega.refit_gather == "shard" and fsdp.refit_gather == "full"
        assert mega.stage("actor_update").layout.zero == 1 and fsdp.stage("actor_update").layout.zero == 3
        if gpus > 1:
            assert (predict_step(mega, dgx).stages["actor_sync"].seconds
                    <= predict_step(fsdp, dgx).stages["actor_sync"].seconds), (job, gpus)
