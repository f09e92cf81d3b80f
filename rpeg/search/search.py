"""search(job, cluster, gpus): the fastest (or cheapest) feasible plan, and the peers' plans.

One joint search over structure (async bound, sharing, fusion, streaming), placement, and
per-stage layout (DP/TP/PP/CP/EP, ZeRO, recomputation) within memory. Layouts are chosen per
stage and remembered (layouts.py); a placement is skipped when a lower bound on its step time
(every group's FLOPs at its devices' achievable peak) cannot beat the best plan found. The
enumeration order is fixed and ties break on the choice's own order, so a search is
deterministic. Ranking uses the analytic step prediction; the winners and the baselines are then
simulated for their timelines.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from rpeg.errors import DoesNotFit, PassRefused, RpegError
from rpeg.graph import Graph, Kind, verify
from rpeg.hardware.topology import Cluster
from rpeg.passes.base import call_text
from rpeg.perf.efficiency import gemm_efficiency
from rpeg.perf.flops import expected_forward_flops, expected_generation_flops, expected_train_flops
from rpeg.perf.stages import stage_cost
from rpeg.perf.step import StepPrediction, _context_switch, predict_step
from rpeg.search.layouts import RPEG_OPTIONS, LayoutCache, LayoutOptions, alternatives, apply_layouts
from rpeg.search.memfit import fit_together, reference_to_host
from rpeg.search.space import (Placement, SpaceOptions, Structure, apply_execution, apply_structure, placements,
                               structures)

OBJECTIVES = ("time", "throughput", "cost")


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    graph: Graph
    prediction: StepPrediction
    gpus: int
    structure: Structure | None = None
    placement: Placement | None = None

    @property
    def step_s(self) -> float:
        return self.prediction.step_s

    def cost_usd(self, cluster: Cluster) -> float:
        return cluster.usd(self.gpus, self.step_s)


@dataclass
class SearchResult:
    ranked: list[Candidate]
    objective: str
    evaluated: int = 0
    pruned: int = 0
    layouts_costed: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> Candidate:
        return self.ranked[0]


def objective_value(c: Candidate, objective: str, cluster: Cluster) -> float:
    if objective == "cost":  # dollars per step; GPU-seconds per step when no price is published
        return c.cost_usd(cluster) if cluster.gpu_hour_usd else c.gpus * c.step_s
    return c.step_s  # time, and throughput (the job's tokens per step are fixed)


def stage_flops(graph: Graph, stage) -> float:
    """A stage's FLOPs per step (no recomputation): what no layout can avoid."""
    if stage.model is None or stage.kind is Kind.SYNC:
        return 0.0
    spec = graph.model(stage.model).spec
    n = graph.stage_sequences(stage)
    job = graph.job
    scalar = "lm" not in graph.model(stage.model).heads  # a value or score head, not the vocabulary's
    if stage.kind is Kind.TRAIN:
        return stage.passes * n * expected_train_flops(spec, job.prompt_len, job.response, value_head=scalar)
    if stage.kind is Kind.GENERATE:
        return n * expected_generation_flops(spec, job.prompt_len, job.response)
    return n * expected_forward_flops(spec, job.prompt_len, job.response, value_head=scalar)


def _lower_bound(graph: Graph, cluster: Cluster, flops: dict[str, float]) -> float:
    """No step is faster than its busiest group's FLOPs at the devices' achievable peak."""
    rate = cluster.device.bf16_flop_per_s * gemm_efficiency(cluster.device)
    best = 0.0
    for grp in graph.groups:
        work = sum(flops[s.name] for s in graph.stages if s.group == grp.name)
        best = max(best, work / (grp.count * rate))
    return best


def _sync_and_switch_s(graph: Graph, cluster: Cluster) -> float:
    """Seconds of a plan's weight syncs and context switch per step."""
    switch = _context_switch(graph, cluster)
    return (sum(stage_cost(graph, s, cluster).seconds for s in graph.stages if s.kind is Kind.SYNC)
            + (switch[1].seconds if switch else 0.0))


