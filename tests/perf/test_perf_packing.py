"""NeMo-RL's packed bins (rpeg/perf/packing.py) and its log-prob path's time (rpeg/perf/logits.py
TRAFFIC, LOSS_HOST), worked by hand."""

from __future__ import annotations

import pytest

from rpeg.errors import RpegError
from rpeg.graph import ParallelLayout as Layout
from rpeg.graph import get_model
from rpeg.graph.job import LengthDistribution
from rpeg.hardware import load_cluster
from rpeg.perf.efficiency import HBM, KERNEL_LAUNCH_S
from rpeg.perf.logits import HEAD_TRAFFIC, LOSS_HOST, TRAFFIC, loss_host_s, traffic_bytes
from rpeg.perf.moe import HOST_OP_S
from rpeg.perf.packing import RankLoad, busiest_rank, deal, ffd
from rpeg.perf.training import PassWorkload, pass_cost


def test_first_fit_decreasing_by_hand():
    # 5 opens bin 0 (room 3), 4 bin 1 (room 4), 3 -> bin 0 (full), 3 -> bin 1 (room 1), 2 opens bin 2, 1 -> bin 1
    assert ffd([3, 1, 5, 2, 4, 3], 8) == [[5, 3], [4, 3, 1], [2]]
    assert ffd([9, 1], 8) == [[9], [1]]  # longer than a bin: a bin of its own


def test_bins_dealt_round_robin_and_padded_to_the_longest():
    bins = [[5, 3], [4, 3, 1], [2]]
    assert deal(bins, 2, pad_to_longest=False) == RankLoad(10.0, 2)  # rank 0: bins 0 and 2, 8 + 2
    assert deal(bins, 2, pad_to_longest=True) == RankLoad(16.0, 2)  # both padded to 8
    assert deal(bins, 4, pad_to_longest=False) == RankLoad(8.0, 1)  # a rank without a bin is skipped


def test_busiest_rank_on_fixed_lengths():
    fixed = LengthDistribution(kind="fixed", mean=900)
    # 8 sequences of 1,000 tokens, bins of 4,096: 4 a bin, one bin per rank of 2
    assert busiest_rank(fixed, 100, 8, 4096, 2, False) == RankLoad(4000.0, 1)
    # padded to multiples of 64: 1,024 each, still 4 a bin
    assert busiest_rank(fixed, 100, 8, 4096, 2, False, 64) == RankLoad(4096.0, 1)
    # 9 sequences: bins of 4, 4, 1; rank 0 holds bins 0 and 2 (5,000), padded to its longest 2 x 4,000
    assert busiest_rank(fixed, 100, 9, 4096, 2, False) == RankLoad(5000.0, 2)
    assert busiest_rank(fixed, 100, 9, 4096, 2, True) == RankLoad(8000.0, 2)


def test_layout_bins_are_checked():
    assert Layout(bins="ffd").describe() == "bins=ffd"
    assert Layout(bins="ffd", packing=False).describe() == "unpacked"
    with pytest.raises(RpegError, match="bins = 'round-robin' must be one of even, ffd"):
        Layout(bins="round-robin")


LLAMA = get_model("llama-3.1-8B")


def test_distributed_logprob_traffic_by_hand():
    t, v = 4096, LLAMA.vocab
    # forward: 48 counted, 8 already in the head's cost; training: 70 + 16 a packed sequence, 24 in the head's
    assert traffic_bytes(LLAMA, tokens=t, tp=2, path="distributed-logprob") == 40 * t * v / 2
    assert traffic_bytes(LLAMA, tokens=t, tp=2, path="distributed-logprob", train=True, sequences=3) == \
        (70 + 3 * 16 - 24) * t * v / 2
    assert traffic_bytes(LLAMA, tokens=t, path="fused-ce", train=True, sequences=3) == 0.0  # not counted
    assert traffic_bytes(LLAMA, tokens=t, path="distributed-logprob", value_head=True) == 0.0
    assert HEAD_TRAFFIC == {"forward": 8.0, "train": 24.0} and all(x.source for x in TRAFFIC.values())


def test_loss_host_by_hand():
    assert loss_host_s(path="distributed-logprob", sequences=4, op_s=1e-5, launch_s=2e-6) == \
        pytest.approx(4 * (95 * 1e-5 + 50 * 2e-6))
    assert loss_host_s(path="bf16-ce", sequences=4, op_s=1e-5, launch_s=2e-6) == 0.0
    assert LOSS_HOST["distributed-logprob"].source


def test_pass_cost_lines_of_the_nemo_rl_path():
    cluster = load_cluster("dgx-h100", 8)
    lay = Layout(dp=8, logits="distributed-logprob")
    work = PassWorkload(sequences=512, seq_len=1024, attention_context=512, micro_batch=4)
    c = dict(pass_cost("actor_update", LLAMA, lay, cluster, work).parts)
    m = 16  # 64 sequences a rank, 4 a micro-batch, of 4,096 tokens
    bw = cluster.device.hbm_bandwidth_bytes_per_s * HBM[cluster.device.kind].value
    bytes_ = (70 + 4 * 16 - 24) * 4096 * LLAMA.vocab
    assert c["log-probs over the vocabulary (distributed-logprob)"] == pytest.approx(m * bytes_ / bw)
    host = 4 * (95 * HOST_OP_S.value + 50 * KERNEL_LAUNCH_S.value)  # x86 host: host_time 1
    assert c["loss per packed sequence, host"] == pytest.approx(m * host)
    plain = dict(pass_cost("actor_update", LLAMA, lay.replace(logits="fused-ce"), cluster, work).parts)
    assert "loss per packed sequence, host" not in plain and "log-probs over the vocabulary (fused-ce)" not in plain


def test_nemo_rl_plans_cost_their_busiest_rank_on_a_line_of_its_own():
    import yaml

    from rpeg.perf import packing
    from rpeg.perf.stages import stage_cost
    from rpeg.perf.validation import bundled, rl_graph

    data = yaml.safe_load(bundled()["nemo-rl-v0.3-stages"].read_text())
    row = next(e for e in data["rl"] if e["id"] == "nrl03-h100-qwen32b-on-64")  # tp 4 pp 2 dp 8
    g, cluster = rl_graph(row, {}, row["id"])
    train = next(s for s in g.stages if s.kind.value == "train")
    assert train.layout.bins == "ffd"
    cost = stage_cost(g, train, cluster)
    parts = dict(cost.parts)
    assert sum(parts.values()) == pytest.approx(cost.seconds)
    even = stage_cost(g, train.replace(layout=train.layout.replace(bins="even")), cluster)
    assert parts[packing.LABEL] == pytest.approx(cost.seconds - even.seconds) and parts[packing.LABEL] > 0
    # 512 sequences an optimizer step, bins of 4,096, sequences padded to multiples of tp = 4, pp > 1: padded bins
    load = packing.busiest_rank(g.job.response, g.job.prompt_len, 512, 4096, 8, True, 4)
    assert cost.microbatches == 4 * load.bins
