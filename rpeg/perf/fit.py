"""Fitting the declared constants (rpeg/perf/fitted.py) across the validation rows that exercise them.

For each group of constants: collect the rows their declarations name (`FILE:KIND`, `FILE:rl:STAGE`),
keep those whose prediction moves between the constants' bounds, and minimise a robust loss, the
mean |log(predicted / measured)| over those rows, by a bounded grid search in log space refined
around the best point (`search`; 1-D and 2-D are what the groups need, any dimension works).
Leave-one-out: each row is predicted with constants fitted on the other rows. Predictions are
cached per point, so the leave-one-out searches reuse the full fit's grid. Groups are fitted one
after another, each holding the others at their latest values (two passes, so groups sharing rows
settle); a group's leave-one-out holds the other groups at their values fitted on all rows.

`scripts/fit_factors.py` runs `fit_all` and writes rpeg/data/fitted.yaml (`write`); `rpeg validate
--loo` prints `loo_report`: the stored in-sample and leave-one-out predictions per row beside a fresh
prediction with the file's values, and says when they disagree (the model changed since the fit:
rerun the script). Pure Python and numpy; reads the shipped validation files.
"""

from __future__ import annotations

import importlib
import itertools
import math
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from rpeg.errors import RpegError
from rpeg.perf import fitted
from rpeg.perf.fitted import FIT_COMMAND, Fitted, override

MISS_LOSS = 10.0  # a row predicted not to fit (or at zero seconds): a large finite loss, not a crash
GRID = 9  # points per dimension of the first, coarse grid (shared by the leave-one-out searches)
REFINE = 5  # points per dimension of each refinement
ROUNDS = 6  # refinements, each halving the step: the last step is 1/64 of the coarse one
MAX_PASSES = 6  # at most this many passes over the groups while a pass still moves a constant
SETTLED = 1e-4  # a pass that moves no constant by more than this (relative) ends the passes
STALE = 1e-3  # relative difference between a stored and a fresh in-sample prediction that marks the fit stale


@dataclass(frozen=True, slots=True)
class Row:
    """One published measurement a constant is fitted on: `predict()` gives the model's seconds
    with the constants as they are now (fitted.override sets them)."""
    id: str  # FILE:ENTRY or FILE:ENTRY:STAGE
    measured: float
    predict: Callable[[], float]


def load_all() -> dict[str, Fitted]:
    """Import every module of rpeg.perf (where constants are declared) and return the declarations."""
    import rpeg.perf as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"rpeg.perf.{info.name}")
    return fitted.declared()


def rows_for(selectors: Sequence[str]) -> list[Row]:
    """The rows `selectors` name (FILE:KIND or FILE:rl:STAGE), in order, each once."""
    from rpeg.graph.serde import read_yaml_file
    from rpeg.perf.validation import bundled

    files = bundled()
    rows: dict[str, Row] = {}
    for sel in selectors:
        parts = sel.split(":")
        if len(parts) not in (2, 3) or parts[0] not in files:
            raise RpegError(f"rows: {sel!r}: expected FILE:KIND or FILE:rl:STAGE with FILE one of {', '.join(files)}")
        stem, kind, stage = parts[0], parts[1], (parts[2] if len(parts) == 3 else None)
        if kind not in ("training", "rl", "refit") or (stage is not None and kind != "rl"):
            raise RpegError(f"rows: {sel!r}: KIND is training, rl or refit; a STAGE only follows rl")
        data = read_yaml_file(str(files[stem]))
        for entry in data.get(kind) or []:
            if unmodelled(entry, kind):
                continue
            one = {"models": data.get("models"), kind: [entry]}
            if stage is None:
                rid, measured = f"{stem}:{entry['id']}", None
            else:
                given = (entry.get("measured") or {}).get("stages_s") or {}
                if stage not in given:
                    continue
                rid, measured = f"{stem}:{entry['id']}:{stage}", float(given[stage])
            if rid in rows:
                continue
            if measured is None:
                measured = _measured(entry, kind, sel)
            rows[rid] = Row(rid, measured, _predictor(one, str(files[stem]), stage))
    return list(rows.values())


def unmodelled(entry: dict, kind: str) -> bool:
    """A training entry run under a condition the model has no mechanism for (validation.IGNORED_OPTIONS,
    e.g. `packing: true`): its miss says nothing about a constant, so no constant is fitted on it."""
    from rpeg.perf.validation import IGNORED_OPTIONS

    return kind == "training" and any(entry.get(k) not in (None, False) for k in IGNORED_OPTIONS)


