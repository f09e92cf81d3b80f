"""Generation with a continuous-batching engine: response lengths, the event simulation of one
instance (admission, KV-cache limits, preemption), and the stage cost over dp instances.

Qwen3-0.6B on H100s keeps the simulations short."""

import math

import pytest

from rpeg.errors import RpegError
from rpeg.graph import LengthDistribution as Dist
from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import get_model
from rpeg.hardware import load_cluster
from rpeg.perf.generation import (ASYNC_ENGINE_MAX_SEQS, GenWorkload, engine_max_seqs, generation_cost,
                                  response_lengths, simulate_instance)

SMALL = get_model("qwen3-0.6B")
LOGNORMAL = Dist(kind="lognormal", mean=1000, max=8192, sigma=1.0, runaway=0.0)  # the body alone: its order statistics
TIME_PARTS = ("prefill", "decode", "tensor-parallel comm", "engine step overhead")


@pytest.fixture(scope="module")
def dgx():
    return load_cluster("dgx-h100", 8)


def seconds(sim):
    return sum(sim[k] for k in TIME_PARTS)


def simulate(cluster, lengths, capacity, prompt=256, layout=Layout()):
    return simulate_instance(SMALL, layout, cluster, n=len(lengths), prompt=prompt, lengths=lengths,
                             capacity_tokens=capacity)


# ---- response lengths ----------------------------------------------------------------------------
@pytest.mark.parametrize("dist", [LOGNORMAL, Dist(kind="uniform", min=100, max=2000),
                                  Dist(kind="lognormal", mean=4000, max=16384, sigma=0.6)])
def test_response_lengths_have_the_distribution_mean(dist):
    lengths = response_lengths(dist, 256)
    assert len(lengths) == 256
    assert sum(lengths) / 256 == pytest.approx(dist.mean, rel=0.03)
    assert max(lengths) <= dist.max and min(lengths) >= 1


def test_response_lengths_are_interleaved_not_sorted():
    lengths = response_lengths(LOGNORMAL, 256)
    assert lengths != sorted(lengths) and lengths != sorted(lengths, reverse=True)
    # every stretch of the order is a mix of short and long answers
    for i in range(0, 256, 64):
        part = lengths[i:i + 64]
        assert sum(part) / 64 == pytest.approx(sum(lengths) / 256, rel=0.25)
        assert min(part) < 0.5 * LOGNORMAL.mean < 2 * LOGNORMAL.mean < max(part)
    # the quantiles (i + 0.5) / n, each once
    expected = sorted(max(1.0, round(LOGNORMAL.quantile((i + 0.5) / 256))) for i in range(256))
    assert sorted(lengths) == expected


def test_fixed_response_lengths():
    assert response_lengths(Dist.fixed(300), 7) == [300] * 7


# ---- one engine instance ------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [1e12, math.inf])
def test_fixed_length_job_without_kv_limit_takes_length_minus_one_decode_steps(dgx, capacity):
    """The prefill samples the first of the 300 tokens; 299 decode steps sample the rest."""
    sim = simulate(dgx, [300.0] * 32, capacity, prompt=128)
    assert sim["decode_steps"] == 299
    assert sim["preemptions"] == 0
    assert seconds(sim) > 0


def test_more_sequences_than_max_num_seqs_run_in_waves(dgx):
    n = engine_max_seqs(Layout(), dgx.device) + 1
    sim = simulate(dgx, [100.0] * n, 1e12, prompt=64)
    assert sim["decode_steps"] == 198  # one sequence waits for the first 1,024 to finish: 2 x 99


@pytest.mark.parametrize("system, tp, expected", [("dgx-h100", 1, 1024), ("dgx-b200", 1, 1024),
                                                  ("gb200-nvl72", 1, 1024), ("dgx-a100-80gb", 1, 256)])
def test_max_num_seqs_is_vllms_llm_class_default_for_the_device(system, tp, expected):
    """vLLM's EngineArgs.get_batch_defaults for the LLM class: 1,024 on a GPU reporting 70 GiB or more
    that is not an A100 (an 80 GB A100 reports 80 GiB and still gets 256)."""
    assert engine_max_seqs(Layout(tp=tp), load_cluster(system, 8).device) == expected