def _trade_for_sync(graph: Graph, cluster: Cluster, pred: StepPrediction, options: LayoutOptions,
                    cache: LayoutCache, bar_s: float = math.inf) -> tuple[Graph, StepPrediction]:
    """Layouts are chosen stage by stage, but the weight sync and the context switch depend on the
    generation and training layouts of the synced model (how many shards send, what is
    offloaded): a slower trainer with more senders can make a faster step. Try those stages'
    other fitting layouts (one per shape) whose sync and switch are cheaper than those of every
    faster layout (where one overflows with the models it shares devices with, the reference goes
    to the host or the others' layouts are traded for memory as the first fit does); keep the
    fastest step. The stages themselves are at their fastest already, so a layout gains at most
    what it saves on the sync and switch: one that cannot bring the step under `bar_s` is not
    costed."""
    synced = {s.model for s in graph.stages if s.kind is Kind.SYNC}
    for stage in [s for s in graph.stages if s.model in synced and s.kind in (Kind.GENERATE, Kind.TRAIN)]:
        now = floor = _sync_and_switch_s(graph, cluster)
        trials = []
        for lay, cost in alternatives(graph, stage, cluster, options, cache):
            trial = graph.with_stages([graph.stage(stage.name).replace(layout=lay)])
            trials.append((cost.seconds, _sync_and_switch_s(trial, cluster), trial))
        for _, overhead, trial in sorted(trials, key=lambda x: x[:2]):
            if overhead >= floor - 1e-12:
                continue
            floor = overhead
            if pred.step_s - (now - overhead) >= min(bar_s, pred.step_s):
                continue
            p = predict_step(trial, cluster)
            if _overflows_together(p):
                # a cheaper sync from a layout that overflows with the co-resident models: the reference
                # on the host or the other stages' layouts may make room (memfit.py), at a cost the
                # prediction weighs
                made = [t for t in (reference_to_host(trial, options), fit_together(trial, cluster, options, cache))
                        if t is not None]
                fitting = [(q.step_s, i, t, q) for i, t in enumerate(made) for q in [predict_step(t, cluster)]
                           if q.fits]
                if not fitting:
                    continue
                _, _, trial, p = min(fitting, key=lambda x: x[:2])
            if p.fits and p.step_s < pred.step_s - 1e-12:
                graph, pred = trial, p
    return graph, pred


def _overflows_together(pred: StepPrediction) -> bool:
    """Every stage fits alone, but the models sharing devices, summed, do not (residency.py): what
    memfit.py can trade speed for."""
    return pred.oom and all(c.fits for c in pred.stages.values())


def _finish(graph: Graph) -> Graph:
    calls = tuple(call_text("parallelize", stage=s.name, layout=s.layout.describe())
                  for s in graph.stages if s.layout is not None)
    return verify(graph.replace(history=graph.history + calls), "search")


