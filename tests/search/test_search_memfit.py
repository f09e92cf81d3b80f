"""fit_together (rpeg/search/memfit.py): layouts traded for memory until the models sharing devices
fit summed; unchanged when they already do; None when no layout makes them."""

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.graph import Job, get_model
from rpeg.graph import LengthDistribution as Dist
from rpeg.hardware import load_cluster
from rpeg.passes import bound_asynchrony, place
from rpeg.perf.step import predict_step
from rpeg.search.layouts import LayoutCache, LayoutOptions, apply_layouts
from rpeg.search.memfit import fit_together, frugal_layouts

H100 = load_cluster("dgx-h100", 8)
JOB = Job(prompts=64, samples_per_prompt=8, prompt_len=512, response=Dist.fixed(1024))


def ppo(model: str, gen: int = 2):
    spec = get_model(model)
    g = build_graph("ppo", JOB, Models(actor=spec, critic=spec, reference=spec, reward=spec))
    g = place(bound_asynchrony(g, 1), {"generation": gen, "training": 8 - gen}, assign={"generate": "generation"},
              default="training")
    return g


def test_models_that_fit_together_keep_their_fastest_layouts():
    opts, cache = LayoutOptions(offload=True), LayoutCache()
    g = apply_layouts(ppo("qwen3-0.6B"), H100, opts, cache)
    assert predict_step(g, H100).fits
    assert fit_together(g, H100, opts, cache) == g


def test_four_8b_models_on_six_gpus_are_traded_into_memory():
    opts, cache = LayoutOptions(offload=True), LayoutCache()
    fastest = apply_layouts(ppo("llama-3.1-8B"), H100, opts, cache)
    before = predict_step(fastest, H100)
    assert all(c.fits for c in before.stages.values()) and not before.fits
    fitted = fit_together(fastest, H100, opts, cache)
    after = predict_step(fitted, H100)
    assert after.fits and all(m.peak_bytes <= H100.device.hbm_capacity_bytes for m in after.memory)
    changed = [s.name for s in fitted.stages if s.layout != fastest.stage(s.name).layout]
    assert changed and "generate" not in changed
    for name in changed:  # each change is a layout on the stage's time / memory front, slower than the fastest
        stage = fitted.stage(name)
        front = dict(frugal_layouts(fitted, stage, H100, opts, cache))
        assert stage.layout in front
        assert front[stage.layout].seconds >= before.stages[name].seconds - 1e-12
    # trading memory costs time, never saves it
    assert after.step_s >= before.step_s - 1e-9


def test_an_engine_that_never_sleeps_leaves_no_room_for_a_frozen_model():
    """The reference placed on the generation GPUs, where no trainer is: the engine never sleeps and
    keeps 0.9 of each device (vLLM's default), and no layout of the 8B reference fits in the rest (its
    weights at least 16 GB / 2 beside 77 GB of engine on 85.5)."""
    opts, cache = LayoutOptions(offload=True), LayoutCache()
    g = build_graph("grpo", JOB, Models(actor=get_model("llama-3.1-8B")))
    g = place(bound_asynchrony(g, 1), {"generation": 2, "training": 6},
              assign={"generate": "generation", "ref_logprobs": "generation"}, default="training")
    fastest = apply_layouts(g, H100, opts, cache)
    assert fastest is not None and all(c.fits for c in predict_step(fastest, H100).stages.values())
    assert fit_together(fastest, H100, opts, cache) is None



def test_keeping_the_reference_on_the_host_is_a_move_of_its_own():
    """Llama 8B GRPO with 2 of 8 GPUs training: the actor's state and the reference's weights overflow
    them. Where host offload is allowed, the reference may wait on the host and be swapped in for its
    pass (NeMo-RL's way, passes/reference.py): its 2P bf16 weights leave the devices, and its pass
    pays three copies of the actor's per-device bf16 weights over the host link."""
    from rpeg.perf.efficiency import host_link_bytes_per_s
    from rpeg.perf.memory import params_per_device
    from rpeg.search.memfit import reference_to_host

    llama = get_model("llama-3.1-8B")
    g = build_graph("grpo", JOB, Models(actor=llama))
    g = place(bound_asynchrony(g, 1), {"generation": 6, "training": 2}, assign={"generate": "generation"},
              default="training")
    opts, cache = LayoutOptions(offload=True), LayoutCache()
    fastest = apply_layouts(g, H100, opts, cache)
    before = predict_step(fastest, H100)
    assert not before.fits
    assert reference_to_host(fastest, LayoutOptions(offload=False)) is None
    moved = reference_to_host(fastest, opts)
    assert moved.reference_on_host and moved.history[-1] == "reference_on_host()"
    assert reference_to_host(moved, opts) is None  # already there
    after = predict_step(moved, H100)
    ref = [h for m in before.memory for h in m.lines if h.model == "ref"]
    assert [h.bytes for h in ref] == [pytest.approx(2 * llama.params_total(), rel=1e-6)]
    assert not [h for m in after.memory for h in m.lines if h.model == "ref"]
    swap = 3 * 2 * params_per_device(llama, fastest.stage("actor_update").layout) / host_link_bytes_per_s(H100.device)
    assert after.stages["ref_logprobs"].seconds - before.stages["ref_logprobs"].seconds == pytest.approx(swap)
    assert predict_step(fit_together(moved, H100, opts, cache), H100).fits
