"""The runtime runs the plan's micro-batches: each pass takes as many rows per forward (and backward)
call as its stage's layout says (`micro_batch` padded rows, or a packed layout's token budget), so
the prediction and the run count the same calls."""

from __future__ import annotations

import torch

from rpeg.algorithms import Models, build_graph
from rpeg.graph.config import AlgoConfig
from rpeg.graph.layout import ParallelLayout
from rpeg.passes import colocate
from rpeg.runtime.batch import build_batch
from rpeg.runtime.models import build_tiny, load
from rpeg.runtime.roles import micro_batch, optim_configs, step_stages
from rpeg.runtime.trainer import MicroBatch, OptimConfig, Trainer
from tests.runtime.test_runtime_e2e import TINY, job, lay, rt


def test_a_layout_gives_rows_or_a_token_budget():
    assert MicroBatch.of(ParallelLayout(micro_batch=8, packing=False), longest=20) == MicroBatch(rows=8)
    packed = MicroBatch.of(ParallelLayout(micro_batch=3), longest=20)  # packing: 3 x 20 tokens a call
    assert packed == MicroBatch(rows=3, tokens=60)
    assert [packed.rows_for(n) for n in (10, 20, 21, 61)] == [6, 3, 2, 1]  # at least one row, however long
    assert MicroBatch(rows=8).rows_for(1000) == 8
    assert OptimConfig(micro_batch=5).micro_batch == OptimConfig(micro_batch=5).forward_batch == MicroBatch(rows=5)


def test_each_role_takes_its_own_stages_micro_batch(tmp_path):
    g = colocate(build_graph("ppo", job(), Models(actor=TINY)), 1)
    sizes = {"actor_logprobs": 2, "actor_update": 3, "ref_logprobs": 5, "critic_values": 7, "critic_update": 11}
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            g = lay(g, s.name, dp=1, micro_batch=sizes.get(s.name, 1))
    actor, ref, critic = optim_configs(g, step_stages(g), rt(tmp_path))
    assert (actor.forward_batch.rows, actor.micro_batch.rows) == (2, 3)
    assert ref.forward_batch.rows == 5
    assert (critic.forward_batch.rows, critic.micro_batch.rows) == (7, 11)
    assert micro_batch(g, "actor_update").tokens == 0  # the test layouts pad (packing false)


def test_the_trainer_calls_the_model_once_per_planned_micro_batch(tmp_path):
    path = build_tiny(str(tmp_path / "tiny"))
    model, tok = load(path)
    prompts = [tok("12+7=", add_special_tokens=False)["input_ids"]] * 6
    batch = build_batch(prompts, [[5, 6, 7]] * 6, [[-1.0] * 3] * 6, [0, 0, 0, 1, 1, 1], [0] * 6, tok.pad_token_id)
    calls = []
    model.register_forward_pre_hook(lambda mod, args, kw: calls.append(kw["input_ids"].shape[0]), with_kwargs=True)
    length = batch.input_ids.shape[1]
    trainer = Trainer(model, AlgoConfig(adv_estimator="grpo"),
                      OptimConfig(micro_batch=MicroBatch(rows=1, tokens=2 * length), forward_batch=4))
    logp = trainer.logprobs(batch)
    assert calls == [4, 2]  # forward: 4 rows a call
    calls.clear()
    batch.extras["old_logprobs"] = logp
    batch.extras["advantages"] = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])[:, None].expand_as(batch.mask).clone()
    trainer.train(batch, epochs=1, mini_batches=1, seed=0)
    assert calls == [2, 2, 2]  # update: a token budget of two padded rows


def test_a_forward_pass_on_sharded_training_workers_must_say_zero_3():
    import pytest

    from rpeg.errors import RpegError
    from rpeg.runtime.plan_check import check_plan

    def plan(logprobs_zero):
        g = colocate(build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.04), 2)
        zero = {"actor_update": 3, "actor_logprobs": logprobs_zero}
        for s in g.stages:
            if s.model and s.kind.value != "sync":
                g = lay(g, s.name, dp=2, zero=zero.get(s.name, 0))
        return g

    with pytest.raises(RpegError, match="actor_logprobs runs on actor_update's data-parallel workers.*zero = 3"):
        check_plan(plan(0))
    check_plan(plan(3))  # the reference is a whole copy per device: zero 0 is what runs


def test_megatron_recipe_options_are_planned_not_executed():
    import pytest

    from rpeg.errors import RpegError
    from rpeg.runtime.plan_check import check_plan

    g = colocate(build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.04), 2)
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            g = lay(g, s.name, dp=2, zero=3 if s.kind.value in ("train", "infer") and s.model == "actor" else 0)
    check_plan(g)
    update = g.stage("actor_update")
    g = g.with_stages([update.replace(layout=update.layout.replace(grad_dtype="bf16"))])
    with pytest.raises(RpegError, match="actor_update.*grads-bf16: the runtime runs none of Megatron-Core's"):
        check_plan(g)


def test_the_runnable_plan_halves_a_micro_batch_that_does_not_fit():
    """GRPO on Qwen2.5-0.5B on one H100 with the default job: 64 padded rows of 512 + 1,024 tokens
    hold fp32 logits over a 151,936-token vocabulary (60 GB a copy, rpeg/perf/logits.py) beside the
    engine; the plan `rpeg train` makes runs smaller micro-batches, says so, and fits."""
    from rpeg.graph import Job, get_model
    from rpeg.hardware import load_cluster
    from rpeg.perf.step import predict_step
    from rpeg.runtime.plan_check import runnable_plan

    g = build_graph("grpo", Job(), Models(actor=get_model("qwen2.5-0.5B")))
    h100 = load_cluster("dgx-h100", 1)
    cand = runnable_plan(g, h100, 1, micro_batch=64)
    rows = {s.layout.micro_batch for s in cand.graph.stages if s.layout is not None and s.kind.value != "generate"}
    assert len(rows) == 1 and rows.pop() < 64
    assert "runtime.micro_batch 64 does not fit" in cand.name
    assert predict_step(cand.graph, h100).fits
