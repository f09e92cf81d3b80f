"""Experiment trackers: each step's metrics and the held-out accuracy in TensorBoard, W&B and MLflow.

`runtime.loggers: [tensorboard, wandb, mlflow]` (any subset; metrics.jsonl is always written).
Names are stable across runs and trackers:

- `train/<metric>` for every number of a step's metrics line (reward, accuracy, kl, clipfrac,
  step_s, staleness_max, ...), at the step's number as metrics.jsonl counts it (1 for the first);
- `eval/accuracy_sampled` and `eval/accuracy_greedy` at each held-out evaluation, at the number of
  steps trained when it was measured: 0 before training, N after the run's N steps.

The run's config: the job file (its plan as passes), the plan's description and the prediction
(step time on the job's cluster), logged once at the start: TensorBoard as text (`config`), W&B
as the run's config, MLflow as flattened params plus `plan.json` as an artifact.

Where each writes, under the run's folder unless the tracker's own settings say otherwise:
- tensorboard: `tensorboard/` (event files; `tensorboard --logdir out/tensorboard`);
- wandb: `wandb/`, online when WANDB_API_KEY is set (or WANDB_MODE says so), else offline
  (`wandb sync out/wandb/offline-run-*` uploads it later); project WANDB_PROJECT, else `rpeg`;
- mlflow: MLFLOW_TRACKING_URI when set, else a file store `mlruns/` (MLflow 3 keeps file stores in
  maintenance mode and asks for MLFLOW_ALLOW_FILE_STORE; set for that store only); experiment
  MLFLOW_EXPERIMENT_NAME, else `rpeg`.

A resumed run (--resume) logs from the checkpoint's step on into the same run where the tracker
can resume one (W&B: the id saved in the run folder; MLflow: the run id saved there; TensorBoard:
the same folder); steps after the last checkpoint that were logged before the crash appear twice
in TensorBoard, as in any resumed TensorBoard run.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from rpeg.errors import RpegError

TRACKERS = ("tensorboard", "wandb", "mlflow")
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}
_IDS = "trackers.json"  # the run folder's record of the trackers' run ids, for --resume


def numbers(metrics: dict) -> dict[str, float]:
    """The finite numbers of a metrics line, as trackers take them (bools and text left out)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            continue
        out[k] = float(v)
    return out


def _flat(data: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(data, list):
        out[prefix[:-1]] = json.dumps(data)[:500]
    else:
        out[prefix[:-1]] = str(data)[:500]
    return out


class Trackers:
    """The chosen trackers of one run; `log` and `close` call each in turn."""

    def __init__(self, names: tuple[str, ...], out: str, run_name: str, config: dict, resume: bool):
        self.names, self.out = names, out
        self._tb = self._wandb = self._mlflow = None
        ids_path = os.path.join(out, _IDS)
        ids = {}
        if resume and os.path.exists(ids_path):
            with open(ids_path, encoding="utf-8") as f:
                ids = json.load(f)
        for name in names:
            try:
                getattr(self, f"_start_{name}")(run_name, config, ids)
            except ImportError:
                self.close()
                raise RpegError(f"runtime: loggers: {name} is not installed (pip install {PACKAGES[name]})") from None
        if names:
            tmp = ids_path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(ids, f)
            os.replace(tmp, ids_path)

    # ---- starting ----------------------------------------------------------------------------------
    def _start_tensorboard(self, run_name: str, config: dict, ids: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(log_dir=os.path.join(self.out, "tensorboard"))
        self._tb.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```", 0)

    def _start_wandb(self, run_name: str, config: dict, ids: dict) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        kwargs = {"id": ids["wandb"], "resume": "allow"} if ids.get("wandb") else {}
        self._wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "rpeg"), name=run_name, dir=self.out,
                                 mode=mode, config=config, reinit="create_new", **kwargs)
        ids["wandb"] = self._wandb.id

    def _start_mlflow(self, run_name: str, config: dict, ids: dict) -> None:
        import mlflow

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = "file:" + os.path.abspath(os.path.join(self.out, "mlruns"))
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # the run folder's own store (see the docstring)
        self._mlflow = mlflow.tracking.MlflowClient(uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "rpeg")
        exp = self._mlflow.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp else self._mlflow.create_experiment(name)
        if ids.get("mlflow"):
            self._run_id = ids["mlflow"]
        else:
            run = self._mlflow.create_run(exp_id, run_name=run_name)
            self._run_id = run.info.run_id
            for k, v in sorted(_flat(config).items()):
                self._mlflow.log_param(self._run_id, k[:250], v)
            self._mlflow.log_dict(self._run_id, config, "plan.json")
        ids["mlflow"] = self._run_id
        ids["mlflow_uri"] = uri

    # ---- logging ---------------------------------------------------------------------------------------
    def log(self, metrics: dict) -> None:
        """A step's metrics line: train/<key>, and eval/<...> when the step ended with an evaluation."""
        step = int(metrics["step"])
        self._write(step, {f"train/{k}": v for k, v in numbers(metrics).items()
                           if k not in ("step", "test_accuracy", "test_accuracy_greedy")})
        if "test_accuracy" in metrics:
            self.accuracy(step, {"sampled": metrics["test_accuracy"], "greedy": metrics["test_accuracy_greedy"]})

    def accuracy(self, step: int, acc: dict) -> None:
        """A held-out evaluation after `step` steps of training."""
        self._write(step, {"eval/accuracy_sampled": float(acc["sampled"]),
                           "eval/accuracy_greedy": float(acc["greedy"])})

    def _write(self, step: int, values: dict[str, float]) -> None:
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(values, step=step)
        if self._mlflow is not None:
            import time

            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self._mlflow.log_batch(self._run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def close(self, status: str = "FINISHED") -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish(exit_code=0 if status == "FINISHED" else 1)
            self._wandb = None
        if self._mlflow is not None:
            self._mlflow.set_terminated(self._run_id, status=status)
            self._mlflow = None
