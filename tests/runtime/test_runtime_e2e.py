"""End-to-end runs of the runtime on a tiny model: GRPO and PPO train, record rewards and change
the weights; an interrupted-and-resumed run ends with the same weights as an uninterrupted one;
plans the runtime cannot honour are refused before anything starts."""

from __future__ import annotations

import json
import os

import pytest
import torch

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import Job, LengthDistribution, get_model
from rpeg.passes import bound_asynchrony, colocate, parallelize, place, refit
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.run import run

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`

TINY = get_model("tiny-qwen2")


def job(mini_batches=2):
    return Job(prompts=8, samples_per_prompt=4, prompt_len=6, response=LengthDistribution.fixed(4),
               mini_batches=mini_batches)


MICRO = {"micro_batch": 64, "packing": False}  # the runtime's micro-batch, stated in the plan's layouts


def lay(g, stage: str, **layout):
    """`parallelize` with 64-row micro-batches unless the layout says otherwise."""
    return parallelize(g, stage, **(MICRO | layout))


def laid_out(g):
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            g = lay(g, s.name, dp=1)
    return g


def split_async_plan(kl_coef=0.0):
    """GRPO with generation on one device, everything else on another, one step ahead (k = 1)."""
    g = bound_asynchrony(build_graph("grpo", job(), Models(actor=TINY), kl_coef=kl_coef), 1)
    return laid_out(place(g, {"gen": 1, "train": 1}, {"generate": "gen"}, default="train"))


def colocated_plan(algorithm="grpo", **cfg):
    return laid_out(colocate(build_graph(algorithm, job(), Models(actor=TINY), **cfg), 1))


def rt(tmp_path, **kw):
    base = dict(model_path="tiny", task={"name": "arithmetic", "ops": ["add"], "level": 1}, steps=3, lr=1e-3,
                max_new_tokens=3, eval_every=0, eval_size=20, checkpoint_every=1, out=str(tmp_path / "run"), threads=1)
    base.update(kw)
    return RuntimeConfig(**base)


def weights(out: str) -> dict:
    folder = os.path.join(out, "checkpoints")
    with open(os.path.join(folder, "latest")) as fh:
        state = torch.load(os.path.join(folder, fh.read().strip(), "state.pt"), weights_only=False)
    return state["actor"]["model"]


def test_grpo_trains_and_records(tmp_path):
    from rpeg.hardware import load_cluster

    result = run(colocated_plan(kl_coef=0.04), rt(tmp_path), progress=False, cluster=load_cluster("dgx-h100", 1))
    assert len(result.metrics) == 3
    rows = [json.loads(line) for line in open(os.path.join(result.out, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(0.0 <= r["reward"] <= 1.0 and "pg_loss" in r and r["grad_norm"] >= 0 for r in rows)
    assert all(r["staleness_max"] == 0 for r in rows)
    from safetensors.torch import load_file  # the warm model on disk is where RL started

    start = load_file(os.path.join(result.out, "warm-model", "model.safetensors"))
    end = weights(result.out)
    changed = [k for k in start if not torch.equal(start[k], end[k].to(start[k].dtype))]
    assert changed, "training changed no weight"
    for name in ("timeline.json", "gantt.png", "reward.png", "summary.json"):
        assert os.path.exists(os.path.join(result.out, name))
    trace = json.load(open(os.path.join(result.out, "timeline.json")))
    kinds = {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"generate", "train", "sync"} <= kinds
    summary = json.load(open(os.path.join(result.out, "summary.json")))
    assert summary["predicted_step_s"] > 0 and summary["device"] == "cpu"  # the model's figure beside the run
    memory = summary["peak_memory"]  # the model's per stage; measured on GPUs only
    assert memory["actor_update"]["predicted_gb"] > 0 and not any("measured_gb" in row for row in memory.values())


def test_ppo_with_a_critic(tmp_path):
    result = run(colocated_plan("ppo"), rt(tmp_path, steps=2), progress=False)
    last = result.metrics[-1]
    assert "critic_vf_loss" in last and "pg_loss" in last


def test_remax_scores_a_greedy_response_per_prompt(tmp_path):
    result = run(colocated_plan("remax"), rt(tmp_path, steps=2), progress=False)
    assert all(0.0 <= m["greedy_reward"] <= 1.0 and "pg_loss" in m and "kl_ref" in m for m in result.metrics)
    units = [r.unit for r in result.timeline.records]
    assert units.count("generate_greedy") == 2 and units.count("reward_greedy") == 2


def test_remax_advantage_is_the_reward_minus_the_greedy_reward(tmp_path, monkeypatch):
    """The loop hands the estimator one greedy score per prompt, and each sample's advantage is its
    reward minus its own prompt's greedy reward (advantages are computed in the driver)."""
    from rpeg.runtime import algos

    seen = []
    real = algos.compute_advantages

    def spy(name, **kw):
        out = real(name, **kw)
        seen.append((name, kw, out[0]))
        return out

    monkeypatch.setattr(algos, "compute_advantages", spy)
    run(colocated_plan("remax", kl_coef=0.0), rt(tmp_path, steps=2), progress=False)
    assert [name for name, _, _ in seen] == ["remax", "remax"]
    for _, kw, adv in seen:
        assert kw["greedy_scores"].shape == (8,)  # the job's 8 prompts
        want = (kw["scores"] - kw["greedy_scores"][kw["group_index"]])[:, None] * kw["mask"]
        assert torch.allclose(adv, want)


def test_dapo_trains_on_groups_with_mixed_rewards_only(tmp_path):
    plan = colocated_plan("dapo")
    assert plan.config.oversample == 1.5
    result = run(plan, rt(tmp_path, steps=3, task={"name": "arithmetic", "ops": ["add"], "level": 1}),
                 progress=False)
    for m in result.metrics:
        assert 0 <= m["kept_groups"] <= 8  # at most the job's prompts, out of ceil(8 x 1.5) = 12 generated
        assert ("pg_loss" in m) == (m["kept_groups"] > 0) and ("skipped" in m) == (m["kept_groups"] == 0)
    units = [r.unit for r in result.timeline.records]
    assert units.count("dynamic_sampling") == 3


def test_mixed_groups_keeps_the_first_groups_whose_rewards_differ():
    from rpeg.runtime.filters import mixed_groups as _mixed_groups

    scores = torch.tensor([1.0, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0.5])  # four groups of three
    assert _mixed_groups(scores, 3, 8) == [0, 2, 3]
    assert _mixed_groups(scores, 3, 2) == [0, 2]
    assert _mixed_groups(torch.zeros(6), 3, 8) == []


def test_resume_is_exact(tmp_path):
    plan = colocated_plan()
    full = run(plan, rt(tmp_path / "a", steps=4), progress=False)
    part = run(plan, rt(tmp_path / "b", steps=2), progress=False)
    resumed = run(plan, rt(tmp_path / "b", steps=4), resume=True, progress=False)
    a, b = weights(full.out), weights(resumed.out)
    assert part.metrics and len(resumed.metrics) == 4
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed run's weights differ from the uninterrupted run's"
    assert [m["reward"] for m in full.metrics] == [m["reward"] for m in resumed.metrics]


def test_async_disaggregated_records_staleness(tmp_path):
    g = build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.0)
    g = bound_asynchrony(g, 1)
    g = place(g, {"gen": 1, "train": 1}, {"generate": "gen"}, default="train")
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            g = lay(g, s.name, dp=1)
    result = run(g, rt(tmp_path, steps=3), progress=False)
    # step t+1 sampled with step t's weights: the bound k = 1 reached and never passed (the staleness
    # contract; k = 2 in test_runtime_staleness.py)
    assert [m["staleness_max"] for m in result.metrics] == [0, 1, 1]
    # the trainer's logprobs match the engine's for fresh samples; for samples one version old they differ
    # exactly when the update in between moved the weights (a step whose group rewards are all equal has
    # zero advantages, so zero gradient, and leaves them where they were)
    m = result.metrics
    assert m[0]["logprob_gap_max"] < 1e-4
    for prev, cur in zip(m, m[1:]):
        assert (cur["logprob_gap_max"] > 1e-3) == (prev["grad_norm"] > 0), (prev, cur)
    assert max(x["logprob_gap_max"] for x in m) > 1e-3


def test_plans_the_runtime_cannot_honour_are_refused(tmp_path):
    g = colocated_plan()
    with pytest.raises(RpegError, match="reward model"):
        run(laid_out(colocate(build_graph("grpo", job(), Models(actor=TINY, reward=TINY)), 1)), rt(tmp_path),
            progress=False)
    two = colocate(build_graph("grpo", job(), Models(actor=TINY)), 2)
    for s in two.stages:
        if s.model and s.kind.value != "sync":
            two = lay(two, s.name, dp=1, tp=2)
    with pytest.raises(RpegError, match="colocated plan runs one process per device.*data parallelism only"):
        run(two, rt(tmp_path), progress=False)
    apart = place(build_graph("remax", job(), Models(actor=TINY)), {"gen": 1, "greedy": 1, "train": 1},
                  {"generate": "gen", "generate_greedy": "greedy"}, default="train")
    with pytest.raises(RpegError, match="generate_greedy.*generation engines"):
        run(laid_out(apart), rt(tmp_path), progress=False)
    with pytest.raises(RpegError, match="does not exist"):
        run(g, rt(tmp_path, model_path=str(tmp_path / "missing")), progress=False)
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_tensor_parallel_training_group(tmp_path):
    """Generation on one device, training and logprobs tensor-parallel over two (DTensor)."""
    g = build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.0)
    g = place(g, {"gen": 1, "train": 2}, {"generate": "gen"}, default="train")
    g = lay(g, "generate", dp=1)
    for name in ("actor_logprobs", "actor_update"):
        g = lay(g, name, dp=1, tp=2)
    with pytest.raises(RpegError, match="refit"):  # the runtime's sync gathers in full; the plan must say so
        run(g, rt(tmp_path / "refused", steps=2), progress=False)
    g = refit(g, "full")
    result = run(g, rt(tmp_path, steps=2), progress=False)
    assert len(result.metrics) == 2 and all(m["grad_norm"] >= 0 and "pg_loss" in m for m in result.metrics)
    updates = [r for r in result.timeline.records if r.unit == "actor_update"]
    assert updates and all(r.devices == (1, 2) for r in updates)  # the training group's two devices
    # on-policy: the engine got each step's weights over the weight-sync group, so its logprobs are the trainer's
    assert all(m["logprob_gap_max"] < 1e-4 for m in result.metrics), [m["logprob_gap_max"] for m in result.metrics]


def test_a_colocated_plan_on_two_devices_shards_training_and_splits_generation(tmp_path):
    """The hybrid engine on two devices: one process per device, each training its FSDP2 shard and
    generating half of the prompts with the full weights it gathered in-process at the sync."""
    import ray

    from rpeg.runtime.models import build_tiny
    from rpeg.runtime.roles import Roles
    from rpeg.runtime.rollout import SamplingParams

    g = colocate(build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.04), 2)
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            g = lay(g, s.name, dp=2, **({"zero": 3} if s.name in ("actor_update", "actor_logprobs") else {}))
    result = run(g, rt(tmp_path, steps=3), progress=False)
    assert len(result.metrics) == 3 and all("kl_ref" in m for m in result.metrics)
    # after every sync the engines' logprobs of their samples are the sharded trainer's: each rank's
    # engine holds exactly the gathered weights of the current version
    assert all(m["logprob_gap_max"] < 1e-4 for m in result.metrics), [m["logprob_gap_max"] for m in result.metrics]
    assert any(m["grad_norm"] > 0 for m in result.metrics)
    assert all(r.devices == (0, 2) for r in result.timeline.records if r.unit in ("generate", "actor_update"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never another test's cluster
    try:
        roles = Roles.build(g, rt(tmp_path / "b"), build_tiny(str(tmp_path / "tiny")), ray)
        try:
            assert len(roles.engines.ranks) == 2 and len(roles.actor.workers) == 2
            assert len({ray.get(w.where.remote())[1] for w in roles.actor.workers}) == 2  # two processes
            outs = roles.engines.wait(roles.engines.submit([[5, 6, 7]] * 6, SamplingParams(max_new_tokens=2), 0))
            assert [len(o.responses) for o in outs] == [3, 3]  # each generated its share
        finally:
            roles.close()
    finally:
        ray.shutdown()


def test_tensor_parallel_generation_engine(tmp_path):
    """Generation tensor-parallel over two devices (the hf engine, DTensor-sliced layers), training on
    a third: after each weight sync the engine's logprobs of its samples are the trainer's."""
    g = build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.0)
    g = place(g, {"gen": 2, "train": 1}, {"generate": "gen"}, default="train")
    g = lay(g, "generate", dp=1, tp=2)
    for name in ("actor_logprobs", "actor_update"):
        g = lay(g, name, dp=1)
    result = run(refit(g, "full"), rt(tmp_path, steps=2), progress=False)
    assert all(m["logprob_gap_max"] < 1e-4 for m in result.metrics), [m["logprob_gap_max"] for m in result.metrics]
    assert all(r.devices == (0, 2) for r in result.timeline.records if r.unit == "generate")


def test_pipeline_parallel_training_group(tmp_path):
    """Generation on one device; the policy's logprobs and training over two pipeline stages (1F1B):
    the engine's logprobs of its samples are the trainer's after every sync (the full weights are
    the union of the stages'), and a resumed pipeline run continues from its checkpoint."""
    g = build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.0)
    g = place(g, {"gen": 1, "train": 2}, {"generate": "gen"}, default="train")
    g = lay(g, "generate", dp=1)
    for name in ("actor_logprobs", "actor_update"):
        g = lay(g, name, dp=1, pp=2, micro_batch=8)
    g = refit(g, "full")
    result = run(g, rt(tmp_path, steps=2), progress=False)
    assert all(m["logprob_gap_max"] < 1e-4 for m in result.metrics), [m["logprob_gap_max"] for m in result.metrics]
    assert any(m["grad_norm"] > 0 for m in result.metrics)
    assert all(r.devices == (1, 2) for r in result.timeline.records if r.unit == "actor_update")
    more = run(g, rt(tmp_path, steps=3), resume=True, progress=False)
    assert [m["step"] for m in more.metrics] == [1, 2, 3]
    gpipe = run(g, rt(tmp_path / "g", steps=1, pp_schedule="gpipe"), progress=False)
    assert gpipe.metrics[0]["logprob_gap_max"] < 1e-4


def test_a_data_parallel_reference_runs_a_copy_per_device_and_other_layouts_are_refused(tmp_path):
    """A split plan's reference on two devices (dp 2): two workers, each scoring half of the rows;
    a tensor-parallel reference is refused (the runtime runs it data parallel only)."""
    g = build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.04)
    g = place(g, {"gen": 1, "train": 1, "ref": 2}, {"generate": "gen", "ref_logprobs": "ref"}, default="train")
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            g = lay(g, s.name, dp=g.group(s.group).count)
    result = run(g, rt(tmp_path, steps=2), progress=False)
    assert all(m["kl_ref"] == m["kl_ref"] for m in result.metrics)  # computed (not NaN)
    assert all(r.devices == (2, 2) for r in result.timeline.records if r.unit == "ref_logprobs")
    assert abs(result.metrics[0]["kl_ref"]) < 1e-4  # the first step: policy and reference hold the same weights
    import ray

    from rpeg.runtime.models import build_tiny
    from rpeg.runtime.roles import Roles

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        roles = Roles.build(g, rt(tmp_path / "c"), build_tiny(str(tmp_path / "tiny")), ray)
        try:
            assert len(roles.reference.workers) == 2 and roles.reference.tp == 1  # a shard each
        finally:
            roles.close()
    finally:
        ray.shutdown()
    with pytest.raises(RpegError, match="reference data parallel"):
        run(lay(g, "ref_logprobs", dp=1, tp=2), rt(tmp_path / "b"), progress=False)


def test_cuda_without_a_gpu_is_refused_before_anything_starts(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RpegError, match="torch sees no CUDA device"):
        run(colocated_plan(), rt(tmp_path, device="cuda"), progress=False)
    assert not os.path.exists(tmp_path / "run" / "warm-model")


def test_vllm_engine_without_vllm_is_refused_before_anything_starts(tmp_path):
    from rpeg.runtime.vllm_engine import available

    if available():
        pytest.skip("vllm is importable here; tests/with_vllm runs it")
    with pytest.raises(RpegError, match="engine: vllm needs an importable vllm"):
        run(colocated_plan(), rt(tmp_path, engine="vllm"), progress=False)
    assert not os.path.exists(tmp_path / "run")


def test_runtime_config_rejects_bad_engine_settings():
    with pytest.raises(RpegError, match="device = 'tpu': expected cpu or cuda"):
        RuntimeConfig(device="tpu")
    with pytest.raises(RpegError, match="pp_schedule = 'zb'"):
        RuntimeConfig(pp_schedule="zb")
    with pytest.raises(RpegError, match="engine_memory"):
        RuntimeConfig(engine_memory=1.5)
    with pytest.raises(RpegError, match="expected hf or vllm"):
        RuntimeConfig(engine="sglang")


def test_a_critic_on_its_own_devices_trains_concurrently_with_the_actor(tmp_path):
    """Split PPO, the critic on a group of its own: both updates start at once, so in every step the
    critic's update begins before the actor's has ended (their records overlap)."""
    g = build_graph("ppo", job(), Models(actor=TINY))
    g = place(g, {"gen": 1, "train": 1, "critic": 1}, {"generate": "gen", "critic_values": "critic",
                                                        "critic_update": "critic"}, default="train")
    g = laid_out(g)
    result = run(g, rt(tmp_path, steps=2), progress=False)
    recs = {(r.unit, r.step): r for r in result.timeline.records}
    for step in (0, 1):
        actor, critic = recs[("actor_update", step)], recs[("critic_update", step)]
        assert critic.group != actor.group
        assert critic.start < actor.end and actor.start < critic.end, (actor, critic)
    assert "critic_vf_loss" in result.metrics[-1]


def test_actor_and_critic_fused_train_in_one_schedule_with_the_same_math(tmp_path):
    """fuse(actor_update, critic_update) on one device: their optimizer steps alternate in one call
    (one span for both), and each model ends where its separate update would have taken it."""
    from rpeg.passes import fuse
    from tests.runtime.test_runtime_golden import record

    fused = run(laid_out(fuse(colocate(build_graph("ppo", job(), Models(actor=TINY)), 1),
                              ["actor_update", "critic_update"])), rt(tmp_path / "f", steps=2), progress=False)
    apart = run(colocated_plan("ppo"), rt(tmp_path / "a", steps=2), progress=False)
    recs = {(r.unit, r.step): (r.start, r.end) for r in fused.timeline.records}
    assert all(recs[("actor_update", s)] == recs[("critic_update", s)] for s in (0, 1))
    a, b = record(fused.out, fused.metrics), record(apart.out, apart.metrics)
    assert a["weights"] == b["weights"] and a["metrics"] == b["metrics"]


def test_a_value_head_on_the_policy_gets_logprobs_and_values_from_one_pass(tmp_path):
    """share_actor_critic: the plan's one stage writes old logprobs and values, so the run makes one
    forward pass per step for both (one record each step), equal to the two separate passes."""
    from rpeg.graph.config import AlgoConfig
    from rpeg.passes import share_actor_critic
    from rpeg.runtime.models import build_tiny, load
    from rpeg.runtime.trainer import OptimConfig, Trainer
    from tests.runtime.test_runtime_fsdp import _batch

    g = laid_out(colocate(share_actor_critic(build_graph("ppo", job(), Models(actor=TINY))), 1))
    result = run(g, rt(tmp_path, steps=2), progress=False)
    assert all("vf_loss" in m and "pg_loss" in m for m in result.metrics), sorted(result.metrics[0])
    passes = [r for r in result.timeline.records if r.unit == "actor_logprobs"]
    assert len(passes) == 2  # one per step, not a logprobs pass and a values pass
    model, _ = load(build_tiny(str(tmp_path / "tiny")))
    trainer = Trainer(model, AlgoConfig(adv_estimator="gae"), OptimConfig(forward_batch=3), lm=True, value=True)
    logp, values = trainer.logprobs_and_values(_batch())
    assert torch.equal(logp, trainer.logprobs(_batch())) and torch.equal(values, trainer.values(_batch()))
