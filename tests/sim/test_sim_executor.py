"""simulate(plan, cluster, steps): invariants of the executed timeline.

Plans: GRPO on Qwen3-0.6B (generate -> reward, actor_logprobs, ref_logprobs -> advantages ->
actor_update -> actor_sync) colocated, split into generation and training, or in three groups
(generation, reference, training: the weight sync spans the first and the last); PPO on
Llama-3.1-8B (actor, critic, reference and reward model) with layouts from the planner's
per-stage choice. DGX H100 nodes, 4 to 12 GPUs."""

import math

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import Job, Kind, get_model
from rpeg.graph import LengthDistribution as Dist
from rpeg.hardware import load_cluster
from rpeg.passes import bound_asynchrony, colocate, fuse, parallelize, place, stream
from rpeg.perf.stages import stage_cost
from rpeg.perf.step import SWITCH, predict_step
from rpeg.perf.validation import bundled
from rpeg.search.default import default_plan
from rpeg.search.layouts import LayoutCache, LayoutOptions, apply_layouts
from rpeg.search.memfit import fit_together
from rpeg.sim import simulate

SMALL = get_model("qwen3-0.6B")
LLAMA = get_model("llama-3.1-8B")
JOB = Job(prompts=16, samples_per_prompt=4, prompt_len=256, response=Dist.fixed(512))
# short answers to long prompts, four epochs: training, not generation, is the bottleneck
TRAIN_HEAVY = Job(prompts=16, samples_per_prompt=4, prompt_len=1024, response=Dist.fixed(64), ppo_epochs=4)
PUBLISHED = bundled()["published"]


@pytest.fixture(scope="module")
def dgx():
    return load_cluster("dgx-h100")


def grpo(job=JOB):
    return build_graph("grpo", job, Models(actor=SMALL))


def data_parallel(graph):
    for s in graph.stages:
        if s.model and s.kind is not Kind.SYNC:
            graph = parallelize(graph, s.name, dp=graph.group(s.group).count)
    return graph


def colocated(k=0, devices=4):
    return bound_asynchrony(data_parallel(colocate(grpo(), devices)), k)


def split(k=0, job=JOB):
    g = place(grpo(job), {"gen": 4, "train": 4}, assign={"generate": "gen"}, default="train")
    return bound_asynchrony(data_parallel(g), k)


def three_groups(k=0):
    """Generation on 0-3, the reference model on 4-7, the actor's passes on 8-11."""
    g = place(grpo(), {"gen": 4, "ref": 4, "train": 4}, assign={"generate": "gen", "ref_logprobs": "ref"},
              default="train")
    return bound_asynchrony(data_parallel(g), k)


def ppo_llama(dgx, k, where):
    """PPO on Llama-3.1-8B over 8 GPUs with the planner's per-stage layouts."""
    g = build_graph("ppo", JOB, Models(actor=LLAMA, critic=LLAMA, reference=LLAMA, reward=LLAMA))
    if where == "colocated":
        g = colocate(g, 8)
    else:  # generation on half the node, everything else on the other half
        g = place(g, {"gen": 4, "train": 4}, assign={"generate": "gen"}, default="train")
    cluster, opts, cache = dgx.with_gpus(8), LayoutOptions(), LayoutCache()
    return fit_together(apply_layouts(bound_asynchrony(g, k), cluster, opts, cache), cluster, opts, cache)


PLANS = {
    "colocated k0": lambda dgx: colocated(0),
    "colocated k1": lambda dgx: colocated(1),
    "colocated k0 fused logprobs": lambda dgx: fuse(colocated(0), ["generate", "actor_logprobs"]),
    "split k0": lambda dgx: split(0),
    "split k1": lambda dgx: split(1),
    "split k2 training-bound": lambda dgx: split(2, TRAIN_HEAVY),
    "three groups k1": lambda dgx: three_groups(1),
    "three groups k0": lambda dgx: three_groups(0),
    "default plan ppo": lambda dgx: default_plan(build_graph(
        "ppo", JOB, Models(actor=SMALL, critic=SMALL, reference=SMALL, reward=SMALL)), dgx, 8),
    "ppo llama colocated k1": lambda dgx: ppo_llama(dgx, 1, "colocated"),
    "ppo llama split k2": lambda dgx: ppo_llama(dgx, 2, "split"),
}
STREAMED = {f"{name} streamed": (lambda make: lambda dgx: stream(make(dgx), 4))(make)
            for name, make in PLANS.items() if "fused" not in name}
ALL = {**PLANS, **STREAMED}


