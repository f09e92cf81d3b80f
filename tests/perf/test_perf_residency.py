"""Models sharing devices, summed (rpeg/perf/residency.py): a worked case by hand, the PPO plans of
issue 25 (Llama-3.1-8B as actor, critic, reference and reward model on 8 H100s) that were called
"fits" and are not, the planner's plan for that job, and what the plan moves out (the context
switch, the reference swap) left out of the sum."""

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import Job, Kind, get_model
from rpeg.graph import LengthDistribution as Dist
from rpeg.hardware import load_cluster
from rpeg.passes import bound_asynchrony, colocate, parallelize, place, reference_on_host
from rpeg.perf import memory
from rpeg.perf.residency import device_memory, sleeping_engine
from rpeg.perf.step import _context_switch, predict_step
from rpeg.search.search import search
from rpeg.search.space import SpaceOptions
from rpeg.sim import simulate
from rpeg.spec import spec_from_data
from rpeg.perf.weightsync import RECEIVE_BUFFER, receive_buffer_bytes

LLAMA = get_model("llama-3.1-8B")
P = 8_030_261_248  # Llama-3.1-8B's parameters (untied embedding and output head)
GB = 1e9
H100 = load_cluster("dgx-h100", 8)
CAPACITY = H100.device.hbm_capacity_bytes
# the job of `rpeg plan ppo --model llama-3.1-8B --reward llama-3.1-8B --gpus 8` (the CLI's defaults; the
# critic is the actor's architecture)
ISSUE = {"algorithm": "ppo", "model": "llama-3.1-8B", "critic": "llama-3.1-8B", "reward": "llama-3.1-8B",
         "cluster": "dgx-h100", "gpus": 8}


def layouts(graph, **given):
    """Every model stage data-parallel over its group, or as `given` says."""
    for s in graph.stages:
        if s.model and s.kind is not Kind.SYNC:
            graph = parallelize(graph, s.name, **given.get(s.name, {"dp": graph.group(s.group).count}))
    return graph


def lines(held) -> dict[str, float]:
    return {h.label(): h.bytes for h in held.lines}


def test_a_trained_model_and_two_frozen_ones_add_up_by_hand():
    """GRPO with a reward model, everything but generation on 6 GPUs: the actor trained with ZeRO-1
    over 6 keeps bf16 weights 2P, fp32 gradients 4P and Adam state 12P / 6 = 2P on each device
    (16.06 + 32.12 + 16.06 GB), and the reference and reward models keep their bf16 weights 2P each
    and the reward model's less its output head, which a score head replaces (a vocab x hidden matrix
    for a hidden x 1 one: PR = P - 525,336,576 + 4,096): 10P + 2PR = 95.31 GB before any activation,
    over an H100's 85.9 GB, though every stage alone fits."""
    assert LLAMA.params_total() == P
    job = Job(prompts=64, samples_per_prompt=8, prompt_len=512, response=Dist.fixed(1024))
    g = build_graph("grpo", job, Models(actor=LLAMA, reward=LLAMA))
    g = place(g, {"gen": 2, "train": 6}, assign={"generate": "gen"}, default="train")
    g = layouts(g, actor_update={"dp": 6, "zero": 1})
    pred = predict_step(g, H100)
    assert all(c.fits for c in pred.stages.values())
    gen, train = pred.memory
    assert (train.name, train.first, train.count, train.peak_unit) == ("train", 2, 6, "actor_update")
    held = lines(train)
    assert held["actor trainer weights (actor_update)"] == pytest.approx(2 * P)
    assert held["actor trainer gradients (actor_update)"] == pytest.approx(4 * P)
    assert held["actor trainer optimizer (actor_update)"] == pytest.approx(12 * P / 6)
    assert held["ref weights (ref_logprobs)"] == pytest.approx(2 * P)
    pr = P - LLAMA.vocab * LLAMA.hidden + LLAMA.hidden
    assert held["reward weights (reward)"] == pytest.approx(2 * pr)
    resident = sum(h.bytes for h in train.lines if h.resident)
    assert resident == pytest.approx(10 * P + 2 * pr) and resident / GB == pytest.approx(95.31, abs=0.01)
    # on top: the training pass's own transient, as its stage costs it (activations, logits, buffers)
    own = dict(pred.stages["actor_update"].memory_parts)
    transient = sum(v for k, v in own.items() if k not in ("weights", "gradients", "optimizer"))
    assert own["logits"] > 0 and train.peak_bytes == pytest.approx(10 * P + 2 * pr + transient)
    assert not train.fits and not pred.fits and pred.oom == [train]
    assert "'train' (GPUs 2-7)" in train.describe() and "ref weights (ref_logprobs)" in train.describe()
    # the engine's devices hold only the engine, all step (it never sleeps: nothing is costed to wake it)
    assert gen.fits and all(h.resident and h.model == "actor" for h in gen.lines)
    with pytest.raises(RpegError, match="does not fit in memory: device group 'train'"):
        simulate(g, H100, 2)


def issue_plan():
    """The plan `rpeg plan` picked for the issue's job before the sum: generation on 2 GPUs, the rest
    on 6 at k = 1, both trainers ZeRO-1 and every forward pass with whole weights."""
    g = bound_asynchrony(spec_from_data(ISSUE, "issue").graph(), 1)
    g = place(g, {"generation": 2, "training": 6}, assign={"generate": "generation"}, default="training")
    return layouts(g, actor_update={"dp": 6, "zero": 1}, critic_update={"dp": 6, "zero": 1})