def test_max_num_seqs_on_a_cpu_is_256_per_rank(dgx):
    import dataclasses
    cpu = dataclasses.replace(dgx.device, kind="cpu", name="cpu")
    assert [engine_max_seqs(Layout(tp=t), cpu) for t in (1, 2)] == [256, 512]
    small = dataclasses.replace(dgx.device, hbm_capacity_bytes=48 * 2**30)  # below vLLM's 70 GiB: 256
    assert engine_max_seqs(Layout(), small) == 256


def test_a_max_num_seqs_the_caller_sets_wins_and_asyncllm_takes_128(dgx):
    assert engine_max_seqs(Layout(max_seqs=32), dgx.device) == 32
    assert ASYNC_ENGINE_MAX_SEQS.value == 128  # AsyncLLM's ENGINE_CONTEXT: SchedulerConfig.DEFAULT_MAX_NUM_SEQS
    with pytest.raises(RpegError, match="max_seqs = -1 must be a whole number >= 0"):
        Layout(max_seqs=-1)


def test_an_asyncllm_engine_runs_256_sequences_in_two_waves_where_the_llm_class_runs_one(dgx):
    """256 sequences of 100 tokens: 99 decode steps at the LLM class's 1,024, 2 x 99 at AsyncLLM's 128,
    each wave's steps at half the batch."""
    lengths = [100.0] * 256
    llm = simulate(dgx, lengths, 1e12, prompt=64)
    asyncllm = simulate(dgx, lengths, 1e12, prompt=64, layout=Layout(max_seqs=int(ASYNC_ENGINE_MAX_SEQS.value)))
    assert (llm["decode_steps"], asyncllm["decode_steps"]) == (99, 198)
    assert seconds(asyncllm) > seconds(llm)


@pytest.mark.parametrize("room", [1.0, 2.5, 1e6])  # KV capacity in units of the longest sequence
def test_every_sequence_finishes(dgx, room):
    lengths = response_lengths(LOGNORMAL, 64)
    sim = simulate(dgx, lengths, room * (256 + max(lengths)))
    assert sim["decode_steps"] >= max(lengths) - 1


def test_more_kv_capacity_never_makes_generation_slower(dgx):
    lengths = response_lengths(LOGNORMAL, 64)
    need = 256 + max(lengths)  # one whole sequence
    times = [seconds(simulate(dgx, lengths, cap)) for cap in (need, 1.5 * need, 2 * need, 3 * need, 6 * need,
                                                              20 * need, 1e9)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:]))
    assert times[-1] < times[0]


def test_a_tiny_kv_cache_forces_preemptions_and_is_slower(dgx):
    lengths = [512.0] * 64
    roomy = simulate(dgx, lengths, 1e9, prompt=16)
    tight = simulate(dgx, lengths, 2000, prompt=16)  # admits ~100 prompts, room for ~3 full sequences
    assert roomy["preemptions"] == 0
    assert tight["preemptions"] > 0
    assert tight["decode_steps"] > roomy["decode_steps"] == 511
    assert seconds(tight) > seconds(roomy)


def test_one_token_responses_take_no_decode_step_and_the_head_runs_once_per_prompt(dgx):
    """A response of one token is sampled by the prefill: no decode step. The prefill's output head
    runs on each sequence's last position only: a longer prompt adds the layers' work, not the
    vocabulary head's (hand check: head FLOPs of 32 sequences, not 32 x prompt tokens)."""
    sim = simulate(dgx, [1.0] * 32, 1e12, prompt=128)
    assert sim["decode_steps"] == 0 and sim["decode"] == pytest.approx(0.0, abs=1e-12)
    from rpeg.perf.compute import head_forward
    from rpeg.perf.generation import _prefill_s
    lay = Layout()
    head = {n: head_forward(SMALL, dgx.device, tokens=n).seconds for n in (1.0, 4.0, 4096.0)}
    layers = {n: _prefill_s(SMALL, lay, dgx, 4096.0, 4096.0 / n, "bf16", n) - head[n] for n in (1.0, 4.0)}
    assert layers[1.0] > 0 and head[4096.0] > 10 * head[4.0]
    # the same 4,096 tokens as 1 or 4 prompts: the layers' time differs only by attention context
    assert layers[1.0] == pytest.approx(_prefill_s(SMALL, lay, dgx, 4096.0, 4096.0, "bf16", 1.0) - head[1.0])


