"""Experiment trackers: a short run logs each step's metrics and the held-out accuracy to
TensorBoard, MLflow and W&B (offline), read back with each tracker's own reader."""

from __future__ import annotations

import glob
import json
import os

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph import Job, LengthDistribution, get_model
from rpeg.passes import colocate, parallelize
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.run import run

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")


def plan():
    g = colocate(build_graph("grpo", Job(prompts=4, samples_per_prompt=4, prompt_len=6,
                                         response=LengthDistribution.fixed(3), mini_batches=1),
                             Models(actor=get_model("tiny-qwen2")), kl_coef=0.0), 1)
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            g = parallelize(g, s.name, dp=1, micro_batch=64, packing=False)
    return g


def rt(tmp_path, **kw):
    return RuntimeConfig(**{**dict(model_path="tiny", task={"name": "arithmetic", "ops": ["add"], "level": 1},
                                   steps=3, lr=1e-3, max_new_tokens=3, eval_every=2, eval_size=10,
                                   checkpoint_every=2, out=str(tmp_path / "run"), threads=1), **kw})


def test_every_tracker_holds_the_run(tmp_path, monkeypatch):
    from rpeg.hardware import load_cluster

    for var in ("WANDB_API_KEY", "WANDB_MODE", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    loggers = ("tensorboard", "wandb", "mlflow")
    first = run(plan(), rt(tmp_path, steps=2, loggers=loggers), progress=False, cluster=load_cluster("dgx-h100", 1))
    ids_first = json.load(open(os.path.join(first.out, "trackers.json")))
    # a resumed run logs on into the same runs (its checkpoint is at step 2)
    result = run(plan(), rt(tmp_path, loggers=loggers), resume=True, progress=False,
                 cluster=load_cluster("dgx-h100", 1))
    rows = [json.loads(line) for line in open(os.path.join(result.out, "metrics.jsonl"))]
    rewards = [r["reward"] for r in rows]

    # TensorBoard: its own event reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(result.out, "tensorboard"))
    acc.Reload()
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("train/reward")] == \
        [(r["step"], round(r["reward"], 6)) for r in rows]
    evals = [(e.step, round(e.value, 6)) for e in acc.Scalars("eval/accuracy_sampled")]
    assert evals[0] == (0, round(result.accuracy_before["sampled"], 6))
    assert (2, round(rows[1]["test_accuracy"], 6)) in evals
    assert evals[-1] == (3, round(result.accuracy_after["sampled"], 6))
    assert "config/text_summary" in acc.Tags()["tensors"]  # the plan and prediction, as text
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"algorithm": "grpo"' in text and '"prediction"' in text and '"parallelize"' in text

    # MLflow: a query of its file store
    import mlflow

    ids = json.load(open(os.path.join(result.out, "trackers.json")))
    assert ids == ids_first
    client = mlflow.tracking.MlflowClient(ids["mlflow_uri"])
    hist = client.get_metric_history(ids["mlflow"], "train/reward")
    assert [round(m.value, 6) for m in sorted(hist, key=lambda m: m.step)] == [round(r, 6) for r in rewards]
    run_info = client.get_run(ids["mlflow"])
    assert run_info.info.status == "FINISHED"
    assert run_info.data.params["algorithm"] == "grpo" and float(run_info.data.params["prediction.step_s"]) > 0
    assert "plan.json" in [a.path for a in client.list_artifacts(ids["mlflow"])]

    # W&B: offline (no key), its run file holds the metric names and the run's config
    files = glob.glob(os.path.join(result.out, "wandb", "offline-run-*", "run-*.wandb"))
    # offline, the resumed part is a second run file of the same run id (`wandb sync` joins them)
    assert len(files) == 2 and len({os.path.basename(f) for f in files}) == 1
    assert os.path.basename(files[0]) == f"run-{ids['wandb']}.wandb"
    data = b"".join(open(f, "rb").read() for f in files)
    assert b"train/reward" in data and b"eval/accuracy_greedy" in data and b"parallelize" in data


def test_a_missing_tracker_or_a_bad_name_is_one_line(tmp_path):
    with pytest.raises(RpegError, match="loggers = \\['neptune'\\]: expected distinct names"):
        rt(tmp_path, loggers=("neptune",))