def test_the_issues_ppo_plan_is_no_longer_called_fits():
    pred = predict_step(issue_plan(), H100)
    assert all(c.fits for c in pred.stages.values())  # what was checked before: each stage alone
    assert not pred.fits
    (over,) = pred.oom
    assert over.name == "training" and set(over.models) == {"actor", "critic", "ref", "reward"}
    # two trainers' state (ZeRO-1 over 6) and two frozen models' weights: far past the device
    state = memory.trainer_state_bytes(LLAMA, issue_plan().stage("actor_update").layout)
    assert sum(state.values()) == pytest.approx(2 * P + 4 * P + 12 * P / 6)
    assert over.peak_bytes > sum(state.values()) + 2 * (2 * P) > CAPACITY


def test_the_planner_returns_a_plan_that_fits_summed():
    graph = spec_from_data(ISSUE, "issue").graph()
    best = search(graph, H100, 8, space=SpaceOptions(share=False)).best  # as `rpeg plan` (no --allow-share)
    pred = best.prediction
    assert pred.fits and pred.memory
    for held in pred.memory:
        assert held.peak_bytes == pytest.approx(sum(h.bytes for h in held.lines))
        assert held.peak_bytes <= CAPACITY, held.describe()
    # it is the plan the prediction says: predicting it again gives the same sums
    again = predict_step(best.graph, H100)
    assert [m.peak_bytes for m in again.memory] == pytest.approx([m.peak_bytes for m in pred.memory])
    # the trade it made: the trainers' state no longer fits whole beside the frozen models
    trained = [best.graph.stage(n).layout for n in ("actor_update", "critic_update")]
    assert any(lay.zero == 3 or lay.offload_optimizer or lay.tp * lay.pp > 1 for lay in trained)


def test_a_colocated_ppo_plan_counts_the_critic_beside_the_engine():
    """Everything on 8 GPUs, both trainers ZeRO-1: the context switch moves the actor's state out
    while the engine generates, but nothing moves the critic's (its 16 + 30 + 11 GB stay), and the
    reference and reward weights stay too."""
    g = colocate(build_graph("ppo", Job(), Models(actor=LLAMA, critic=LLAMA, reference=LLAMA, reward=LLAMA)), 8)
    g = layouts(g, actor_update={"dp": 8, "zero": 1}, critic_update={"dp": 8, "zero": 1})
    pred = predict_step(g, H100)
    assert all(c.fits for c in pred.stages.values()) and not pred.fits
    switch = _context_switch(g, H100)
    assert sleeping_engine(g) == switch[0] == "generate"
    (held,) = device_memory(g, pred.stages, sleeping_engine="generate", while_running="generate")
    moved = {h.label() for h in held.moved}
    assert moved == {f"actor trainer {p} (actor_update)" for p in ("weights", "gradients", "optimizer")}
    kept = lines(held)
    critic = memory.trainer_state_bytes(LLAMA, g.stage("critic_update").layout, value_head=True)
    for part in ("weights", "gradients", "optimizer"):
        assert kept[f"critic trainer {part} (critic_update)"] == pytest.approx(critic[part])
    engine = dict(pred.stages["generate"].memory_parts)
    pr = P - LLAMA.vocab * LLAMA.hidden + LLAMA.hidden  # the reward model's score head, not the vocabulary's
    # the engine: its weights, its KV cache and the buckets a weight sync receives into (weightsync.py)
    assert engine[RECEIVE_BUFFER] == receive_buffer_bytes(LLAMA, g.stage("generate").layout, g.refit_gather) > 0
    assert held.peak_bytes == pytest.approx(sum(critic.values()) + 2 * P + 2 * pr + engine["weights"]
                                            + engine["kv_cache"] + engine[RECEIVE_BUFFER])
    # and at the step's peak, both trainers' state is there: actor and critic alone pass the device
    (peak,) = pred.memory
    actor = memory.trainer_state_bytes(LLAMA, g.stage("actor_update").layout)
    assert sum(actor.values()) + sum(critic.values()) > CAPACITY
    assert peak.peak_bytes > sum(actor.values()) + sum(critic.values())


def test_the_reference_on_host_takes_no_memory_between_its_passes():
    """NeMo-RL's way (passes/reference.py): the reference's weights are swapped into the actor's place
    for its pass, so they are not resident, and the actor's weights are out while it runs."""
    job = Job(prompts=64, samples_per_prompt=8, prompt_len=512, response=Dist.fixed(1024))
    g = layouts(colocate(build_graph("grpo", job, Models(actor=LLAMA)), 8), actor_update={"dp": 8, "zero": 1})
    kept = predict_step(g, H100)
    swapped_graph = reference_on_host(g)
    swapped = predict_step(swapped_graph, H100)
    assert any(h.model == "ref" and h.resident for h in kept.memory[0].lines)
    assert not any(h.model == "ref" and h.resident for h in swapped.memory[0].lines)
    (during,) = device_memory(swapped_graph, swapped.stages, sleeping_engine="generate",
                              while_running="ref_logprobs")
    assert [h.label() for h in during.moved] == ["actor trainer weights (actor_update)"]
    assert lines(during)["ref weights swapped in from the host (ref_logprobs)"] == pytest.approx(2 * P)
    assert swapped.memory[0].peak_bytes < kept.memory[0].peak_bytes