@pytest.fixture(scope="module")
def timelines(dgx):
    """name -> (plan, timeline of 8 steps), simulated once."""
    out = {}
    for name, make in ALL.items():
        plan = make(dgx)
        out[name] = (plan, simulate(plan, dgx, 8))
    return out


def by_device(tl):
    out = {}
    for r in tl.records:
        for d in range(r.devices[0], r.devices[0] + r.devices[1]):
            out.setdefault(d, []).append(r)
    return out


# ---- devices ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_no_device_runs_two_units_at_once(timelines, name):
    plan, tl = timelines[name]
    devices = by_device(tl)
    assert devices, "no record occupies a device"
    for d, recs in devices.items():
        recs = sorted(recs, key=lambda r: (r.start, r.end))
        for a, b in zip(recs, recs[1:]):
            assert b.start >= a.end - 1e-9, (name, d, a, b)
    # and every record stays on the plan's devices
    placed = set().union(*(set(g.devices) for g in plan.groups))
    assert set(devices) <= placed


def test_a_fused_unit_is_one_record_per_step(timelines):
    plan, tl = timelines["colocated k0 fused logprobs"]
    units = {r.unit for r in tl.records}
    assert "generate+actor_logprobs" in units and "generate" not in units and "actor_logprobs" not in units
    fused = [r for r in tl.records if r.unit == "generate+actor_logprobs"]
    assert sorted(r.step for r in fused) == list(range(8))


def test_a_weight_sync_occupies_its_two_groups_not_the_one_between(timelines):
    """The sync spans generation (0-3) and training (8-11); the reference group (4-7) never
    hosts it, so its records claim exactly the devices it used."""
    plan, tl = timelines["three groups k1"]
    syncs = [r for r in tl.records if r.unit == "actor_sync"]
    assert syncs
    for s in range(tl.steps):
        used = set()
        for r in (r for r in syncs if r.step == s):
            used |= set(range(r.devices[0], r.devices[0] + r.devices[1]))
        assert used == set(plan.group("gen").devices) | set(plan.group("train").devices)
    ref = tl.groups["ref"]
    ref_work = sum(r.seconds for r in tl.records if r.unit == "ref_logprobs") / tl.steps
    assert ref.busy_fraction * tl.step_s == pytest.approx(ref_work, rel=0.05)  # its own work only


# ---- asynchrony ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize("job", ["generation-bound", "training-bound"])
def test_staleness_never_exceeds_k(dgx, k, job):
    tl = simulate(split(k, JOB if job == "generation-bound" else TRAIN_HEAVY), dgx, 8)
    gens = [r for r in tl.records if r.kind == "generate"]
    assert len(gens) == 8 and all(r.weight_version >= 0 for r in gens)
    worst = max(r.step - r.weight_version for r in gens)
    assert 0 <= worst <= k
    assert tl.max_staleness == worst
    assert all(r.weight_version == -1 for r in tl.records if r.kind != "generate")
    if job == "training-bound":  # generation runs ahead as far as the bound lets it
        assert worst == k


@pytest.mark.parametrize("k", [0, 1, 2])
def test_generation_of_the_next_step_overlaps_training_only_when_k_allows(dgx, k):
    tl = simulate(split(k), dgx, 8)
    first = {(r.unit, r.step): r for r in tl.records}
    overlapped = [t for t in range(7) if first[("generate", t + 1)].start < first[("actor_update", t)].end]
    if k == 0:  # on-policy: step t + 1 samples with the weights step t trained and synced
        assert overlapped == []
        for t in range(7):
            assert first[("generate", t + 1)].start >= first[("actor_sync", t)].end - 1e-12
            assert first[("generate", t + 1)].weight_version == t + 1
    else:
        assert overlapped, "asynchrony never overlapped generation with training"
        assert tl.step_s < simulate(split(0), dgx, 8).step_s


# ---- step time ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("steps", [4, 8])
def test_a_plan_without_overlap_takes_the_sum_of_its_stages_and_the_switch(dgx, steps):
    """Colocated, k = 0, no streams, no fusion: everything runs in turn."""
    plan = colocated(0)
    tl = simulate(plan, dgx, steps)
    pred = predict_step(plan, dgx)
    cluster = dgx.with_gpus(4)
    stages = sum(stage_cost(plan, s, cluster).seconds for s in plan.stages)
    assert SWITCH in pred.stages and pred.stages[SWITCH].seconds > 0
    assert tl.step_s == pytest.approx(stages + pred.stages[SWITCH].seconds, rel=1e-9)
    assert tl.step_s == pytest.approx(pred.step_s, rel=1e-9)
    # the switch is paid in two halves per step, once into generation and once out of it
    halves = [r for r in tl.records if r.unit == SWITCH and r.step == steps - 1]
    assert len(halves) == 2
    assert sum(r.seconds for r in halves) == pytest.approx(pred.stages[SWITCH].seconds, rel=1e-9)