def test_a_sequence_larger_than_the_kv_cache_is_refused(dgx):
    with pytest.raises(RpegError, match="does not fit the KV cache"):
        simulate(dgx, [300.0, 1000.0], 800, prompt=100)


# ---- the stage over dp instances --------------------------------------------------------------------
def work(sequences=256, prompt=256, response=LOGNORMAL):
    return GenWorkload(sequences=sequences, prompt_len=prompt, response=response)


def test_more_instances_finish_the_same_sequences_sooner(dgx):
    times = [generation_cost("gen", SMALL, Layout(dp=dp), dgx, work()).seconds for dp in (1, 2, 4, 8)]
    assert all(b < a for a, b in zip(times, times[1:]))


def test_a_colocated_engine_has_less_kv_room_and_is_never_faster(dgx):
    big = get_model("llama-3.1-8B")
    own = generation_cost("gen", big, Layout(), dgx, work(sequences=128))
    shared = generation_cost("gen", big, Layout(), dgx, work(sequences=128), colocated=True)
    assert shared.seconds >= own.seconds
    assert dict(shared.memory_parts)["kv_cache"] < dict(own.memory_parts)["kv_cache"]


def test_a_model_that_leaves_no_room_for_one_sequence_is_an_oom_verdict(dgx):
    """Llama-3.1-70B's 141 GB of bf16 weights on one 80 GB device: no time, fits is False."""
    big = get_model("llama-3.1-70B")
    c = generation_cost("gen", big, Layout(), dgx, work(sequences=8))
    assert not c.fits
    assert c.seconds == math.inf
    assert dict(c.memory_parts)["weights"] > c.capacity_bytes
    assert generation_cost("gen", big, Layout(tp=8), dgx, work(sequences=8)).fits


@pytest.mark.parametrize("layout, response", [
    (Layout(), LOGNORMAL),
    (Layout(dp=2, tp=2), Dist.fixed(1024)),
    (Layout(dp=4, pp=2), Dist(kind="uniform", min=64, max=4096)),
])
def test_parts_add_up_to_the_total(dgx, layout, response):
    c = generation_cost("gen", SMALL, layout, dgx, work(sequences=128, response=response))
    assert c.seconds > 0 and c.fits
    assert sum(v for _, v in c.parts) == pytest.approx(c.seconds, rel=1e-6)
    assert all(v >= 0 for _, v in c.parts)
    assert c.part("decode") > 0 and c.part("prefill") > 0
    assert (c.part("tensor-parallel comm") > 0) == (layout.tp > 1)


# ---- the engine the step waits for ------------------------------------------------------------------
def test_the_critical_engine_holds_the_longest_response_of_the_whole_batch():
    from rpeg.perf.generation import critical_lengths

    alone = critical_lengths(LOGNORMAL, 64, 64)
    assert alone == response_lengths(LOGNORMAL, 64)  # one engine: its own quantiles
    shared = critical_lengths(LOGNORMAL, 64, 64 * 32)
    assert max(shared) == round(LOGNORMAL.quantile(0.5 ** (1 / (64 * 32)))) > max(alone)
    assert sorted(shared)[:-1] == sorted(alone)[:-1]  # only the longest changes
    capped = Dist(kind="lognormal", mean=3000, max=4096, sigma=1.0)
    assert max(critical_lengths(capped, 64, 64 * 32)) == 4096  # never past the cap


def test_the_same_share_per_engine_takes_longer_the_more_engines_share_the_tail(dgx):
    """32 engines of 64 sequences wait for the longest of 2,048 responses; one engine of 64 for the
    longest of its 64. Without a tail (fixed lengths) the engine count does not matter."""
    def run(dist, dp):
        return generation_cost("g", SMALL, Layout(dp=dp), load_cluster("dgx-h100", dp), GenWorkload(
            sequences=64 * dp, prompt_len=256, response=dist)).seconds

    assert run(LOGNORMAL, 32) > 1.1 * run(LOGNORMAL, 1)
    fixed = Dist(kind="fixed", mean=1000, max=1000)
    assert run(fixed, 32) == pytest.approx(run(fixed, 1), rel=1e-9)


