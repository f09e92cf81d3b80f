"""LoRA in the IR and the performance model (rpeg/graph/lora.py): the adapters' parameters, the trainer's
state, a training pass without the frozen weights' gradients, and a weight sync of the adapters alone,
each against a case computed by hand."""

from __future__ import annotations

import pytest

from rpeg.errors import RpegError
from rpeg.graph import ParallelLayout, get_model
from rpeg.graph.lora import LoRA
from rpeg.hardware import load_cluster
from rpeg.perf import memory
from rpeg.perf.training import PassWorkload, pass_cost
from rpeg.perf.weightsync import weight_sync_cost
from rpeg.spec import spec_data, spec_from_data

QWEN3_8B = get_model("qwen3-8B")


def test_adapter_parameters_of_qwen3_8b_by_hand():
    """Rank 16 on every projection of Qwen3-8B (36 layers, hidden 4096, 32 query and 8 KV heads of 128, MLP
    12288): q and o r (4096 + 4096), k and v r (4096 + 1024), gate and up r (4096 + 12288), down
    r (12288 + 4096), per layer; peft prints 43,646,976 trainable parameters for this LoraConfig."""
    r = 16
    per_layer = r * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 12288))
    assert LoRA(rank=r).params(QWEN3_8B) == 36 * per_layer == 43_646_976
    assert LoRA(rank=r, targets=("q", "v")).params(QWEN3_8B) == 36 * r * (8192 + 5120)
    assert LoRA(rank=r).tensors(QWEN3_8B) == 36 * 7 * 2


def test_the_trainer_keeps_gradients_and_optimizer_state_of_the_adapters_alone():
    """dp 8, ZeRO-1: the bf16 weights whole on every device, beside the adapters; fp32 gradients of the
    adapters; 12 bytes of optimizer state per adapter parameter, over the 8 ranks."""
    lora = LoRA(rank=32)
    layout = ParallelLayout(dp=8, zero=1)
    a = lora.params(QWEN3_8B)
    full = memory.trainer_state_bytes(QWEN3_8B, layout)
    got = memory.trainer_state_bytes(QWEN3_8B, layout, lora=lora)
    assert got["weights"] == pytest.approx(full["weights"] + 2 * a)
    assert got["gradients"] == pytest.approx(4 * a)
    assert got["optimizer"] == pytest.approx(12 * a / 8)
    assert full["optimizer"] == pytest.approx(12 * QWEN3_8B.params_total() / 8)


def test_a_lora_update_skips_the_frozen_gradients_and_steps_the_adapters_alone():
    cluster = load_cluster("dgx-h100", 8)
    layout = ParallelLayout(dp=8, zero=1, micro_batch=4)
    work = PassWorkload(sequences=512, seq_len=2500, attention_context=1250, micro_batch=4)
    lora = LoRA(rank=32)
    full = pass_cost("actor_update", QWEN3_8B, layout, cluster, work)
    low = pass_cost("actor_update", QWEN3_8B, layout, cluster, PassWorkload(**{**_fields(work), "lora": lora}))
    f, lo = dict(full.parts), dict(low.parts)
    # the backward's weight-gradient GEMMs (as long as the forward's) are gone: compute falls by about a third
    assert 0.6 < lo["compute"] / f["compute"] < 0.75
    assert 0 < lo["LoRA adapters' GEMMs"] < 0.02 * lo["compute"]
    # the optimizer walks the adapters' state: its time falls with the parameters it owns
    assert lo["optimizer"] == pytest.approx(f["optimizer"] * lora.params(QWEN3_8B) / QWEN3_8B.params_total(),
                                            rel=0.05)
    assert lo["gradient sync"] < 0.05 * f["gradient sync"]
    assert low.flops < full.flops and low.peak_memory_bytes < full.peak_memory_bytes


def _fields(work: PassWorkload) -> dict:
    return {k: getattr(work, k) for k in work.__slots__}


def test_a_sync_of_the_adapters_moves_megabytes_and_a_merged_one_the_model():
    cluster = load_cluster("dgx-h100", 16)
    train, gen = ParallelLayout(dp=8, zero=3), ParallelLayout(dp=8)
    kw = dict(colocated=False, separation=8, gather="full")
    full = weight_sync_cost("sync", QWEN3_8B, train, gen, cluster, **kw)
    adapters = weight_sync_cost("sync", QWEN3_8B, train, gen, cluster, lora=LoRA(rank=32), **kw)
    merged = weight_sync_cost("sync", QWEN3_8B, train, gen, cluster, lora=LoRA(rank=32, sync="merged"), **kw)
    assert adapters.bytes == 2 * LoRA(rank=32).params(QWEN3_8B) * gen.dp  # bf16 adapters to every engine
    assert full.bytes == 2 * QWEN3_8B.params_total() * gen.dp
    assert adapters.seconds < 0.3 * full.seconds
    assert merged.seconds > full.seconds and merged.parts[0][0] == "merge adapters into the weights"


