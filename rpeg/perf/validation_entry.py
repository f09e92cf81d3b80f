"""What every entry reader of a validation file shares (rpeg/perf/validation.py reads `training` and
`rl` entries, rpeg/perf/validation_refit.py `refit` entries): the result of one entry, and typed,
range-checked values whose errors name the entry, the key and the value in one line."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rpeg.errors import RpegError
from rpeg.graph import ModelSpec, get_model
from rpeg.graph.bounds import MAX_COUNT, MAX_GPUS, MAX_SECONDS, MAX_TOKENS, problem

# NeMo-RL's Megatron worker moves the optimizer state with a blocking `v.to("cpu")` before the refit and
# `v.to("cuda")` before training (megatron_policy_worker.py move_optimizer; offload_optimizer_for_refit is
# on by default; the code since June 2025, before v0.3): pageable copies, at efficiency.PAGEABLE_*; its
# weights go through Megatron-Core's param_and_grad_buffer.offload_to_cpu, a pinned buffer kept from the
# first offload (rpeg/perf/offload.py)
NEMO_RL_PAGEABLE = ("optimizer",)


@dataclass(frozen=True, slots=True)
class StageResult:
    stage: str  # one of STAGES_S
    predicted: float
    measured: float

    @property
    def error(self) -> float | None:
        return (self.predicted - self.measured) / self.measured if self.measured > 0 else None


@dataclass(frozen=True, slots=True)
class Result:
    id: str
    kind: str  # training | rl | refit
    predicted: float  # seconds; inf when the model predicts the entry does not fit in memory
    measured: float
    parts: tuple[tuple[str, float], ...]
    note: str = ""
    stages: tuple[StageResult, ...] = ()  # the stages the entry's measurement splits out

    @property
    def fits(self) -> bool:
        return math.isfinite(self.predicted)

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; None when the model says the entry does not fit."""
        return (self.predicted - self.measured) / self.measured if self.fits else None


def _model(name: str, models: dict[str, ModelSpec]) -> ModelSpec:
    return models.get(str(name).lower()) or get_model(str(name))


def _check_keys(entry: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise RpegError(f"{where}: unknown key {unknown[0]!r}")


def _need(entry: dict, key: str, where: str, kind=int) -> Any:
    if key not in entry:
        raise RpegError(f"{where}: missing {key!r}")
    return _value(entry, key, where, kind)


def _get(entry: dict, key: str, where: str, default: Any, kind=int) -> Any:
    return _value(entry, key, where, kind) if key in entry else default


def _value(entry: dict, key: str, where: str, kind) -> Any:
    """entry[key] of the right type; counts and measurements must be positive (and finite)."""
    value = entry[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RpegError(f"{where}.{key}: expected an integer, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise RpegError(f"{where}.{key}: expected a number, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise RpegError(f"{where}.{key}: expected a name, got {value!r}")
    if kind in (int, float):
        bad = problem(key, value, positive=True, maximum=_maximum(key))
        if bad:
            raise RpegError(f"{where}.{key}: {bad}")
    return value


def _maximum(key: str) -> float:
    """The largest value a validation-file number may take (each well above any published run)."""
    if key.endswith("_s"):
        return MAX_SECONDS
    if key in ("gpus", "gpus_per_node", "gen_gpus"):
        return MAX_GPUS
    if key.endswith("seq_len") or key in ("seq", "prompt_len"):
        return MAX_TOKENS
    return MAX_COUNT
