"""Job files: what a user writes to describe an RL job, and how it becomes a Graph.

    algorithm: grpo
    model: qwen3-8B          # a preset, a catalogue id (Qwen/Qwen2.5-3B-Instruct), a config.json or a
                             # model folder (relative paths: from the job file's folder, then the working
                             # directory), or a mapping of ModelSpec fields (`rpeg models --all`)
    reward: rule             # or a model (preset name or mapping); default rule
    critic: qwen3-8B         # PPO only; default: the actor's architecture
    reference: qwen3-8B      # default: the actor's architecture
    lora: {rank: 32, alpha: 64}  # train low-rank adapters, the weights frozen (rpeg/graph/lora.py); default: none
    job: {prompts: 64, samples_per_prompt: 8, prompt_len: 512,
          response: {kind: lognormal, mean: 2000, max: 8192}, ppo_epochs: 1, mini_batches: 4}
    config: {kl_coef: 0.0}   # overrides of the algorithm's defaults (`rpeg algorithms` lists them),
                             # e.g. off_policy: tis, policy_loss: gspo, dual_clip: 3
    cluster: dgx-h100        # for `rpeg predict` (or --cluster); a preset or a cluster file
    gpus: 16                 # devices of the cluster the job uses (or --gpus)
    passes:                  # optional pass pipeline
      - bound_asynchrony: {k: 1}

Unknown keys are errors (a typo silently ignored is a wrong plan), and so is an empty name
(`cluster: ""`, `critic: ""`: left out, a key takes its default; given empty, it is a mistake).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from rpeg.algorithms import Models, build_graph, get_algorithm
from rpeg.errors import RpegError
from rpeg.graph import Graph, Job, ModelSpec, get_model
from rpeg.graph.bounds import MAX_GPUS, show
from rpeg.graph.lora import LoRA
from rpeg.graph.serde import from_data, read_yaml_file
from rpeg.hardware import Cluster, load_cluster
from rpeg.passes import PassPipeline

KEYS = ("algorithm", "model", "reward", "critic", "reference", "lora", "job", "config", "passes", "cluster", "gpus",
        "runtime")


@dataclass(frozen=True, slots=True)
class JobSpec:
    algorithm: str
    models: Models
    job: Job
    config: dict[str, Any]
    passes: PassPipeline
    cluster: str | None = None  # a preset name or a cluster file, for `rpeg predict`
    gpus: int | None = None
    runtime: dict[str, Any] | None = None  # `rpeg train`'s section (rpeg.runtime.config.RuntimeConfig)

    def graph(self) -> Graph:
        """The algorithm's graph with the job's passes applied."""
        return self.passes.apply(build_graph(self.algorithm, self.job, self.models, **self.config))

    def cluster_and_gpus(self, cluster: str | None = None, gpus: int | None = None, default: str = "dgx-h100",
                         graph: Graph | None = None) -> tuple[Cluster, Cluster, int]:
        """(the cluster as its preset or file states it, the same sized to the devices used, how many).

        The cluster: `cluster` (a flag), else the job file's, else `default`. The devices: `gpus`,
        else the job file's, else as many as `graph`'s placed groups span, else one node."""
        name = cluster or self.cluster or default
        base = load_cluster(name)
        used = gpus or self.gpus or (max(g.first + g.count for g in graph.groups) if graph is not None and graph.groups
                                     else base.gpus_per_node)
        return base, load_cluster(name, used), used


_MODEL = "a model: a preset, a catalogue id, a config.json or a model folder (see `rpeg models --all`)"


def model_from(data: Any, where: str, base: str | None = None) -> ModelSpec:
    """A job file's model: a name (rpeg.graph.catalogue.resolve_model; relative paths from `base`, the job
    file's folder, first), `{preset: name}`, or a mapping of ModelSpec fields."""
    from rpeg.graph.catalogue import resolve_model

    if isinstance(data, str):
        return _located(lambda: resolve_model(_name(data, where, _MODEL), base).spec, where)
    if isinstance(data, dict):
        if set(data) == {"preset"}:
            return _located(lambda: resolve_model(_name(data["preset"], f"{where}.preset", _MODEL), base).spec, where)
        return from_data(ModelSpec, {"name": "custom", **data}, where)
    raise RpegError(f"{where}: expected a model name or a mapping of its dimensions, got {data!r}")