@pytest.mark.parametrize("name", ALL)
def test_a_step_is_no_shorter_than_any_device_s_work(timelines, name):
    """Every step does the same work, so the steady-state step is at least the busiest device's
    work per step (a bursty schedule must not read as a fast one)."""
    _, tl = timelines[name]
    work = {d: sum(r.seconds for r in recs if r.unit != SWITCH) for d, recs in by_device(tl).items()}
    assert tl.step_s >= max(work.values()) / tl.steps * (1 - 1e-9)


def test_simulating_the_published_one_step_off_run_is_as_accurate_as_the_analytic_step():
    from rpeg.graph.serde import read_yaml_file
    from rpeg.perf.validation import _models, rl_graph

    data = read_yaml_file(str(PUBLISHED))
    entries = [e for e in data.get("rl") or [] if e.get("async_bound") == 1 and e.get("colocated") is False]
    assert entries, "no 1-step-off entry in published.yaml"
    for entry in entries:
        graph, cluster = rl_graph(entry, _models(data.get("models"), str(PUBLISHED)), entry["id"])
        measured = entry["measured"]["step_s"]
        perf = predict_step(graph, cluster).step_s
        tl = simulate(graph, cluster, 8)
        assert abs(tl.step_s - measured) <= abs(perf - measured) + 1e-9, (entry["id"], tl.step_s, perf, measured)
        assert tl.max_staleness == 1


@pytest.mark.parametrize("name", [n for n in PLANS if "fused" not in n])
def test_streaming_never_makes_a_step_slower(timelines, name):
    _, plain = timelines[name]
    _, streamed = timelines[f"{name} streamed"]
    assert streamed.step_s <= plain.step_s * (1 + 1e-9), (plain.step_s, streamed.step_s)


def test_streaming_lets_a_consumer_on_other_devices_start_early(timelines):
    _, tl = timelines["three groups k0 streamed"]
    first = {}
    for r in tl.records:
        first.setdefault((r.unit, r.step, r.microbatch), r)
    gen_end = first[("generate", 0, 3)].end
    assert first[("ref_logprobs", 0, 0)].start < gen_end  # the reference group works while generation runs


# ---- figures ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_utilization_and_mfu_are_fractions_and_throughput_is_tokens_over_time(timelines, name):
    plan, tl = timelines[name]
    assert 0 < tl.utilization <= 1 and 0 < tl.mfu <= 1
    for grp, stats in tl.groups.items():
        assert 0 <= stats.busy_fraction <= 1 and 0 <= stats.mfu <= 1, grp
        assert stats.devices == plan.group(grp).count
    assert tl.tokens_per_step == plan.job.sequences * plan.job.mean_seq_len
    assert tl.tokens_per_s == pytest.approx(tl.tokens_per_step / tl.step_s, rel=1e-12)
    assert tl.samples_per_s == pytest.approx(plan.job.sequences / tl.step_s, rel=1e-12)
    assert math.isfinite(tl.step_s) and tl.step_s > 0
    assert len(tl.step_ends) == tl.steps == 8 and list(tl.step_ends) == sorted(tl.step_ends)
    assert tl.makespan == pytest.approx(tl.step_ends[-1])


def test_a_colocated_plan_keeps_its_devices_busier_than_a_split_one(timelines):
    assert timelines["colocated k0"][1].utilization > timelines["split k0"][1].utilization


def test_simulation_is_deterministic(dgx):
    a, b = simulate(split(1), dgx, 6), simulate(split(1), dgx, 6)
    assert a == b


# ---- refusals -----------------------------------------------------------------------------------------------
def test_an_unplaced_graph_is_refused(dgx):
    with pytest.raises(RpegError, match=r"place\(\.\.\.\) or colocate"):
        simulate(grpo(), dgx)


def test_a_plan_that_does_not_fit_is_refused_naming_memory(dgx):
    big = build_graph("grpo", JOB, Models(actor=get_model("llama-3.1-70B")))
    plan = data_parallel(colocate(big, 8))  # 70B trained data-parallel on 80 GB devices
    assert not predict_step(plan, dgx).fits
    with pytest.raises(RpegError, match="memory"):
        simulate(plan, dgx)


def test_fewer_than_one_step_is_refused(dgx):
    with pytest.raises(RpegError, match="at least one step"):
        simulate(colocated(), dgx, 0)