def search(graph: Graph, cluster: Cluster, gpus: int, *, objective: str = "time", max_staleness: int = 1,
           options: LayoutOptions = RPEG_OPTIONS, budget: int = 20000, keep: int = 5,
           cache: LayoutCache | None = None, space: SpaceOptions = SpaceOptions()) -> SearchResult:
    """`graph`: the algorithm's graph before execution passes. `budget`: candidates to evaluate at most."""
    if objective not in OBJECTIVES:
        raise RpegError(f"unknown objective {objective!r} ({', '.join(OBJECTIVES)})")
    if max_staleness < 0:
        raise RpegError(f"max staleness must be >= 0, got {max_staleness}")
    if graph.groups or graph.fusion or graph.streams:
        raise RpegError("search starts from the algorithm's graph: remove placement, fusion and streaming passes")
    t0 = time.perf_counter()
    cache = cache or LayoutCache()
    result = SearchResult(ranked=[], objective=objective)
    counts = [gpus] if objective != "cost" else sorted({gpus, max(1, gpus // 2), max(1, gpus // 4)}, reverse=True)
    found: list[tuple[float, tuple, Candidate]] = []
    for n in counts:
        sized = cluster.with_gpus(n) if not cluster.gpus or cluster.gpus != n else cluster
        for st in structures(graph, max_staleness, space):
            try:
                base = apply_structure(graph, st)
            except PassRefused:
                continue
            flops = {s.name: stage_flops(base, s) for s in base.stages}
            for pl in placements(base, n, sized.gpus_per_node, space):
                if result.evaluated >= budget:
                    result.notes.append(f"stopped at the budget of {budget} candidates")
                    break
                try:
                    g = apply_execution(base, st, pl)
                except PassRefused:
                    continue  # an illegal combination (fusion across groups, streaming a whole-batch consumer)
                result.evaluated += 1
                scale = (sized.usd(n, 1.0) if objective == "cost" and sized.gpu_hour_usd
                         else (n if objective == "cost" else 1))
                if found:
                    best_obj = found[0][0]
                    lb = _lower_bound(g, sized, flops)
                    if lb * scale >= best_obj:
                        result.pruned += 1
                        continue
                g = apply_layouts(g, sized, options, cache)
                if g is None:
                    continue
                pred = predict_step(g, sized)
                if _overflows_together(pred):
                    # the models sharing devices, summed, overflow them: trade speed for memory (memfit.py),
                    # unless even the stages at their fastest alone, less every sync and switch (all the
                    # trade for the sync below can win back), cannot beat the best plan found
                    if found and (pred.step_s - _sync_and_switch_s(g, sized)) * scale >= found[0][0]:
                        result.pruned += 1
                        continue
                    g = fit_together(g, sized, options, cache)
                    if g is None:
                        continue
                    pred = predict_step(g, sized)
                if not pred.fits or not math.isfinite(pred.step_s):
                    continue
                bar_s = found[0][0] / scale if found else math.inf  # the best plan's objective, in seconds here
                g, pred = _trade_for_sync(g, sized, pred, options, cache, bar_s)
                cand = Candidate(name=f"rpeg: {pl.name}, {st.describe()}", graph=g, prediction=pred, gpus=n,
                                 structure=st, placement=pl)
                found.append((objective_value(cand, objective, sized), (n, st, pl), cand))
                found.sort(key=lambda x: (x[0], x[1]))
                del found[keep:]
    result.ranked = [c for _, _, c in found]
    result.ranked = [Candidate(c.name, _finish(c.graph), c.prediction, c.gpus, c.structure, c.placement)
                     for c in result.ranked]
    result.layouts_costed = cache.evaluated
    result.seconds = time.perf_counter() - t0
    if not result.ranked:
        raise NoFeasiblePlan(graph, cluster, gpus)
    return result


class NoFeasiblePlan(DoesNotFit):
    def __init__(self, graph: Graph, cluster: Cluster, gpus: int):
        self.graph, self.cluster, self.gpus = graph, cluster, gpus
        big = max((graph.model(s.model).spec for s in graph.stages if s.model), key=lambda m: m.params_total())
        super().__init__(f"no plan of {graph.algorithm} with {big.name} fits {gpus} x {cluster.device.name} "
                         f"({cluster.device.hbm_capacity_bytes / 1e9:.0f} GB each)")


def nearest_feasible(graph: Graph, cluster: Cluster, gpus: int,
                     options: LayoutOptions = RPEG_OPTIONS,
                     max_staleness: int = 1, space: SpaceOptions = SpaceOptions()) -> tuple[str, SearchResult] | None:
    """The first of: more GPUs (2x, 4x, 8x), a smaller batch (half, quarter of the prompts)."""
    node = cluster.gpus_per_node
    for factor in (2, 4, 8):
        n = max(gpus * factor, node)
        if cluster.gpus and n > cluster.gpus:
            break
        try:
            return f"{n} GPUs instead of {gpus}", search(graph, cluster, n, max_staleness=max_staleness,
                                                          options=options, budget=400, space=space)
        except DoesNotFit:
            continue
    for div in (2, 4):
        prompts = graph.job.prompts // div
        if prompts < 1:
            break
        smaller = graph.replace(job=graph.job.replace(prompts=prompts,
                                                      mini_batches=min(graph.job.mini_batches, prompts)))
        stages = tuple(s for s in smaller.stages)
        try:
            return (f"{prompts} prompts per step instead of {graph.job.prompts}",
                    search(verify(smaller.replace(stages=stages)), cluster, gpus, max_staleness=max_staleness,
                           options=options, budget=400, space=space))
        except DoesNotFit:
            continue
    return None