def _located(read, where: str) -> ModelSpec:
    try:
        return read()
    except RpegError as e:
        msg = str(e)
        raise RpegError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def _name(value: Any, where: str, what: str) -> str:
    """A name a user gave: a string that is not empty (an empty one would silently mean a default)."""
    if not isinstance(value, str):
        raise RpegError(f"{where}: expected {what}, a string, got {value!r}")
    if not value.strip():
        raise RpegError(f"{where}: an empty name; expected {what}")
    return value


def spec_from_data(data: Any, source: str = "job") -> JobSpec:
    if not isinstance(data, dict):
        raise RpegError(f"{source}: expected a mapping with keys {', '.join(KEYS)}")
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise RpegError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    for key in ("algorithm", "model"):
        if key not in data:
            raise RpegError(f"{source}: missing {key!r}")
    algorithm = get_algorithm(_name(data["algorithm"], f"{source}: algorithm", "an algorithm (`rpeg algorithms`)")).name
    reward = data.get("reward", "rule")
    base = os.path.dirname(os.path.abspath(source)) if os.path.isfile(source) else None  # the job file's folder
    models = Models(
        actor=model_from(data["model"], f"{source}: model", base),
        critic=model_from(data["critic"], f"{source}: critic", base) if data.get("critic") is not None else None,
        reference=model_from(data["reference"], f"{source}: reference", base) if data.get("reference") is not None
        else None,
        reward=None if reward in (None, "rule") else model_from(reward, f"{source}: reward", base),
        lora=None if data.get("lora") is None else from_data(LoRA, data["lora"], "lora"),
    )
    job = from_data(Job, {} if data.get("job") is None else data["job"], "job")
    config = {} if data.get("config") is None else data["config"]
    if not isinstance(config, dict):
        raise RpegError(f"{source}: config must be a mapping of algorithm options")
    unnamed = [k for k in config if not isinstance(k, str)]
    if unnamed:
        raise RpegError(f"{source}: config: option {unnamed[0]!r} is not a name (`rpeg algorithms` lists the options)")
    gpus = data.get("gpus")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise RpegError(f"{source}: gpus must be a positive whole number, got {gpus!r}")
    if gpus is not None and gpus > MAX_GPUS:
        raise RpegError(f"{source}: gpus = {show(gpus)} exceeds {MAX_GPUS:,} (above the largest clusters built)")
    cluster = data.get("cluster")
    if cluster is not None:
        cluster = _name(cluster, f"{source}: cluster", "a cluster preset (`rpeg hardware`) or a cluster file")
    return JobSpec(algorithm=algorithm, models=models, job=job, config=dict(config),
                   passes=PassPipeline.from_data(data.get("passes")), cluster=cluster, gpus=gpus,
                   runtime=_runtime_section(data.get("runtime"), source))


def _runtime_section(data: Any, source: str) -> dict[str, Any] | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise RpegError(f"{source}: runtime must be a mapping (see rpeg/runtime/config.py)")
    return dict(data)


def load_spec(path: str) -> JobSpec:
    try:
        return spec_from_data(read_yaml_file(path), path)
    except RpegError as e:
        msg = str(e)
        raise RpegError(msg if path in msg else f"{path}: {msg}") from None


def spec_data(spec: JobSpec, passes: list | None = None, cluster: str | None = None,
              gpus: int | None = None) -> dict[str, Any]:
    """The job file of `spec` (a mapping `spec_from_data` reads back), with `passes` in place of its
    own when given. Models are written by the name that resolves to them from any working directory (a
    preset, a catalogue id, a config's absolute path), or by their dimensions when no name does."""
    from rpeg.graph.serde import to_data

    def model(m: ModelSpec) -> Any:
        try:
            return m.name if get_model(m.name) == m else to_data(m)
        except RpegError:
            return to_data(m)

    data: dict[str, Any] = {"algorithm": spec.algorithm, "model": model(spec.models.actor)}
    for role in ("critic", "reference", "reward"):
        m = getattr(spec.models, role)
        if m is not None:
            data[role] = model(m)
    if spec.models.lora is not None:
        data["lora"] = to_data(spec.models.lora)
    data["job"] = to_data(spec.job)
    if spec.config:
        data["config"] = dict(spec.config)
    if cluster or spec.cluster:
        data["cluster"] = cluster or spec.cluster
    if gpus or spec.gpus:
        data["gpus"] = gpus or spec.gpus
    data["passes"] = passes if passes is not None else [{c.name: dict(c.args)} for c in spec.passes]
    if spec.runtime is not None:
        data["runtime"] = dict(spec.runtime)
    return data
