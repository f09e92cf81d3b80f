"""Layouts that fit together: the stages sharing devices, summed, within the devices' memory.

`apply_layouts` (layouts.py) gives every stage its fastest layout that fits on its own. Stages on
the same devices also hold the other models that live there (rpeg/perf/residency.py): a trained
model's state, a frozen model's weights, an engine that never sleeps. When a set of devices then
overflows, `fit_together` trades speed for memory one stage at a time: among the layouts of the
stages on the overflowing devices that fit alone (each stage's Pareto front of time, resident bytes
and transient bytes: ZeRO-3, offload, recomputation, more model parallelism), it takes the change
that removes the most overflow per added second (bytes over capacity, summed over every stage's turn
on every set of devices, so that helping one of two turns at the same peak counts), until all fit,
or no change helps (the placement is then infeasible); then it undoes the changes later ones made
needless. Two cheap changes so beat one dear one that alone would fit (ZeRO-3 for the critic and
the reward model, not the critic's optimizer on the host). Where host offload is allowed
(`LayoutOptions.offload`), keeping the reference's weights on the host and swapping them in for its
pass (NeMo-RL's way, passes/reference.py) is one more change of the same kind: it frees the
reference's weights on the actor's training devices for the swap's seconds. Greedy, not
exhaustive, and deterministic: ties break on the stage's order and the layout's own order.
"""

from __future__ import annotations

import math

from rpeg.graph import Graph, Kind, ParallelLayout, Stage
from rpeg.graph.verify import layout_problems, reference_host_problem
from rpeg.hardware.topology import Cluster
from rpeg.passes.base import call_text
from rpeg.passes.reference import reference_on_host
from rpeg.perf.cost import StageCost
from rpeg.perf.residency import STATE, DeviceMemory, device_memory, sleeping_engine
from rpeg.perf.stages import stage_cost
from rpeg.search.layouts import LayoutCache, LayoutOptions, _key, best_layout, candidates

MOVES_PER_STAGE = 6  # layout changes per model stage at most: each removes some overflow; PPO on 70B takes ~12


def overflow_bytes(held: tuple[DeviceMemory, ...]) -> float:
    """Bytes per device over capacity, summed over every unit of every set of devices that overflows
    (two units at the same peak: helping one of them counts)."""
    return sum(m.overflow_bytes() for m in held)


def _split(stage: Stage, cost: StageCost) -> tuple[float, float]:
    """(bytes that outlive the stage, bytes only while it runs) of one stage's own need."""
    parts = dict(cost.memory_parts)
    if stage.kind is Kind.TRAIN:
        kept = ("weights", "optimizer") + (("gradients",) if stage.layout.zero < 3 else ())
    elif stage.kind is Kind.GENERATE:
        kept = ()
    else:
        kept = ("weights",)
    resident = sum(parts.get(p, 0.0) for p in kept if p in STATE)
    return resident, cost.peak_memory_bytes - resident


def frugal_layouts(graph: Graph, stage: Stage, cluster: Cluster, opts: LayoutOptions,
                   cache: LayoutCache) -> list[tuple[ParallelLayout, StageCost]]:
    """The stage's layouts that fit alone and that no other beats on time, resident bytes and
    transient bytes at once, fastest first; remembered per stage shape in `cache`."""
    key = _key(graph, stage, cluster, opts)
    if key in cache.frugal:
        return cache.frugal[key]
    devices = graph.group(stage.group).count
    fitting = []
    for lay in candidates(graph, stage, devices, cluster.gpus_per_node, opts, cluster.device):
        if lay.recompute == "selective":
            continue  # with FlashAttention it keeps all but the attention core's few bytes: never on the front
        trial = stage.replace(layout=lay)
        if layout_problems(graph, trial):
            continue
        cost = stage_cost(graph.with_stages([trial]), trial, cluster)
        cache.evaluated += 1
        if cost.fits and math.isfinite(cost.seconds):
            fitting.append((lay, cost, (cost.seconds,) + _split(trial, cost)))
    front: list[tuple[ParallelLayout, StageCost, tuple[float, float, float]]] = []
    for lay, cost, v in sorted(fitting, key=lambda x: x[2]):  # fastest first: only a faster one can dominate
        if not any(w[1] <= v[1] and w[2] <= v[2] for _, _, w in front):
            front.append((lay, cost, v))
    cache.frugal[key] = [(lay, cost) for lay, cost, _ in front]
    return cache.frugal[key]