def _measured(entry: dict, kind: str, sel: str) -> float:
    """An entry's measured seconds, read without predicting it (the constants may have no value yet); a
    training entry's as validation reads it (its iteration time, or what its published throughput implies)."""
    if kind == "training":
        from rpeg.perf.validation import _measured_iteration

        tokens = entry.get("global_batch", 0) * entry.get("seq", 0)
        return _measured_iteration(entry, tokens, entry.get("gpus", 0), f"rows: {sel!r}: entry {entry.get('id')!r}")
    value = entry.get("measured_s") if kind == "refit" else (entry.get("measured") or {}).get("step_s")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise RpegError(f"rows: {sel!r}: entry {entry.get('id')!r} has no positive measured seconds")
    return float(value)


def _predictor(one: dict, path: str, stage: str | None) -> Callable[[], float]:
    """The row's prediction. An rl stage row builds its plan once (plans hold no cost constants) and
    predicts its step at each call."""
    from rpeg.perf.step import predict_step
    from rpeg.perf.validation import _models, rl_graph, stage_split, validate_data

    if stage is None:
        return lambda: validate_data(one, path)[0].predicted
    graph, cluster = rl_graph(one["rl"][0], _models(one.get("models"), path), path)

    def predict() -> float:
        pred = predict_step(graph, cluster)
        return stage_split(graph, pred)[stage] if pred.fits else math.inf
    return predict


