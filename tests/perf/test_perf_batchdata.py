"""The RL batch shipped through Ray to every worker of a pass (rpeg/perf/batchdata.py), by hand."""

import pytest

from rpeg.graph import Kind
from rpeg.graph import ParallelLayout as Layout
from rpeg.perf import batchdata
from rpeg.perf.fitted import override
from rpeg.perf.stages import padded_length
from rpeg.perf.step import predict_step
from rpeg.perf.validation import _models, bundled, rl_graph
from rpeg.graph.serde import read_yaml_file

RATE = "rl.batch_transfer_bytes_per_s"


def test_training_call_by_hand():
    """tp 4 x pp 2 x cp 1 = 8 workers per data-parallel shard get their own copy: 8 copies of 2,048
    sequences padded to 4,096 tokens at 32 B (ids and mask int64, four fp32 per-token fields)."""
    lay = Layout(dp=2, tp=4, pp=2)
    assert batchdata.batch_transfer_bytes(lay, 2048, 4096, train=True) == 8 * 2048 * 4096 * 32
    with override({RATE: 1e9}):
        assert batchdata.batch_transfer_s(lay, 2048, 4096, train=True) == pytest.approx(2.147483648, rel=1e-12)


def test_logprob_call_by_hand():
    """A logprob call carries 24 B a padded token (no prev or reference logprobs yet); context
    parallelism replicates the shard like tensor parallelism; data parallelism does not."""
    lay = Layout(dp=8, tp=2, cp=4)
    assert batchdata.batch_transfer_bytes(lay, 1000, 1000, train=False) == 2 * 4 * 1000 * 1000 * 24
    assert batchdata.batch_transfer_bytes(Layout(dp=16, tp=2, cp=4), 1000, 1000, train=False) == \
        batchdata.batch_transfer_bytes(lay, 1000, 1000, train=False)
    with override({RATE: 2e9}):
        assert batchdata.batch_transfer_s(lay, 1000, 1000, train=False) == pytest.approx(0.096, rel=1e-12)  # 1.92e8 B at 2 GB/s


def test_each_pass_of_an_rl_step_carries_its_line():
    """On the 16K NeMo-RL v0.3 row (tp 4, pp 4, cp 4: 64 copies), the two logprob passes and the
    training pass each show the line, at the step's padded length, once per pass (the training
    call carries all four optimizer steps' sequences)."""
    path = bundled()["nemo-rl-v0.3-stages"]
    data = read_yaml_file(str(path))
    entry = next(e for e in data["rl"] if e["id"] == "nrl03-h100-llama70b-16k-128")
    g, cluster = rl_graph(entry, _models(data.get("models"), str(path)), str(path))
    with override({RATE: 1e9}):
        pred = predict_step(g, cluster)
    padded = padded_length(g)
    assert 16000 < padded <= 16384  # the runaways run to the cap
    for s in g.stages:
        if s.kind not in (Kind.TRAIN, Kind.INFER):
            continue
        per_token = 32 if s.kind is Kind.TRAIN else 24
        want = 64 * 2048 * padded * per_token / 1e9
        assert pred.stages[s.name].part(batchdata.LABEL) == pytest.approx(want, rel=1e-12)
