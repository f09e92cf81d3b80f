"""Where the colocated step's moves land among NeMo-RL's step timers (rpeg/perf/validation.py,
`stage_split`), pinned on the v0.3 Llama-3.1-8B row by hand.

NeMo-RL's Megatron worker (nemo_rl/models/policy/megatron_policy_worker.py at v0.3.0 and v0.6.0):
the refit timer ("prepare_for_generation") holds offload_before_refit (the Adam state to the host
with blocking `.to("cpu")`, the gradient buffer freed) and offload_after_refit (the parameter buffer
to Megatron's pinned host copy) and the engine's wake; "generation" holds finish_generation (the
engine's sleep); the remainder ("other") holds logprob_inference_prep (the parameter buffer back)
and training_prep (the Adam state back with blocking `.to("cuda")`, the gradient buffer
reallocated and zeroed: no copy); the reference's weights swap in and out inside
"policy_and_reference_logprobs". Host-side stages (rewards, advantages) cost nothing."""

import pytest

from rpeg.graph.serde import read_yaml_file
from rpeg.perf.step import SWITCH, predict_step
from rpeg.perf.validation import _models, bundled, rl_graph, stage_split


@pytest.fixture(scope="module")
def llama8b():
    data = read_yaml_file(str(bundled()["nemo-rl-v0.3-stages"]))
    entry = next(e for e in data["rl"] if e["id"] == "nrl03-h100-llama8b-on-8")
    graph, cluster = rl_graph(entry, _models(data.get("models"), "test"), "test")
    return graph, cluster, predict_step(graph, cluster)


def test_the_trainer_state_comes_back_in_the_remainder_at_its_copies_rates(llama8b):
    """8 H100s, dp 8, ZeRO-1: each holds all 8.03 B parameters in bf16 (16.1 GB, back from Megatron's
    pinned copy at 25 GB/s) and an eighth of the 12-byte Adam state (12.0 GB, back through pageable
    memory at 5 GB/s): 0.64 + 2.41 = 3.05 s of the remainder; the step's other parts none of it."""
    graph, cluster, pred = llama8b
    assert cluster.device.host == "x86"
    p = graph.model("actor").spec.params_total()
    assert p == pytest.approx(8.03e9, rel=0.01)
    weights_back, adam_back = p * 2 / 25e9, p * 12 / 8 / 5e9
    assert stage_split(graph, pred)["other"] == pytest.approx(weights_back + adam_back, rel=1e-9)
    assert stage_split(graph, pred)["other"] == pytest.approx(3.05, abs=0.01)


def test_the_offload_and_the_wake_are_the_refit_timers_and_the_sleep_generations(llama8b):
    """The Adam state goes out through pageable memory at 2.5 GB/s, the weights to pinned memory at
    25 GB/s; the engine's bf16 weights (tp 1: all of them) go out at its sleep and back at its wake,
    pinned (vLLM's sleep level 1)."""
    graph, _, pred = llama8b
    p = graph.model("actor").spec.params_total()
    split = stage_split(graph, pred)
    engine = p * 2 / 25e9
    offload = p * 2 / 25e9 + p * 12 / 8 / 2.5e9
    assert split["refit"] == pytest.approx(pred.stages["actor_sync"].seconds + offload + engine, rel=1e-9)
    assert split["generation"] == pytest.approx(pred.stages["generate"].seconds + engine, rel=1e-9)
    assert sum(split.values()) == pytest.approx(sum(c.seconds for c in pred.stages.values()), rel=1e-12)
    assert pred.stages[SWITCH].seconds == pytest.approx(offload + 2 * engine + p * 2 / 25e9 + p * 12 / 8 / 5e9,
                                                        rel=1e-9)


def test_the_reference_swap_is_in_the_logprob_timer(llama8b):
    """use_reference_model: the actor's per-device weights out, the reference's in, the actor's back:
    three copies of 16.1 GB at 25 GB/s, in the reference stage, so in `logprobs`."""
    graph, _, pred = llama8b
    p = graph.model("actor").spec.params_total()
    ref = pred.stages["ref_logprobs"]
    assert ref.part("reference weights swapped through the host") == pytest.approx(3 * p * 2 / 25e9, rel=1e-9)
    assert stage_split(graph, pred)["logprobs"] == pytest.approx(
        ref.seconds + pred.stages["actor_logprobs"].seconds, rel=1e-12)
