"""Streaming between stages: a step's prompt groups go through generation, scoring, inference and
advantages part by part, and training per mini-batch, as the plan's streams say."""

from __future__ import annotations

import pytest
import torch

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.passes import fuse, place, stream
from rpeg.runtime.batch import Batch, build_batch
from rpeg.runtime.plan_check import check_plan
from rpeg.runtime.run import run
from tests.runtime.test_runtime_e2e import TINY, job, laid_out, rt

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`


def split_streamed(parts=4, fused=False, algorithm="grpo", **cfg):
    g = build_graph(algorithm, job(), Models(actor=TINY), **cfg)
    if fused:  # the engine's logprobs are the old ones: both on the generation devices
        g = place(fuse(g, ["generate", "actor_logprobs"]), {"gen": 1, "train": 1},
                  {"generate": "gen", "actor_logprobs": "gen"}, default="train")
    else:
        g = place(g, {"gen": 1, "train": 1}, {"generate": "gen"}, default="train")
    return laid_out(stream(g, parts))


def by(records, unit, step):
    return sorted((r for r in records if r.unit == unit and r.step == step), key=lambda r: r.microbatch)


def test_join_repads_parts_into_the_whole_batch():
    prompts, responses = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]], [[11, 12], [13], [14, 15, 16], [17]]
    lps = [[-0.1, -0.2], [-0.3], [-0.4, -0.5, -0.6], [-0.7]]
    whole = build_batch(prompts, responses, lps, [0, 0, 1, 1], [0] * 4, pad_id=0)
    a = build_batch(prompts[:2], responses[:2], lps[:2], [0, 0], [0, 0], pad_id=0)
    b = build_batch(prompts[2:], responses[2:], lps[2:], [1, 1], [0, 0], pad_id=0)
    a.extras["advantages"], b.extras["advantages"] = a.mask * 2.0, b.mask * 3.0
    joined = Batch.join([a, b], pad_id=0)
    assert joined.prompt_len == whole.prompt_len
    for name in ("input_ids", "attention_mask", "mask", "rollout_logprobs", "group_index"):
        assert torch.equal(getattr(joined, name), getattr(whole, name)), name
    assert torch.equal(joined.extras["advantages"], whole.mask * torch.tensor([2.0, 2, 3, 3])[:, None])


def test_parts_flow_downstream_while_generation_goes_on(tmp_path):
    """Split GRPO streamed in 4 parts: generation, rewards, the trainer's old logprobs and the
    advantages each run per part; the trainer's logprobs of the first part start before the engine
    has finished the last. The updates (2 mini-batches) wait for every old logprob of the step, so
    the trainer's logprobs are the engine's to rounding: the step stays on-policy."""
    # 32 new tokens: each part's generation takes several times what a part's scoring does, so
    # the order checked below holds with margin on a loaded machine (at 8 it came down to a few ms)
    result = run(split_streamed(), rt(tmp_path, steps=3, max_new_tokens=32), progress=False)
    recs = result.timeline.records
    for step in (1, 2):  # step 0 also warms the workers up (their first calls take a second)
        for unit in ("generate", "reward", "actor_logprobs", "advantages"):
            assert [r.microbatch for r in by(recs, unit, step)] == [0, 1, 2, 3], unit
        assert [r.microbatch for r in by(recs, "actor_update", step)] == [0, 1]
        gen, logprobs = by(recs, "generate", step), by(recs, "actor_logprobs", step)
        assert logprobs[0].start < gen[-1].end, (logprobs[0], gen[-1])  # a consumer before its producer's end
        assert by(recs, "actor_update", step)[0].start >= max(r.end for r in logprobs)
    assert all(m["logprob_gap_max"] < 1e-4 for m in result.metrics), [m["logprob_gap_max"] for m in result.metrics]
    assert all(m["grad_norm"] >= 0 and "pg_loss" in m for m in result.metrics)


def test_with_the_engines_logprobs_training_starts_per_mini_batch(tmp_path):
    """Generation fused with the old logprobs: nothing else reads the trainer's weights in the step,
    so the first mini-batch's update starts as soon as its two parts are scored, before the rest of
    the step's parts are."""
    # 64 new tokens: the engine's last two parts take far longer than scoring one part does (at 8
    # tokens a loaded CI machine once ran them within 6 ms of the first update's start)
    result = run(split_streamed(fused=True), rt(tmp_path, steps=3, max_new_tokens=64), progress=False)
    recs = result.timeline.records
    for step in (1, 2):
        updates, gen = by(recs, "actor_update", step), by(recs, "generate", step)
        assert [r.microbatch for r in updates] == [0, 1]
        assert updates[0].start < gen[-1].end, (updates[0], gen[-1])  # training overlaps the engine
    assert len(result.metrics) == 3 and all("pg_loss" in m for m in result.metrics)


def test_streamed_ppo_with_a_critic_and_reference(tmp_path):
    """PPO streamed: reference logprobs and the critic's values per part; advantages (GAE, whitened
    over the batch) on the whole batch; actor and critic updates per mini-batch."""
    g = build_graph("ppo", job(), Models(actor=TINY))
    g = laid_out(stream(place(g, {"gen": 1, "train": 1}, {"generate": "gen"}, default="train"), 2))
    result = run(g, rt(tmp_path, steps=2), progress=False)
    recs = result.timeline.records
    assert [r.microbatch for r in by(recs, "critic_values", 1)] == [0, 1]
    assert [r.microbatch for r in by(recs, "advantages", 1)] == [0]
    assert [r.microbatch for r in by(recs, "critic_update", 1)] == [0, 1]
    assert all("critic_vf_loss" in m and "kl_ref" in m for m in result.metrics)


def test_streams_the_runtime_does_not_run_are_refused():
    with pytest.raises(RpegError, match="greedy baseline or DAPO"):
        check_plan(laid_out(stream(place(build_graph("remax", job(), Models(actor=TINY)), {"all": 1}, {},
                                         default="all"), 2)))
    with pytest.raises(RpegError, match="only 8 prompts"):
        check_plan(split_streamed(parts=16))
    g = build_graph("grpo", job().replace(ppo_epochs=2), Models(actor=TINY))
    g = laid_out(stream(place(g, {"gen": 1, "train": 1}, {"generate": "gen"}, default="train"), 2))
    with pytest.raises(RpegError, match="2 PPO epochs"):
        check_plan(g)
    check_plan(split_streamed())  # what the runtime does run