def test_a_job_file_says_lora_and_a_bad_one_is_one_line():
    data = {"algorithm": "grpo", "model": "qwen3-8B", "lora": {"rank": 16, "targets": ["q", "v"]}}
    spec = spec_from_data(data)
    g = spec.graph()
    assert g.model("actor").lora == LoRA(rank=16, targets=("q", "v"))
    assert spec_from_data(spec_data(spec)).models.lora == spec.models.lora
    assert spec_from_data({"algorithm": "grpo", "model": "qwen3-8B"}).graph().model("actor").lora is None
    for bad, said in (({"rank": 0}, "rank = 0"), ({"targets": ["lm_head"]}, "target 'lm_head'"),
                      ({"sync": "tensors"}, "lora.sync")):
        with pytest.raises(RpegError, match=said):
            spec_from_data(data | {"lora": bad})
    with pytest.raises(RpegError, match="multi-head latent attention"):
        spec_from_data({"algorithm": "grpo", "model": "deepseek-v3", "lora": {"rank": 8}}).graph()


def test_the_planner_picks_another_plan_for_a_lora_job():
    """GRPO on Qwen3-8B over 16 H100s: in full, the update needs tensor parallelism to fit its optimizer state
    beside the activations; with LoRA's adapters alone it fits as plain data parallelism, which is faster."""
    from rpeg.search.search import search

    job = {"prompts": 64, "samples_per_prompt": 8, "prompt_len": 512,
           "response": {"kind": "lognormal", "mean": 2000, "max": 8192}}
    base = {"algorithm": "grpo", "model": "qwen3-8B", "job": job, "config": {"kl_coef": 0.0}}
    cluster = load_cluster("dgx-h100", 16)
    full = search(spec_from_data(base).graph(), cluster, 16).best
    low = search(spec_from_data(base | {"lora": {"rank": 32}}).graph(), cluster, 16).best
    f, lo = full.graph.stage("actor_update").layout, low.graph.stage("actor_update").layout
    assert f.tp > 1 and lo.tp == 1 and lo.dp == 16, (f.describe(), lo.describe())
    assert low.step_s < full.step_s


def test_rpeg_train_takes_a_lora_job_and_refuses_the_layouts_it_does_not_run_with_adapters():
    from rpeg.passes import colocate, parallelize, place
    from rpeg.runtime.plan_check import check_plan

    def laid(g, **layouts):
        for st in g.stages:
            if st.model and st.kind.value != "sync":
                g = parallelize(g, st.name, **layouts.get(st.name, {"dp": 1}))
        return g

    def split(gen: int, train: int, **layouts):
        g = spec_from_data({"algorithm": "grpo", "model": "tiny-qwen2", "lora": {"rank": 8},
                            "config": {"kl_coef": 0.0}}).graph()
        return laid(place(g, {"gen": gen, "train": train}, {"generate": "gen"}, default="train"), **layouts)

    check_plan(laid(colocate(spec_from_data({"algorithm": "grpo", "model": "tiny-qwen2", "lora": {"rank": 8}}).graph(),
                             1)))
    check_plan(split(1, 1))
    with pytest.raises(RpegError, match="trains LoRA adapters with data .FSDP2. and tensor parallelism, not through "
                                        "a pipeline"):
        check_plan(split(1, 2, actor_update={"dp": 1, "pp": 2}, actor_logprobs={"dp": 1, "pp": 2}))
    with pytest.raises(RpegError, match="tensor-parallel engine holding LoRA adapters is not run; lora.sync: merged"):
        check_plan(split(2, 1, generate={"dp": 1, "tp": 2}))


def test_a_lora_reference_is_the_base_with_adapters_off_and_holds_no_weights_of_its_own():
    """GRPO with a KL to the reference, colocated on 8 H100s: in full the reference keeps its own bf16 copy on
    every device; with LoRA it runs the actor's frozen base, so nothing of its own is held."""
    from rpeg.perf.step import predict_step
    from rpeg.search.default import default_plan

    cluster = load_cluster("dgx-h100", 8)
    data = {"algorithm": "grpo", "model": "qwen3-8B", "config": {"kl_coef": 0.04},
            "job": {"prompts": 64, "samples_per_prompt": 8, "prompt_len": 512,
                    "response": {"kind": "lognormal", "mean": 2000, "max": 8192}}}

    def ref_weights(spec) -> float:
        g = spec.graph()
        pred = predict_step(default_plan(g, cluster, 8), cluster)
        return max(sum(h.bytes for h in d.lines if h.model == "ref" and h.what == "weights") for d in pred.memory)

    full, low = spec_from_data(data), spec_from_data(data | {"lora": {"rank": 32}})
    assert low.graph().model("ref").base_of == "actor" and full.graph().model("ref").base_of == ""
    assert ref_weights(full) == pytest.approx(2 * QWEN3_8B.params_total(), rel=0.01)
    assert ref_weights(low) == 0.0