def fit_together(graph: Graph, cluster: Cluster, opts: LayoutOptions, cache: LayoutCache) -> Graph | None:
    """`graph` (every model stage at its fastest layout alone, from `apply_layouts`) with layouts
    changed until every set of devices fits with its co-resident models summed; None if no change
    of layout makes it fit."""
    costs = {}
    for s in graph.stages:
        if s.model is None or s.kind is Kind.SYNC:
            continue
        found = best_layout(graph, s, cluster, opts, cache)  # remembered: no new costing
        costs[s.name] = found[1] if found and found[0] == s.layout else stage_cost(graph, s, cluster)
    held = _held(graph, costs)
    changed: list[str] = []
    for _ in range(MOVES_PER_STAGE * len(costs)):
        over = overflow_bytes(held)
        if over <= 0:
            return _relax(graph, costs, changed, cluster, opts, cache)
        worst = max((m for m in held if not m.fits), key=lambda m: m.peak_bytes - m.capacity_bytes)
        on = set(range(worst.first, worst.first + worst.count))
        units_over = sum(1 for m in held for _, b in m.units if 0 < m.capacity_bytes < b)
        best = None  # (rank, trial graph, trial costs, held)
        for s in graph.stages:
            if s.model is None or s.kind in (Kind.SYNC, Kind.GENERATE) or not on & set(graph.group(s.group).devices):
                continue
            now = _split(s, costs[s.name])
            for lay, cost in frugal_layouts(graph, s, cluster, opts, cache):
                if lay == s.layout:
                    continue
                res, trans = _split(s.replace(layout=lay), cost)
                added = max(cost.seconds - costs[s.name].seconds, 1e-9)
                # it removes at most what it holds less (resident bytes from every overflowing unit,
                # transient ones from its own), and never more than the overflow: skip what cannot
                # beat the best change found so far without summing the devices again
                bound = min(over, units_over * max(0.0, now[0] - res) + max(0.0, now[1] - trans)) / added
                if bound <= 0 or (best is not None and -bound >= best[0][0]):
                    continue
                move = _ranked(graph.with_stages([s.replace(layout=lay)]), {**costs, s.name: cost}, over, added,
                               s.name)
                if move is not None and (best is None or move[0] < best[0]):
                    best = move
        move = _reference_to_host(graph, costs, cluster, opts, over)
        if move is not None and (best is None or move[0] < best[0]):
            best = move
        if best is None:
            return None
        _, graph, costs, held, name = best
        changed += [name] if name not in changed else []
    return _relax(graph, costs, changed, cluster, opts, cache) if overflow_bytes(held) <= 0 else None


REFERENCE_MOVE = "reference on the host"


def reference_to_host(graph: Graph, opts: LayoutOptions) -> Graph | None:
    """`graph` with the reference's weights kept on the host (passes/reference.py), or None where host
    offload is not allowed, they are there already, or the plan cannot."""
    if not opts.offload or graph.reference_on_host or reference_host_problem(graph):
        return None
    return reference_on_host(graph)


def _ref_costs(graph: Graph, costs: dict[str, StageCost], cluster: Cluster) -> dict[str, StageCost]:
    return {**costs, **{s.name: stage_cost(graph, s, cluster) for s in graph.stages
                        if s.model == "ref" and s.kind is Kind.INFER and s.name in costs}}


def _reference_to_host(graph: Graph, costs: dict[str, StageCost], cluster: Cluster, opts: LayoutOptions,
                       over: float) -> tuple | None:
    """The move that keeps the reference's weights on the host, ranked as a layout change is, or None
    where host offload is not allowed, it is already there, or it cannot be done or removes nothing."""
    trial = reference_to_host(graph, opts)
    if trial is None:
        return None
    trial_costs = _ref_costs(trial, costs, cluster)
    added = max(sum(trial_costs[n].seconds - costs[n].seconds for n in costs), 1e-9)
    return _ranked(trial, trial_costs, over, added, REFERENCE_MOVE)


def _ranked(trial: Graph, trial_costs: dict[str, StageCost], over: float, added: float, name: str) -> tuple | None:
    """(rank, trial, its costs, what its devices hold, the change's name) of a change that adds
    `added` seconds, ranked by the overflow it removes per added second, the most first; None if it
    removes none of the `over` bytes."""
    trial_held = _held(trial, trial_costs)
    left = overflow_bytes(trial_held)
    if left >= over - 1.0:
        return None
    return (-(over - left) / added, left), trial, trial_costs, trial_held, name


def _relax(graph: Graph, costs: dict[str, StageCost], changed: list[str], cluster: Cluster, opts: LayoutOptions,
           cache: LayoutCache) -> Graph:
    """Undo what the greedy changes made needless: each changed stage, in order, back to the fastest
    layout of its front that still lets every set of devices fit; the reference back on its devices
    if it then fits there."""
    if REFERENCE_MOVE in changed:
        undone = call_text("reference_on_host")
        trial = graph.replace(reference_on_host=False, history=tuple(h for h in graph.history if h != undone))
        trial_costs = _ref_costs(trial, costs, cluster)
        if overflow_bytes(_held(trial, trial_costs)) <= 0:
            graph, costs = trial, trial_costs
    for s in graph.stages:
        if s.name not in changed:
            continue
        for lay, cost in frugal_layouts(graph, s, cluster, opts, cache):
            if cost.seconds >= costs[s.name].seconds - 1e-12:
                break
            trial = graph.with_stages([s.replace(layout=lay)])
            trial_costs = {**costs, s.name: cost}
            if overflow_bytes(_held(trial, trial_costs)) <= 0:
                graph, costs = trial, trial_costs
                break
    return graph


def _held(graph: Graph, costs: dict[str, StageCost]) -> tuple[DeviceMemory, ...]:
    return device_memory(graph, costs, sleeping_engine=sleeping_engine(graph))
