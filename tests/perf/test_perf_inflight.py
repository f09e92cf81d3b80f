"""Several steps' prompts in flight (Graph.in_flight, rpeg/passes/asynchrony.py): the engine never
drains, its batch holds up to in_flight steps' sequences (capped by max_num_seqs and the KV cache),
and a step costs one step's sequences at that occupancy; the simulator agrees with predict_step. With
refill (NeMo-RL's in-flight weight updates) the same holds at one step in flight.

Qwen3-0.6B on H100s with fixed response lengths, so that every wave of the batch is hand-computable:
sequences admitted together finish together."""

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import PassRefused, RpegError
from rpeg.graph import Job, Kind, get_model
from rpeg.graph import LengthDistribution as Dist
from rpeg.graph import ParallelLayout as Layout
from rpeg.hardware import load_cluster
from rpeg.passes import bound_asynchrony, parallelize, place
from rpeg.perf.generation import GenWorkload, _prefill_s, _StepModel, generation_cost, steady_state
from rpeg.perf.step import predict_step, scheduled_distance
from rpeg.sim import simulate

SMALL = get_model("qwen3-0.6B")
PROMPT, LENGTH, N = 128, 300, 64  # per engine: 64 sequences a step of 300 tokens after a 128-token prompt
TIME_PARTS = ("decode", "tensor-parallel comm", "engine step overhead")
ENGINE = Layout(max_seqs=256)  # an engine that runs at most 256 sequences at once (vLLM's max_num_seqs)


@pytest.fixture(scope="module")
def dgx():
    return load_cluster("dgx-h100", 8)


def cost(cluster, in_flight, n=N, partial=False, refill=False):
    work = GenWorkload(sequences=n, prompt_len=PROMPT, response=Dist.fixed(LENGTH), in_flight=in_flight,
                       partial=partial, refill=refill)
    return generation_cost("g", SMALL, ENGINE, cluster, work)


def wave(cluster, batch):
    """(prefill s, decode + comm + overhead s) of `batch` sequences admitted together: their prompts
    prefilled at once, then LENGTH - 1 decode steps at that batch, the KV cache growing from
    batch x PROMPT tokens to batch x (PROMPT + LENGTH - 1), priced at both ends and averaged."""
    step = _StepModel(SMALL, ENGINE, cluster, "bf16")
    t0, t1 = step(batch, batch * PROMPT)[0], step(batch, batch * (PROMPT + LENGTH - 1))[0]
    prefill = _prefill_s(SMALL, ENGINE, cluster, batch * PROMPT, PROMPT, "bf16", batch)
    return prefill, (LENGTH - 1) * (t0 + t1) / 2


@pytest.mark.parametrize("in_flight, batch", [(2, 128), (4, 256), (8, 256)])
def test_a_step_costs_its_share_of_a_wave_of_the_in_flight_batch(dgx, in_flight, batch):
    """64 sequences a step, s steps in flight: the engine runs waves of min(64 s, max_num_seqs) and a
    step is 64 / batch of a wave (half a wave of 128 at s = 2; a quarter of a wave of 256 beyond,
    where max_num_seqs caps the batch: s = 8 costs what s = 4 does)."""
    c = cost(dgx, in_flight)
    prefill, decode = wave(dgx, batch)
    assert c.part("prefill") == pytest.approx(prefill * N / batch, rel=1e-9)
    assert sum(c.part(k) for k in TIME_PARTS) == pytest.approx(decode * N / batch, rel=1e-9)


def test_one_step_in_flight_drains_every_step(dgx):
    """in_flight = 1: one wave of the step's 64 sequences, the whole of it every step."""
    c = cost(dgx, 1)
    prefill, decode = wave(dgx, N)
    assert c.part("prefill") == pytest.approx(prefill, rel=1e-9)
    assert sum(c.part(k) for k in TIME_PARTS) == pytest.approx(decode, rel=1e-9)
    assert cost(dgx, 2).seconds < 0.75 * c.seconds  # decode reads the weights once a step for twice the batch


def test_the_kv_cache_caps_the_in_flight_batch(dgx):
    """A KV cache that holds about 100 of the sequences: 4 and 8 steps in flight (256 and 512 asked
    for) run the same batch, slower per step than when max_num_seqs alone caps it."""
    kw = dict(n=N, lengths=[float(LENGTH)] * N, prompt=PROMPT, dtype="bf16")
    room = 100 * (PROMPT + LENGTH)

    def per_step(ahead, capacity):
        sim = steady_state(SMALL, ENGINE, dgx, ahead=ahead, max_seqs=min(256, ahead * N), steps=16,
                           capacity_tokens=capacity, **kw)
        return sum(sim[k] for k in ("prefill",) + TIME_PARTS)

    assert per_step(4, room) == pytest.approx(per_step(8, room), rel=0.05)  # preemptions fall differently
    assert per_step(4, room) > 1.2 * per_step(4, 1e12)


def test_the_long_tail_is_paid_once_not_every_step(dgx):
    """A long-tailed length distribution: draining pays the step's longest response every step; with
    two steps in flight the slots it leaves are filled by the next step's sequences."""
    tail = Dist(kind="lognormal", mean=1000, max=16384, sigma=1.2)

    def run(s):
        return generation_cost("g", SMALL, ENGINE, dgx, GenWorkload(sequences=64, prompt_len=256, response=tail,
                                                                     in_flight=s)).seconds
    assert run(2) < 0.5 * run(1)


