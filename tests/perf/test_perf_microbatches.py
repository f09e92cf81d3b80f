"""What one micro-batch of a training or forward pass holds: a token budget of micro_batch x the
longest sequence with packing, or micro_batch sequences padded to the batch's longest without."""

from __future__ import annotations

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import PassRefused, RpegError
from rpeg.graph import Job, LengthDistribution, ParallelLayout, get_model
from rpeg.hardware import load_cluster
from rpeg.passes import colocate, parallelize
from rpeg.perf.stages import padded_length, stage_cost

SPEC = get_model("qwen3-8B")
JOB = Job(prompts=64, samples_per_prompt=16, prompt_len=256,
          response=LengthDistribution(kind="lognormal", mean=1500, max=7936), mini_batches=4)
CLUSTER = load_cluster("dgx-h100", 8)


def _cost(stage: str, **layout):
    g = colocate(build_graph("grpo", JOB, Models(actor=SPEC), kl_coef=0.0), 8)
    g = parallelize(g, stage, dp=4, tp=2, pp=1, zero=1 if stage == "actor_update" else 0, **layout)
    return stage_cost(g, g.stage(stage), CLUSTER), g


def test_a_larger_token_budget_means_fewer_micro_batches():
    one, _ = _cost("actor_logprobs")
    four, _ = _cost("actor_logprobs", micro_batch=4)
    assert four.microbatches < one.microbatches
    assert four.microbatches == pytest.approx(one.microbatches / 4, abs=1)


def test_an_unpacked_batch_pads_every_sequence_to_the_batchs_longest():
    packed, g = _cost("actor_update")
    unpacked, _ = _cost("actor_update", packing=False)
    longest = padded_length(g)
    assert longest == pytest.approx(256 + JOB.response.quantile(0.5 ** (1 / JOB.sequences)))
    assert longest > JOB.mean_seq_len
    # the same sequences, each computed at the padded length: more FLOPs and more time
    assert unpacked.flops > packed.flops * 1.5 and unpacked.seconds > packed.seconds * 1.5
    assert unpacked.microbatches == JOB.sequences // 4  # one sequence per micro-batch, over dp 4


def test_layout_and_pass_check_the_new_fields():
    assert ParallelLayout(micro_batch=4, packing=False).describe() == "mb4 unpacked"
    with pytest.raises(RpegError, match="micro_batch = 0 must be >= 1"):
        ParallelLayout(micro_batch=0)
    g = build_graph("grpo", JOB, Models(actor=SPEC), kl_coef=0.0)
    with pytest.raises(PassRefused, match="packing = 'no'"):
        parallelize(colocate(g, 8), "actor_update", dp=8, packing="no")