def test_runaway_responses_make_a_large_batch_run_to_the_cap(dgx):
    """Without runaways the log-normal's longest of 2,048 stops short of a 16K cap; with 1% of
    responses that never stop, the step runs a response to the cap, whatever the body."""
    def run(runaway):
        dist = Dist(kind="lognormal", mean=749, max=16234, sigma=0.8, runaway=runaway)
        return generation_cost("g", SMALL, Layout(dp=8), dgx, GenWorkload(sequences=2048, prompt_len=150,
                                                                         response=dist))

    from rpeg.perf.generation import critical_lengths
    body = Dist(kind="lognormal", mean=749, max=16234, sigma=0.8, runaway=0.0)
    assert max(critical_lengths(body, 256, 2048)) < 10000
    assert max(critical_lengths(Dist(kind="lognormal", mean=749, max=16234, sigma=0.8), 256, 2048)) == 16234
    assert run(0.01).seconds > 1.5 * run(0.0).seconds


# ---- partial rollout: the engine never drains -----------------------------------------------------
def test_partial_rollout_pays_the_tail_once_not_every_step(dgx):
    """One engine, a long tail: without partial rollout each step runs until its longest response;
    with it the next step's sequences fill the slots, so a step costs less. Fixed lengths have no tail
    to save when they fit in one wave."""
    def run(dist, partial, n=512):  # an engine of max_num_seqs 256: n = 256 is one wave
        return generation_cost("g", SMALL, Layout(max_seqs=256), dgx,
                               GenWorkload(sequences=n, prompt_len=256, response=dist, partial=partial)).seconds

    tail = Dist(kind="lognormal", mean=1000, max=16384, sigma=1.2)
    assert run(tail, True) < 0.9 * run(tail, False)
    fixed = Dist(kind="fixed", mean=1000, max=1000)
    assert run(fixed, True, n=256) == pytest.approx(run(fixed, False, n=256), rel=0.05)


def test_partial_rollout_needs_asynchrony_and_the_peers_that_have_it_use_it():
    from rpeg.algorithms import Models, build_graph
    from rpeg.errors import PassRefused, RpegError
    from rpeg.graph import Job
    from rpeg.passes import bound_asynchrony, partial_rollout
    from rpeg.search.baselines import BASELINES
    from rpeg.search.layouts import LayoutCache

    g = build_graph("grpo", Job(), Models(actor=SMALL))
    with pytest.raises(PassRefused, match="apply bound_asynchrony"):
        partial_rollout(g)
    p = partial_rollout(bound_asynchrony(g, 1))
    assert p.partial_rollout and p.history[-1] == "partial_rollout()"
    with pytest.raises(RpegError, match="partial rollout"):
        bound_asynchrony(p, 0)  # the verifier refuses undoing the bound under it
    cluster = load_cluster("dgx-h100", 16)
    plans = {n: BASELINES[n].build(g, cluster, 16, LayoutCache()) for n in BASELINES}
    assert {n for n, q in plans.items() if q.partial_rollout} == {"areal", "verl-fully-async"}


def test_a_grace_host_pays_its_host_time_and_nothing_else():
    """The same GPU figures behind a Grace host: the engine's per-step host overhead grows by
    HOST_TIME[grace]; decode kernels, prefill and communication do not change."""
    import dataclasses

    from rpeg.hardware.topology import Cluster
    from rpeg.perf.efficiency import HOST_TIME

    x86 = load_cluster("dgx-h100", 8)
    grace = dataclasses.replace(x86, device=dataclasses.replace(x86.device, host="grace"))
    assert isinstance(grace, Cluster)
    work = GenWorkload(sequences=512, prompt_len=256, response=LOGNORMAL)
    a, b = (dict(generation_cost("g", SMALL, Layout(dp=8), c, work).parts) for c in (x86, grace))
    assert b["engine step overhead"] == pytest.approx(a["engine step overhead"] * HOST_TIME["grace"].value)
    for part in ("prefill", "decode"):
        assert b[part] == pytest.approx(a[part])


