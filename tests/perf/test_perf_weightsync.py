"""Weight sync from the trainer to the engine, and the context switch of a colocated plan."""

import pytest

from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import get_model
from rpeg.hardware import load_cluster
from rpeg.perf.efficiency import HBM, HOST_LINK_BYTES_PER_S, LINK
from rpeg.perf.weightsync import context_switch_cost, weight_sync_cost

MODELS = [get_model(n) for n in ("qwen3-0.6B", "llama-3.1-8B", "llama-3.1-70B")]  # growing
TRAIN = Layout(dp=2, tp=4)
GEN = Layout(dp=2, tp=4)


@pytest.fixture(scope="module")
def dgx():
    return load_cluster("dgx-h100", 16)


def sync(cluster, spec, colocated, train=TRAIN, gen=GEN):
    return weight_sync_cost("sync", spec, train, gen, cluster, colocated=colocated, separation=0 if colocated else 8)


@pytest.mark.parametrize("spec", MODELS, ids=lambda m: m.name)
def test_colocated_sync_is_cheaper_than_sending_across_nodes(dgx, spec):
    colocated, disaggregated = sync(dgx, spec, True), sync(dgx, spec, False)
    assert colocated.seconds < disaggregated.seconds
    assert colocated.part("copy into engine") == disaggregated.part("copy into engine")
    assert disaggregated.part("send to generation") > colocated.part("gather shards")


def test_disaggregated_send_by_hand(dgx):
    """4 training shard holders send 2 bytes per parameter over their own 400 Gb/s NICs."""
    spec = MODELS[1]
    nic = 50e9 * LINK["infiniband"].value
    c = sync(dgx, spec, False)
    assert c.part("send to generation") == pytest.approx(spec.params_total() * 2 / (4 * nic) + 5e-6, rel=1e-12)
    shard = spec.params_total() * 2 / 4  # one tp=4 engine shard
    assert c.part("copy into engine") == pytest.approx(shard / (3.35e12 * HBM["gpu"].value), rel=1e-12)
    assert sum(v for _, v in c.parts) == pytest.approx(c.seconds, rel=1e-12)


@pytest.mark.parametrize("colocated", [True, False])
def test_bigger_models_take_longer_to_sync(dgx, colocated):
    times = [sync(dgx, spec, colocated).seconds for spec in MODELS]
    assert times[0] < times[1] < times[2]


def test_context_switch_grows_with_the_model():
    times = [context_switch_cost("switch", spec, TRAIN, GEN).seconds for spec in MODELS]
    assert times[0] < times[1] < times[2]


def test_context_switch_by_hand():
    """Trainer state (bf16 weights, fp32 gradients, 12 B of Adam state) and the engine's bf16
    weights go to host and come back over a 25 GB/s host link."""
    spec = MODELS[1]
    c = context_switch_cost("switch", spec, Layout(dp=8), Layout(dp=8))
    p = spec.params_total()
    host = HOST_LINK_BYTES_PER_S.value
    for move in ("offload trainer state", "reload trainer state"):  # each its own line: they land in different
        assert c.part(move) == pytest.approx(p * (2 + 4 + 12) / host, rel=1e-12)  # timers of the systems
    for move in ("engine sleep", "engine wake"):
        assert c.part(move) == pytest.approx(p * 2 / host, rel=1e-12)
    assert c.seconds == pytest.approx(2 * p * 20 / host, rel=1e-12)
    # ZeRO-1 leaves 1/dp of the optimizer state to move
    z1 = context_switch_cost("switch", spec, Layout(dp=8, zero=1), Layout(dp=8))
    assert z1.part("offload trainer state") == pytest.approx(p * (6 + 12 / 8) / host, rel=1e-12)