def loss(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean |log(predicted / measured)|; a row predicted not to fit costs MISS_LOSS."""
    ok = np.isfinite(predicted) & (predicted > 0)
    per = np.full(len(measured), MISS_LOSS)
    per[ok] = np.abs(np.log(predicted[ok] / measured[ok]))
    return float(per.mean()) if len(per) else 0.0


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured)) if len(measured) else 0.0


@dataclass
class _Evaluator:
    """Predictions of a group's rows at points of its constants, cached by point."""
    constants: tuple[Fitted, ...]
    rows: list[Row]
    held: dict[str, float]
    cache: dict[tuple[float, ...], np.ndarray] = field(default_factory=dict)

    def at(self, point: tuple[float, ...]) -> np.ndarray:
        key = tuple(round(v, 12) for v in point)
        if key not in self.cache:
            with override({**self.held, **{c.name: v for c, v in zip(self.constants, point)}}):
                self.cache[key] = np.array([r.predict() for r in self.rows], dtype=float)
        return self.cache[key]


def search(evaluate: Callable[[tuple[float, ...]], float], bounds: Sequence[tuple[float, float]],
           grid: int = GRID, rounds: int = ROUNDS) -> tuple[float, ...]:
    """The point within `bounds` (each low > 0) that minimises `evaluate`: a `grid`-point grid per
    dimension in log space, then `rounds` refinements of REFINE points per dimension spanning one
    step either side of the best point found (each halves the step). Ties go to the first point seen."""
    if grid < 3 or rounds < 0:
        raise RpegError(f"search: grid >= 3 and rounds >= 0 required, got grid {grid}, rounds {rounds}")
    lo = [math.log(a) for a, _ in bounds]
    hi = [math.log(b) for _, b in bounds]
    span_lo, span_hi, points = list(lo), list(hi), grid
    best, best_value = None, math.inf
    for _ in range(rounds + 1):
        axes = [np.linspace(a, b, points) for a, b in zip(span_lo, span_hi)]
        for logs in itertools.product(*axes):
            point = tuple(float(math.exp(v)) for v in logs)
            value = evaluate(point)
            if value < best_value - 1e-12:
                best, best_value = point, value
        steps = [(b - a) / (points - 1) for a, b in zip(span_lo, span_hi)]
        centre = [math.log(v) for v in best]
        span_lo = [max(lo[i], centre[i] - steps[i]) for i in range(len(lo))]
        span_hi = [min(hi[i], centre[i] + steps[i]) for i in range(len(hi))]
        points = REFINE
    return best


@dataclass(frozen=True, slots=True)
class GroupFit:
    group: str
    values: dict[str, float]
    rows: tuple[str, ...]
    measured: tuple[float, ...]
    in_sample: tuple[float, ...]
    loo: tuple[float, ...]

    @property
    def in_sample_mape(self) -> float:
        return mape(np.array(self.in_sample), np.array(self.measured))

    @property
    def loo_mape(self) -> float:
        return mape(np.array(self.loo), np.array(self.measured))


def exercising(constants: Sequence[Fitted], rows: list[Row], held: dict[str, float],
               declared: dict[str, Fitted] | None = None) -> list[Row]:
    """The rows whose prediction moves when the group's constants go from their lower to their upper
    bounds, with the other constants at `held` or (a term may hide behind another's) at their lower bounds."""
    settings = [held] + ([{k: declared[k].bounds[0] for k in held}] if declared else [])
    moved = set()
    for other in settings:
        ev = _Evaluator(tuple(constants), rows, other)
        low, high = ev.at(tuple(c.bounds[0] for c in constants)), ev.at(tuple(c.bounds[1] for c in constants))
        moved |= {r.id for r, a, b in zip(rows, low, high) if not (a == b or (math.isinf(a) and math.isinf(b)))}
    return [r for r in rows if r.id in moved]


def fit_group(constants: Sequence[Fitted], rows: list[Row], held: dict[str, float], *, loo: bool = True,
              progress: Callable[[str], None] | None = None) -> GroupFit:
    """Fit `constants` (one group) on `rows` with the other constants at `held`."""
    constants = tuple(constants)
    if not rows:
        raise RpegError(f"fit: no row exercises {', '.join(c.name for c in constants)} (its declared rows: "
                        f"{', '.join(constants[0].rows)})")
    ev = _Evaluator(constants, rows, held)
    measured = np.array([r.measured for r in rows])
    bounds = [c.bounds for c in constants]

    def fit(mask: np.ndarray) -> tuple[float, ...]:
        return search(lambda p: loss(ev.at(p)[mask], measured[mask]), bounds)

    everything = np.ones(len(rows), dtype=bool)
    best = fit(everything)
    in_sample = ev.at(best)
    loo_pred = np.array(in_sample, dtype=float)
    if loo and len(rows) > 1:
        for i in range(len(rows)):
            if progress:
                progress(f"  leave out {rows[i].id} ({i + 1}/{len(rows)})")
            mask = everything.copy()
            mask[i] = False
            loo_pred[i] = ev.at(fit(mask))[i]
    return GroupFit(constants[0].group, {c.name: v for c, v in zip(constants, best)}, tuple(r.id for r in rows),
                    tuple(float(m) for m in measured), tuple(float(v) for v in in_sample),
                    tuple(float(v) for v in loo_pred))


def groups(declared: dict[str, Fitted]) -> dict[str, tuple[Fitted, ...]]:
    out: dict[str, list[Fitted]] = {}
    for c in sorted(declared.values(), key=lambda c: c.name):
        out.setdefault(c.group, []).append(c)
    return {g: tuple(cs) for g, cs in sorted(out.items())}


def fit_all(declared: dict[str, Fitted] | None = None, *, passes: int = 2,
            progress: Callable[[str], None] | None = None, only: Sequence[str] = ()) -> list[GroupFit]:
    """Fit every group (in name order, `passes` times or more, up to MAX_PASSES, until a pass moves no
    constant: groups sharing rows settle), then the leave-one-out predictions of each with the others
    held at their final values. `only`: fit these
    groups alone, the others held at their stored values (a quick loop; a shipped file comes from all)."""
    declared = load_all() if declared is None else declared
    current = {name: (rec["value"] if (rec := fitted.fitted_file().get(name)) else c.start)
               for name, c in declared.items()}
    by_group = groups(declared)
    unknown = sorted(set(only) - set(by_group))
    if unknown:
        raise RpegError(f"--only: {unknown[0]!r} is not a group of fitted constants ({', '.join(by_group)})")
    if only:
        by_group = {g: cs for g, cs in by_group.items() if g in only}
    group_rows = {}
    for g, cs in by_group.items():
        held = {k: v for k, v in current.items() if k not in {c.name for c in cs}}
        group_rows[g] = exercising(cs, rows_for(sorted({s for c in cs for s in c.rows})), held, declared)
    for p in range(max(passes, MAX_PASSES)):
        before = dict(current)
        for g, cs in by_group.items():
            if progress:
                progress(f"pass {p + 1}: fitting {g} on {len(group_rows[g])} rows")
            held = {k: v for k, v in current.items() if k not in {c.name for c in cs}}
            current.update(fit_group(cs, group_rows[g], held, loo=False).values)
        # groups that share rows (a constant's rows priced by another group's too) settle by refitting each in
        # turn: stop once a pass moves no constant, so the final fits below, and the rows they store, agree
        if p + 1 >= passes and all(abs(current[k] - before[k]) <= SETTLED * abs(before[k]) for k in current):
            break
    out = []
    for g, cs in by_group.items():
        if progress:
            progress(f"leave-one-out: {g}")
        held = {k: v for k, v in current.items() if k not in {c.name for c in cs}}
        out.append(fit_group(cs, group_rows[g], held, progress=progress))
    return out


def records(fits: list[GroupFit], declared: dict[str, Fitted]) -> dict:
    """What rpeg/data/fitted.yaml holds: each constant's value and story, each group's rows."""
    constants, group_data = {}, {}
    for f in fits:
        for name, value in f.values.items():
            c = declared[name]
            constants[name] = {"value": float(f"{value:.4g}"), "unit": c.unit, "group": f.group,
                               "mechanism": c.mechanism, "rows": list(f.rows),
                               "in_sample_mape": round(f.in_sample_mape, 4), "loo_mape": round(f.loo_mape, 4)}
        group_data[f.group] = {
            "constants": list(f.values), "in_sample_mape": round(f.in_sample_mape, 4),
            "loo_mape": round(f.loo_mape, 4),
            "rows": {rid: {"measured": m, "in_sample": round(a, 4), "loo": round(b, 4)}
                     for rid, m, a, b in zip(f.rows, f.measured, f.in_sample, f.loo)}}
    return {"command": FIT_COMMAND, "constants": constants, "groups": group_data}


def merged(data: dict, path=fitted.FITTED_PATH) -> dict:
    """`data` (records of some groups) over the stored file's records of the others."""
    import yaml

    if not path.exists():
        return data
    with open(path, encoding="utf-8") as f:
        old = yaml.safe_load(f) or {}
    return {"command": FIT_COMMAND, "constants": {**(old.get("constants") or {}), **data["constants"]},
            "groups": {**(old.get("groups") or {}), **data["groups"]}}


def write(data: dict, path=fitted.FITTED_PATH) -> None:
    import yaml

    header = ("# Fitted constants (rpeg/perf/fitted.py): written by `" + FIT_COMMAND + "`, do not edit by hand.\n"
              "# Each constant: its value, the mechanism it prices, the rows it was fitted on, and the mean\n"
              "# absolute percentage error in-sample and leave-one-out (each row predicted by constants\n"
              "# fitted without it). groups: per row, measured, in-sample and leave-one-out seconds.\n")
    with open(path, "w", encoding="utf-8") as f:
        f.write(header + yaml.safe_dump(data, sort_keys=False, width=120, allow_unicode=True))


@dataclass(frozen=True, slots=True)
class LooRow:
    group: str
    id: str
    measured: float
    in_sample: float  # stored by the fit
    loo: float  # stored by the fit
    now: float  # predicted now with the file's values

    @property
    def stale(self) -> bool:
        return not (math.isfinite(self.now) and abs(self.now - self.in_sample) <= STALE * max(self.in_sample, 1e-9))


def loo_report(only_files: Sequence[str] | None = None) -> list[LooRow]:
    """The stored fit per row (rows of `only_files`, or all), each with a fresh prediction."""
    declared = load_all()
    data = fitted.fitted_file()
    stored = _groups_stored()
    missing = sorted(n for n in declared if n not in data)
    if missing:
        raise RpegError(f"--loo: {missing[0]!r} has no fitted value in {fitted.FITTED_PATH.name}: run `{FIT_COMMAND}`")
    out = []
    for g, info in stored.items():
        ids = [rid for rid in info["rows"] if only_files is None or rid.split(":")[0] in only_files]
        if not ids:
            continue
        sels = sorted({s for n in info["constants"] if n in declared for s in declared[n].rows})
        fresh = {r.id: r for r in rows_for(sels)}
        for rid in ids:
            rec = info["rows"][rid]
            now = fresh[rid].predict() if rid in fresh else math.nan
            out.append(LooRow(g, rid, float(rec["measured"]), float(rec["in_sample"]), float(rec["loo"]), now))
    return out


def _groups_stored() -> dict:
    import yaml

    path = fitted.FITTED_PATH
    if not path.exists():
        raise RpegError(f"--loo: {path.name} does not exist: run `{FIT_COMMAND}`")
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    g = data.get("groups")
    if not isinstance(g, dict):
        raise RpegError(f"--loo: {path.name} has no `groups:` (per-row predictions): rerun `{FIT_COMMAND}`")
    return g


__all__ = ["GroupFit", "LooRow", "Row", "exercising", "fit_all", "fit_group", "groups", "load_all", "loo_report",
           "loss", "mape", "merged", "records", "rows_for", "search", "unmodelled", "write"]
