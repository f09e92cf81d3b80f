"""`refit` entries of a validation file (rpeg/perf/validation_refit.py): each transport predicts with
weight_sync_cost the way a plan's SYNC stage does, a colocated refit timer adds the optimizer offload
and the engine's wake, and every bad key or value is one line naming the entry and the way out."""

import math

import pytest

from rpeg.errors import RpegError
from rpeg.graph import ParallelLayout, get_model
from rpeg.hardware import load_cluster
from rpeg.perf.validation import bundled, summary, validate_file
from rpeg.perf.weightsync import weight_sync_cost

REFIT = """
refit:
  - {id: bcast, system: dgx-h100, model: qwen2.5-7B, train_gpus: 8, gen_gpus: 8, training: {zero: 3},
     generation: {tp: 4}, transport: nccl-broadcast, bucket_mb: 2048, measured_s: 5.0, source: test}
  - {id: reshard, system: gb200-nvl72, model: qwen3-30B-A3B, train_gpus: 16, gen_gpus: 16, gpus_per_node: 4,
     training: {tp: 1, pp: 2, cp: 1, ep: 8}, generation: {tp: 8, pp: 1, ep: 1}, transport: nccl-reshard,
     measured_s: 0.9, notes: test}
  - {id: ipc, system: dgx-h100, model: llama-3.1-8B, gpus: 8, training: {tp: 2, zero: 1}, generation: {tp: 1},
     transport: cuda-ipc, measured_s: 5}
  - {id: ipc-timer, system: dgx-h100, model: llama-3.1-8B, gpus: 8, training: {tp: 2, zero: 1},
     generation: {tp: 1}, transport: cuda-ipc, covers: prepare-for-generation, measured_s: 5}
"""


def _write(tmp_path, text):
    f = tmp_path / "refit.yaml"
    f.write_text(text)
    return str(f)


def test_each_transport_predicts_as_the_sync_stage_does(tmp_path):
    results = {r.id: r for r in validate_file(_write(tmp_path, REFIT))}
    assert list(results) == ["bcast", "reshard", "ipc", "ipc-timer"]
    assert all(r.kind == "refit" and math.isfinite(r.predicted) and r.predicted > 0 for r in results.values())
    # the disaggregated broadcast: trainer on devices 0-7, the engines on 8-15 (one node further)
    spec = get_model("qwen2.5-7B")
    cost = weight_sync_cost("x", spec, ParallelLayout(dp=8, zero=3), ParallelLayout(dp=2, tp=4),
                            load_cluster("dgx-h100", 16), colocated=False, separation=8, gather="full",
                            bucket_bytes=2048 * 2**20)
    assert results["bcast"].predicted == pytest.approx(cost.seconds)
    assert dict(results["bcast"].parts) == dict(cost.parts)
    assert "gather over data parallelism" in dict(results["bcast"].parts)  # zero 3: FSDP's full_tensor()
    assert "send to generation" in dict(results["reshard"].parts)  # shard to shard, not one sender
    # NeMo-RL's refit timer: the transfer plus the optimizer's offload and the engine's wake
    timer, ipc = dict(results["ipc-timer"].parts), dict(results["ipc"].parts)
    assert {"offload trainer state", "engine wake"} <= set(timer) and "offload trainer state" not in ipc
    assert results["ipc-timer"].predicted > results["ipc"].predicted
    assert set(summary(list(results.values()))) == {"all", "refit"}


def test_the_shipped_v06_file_predicts_every_row():
    results = validate_file(str(bundled()["nemo-rl-v0.6"]))
    kinds = [r.kind for r in results]
    assert kinds.count("rl") == 17 and kinds.count("refit") == 12
    assert all(r.fits and math.isfinite(r.predicted) and r.predicted > 0 for r in results)
    assert len({r.id for r in results}) == len(results)


