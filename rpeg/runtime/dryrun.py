"""`rpeg train JOB --dry-run`: everything that can fail before the first step, checked in seconds.

Each check either passes, adding a line to what is printed, or raises an RpegError of one line naming
what is wrong and what to change. Nothing is trained and no Ray worker starts (a job that names a Ray
cluster is asked, not placed on); the checks, in order:

- the plan against the runtime (`plan_check.check_plan`, the combinations it does not run) and the
  job's multi-turn environment against the plan and task;
- the devices: `runtime.device: cuda` needs as many GPUs as the plan places (this machine's, or the
  named Ray cluster's), and a Ray cluster needs one CPU per device of the plan;
- the model folder and its tokenizer (`model_path`; the configuration and tokenizer are read, the
  weights are not), and a reward model's folder where the plan scores with one;
- the task and its reward: problems drawn, one scored;
- memory per device against the prediction (the plan's cluster: GPUs, or cpu-local's measured RAM);
- the experiment trackers' packages (`runtime.loggers`);
and the plan, its predicted step time and the most memory a device holds are printed.
"""

from __future__ import annotations

import importlib.util
import os

from rpeg.errors import RpegError
from rpeg.graph import Graph
from rpeg.runtime.config import RuntimeConfig

TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
GB = 1e9


def dry_run(graph: Graph, rt: RuntimeConfig, cluster=None) -> list[str]:
    """The checks above, in order: the lines that report each one passed (the first failure raises)."""
    from rpeg.runtime.plan_check import check_plan
    from rpeg.runtime.roles import step_stages
    from rpeg.runtime.run import check_episodes, check_reward_path, task_of

    check_plan(graph)
    lines = []
    names = step_stages(graph)
    task = task_of(rt)
    if rt.environment is not None:
        check_episodes(graph, rt, task, names)
    lines.append("plan: the runtime runs it" + (" (with the job's environment)" if rt.environment else ""))
    lines.append(_devices(graph, rt))
    lines.append(_model(rt.model_path, "model_path"))
    if graph.stage(names.reward).model is not None:
        check_reward_path(rt)
        lines.append(_model(rt.reward_model_path, "reward_model_path"))
    problems = task.problems("train", 2, seed=rt.seed)
    task.reward(problems[0], "")
    lines.append(f"task: {task.name}, problems drawn and one scored")
    lines.append(_memory(graph, cluster))
    for logger in rt.loggers:
        package = TRACKER_PACKAGES.get(logger, logger)
        if importlib.util.find_spec(package) is None:
            raise RpegError(f"runtime.loggers names {logger}, but the package {package!r} is not installed here "
                            f"(pip install {package}, or leave it out of runtime.loggers)")
    if rt.loggers:
        lines.append(f"trackers: {', '.join(rt.loggers)} installed")
    return lines


def _devices(graph: Graph, rt: RuntimeConfig) -> str:
    need = max((g.first + g.count for g in graph.groups), default=1)
    address = rt.address or os.environ.get("RAY_ADDRESS", "")
    if address:
        import ray

        try:
            ray.init(address=address, log_to_driver=False)
        except Exception as e:  # noqa: BLE001 - any failure to connect is the one line
            raise RpegError(f"runtime.address {address!r}: no Ray cluster answers there ({type(e).__name__})") from None
        try:
            have = ray.cluster_resources()
        finally:
            ray.shutdown()
        kind, count = ("GPU", have.get("GPU", 0.0)) if rt.device == "cuda" else ("CPU", have.get("CPU", 0.0))
        if count < need:
            raise RpegError(f"the plan places {need} device(s) (one {kind} each); the Ray cluster at {address} has "
                            f"{count:g} {kind}s: use a plan for fewer devices or a larger cluster")
        return f"devices: the Ray cluster at {address} has {count:g} {kind}s for the plan's {need}"
    if rt.device == "cuda":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < need:
            raise RpegError(f"the plan places {need} device(s) on GPUs (runtime.device: cuda); this machine has "
                            f"{have}: use a plan for {have or 'no'} GPU(s), or device: cpu")
        return f"devices: {need} of this machine's {have} GPUs"
    return f"devices: {need} on this machine's {os.cpu_count() or 1} cores (a private Ray cluster)"


def _model(path: str, key: str) -> str:
    """A model folder the workers can load: its config and tokenizer read, the weights not."""
    if path == "tiny":
        return f"{key}: tiny (built locally at the start)"
    from transformers import AutoConfig, AutoTokenizer

    from rpeg.runtime.models import check_folder

    check_folder(path, key)

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - whatever transformers raises, named in one line
        raise RpegError(f"runtime.{key}: {path!r} does not load ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else 'no message'})") from None
    return f"{key}: {path} ({config.model_type}, tokenizer read)"


def _memory(graph: Graph, cluster) -> str:
    if cluster is None:
        return "memory: not predicted (the plan's cluster is not known here; `rpeg calibrate` for cpu-local)"
    from rpeg.perf.step import predict_step

    pred = predict_step(graph, cluster)
    if not pred.fits:
        over = pred.oom[0] if pred.oom else None
        detail = over.describe() if over is not None else next(
            f"{c.stage} needs {c.peak_memory_bytes / GB:.1f} GB of {c.capacity_bytes / GB:.1f} GB"
            for c in pred.stages.values() if not c.fits)
        raise RpegError(f"the plan does not fit memory on {cluster.name}: {detail}")
    return (f"memory: fits on {cluster.name}, predicted peak {pred.peak_memory_bytes / GB:.2f} GB a device (an "
            f"engine's KV cache counted as preallocated); predicted {pred.step_s:.2f} s a step")
