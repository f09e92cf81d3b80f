"""Offload as a plan option (rpeg/perf/offload.py): memory and time terms against worked numbers,
each system's flag changing the verdict and the time, and the planner choosing offload only when
nothing else fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from rpeg.errors import RpegError
from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import get_model
from rpeg.hardware import load_cluster
from rpeg.interop import openrlhf, verl
from rpeg.interop.common import job_data
from rpeg.perf import memory, offload, residency
from rpeg.perf.efficiency import HOST_LINK_BYTES_PER_S, HOST_OPTIMIZER_BYTES_PER_S, OPTIMIZER_BYTES_PER_PARAM
from rpeg.perf.residency import device_memory
from rpeg.perf.step import SWITCH, predict_step
from rpeg.perf.weightsync import context_switch_cost
from rpeg.search.search import search
from rpeg.spec import spec_from_data

PEERS = Path(__file__).resolve().parents[1] / "data" / "peers"
SPEC = get_model("qwen2.5-7B")
H100 = load_cluster("dgx-h100")
MEM = dict(seq_len=2048, micro_batch=1)


def test_layout_checks_offload():
    assert Layout(offload_optimizer=True).offload_optimizer == 1.0
    assert Layout(resident=["optimizer", "weights"]).resident == ("weights", "optimizer")  # canonical order
    with pytest.raises(RpegError, match="offload_params needs zero = 3 and offload_optimizer = 1"):
        Layout(dp=8, zero=1, offload_params=True)
    with pytest.raises(RpegError, match="from 0 to 1"):
        Layout(offload_optimizer=1.5)
    with pytest.raises(RpegError, match="resident"):
        Layout(resident=("activations",))


def test_optimizer_offload_leaves_the_device_and_zero2_gradients_with_it():
    p = memory.params_per_device(SPEC, Layout(dp=8))
    z1, z1_host = (memory.training_memory(SPEC, Layout(dp=8, zero=1, offload_optimizer=f), **MEM) for f in (0, 1))
    assert z1.optimizer == pytest.approx(p * 12 / 8) and z1_host.optimizer == 0
    assert z1_host.gradients == z1.gradients == pytest.approx(p * 4)  # Megatron's buffer stays on the device
    half = memory.training_memory(SPEC, Layout(dp=8, zero=2, offload_optimizer=0.5), **MEM)
    assert half.optimizer == pytest.approx(p * 12 / 8 / 2) and half.gradients == pytest.approx(p * 4 / 8 / 2)
    z3 = memory.training_memory(SPEC, Layout(dp=8, zero=3, offload_optimizer=1, offload_params=True), **MEM)
    assert z3.weights == z3.gradients == z3.optimizer == 0
    assert z3.buffers == memory.training_memory(SPEC, Layout(dp=8, zero=3), **MEM).buffers  # the gathered layers stay


def test_offload_time_terms_against_worked_numbers():
    owned = 1e9  # parameters whose optimizer state one device owns
    dev = H100.device
    parts = dict(offload.optimizer_offload_parts(owned, Layout(offload_optimizer=0.5), dev))
    link = HOST_LINK_BYTES_PER_S.value
    assert parts[offload.GRADS_DOWN] == pytest.approx(0.5e9 * 4 / link)  # 0.08 s at 25 GB/s
    assert parts[offload.WEIGHTS_UP] == pytest.approx(0.5e9 * 2 / link)  # 0.04 s
    assert parts[offload.HOST_STEP] == pytest.approx(0.5e9 * OPTIMIZER_BYTES_PER_PARAM.value
                                                     / HOST_OPTIMIZER_BYTES_PER_S["x86"].value)  # 0.36 s
    assert offload.optimizer_offload_parts(owned, Layout(), dev) == ()


def test_training_stage_shows_each_offload_term_and_pays_for_it():
    from rpeg.perf.training import PassWorkload, pass_cost
    work = PassWorkload(sequences=64, seq_len=2048, attention_context=1024, micro_batch=4)
    base = pass_cost("t", SPEC, Layout(dp=8, zero=1), H100, work)
    host = pass_cost("t", SPEC, Layout(dp=8, zero=1, offload_optimizer=1.0), H100, work)
    owned = memory.params_per_device(SPEC, Layout(dp=8)) / 8
    expect = dict(offload.optimizer_offload_parts(owned, Layout(offload_optimizer=1.0), H100.device))
    for name, seconds in expect.items():
        assert host.part(name) == pytest.approx(seconds)
    assert host.part("optimizer") == 0 and base.part("optimizer") > 0
    assert host.seconds == pytest.approx(base.seconds - base.part("optimizer") + sum(expect.values()))
    assert host.peak_memory_bytes < base.peak_memory_bytes
    fetch = pass_cost("t", SPEC, Layout(dp=8, zero=3, offload_optimizer=1.0, offload_params=True), H100, work)
    assert fetch.part(offload.FETCH) > 0


def test_context_switch_moves_only_what_is_not_resident():
    p = memory.params_per_device(SPEC, Layout(dp=8))
    host = HOST_LINK_BYTES_PER_S.value
    moved = context_switch_cost("s", SPEC, Layout(dp=8, zero=1), Layout(dp=8))
    assert moved.part("offload trainer state") == pytest.approx(p * (2 + 12 / 8) / host, rel=1e-12)
    kept = context_switch_cost("s", SPEC, Layout(dp=8, zero=1, resident=("optimizer",)), Layout(dp=8))
    assert kept.part("offload trainer state") == pytest.approx(p * 2 / host, rel=1e-12)
    on_host = context_switch_cost("s", SPEC, Layout(dp=8, zero=1, offload_optimizer=1.0), Layout(dp=8))
    assert on_host.part("offload trainer state") == pytest.approx(p * 2 / host, rel=1e-12)


def _predict(view):
    spec = spec_from_data(job_data(view), "test")
    return predict_step(spec.graph(), load_cluster(view.cluster or "dgx-h100"))


def test_verl_megatron_offload_keys_change_the_engines_memory_and_the_switch():
    text = (PEERS / "verl" / "run_qwen2-7b_math.sh").read_text()
    meg = text.replace("actor_rollout_ref.actor.fsdp_config.param_offload=False \\",
                       "actor_rollout_ref.actor.strategy=megatron \\")
    keys = ("actor_rollout_ref.actor.megatron.param_offload", "actor_rollout_ref.actor.megatron.grad_offload",
            "actor_rollout_ref.actor.megatron.optimizer_offload")
    on = meg.replace("actor_rollout_ref.actor.strategy=megatron \\",
                     "actor_rollout_ref.actor.strategy=megatron \\" + "".join(f"\n    {k}=True \\" for k in keys))
    kept, moved = verl.read(meg, "kept.sh").view, verl.read(on, "moved.sh").view
    assert kept.layout("actor_update").resident == ("weights", "gradients", "optimizer")
    assert moved.layout("actor_update").resident == ()
    pk, pm = _predict(kept), _predict(moved)
    state = memory.trainer_state_bytes(SPEC, kept.layout("actor_update"))
    # while the engine generates, the kept state stays beside it (rpeg/perf/residency.py), the moved state is out
    gen_k, gen_m = (_held_while(view, "generate") for view in (kept, moved))
    assert gen_k.peak_bytes - gen_m.peak_bytes == pytest.approx(sum(state.values()))
    assert {h.what for h in gen_m.moved} == {"trainer weights", "trainer gradients", "trainer optimizer"}
    assert not gen_k.moved
    assert pk.stages[SWITCH].part("offload trainer state") == 0 < pm.stages[SWITCH].part("offload trainer state")
    assert pk.step_s < pm.step_s
    # written back: verl's config says the same
    again = verl.read(verl.write(moved).text, "again.sh").view
    assert again.layout("actor_update") == moved.layout("actor_update")


def _held_while(view, stage: str):
    """The account of the devices `stage` runs on, while it runs."""
    graph = spec_from_data(job_data(view), "test").graph()
    pred = predict_step(graph, load_cluster(view.cluster or "dgx-h100"))
    (held,) = device_memory(graph, pred.stages, sleeping_engine=residency.sleeping_engine(graph), while_running=stage)
    return held


def test_verl_fsdp2_offload_policy_is_offload_params():
    text = (PEERS / "verl" / "run_qwen2-7b_math.sh").read_text().replace(
        "actor_rollout_ref.actor.fsdp_config.param_offload=False \\",
        "actor_rollout_ref.actor.strategy=fsdp2 \\\n    actor_rollout_ref.actor.fsdp_config.offload_policy=True \\")
    lay = verl.read(text, "p.sh").view.layout("actor_update")
    assert lay.offload_params and lay.offload_optimizer == 1.0


def test_openrlhf_adam_offload_makes_a_job_fit():
    # at the script's 74,240-token packed micro-batches a 14B model's logits alone (37k tokens per device
    # after ring attention x 152k vocabulary x 14 bytes, 79 GB) fill an 80 GB GPU: the job at 16k tokens
    text = (PEERS / "openrlhf" / "train_reinforce_baseline_hybrid_engine.sh").read_text().replace(
        "--data.max_len 74240", "--data.max_len 16384").replace("--rollout.max_new_tokens 64000",
                                                                 "--rollout.max_new_tokens 15000")
    without = openrlhf.read(text, "a.sh", model="qwen2.5-14B").view
    with_ = openrlhf.read(text.replace("# --ds.adam_offload", "--ds.adam_offload"), "b.sh", model="qwen2.5-14B").view
    old = openrlhf.read(text.replace("# --ds.adam_offload", "--adam_offload"), "c.sh", model="qwen2.5-14B").view
    assert with_.layout("actor_update").offload_optimizer == 1.0 == old.layout("actor_update").offload_optimizer
    assert not _predict(without).fits
    fit = _predict(with_)
    assert fit.fits and fit.stages["actor_update"].part(offload.HOST_STEP) > 0
    assert "--ds.adam_offload" in openrlhf.write(with_).text


def test_planner_takes_offload_only_when_nothing_else_fits():
    graph = spec_from_data({"algorithm": "grpo", "model": "qwen2.5-7B", "job": {
        "prompts": 16, "samples_per_prompt": 8, "prompt_len": 512, "mini_batches": 1,
        "response": {"kind": "lognormal", "mean": 1024, "max": 2048}}}, "test").graph()
    small = search(graph, H100, 1, budget=200).best.graph.stage("actor_update").layout
    assert small.offload_optimizer == 1.0  # weights, fp32 gradients and Adam state do not fit one H100
    eight = search(graph, H100, 8, budget=200).best.graph.stage("actor_update").layout
    assert eight.offload_optimizer == 0 and not eight.offload_params