@pytest.mark.parametrize("edit, needle", [
    (("transport: nccl-broadcast, bucket", "transport: rdma, bucket"),
     "refit[0] (bcast).transport: expected one of nccl-broadcast, nccl-reshard, cuda-ipc, got 'rdma'"),
    (("generation: {tp: 4}, transport: nccl-broadcast", "generation: {tp: 4}"), "refit[0] (bcast).transport"),
    (("training: {zero: 3}", "training: {zero: 4}"), "refit[0] (bcast).training.zero: expected 0, 1, 2 or 3"),
    (("training: {zero: 3}", "training: {zero: true}"), "training.zero: expected 0, 1, 2 or 3"),
    (("training: {zero: 3}", "training: {dp: 8}"), "refit[0] (bcast).training: unknown key 'dp'"),
    (("generation: {tp: 4}, transport: nccl-broadcast", "generation: {tp: 3}, transport: nccl-broadcast"),
     "generation tp*pp = 3*1 = 3 does not divide its 8 devices"),
    (("training: {tp: 1, pp: 2, cp: 1, ep: 8}", "training: {tp: 1, pp: 2, cp: 1, ep: 16}"),
     "training ep = 16 exceeds the dp*cp*tp = 8 devices"),
    (("training: {tp: 1, pp: 2, cp: 1, ep: 8}", "training: {tp: 3, pp: 2, cp: 1, ep: 8}"),
     "training tp*pp*cp = 3*2*1 = 6 does not divide its 16 devices"),
    (("measured_s: 5.0", "measured_s: -1"), "refit[0] (bcast).measured_s"),
    (("measured_s: 5.0", "measured_s: fast"), "measured_s: expected a number, got 'fast'"),
    (("bucket_mb: 2048", "bucket_mb: 0"), "refit[0] (bcast).bucket_mb"),
    (("train_gpus: 8, gen_gpus: 8, training: {zero: 3}", "gpus: 16, training: {zero: 3}"),
     "a disaggregated (nccl-broadcast) entry gives train_gpus and gen_gpus, not gpus"),
    (("gpus: 8, training: {tp: 2, zero: 1}, generation: {tp: 1},\n     transport: cuda-ipc, measured_s: 5}",
      "gpus: 8, gen_gpus: 8, training: {tp: 2, zero: 1}, generation: {tp: 1},\n     transport: cuda-ipc, "
      "measured_s: 5}"), "refit[2] (ipc).gen_gpus: a colocated (cuda-ipc) entry gives `gpus`"),
    (("transport: nccl-broadcast, bucket_mb", "transport: nccl-broadcast, covers: prepare-for-generation, bucket_mb"),
     "covers: prepare-for-generation (the optimizer offload and the engine's wake around a colocated refit) "
     "needs transport cuda-ipc"),
    (("covers: prepare-for-generation", "covers: all"), "refit[3] (ipc-timer).covers: expected one of transfer"),
    (("model: qwen2.5-7B", "model: qwen9-1T"), "unknown model 'qwen9-1T'"),
    (("source: test}", "source: test, wire: ib}"), "refit[0] (bcast): unknown key 'wire'"),
    (("train_gpus: 8, gen_gpus: 8, training: {zero: 3}", "train_gpus: 8, training: {zero: 3}"),
     "refit[0] (bcast): missing 'gen_gpus'"),
])
def test_bad_refit_entries_are_one_line_errors(tmp_path, edit, needle):
    assert edit[0] in REFIT
    with pytest.raises(RpegError) as info:
        validate_file(_write(tmp_path, REFIT.replace(*edit)))
    msg = str(info.value)
    assert needle in msg and "\n" not in msg


def test_refit_must_be_a_list(tmp_path):
    with pytest.raises(RpegError, match="refit: expected a list of entries"):
        validate_file(_write(tmp_path, "refit: {id: x}\n"))


def test_offload_stages_the_trainer_weights_through_the_host(tmp_path):
    """verl with parameter offload brings its shards from the host for the export and back: FSDP2's
    fp32 shards through pageable memory both ways (verl issue #7060: 2.4-2.7 s of the 7B sync)."""
    text = REFIT.replace("transport: nccl-broadcast", "offload: true, transport: nccl-broadcast", 1)
    on = {r.id: r for r in validate_file(_write(tmp_path, text))}["bcast"]
    parts = dict(on.parts)
    assert {"load trainer weights from host (pageable)", "offload trainer weights to host (pageable)"} <= set(parts)
    assert 1.5 < parts["load trainer weights from host (pageable)"] + parts[
        "offload trainer weights to host (pageable)"] < 4.0  # 7B, fp32 over 8 devices at 5 and 2.5 GB/s
    bad = REFIT.replace("transport: nccl-broadcast", "offload: yes please, transport: nccl-broadcast", 1)
    with pytest.raises(RpegError, match="offload: expected true or false"):
        validate_file(_write(tmp_path, bad))
