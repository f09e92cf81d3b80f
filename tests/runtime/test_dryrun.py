"""`rpeg train JOB --dry-run`: what can fail before the first step is found in seconds, each in one line,
and nothing is trained."""

from __future__ import annotations

import os
import pathlib
import re

import pytest
import yaml

from rpeg.algorithms import Models, build_graph
from rpeg.cli import main
from rpeg.errors import RpegError
from rpeg.graph import get_model
from rpeg.hardware import load_cluster
from rpeg.passes import colocate
from rpeg.runtime.dryrun import TRACKER_PACKAGES, dry_run
from tests.runtime.test_runtime_e2e import job, laid_out, rt

DEMO = pathlib.Path(__file__).resolve().parents[2] / "examples" / "demo-grpo-tiny.yaml"


def _job(tmp_path, **runtime) -> str:
    data = yaml.safe_load(DEMO.read_text())
    data["runtime"] |= {"out": str(tmp_path / "out")} | runtime
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_the_demo_passes_and_trains_nothing(tmp_path, capsys):
    assert main(["train", _job(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    for line in ("plan: the runtime runs it", "model_path: tiny", "task: arithmetic", "memory: fits on cpu-local",
                 "dry run: every check passed"):
        assert line in out
    assert not os.path.exists(tmp_path / "out" / "metrics.jsonl")


@pytest.mark.parametrize("runtime, message", [
    ({"model_path": "/nonexistent/model"}, "runtime.model_path: the model folder '/nonexistent/model' does not exist"),
    ({"device": "cuda"}, r"the plan places 1 device\(s\) on GPUs \(runtime.device: cuda\); this machine has 0"),
    ({"loggers": ["mlflow"]}, "runtime.loggers names mlflow, but the package 'rpeg_absent_mlflow' is not installed"),
])
def test_each_problem_is_one_line(tmp_path, capsys, monkeypatch, runtime, message):
    monkeypatch.setitem(TRACKER_PACKAGES, "mlflow", "rpeg_absent_mlflow")  # as on a machine without it
    if runtime.get("device") == "cuda":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    assert main(["train", _job(tmp_path, **runtime), "--dry-run"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err


def test_a_placed_plan_that_does_not_fit_memory_is_named(tmp_path):
    # an 8B model's full fine-tune, colocated on one H100: its Adam states alone exceed 80 GB
    graph = laid_out(colocate(build_graph("grpo", job(), Models(actor=get_model("qwen3-8B"))), 1))
    with pytest.raises(RpegError, match="the plan does not fit memory on dgx-h100"):
        dry_run(graph, rt(tmp_path), load_cluster("dgx-h100", 1))
