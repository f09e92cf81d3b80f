"""Algorithm builders, one per file, registered by name: `build_graph("grpo", job, models)`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from rpeg.algorithms import dapo, dr_grpo, grpo, ppo, reinforce_pp, remax, rloo
from rpeg.algorithms.common import Models
from rpeg.errors import RpegError
from rpeg.graph import AlgoConfig, Graph, Job
from rpeg.graph.serde import from_data, to_data


@dataclass(frozen=True, slots=True)
class Algorithm:
    name: str
    build: Callable[..., Graph]
    default: AlgoConfig
    summary: str


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("ppo", ppo.build, ppo.DEFAULT, "PPO with critic and GAE (Schulman 2017; Ouyang 2022)"),
    Algorithm("grpo", grpo.build, grpo.DEFAULT, "group-relative advantages, no critic (Shao 2024)"),
    Algorithm("rloo", rloo.build, rloo.DEFAULT, "leave-one-out baseline (Ahmadian 2024)"),
    Algorithm("reinforce_pp", reinforce_pp.build, reinforce_pp.DEFAULT,
              "REINFORCE++ with batch-normalized returns (Hu 2025)"),
    Algorithm("reinforce_pp_baseline", reinforce_pp.build_baseline, reinforce_pp.DEFAULT_BASELINE,
              "REINFORCE++ with a group-mean baseline (Hu 2025)"),
    Algorithm("remax", remax.build, remax.DEFAULT, "greedy-rollout baseline (Li 2023)"),
    Algorithm("dapo", dapo.build, dapo.DEFAULT, "dynamic sampling, clip-higher, token loss (Yu 2025)"),
    Algorithm("dr_grpo", dr_grpo.build, dr_grpo.DEFAULT, "GRPO without length/std bias (Liu 2025)"),
)}


def get_algorithm(name: str) -> Algorithm:
    key = name.lower().replace("-", "_").replace("++", "_pp").replace(".", "_")  # Dr.GRPO
    if key in ALGORITHMS:
        return ALGORITHMS[key]
    raise RpegError(f"unknown algorithm {name!r} (known: {', '.join(ALGORITHMS)})")


def build_graph(name: str, job: Job, models: Models, **config_changes) -> Graph:
    """Build the named algorithm's graph; `config_changes` override its AlgoConfig defaults."""
    algo = get_algorithm(name)
    known = {f.name for f in dataclasses.fields(AlgoConfig)}
    unknown = sorted(set(config_changes) - known)
    if unknown:
        raise RpegError(f"unknown algorithm option {unknown[0]!r} (known: {', '.join(sorted(known))})")
    config = from_data(AlgoConfig, {**to_data(algo.default), **config_changes}, "config")
    return algo.build(job, models, config)


__all__ = ["ALGORITHMS", "Algorithm", "Models", "build_graph", "get_algorithm"]