# ---- output processing in the engine's step loop (inline_output) -----------------------------------
def _waves(cluster, batch, length, prompt, inline):
    """`batch` sequences of `length` tokens admitted together, no KV limit: one interval of length - 1
    decode steps at a fixed batch, so the output processing is hand-computable."""
    return simulate_instance(SMALL, Layout(inline_output=inline), cluster, n=batch, prompt=prompt,
                             lengths=[length] * batch, capacity_tokens=math.inf)


def test_inline_output_processing_is_paid_every_decode_step(dgx):
    """In the step loop (vLLM's LLM with VLLM_ENABLE_V1_MULTIPROCESSING=0, NeMo-RL's synchronous
    engine): 100 us x 64 sequences x 999 decode steps = 6.3936 s, its own part; nothing else moves."""
    from rpeg.perf.fitted import override
    from rpeg.perf.generation import OUTPUT_PER_SEQ_S

    with override({OUTPUT_PER_SEQ_S.name: 100e-6}):
        inline = _waves(dgx, 64, 1000, 256, True)
        beside = _waves(dgx, 64, 1000, 256, False)
    assert inline["decode_steps"] == 999
    assert inline["output processing"] == pytest.approx(100e-6 * 64 * 999)
    for part in ("prefill", "decode", "tensor-parallel comm", "engine step overhead"):
        assert inline[part] == pytest.approx(beside[part])


def test_output_processing_beside_the_steps_costs_only_its_excess(dgx):
    """With the engine core in its own process the front end processes one step's outputs while the
    next step runs: hidden while it is shorter than the step (8 sequences: 0.8 ms against a step of
    ~2 ms of host overhead alone), and only the excess beyond the step where it is longer (1 ms a
    sequence x 64: 64 ms against a step of a few ms)."""
    from rpeg.perf.fitted import override
    from rpeg.perf.generation import OUTPUT_PER_SEQ_S, _StepModel

    with override({OUTPUT_PER_SEQ_S.name: 100e-6}):
        assert _waves(dgx, 8, 1000, 256, False)["output processing"] == 0.0
    with override({OUTPUT_PER_SEQ_S.name: 1e-3}):
        sim = _waves(dgx, 64, 1000, 256, False)
    step = _StepModel(SMALL, Layout(), dgx, "bf16")
    held0 = 64 * 256  # each sequence holds its prompt when the first decode step starts
    mean_step = (step(64, held0)[0] + step(64, held0 + 64 * 999)[0]) / 2
    assert 0 < mean_step < 0.064
    assert sim["output processing"] == pytest.approx(999 * (1e-3 * 64 - mean_step))


def test_the_stage_shows_inline_output_processing_as_its_own_line(dgx):
    work = GenWorkload(sequences=512, prompt_len=256, response=LOGNORMAL)
    inline = generation_cost("g", SMALL, Layout(dp=8, inline_output=True), dgx, work)
    parts = dict(inline.parts)
    assert parts["output processing"] > 0
    assert inline.seconds == pytest.approx(sum(parts.values()))
    assert inline.overhead_s == pytest.approx(parts["engine step overhead"] + parts["output processing"])
    beside = generation_cost("g", SMALL, Layout(dp=8), dgx, work)
    assert inline.seconds - beside.seconds == pytest.approx(parts["output processing"]
                                                            - dict(beside.parts).get("output processing", 0.0))


def test_partial_rollout_recomputes_what_the_engine_holds_not_its_max_num_seqs(dgx):
    """An engine with 20 sequences a step holds at most the 40 of the two steps its steady state runs:
    their carried KV is what a weight update recomputes, whatever max_num_seqs allows (1,024 on an H100);
    with 600 a step, max_num_seqs (256 here) caps it."""
    from rpeg.perf.generation import _prefill_s, carried_recompute_s
    dist = Dist(kind="lognormal", mean=1000, max=8192, sigma=1.0)
    mean, mean2 = dist.moments()
    context = 256 + mean2 / (2 * mean)
    work = GenWorkload(sequences=20, prompt_len=256, response=dist, partial=True)
    for lay, n, held in ((Layout(), 20, 40), (Layout(max_seqs=256), 600, 256)):
        expected = _prefill_s(SMALL, lay, dgx, held * context, context, "bf16", held)
        assert carried_recompute_s(SMALL, lay, dgx, work, math.inf, n) == pytest.approx(expected, rel=1e-12)