def test_refill_pays_the_tail_once_at_one_step_in_flight(dgx):
    """One step in flight, refilled as its sequences finish (NeMo-RL's in-flight weight updates): the
    long tail goes as with two steps in flight, while the batch stays one step's 64."""
    tail = Dist(kind="lognormal", mean=1000, max=16384, sigma=1.2)

    def run(s, refill):
        work = GenWorkload(sequences=64, prompt_len=256, response=tail, in_flight=s, refill=refill)
        return generation_cost("g", SMALL, ENGINE, dgx, work).seconds
    drained, refilled = run(1, False), run(1, True)
    assert refilled < 0.5 * drained
    assert run(2, False) < refilled  # two steps' sequences share each decode step's weight read


def test_refill_at_one_step_costs_one_wave_of_its_sequences(dgx):
    """Fixed lengths: refilled at one step in flight, a step is a wave of its own 64 sequences, as draining."""
    c, prefill_decode = cost(dgx, 1, refill=True), wave(dgx, N)
    assert c.part("prefill") == pytest.approx(prefill_decode[0], rel=1e-9)
    assert sum(c.part(k) for k in TIME_PARTS) == pytest.approx(prefill_decode[1], rel=1e-9)


def test_partial_rollout_keeps_its_full_batch_whatever_the_steps_in_flight(dgx):
    assert cost(dgx, 2, partial=True).seconds == pytest.approx(cost(dgx, 1, partial=True).seconds, rel=1e-12)


# ---- the pass, the verifier, the schedule ---------------------------------------------------------
def grpo():
    job = Job(prompts=16, samples_per_prompt=4, prompt_len=PROMPT, response=Dist.fixed(LENGTH))
    return build_graph("grpo", job, Models(actor=SMALL))


def test_bound_asynchrony_sets_the_steps_in_flight_and_refuses_more_than_k():
    g = bound_asynchrony(grpo(), 8, in_flight=8)
    assert (g.async_bound, g.in_flight) == (8, 8)
    assert g.history[-1] == "bound_asynchrony(k=8, in_flight=8)"
    assert bound_asynchrony(grpo(), 2).in_flight == 1
    assert bound_asynchrony(g, 0).in_flight == 1  # back on-policy: one step at a time
    for bad in (0, 3, True, 1.5):
        with pytest.raises(PassRefused, match="in_flight must be a whole number of steps from 1 to k = 2"):
            bound_asynchrony(grpo(), 2, in_flight=bad)
    with pytest.raises(PassRefused, match="from 1 to k = 0"):
        bound_asynchrony(grpo(), 0, in_flight=2)


def test_refill_needs_an_async_bound_and_is_recorded():
    g = bound_asynchrony(grpo(), 1, refill=True)
    assert (g.async_bound, g.in_flight, g.refill) == (1, 1, True)
    assert g.history[-1] == "bound_asynchrony(k=1, refill=True)"
    assert not bound_asynchrony(g, 1).refill
    with pytest.raises(PassRefused, match="refill .* needs k >= 1"):
        bound_asynchrony(grpo(), 0, refill=True)
    with pytest.raises(PassRefused, match="refill must be true or false"):
        bound_asynchrony(grpo(), 1, refill="yes")
    from rpeg.graph.verify import verify
    with pytest.raises(RpegError, match="refill.*needs an async bound k >= 1, not 0"):
        verify(grpo().replace(refill=True), "test")


def test_the_verifier_refuses_more_steps_in_flight_than_the_bound():
    from rpeg.graph.verify import verify
    with pytest.raises(RpegError, match="in-flight.*3 steps' prompts in flight.*so 1 to 2"):
        verify(bound_asynchrony(grpo(), 2).replace(in_flight=3), "test")


def split(k, in_flight):
    g = place(grpo(), {"gen": 4, "train": 4}, assign={"generate": "gen"}, default="train")
    for s in g.stages:
        if s.model and s.kind is not Kind.SYNC:
            g = parallelize(g, s.name, dp=g.group(s.group).count)
    return bound_asynchrony(g, k, in_flight=in_flight)


def test_generation_reads_weights_from_fewer_tasks_back_the_more_steps_in_flight():
    """k = 4: the generation task of step t reads weights written 1 + k = 5 tasks before it with one
    step in flight, 1 + k - 3 = 2 with four (its sequences entered three tasks earlier)."""
    for s, distance in ((1, 5), (4, 2)):
        g = split(4, s)
        edge = next(e for e in g.weight_edges() if e.dst == "generate")
        assert edge.distance == 5 and scheduled_distance(g, edge) == distance


@pytest.mark.parametrize("k, in_flight", [(2, 2), (4, 4), (4, 2)])
def test_the_simulator_agrees_with_predict_step_and_records_the_staleness(dgx, k, in_flight):
    """Generation-bound split plans: the simulated steady-state step is predict_step's, and a step's
    sequences sampled with the version the engine had when they entered it, in_flight - 1 generation
    tasks before the task that ends them: staleness up to k, never beyond."""
    g = split(k, in_flight)
    pred = predict_step(g, dgx)
    assert pred.bottleneck.startswith("device group 'gen'")
    timeline = simulate(g, dgx, steps=12)
    assert timeline.step_s == pytest.approx(pred.step_s, rel=1e-6)
    assert timeline.max_staleness == in_flight  # the trainer keeps up: a version per step behind the engine


def test_the_runtime_refuses_several_steps_in_flight_and_refill():
    from rpeg.runtime.plan_check import check_plan
    with pytest.raises(RpegError, match="2 steps' prompts in flight.*one step's prompts at a time"):
        check_plan(split(2, 2))
    with pytest.raises(RpegError, match="admits the next step's prompts.*refill false"):
        check_plan(split(1, 1).replace(refill=True))


def test_serial_calls_refuse_refill():
    from rpeg.passes.calls import serial_calls
    with pytest.raises(PassRefused, match="refill the engine's batch stays full"):
        serial_calls(bound_asynchrony(grpo(), 1, refill=True), 4)
