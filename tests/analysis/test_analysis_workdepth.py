"""Work–depth analysis: hand-worked depths, work totals, and what asynchrony, streaming and
micro-batching do to the critical path."""

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.analysis import async_depth_table, work_depth
from rpeg.analysis.workdepth import multi_step_depth
from rpeg.graph import Job, LengthDistribution, get_model
from rpeg.passes import bound_asynchrony, fuse, stream
from rpeg.perf.flops import sequence_forward_flops, train_flops

TINY = get_model("tiny-qwen2")


def grpo(job=None, **cfg):
    return build_graph("grpo", job or Job(prompts=8, samples_per_prompt=4, prompt_len=16,
                                          response=LengthDistribution.fixed(32)), Models(actor=TINY), **cfg)


def by_stage(wd):
    return {s.stage: s for s in wd.stages}


def test_generation_depth_is_longest_response_times_layers():
    wd = by_stage(work_depth(grpo()))
    # the prefill samples the first of 32 tokens, 31 decode steps the rest: 32 passes
    assert wd["generate"].depth == pytest.approx(32 * TINY.layers)


def test_generation_depth_follows_the_tail_not_the_mean():
    short = Job(prompts=8, samples_per_prompt=4, prompt_len=16,
                response=LengthDistribution(kind="lognormal", mean=64, max=128))
    long_tail = short.replace(response=LengthDistribution(kind="lognormal", mean=64, max=4096))
    d_short = by_stage(work_depth(grpo(short)))["generate"].depth
    d_long = by_stage(work_depth(grpo(long_tail)))["generate"].depth
    assert d_long > 2 * d_short  # same mean, longer tail


def test_inference_work_is_a_forward_pass_per_sequence():
    wd = by_stage(work_depth(grpo()))
    assert wd["actor_logprobs"].flops == pytest.approx(32 * sequence_forward_flops(TINY, 16 + 32))
    assert wd["actor_logprobs"].depth == TINY.layers


def test_training_depth_grows_with_layers_times_microbatches():
    g = grpo()
    one = by_stage(work_depth(g))["actor_update"]
    four = by_stage(work_depth(g.with_stages([g.stage("actor_update").replace(microbatches=4)])))["actor_update"]
    assert one.depth == 2 * TINY.layers + 1  # forward + backward, one optimizer step
    assert four.depth == 2 * TINY.layers * 4 + 1
    assert four.flops == one.flops  # micro-batching changes depth, not work
    assert one.flops == pytest.approx(32 * train_flops(TINY, 48))


def test_totals_and_parallelism():
    wd = work_depth(grpo())
    assert wd.flops == pytest.approx(sum(s.flops for s in wd.stages))
    assert wd.parallelism == pytest.approx(wd.flops / wd.depth)
    assert wd.critical_path[0] == "generate"
    assert wd.depth >= max(s.depth for s in wd.stages)


def test_asynchrony_overlaps_steps_down_to_the_deepest_stage_and_keeps_work():
    """Each stage runs its steps in order, so with any bound k the depth of n steps is at least n times
    the deepest stage (the Foundations paper's max{D_G + D_A, D_T}), and at most n synchronous steps.
    Before issue 25 a bound k divided the depth by about k + 1 (2.00x / 2.66x / 3.99x for k = 1, 2, 4
    on the README's example, where generation is 99.98% of the step's depth)."""
    steps = 6
    rows = async_depth_table(grpo(), ks=(0, 1, 2, 4), steps=steps)
    wd = work_depth(grpo())
    deepest = max(s.depth for s in wd.stages)
    assert rows[0]["depth"] == pytest.approx(steps * rows[0]["step_depth"], rel=1e-6)
    assert rows[0]["depth"] > rows[1]["depth"] >= rows[2]["depth"] >= rows[3]["depth"]
    for r in rows[1:]:
        assert r["depth"] >= steps * deepest - 1e-6
    # generation is nearly all of the step here: asynchrony saves less than one step's non-generation depth
    gen = by_stage(wd)["generate"].depth
    assert rows[0]["depth"] - rows[3]["depth"] <= steps * (wd.depth - gen) + 1e-6
    g1 = bound_asynchrony(grpo(), 1)
    assert work_depth(g1).flops == pytest.approx(work_depth(grpo()).flops)


def test_multi_step_depth_of_one_step_is_the_step_depth():
    g = grpo()
    wd = work_depth(g)
    assert multi_step_depth(g, {s.stage: s.depth for s in wd.stages}, 1) == pytest.approx(wd.depth)


def test_streaming_and_fusion_never_lengthen_the_critical_path():
    job = Job(prompts=8, samples_per_prompt=4, prompt_len=16, response=LengthDistribution.fixed(32), mini_batches=2)
    g = grpo(job)
    base = work_depth(g).depth
    streamed = stream(g, 4)
    assert work_depth(streamed).depth <= base
    fused = fuse(g, ["generate", "reward"])
    assert work_depth(fused).depth <= base


def test_gae_depth_is_an_associative_scan_over_tokens():
    """GAE's recurrence is a linear first-order scan: depth log2 of the response length (5 for 20 tokens),
    not one layer step per token (20 before issue 25; 1,024 on the PPO example)."""
    g = build_graph("ppo", Job(prompts=4, samples_per_prompt=2, prompt_len=8, response=LengthDistribution.fixed(20)),
                    Models(actor=TINY))
    assert by_stage(work_depth(g))["advantages"].depth == pytest.approx(5)
