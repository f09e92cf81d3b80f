"""Fitted constants: a factor whose mechanism is clear but whose value nobody publishes.

A cost term comes first with a physical mechanism and a published figure (rpeg/perf/efficiency.py).
Where only the mechanism is known (a host cost per tensor, an assembly rate), its constant may be
fitted across many published rows, and then it is global: one value per device, link, engine or
transport, never per row or per system. This module declares such constants and serves their values;
rpeg/perf/fit.py fits them and `scripts/fit_factors.py` reruns the fit and writes the values, with
the rows they were fitted on and the in-sample and leave-one-out errors, to rpeg/data/fitted.yaml.

Declaring one (in the module that uses it, at import time)::

    PER_TENSOR_S = declare("weightsync.per_tensor_s[megatron]", unit="s", bounds=(1e-6, 1e-2),
                           mechanism="...", rows=("nemo-rl-v0.6:refit", "nemo-rl-v0.3-stages:rl:refit"),
                           group="weightsync-megatron")
    ... PER_TENSOR_S.value ...

`rows` name validation files RPEG ships and what to compare in them: `FILE:KIND` (each entry's
predicted total: KIND is training, rl or refit) or `FILE:rl:STAGE` (a stage of `measured.stages_s`).
Only the rows whose prediction moves with the constant are fitted on (rpeg/perf/fit.py checks).
Constants of one `group` are fitted together (a 2-D search for two); groups one after another.
Nothing else is needed: the fit script imports every module of rpeg.perf, so a declaration anywhere
there is found, fitted and written.

Reading a value: the override context (`override`, what the fit uses to try values) wins, then
rpeg/data/fitted.yaml. A declared constant missing from the file is an error that names the script.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from rpeg.errors import RpegError
from rpeg.perf.efficiency import Factor

FITTED_PATH = Path(__file__).resolve().parents[1] / "data" / "fitted.yaml"
FIT_COMMAND = "python scripts/fit_factors.py"
_OVERRIDE: contextvars.ContextVar[dict[str, float]] = contextvars.ContextVar("rpeg_fitted_override", default={})
_DECLARED: dict[str, "Fitted"] = {}


@dataclass(frozen=True, slots=True)
class Fitted:
    """One declared constant. `bounds`: the search interval (log-spaced: both > 0)."""
    name: str
    unit: str
    mechanism: str
    bounds: tuple[float, float]
    rows: tuple[str, ...]
    group: str

    @property
    def value(self) -> float:
        over = _OVERRIDE.get()
        if self.name in over:
            return over[self.name]
        record = fitted_file().get(self.name)
        if record is None:
            raise RpegError(f"fitted constant {self.name!r} has no value in {FITTED_PATH.name}: run "
                            f"`{FIT_COMMAND}` to fit it")
        return float(record["value"])

    @property
    def start(self) -> float:
        """Where a fit starts when the file has no value yet: the middle of the bounds (log scale)."""
        return math.sqrt(self.bounds[0] * self.bounds[1])

    def factor(self) -> Factor:
        """As an efficiency Factor (value and reason), for the docs' and `rpeg validate`'s tables."""
        record = fitted_file().get(self.name, {})
        loo = record.get("loo_mape")
        err = f"; in-sample {record['in_sample_mape']:.1%}, leave-one-out {loo:.1%} over {len(record['rows'])} " \
              f"rows" if loo is not None else ""
        return Factor(self.value, f"FITTED ({FIT_COMMAND}): {self.mechanism}{err}")


def declare(name: str, *, unit: str, mechanism: str, bounds: tuple[float, float], rows: tuple[str, ...],
            group: str | None = None) -> Fitted:
    """Declare a fitted constant (once, at import time of the module that uses it)."""
    lo, hi = bounds
    if not (0 < lo < hi and math.isfinite(hi)):
        raise RpegError(f"fitted constant {name!r}: bounds must satisfy 0 < low < high, got {bounds!r}")
    if not rows or not all(isinstance(r, str) and r.count(":") in (1, 2) for r in rows):
        raise RpegError(f"fitted constant {name!r}: rows must name FILE:KIND or FILE:rl:STAGE, got {rows!r}")
    c = Fitted(name, unit, mechanism, (float(lo), float(hi)), tuple(rows), group or name)
    if name in _DECLARED and _DECLARED[name] != c:
        raise RpegError(f"fitted constant {name!r} declared twice, differently")
    _DECLARED[name] = c
    return c


def declared() -> dict[str, Fitted]:
    """Every constant declared so far (import the declaring modules first: rpeg.perf.fit.load_all)."""
    return dict(_DECLARED)


@contextlib.contextmanager
def override(values: dict[str, float]) -> Iterator[None]:
    """Within the block, these constants take these values (the fit tries values this way)."""
    unknown = sorted(set(values) - set(_DECLARED))
    if unknown:
        raise RpegError(f"override: {unknown[0]!r} is not a declared fitted constant "
                        f"({', '.join(sorted(_DECLARED)) or 'none declared'})")
    token = _OVERRIDE.set({**_OVERRIDE.get(), **{k: float(v) for k, v in values.items()}})
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


@functools.lru_cache(maxsize=4)
def _read(path: str, mtime: float) -> dict[str, Any]:
    import yaml

    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    constants = data.get("constants") if isinstance(data, dict) else None
    if not isinstance(constants, dict):
        raise RpegError(f"{path}: expected a mapping `constants:` of fitted constants (rerun `{FIT_COMMAND}`)")
    for name, record in constants.items():
        if not isinstance(record, dict) or not isinstance(record.get("value"), (int, float)):
            raise RpegError(f"{path}: constants.{name}.value: expected a number (rerun `{FIT_COMMAND}`)")
    return constants


def fitted_file(path: Path = FITTED_PATH) -> dict[str, Any]:
    """The records of rpeg/data/fitted.yaml by constant name ({} when the file does not exist yet)."""
    if not path.exists():
        return {}
    return _read(str(path), path.stat().st_mtime)


def table() -> list[tuple[str, float, str]]:
    """Every declared constant with its value and reason (mechanism, fit errors)."""
    return [(c.name, c.factor().value, c.factor().reason) for c in sorted(_DECLARED.values(), key=lambda c: c.name)]


__all__ = ["FITTED_PATH", "FIT_COMMAND", "Fitted", "declare", "declared", "fitted_file", "override", "table"]
