"""The fastest parallel layout for one stage on its device group, within memory.

Given where a stage runs, its layout can be chosen on its own (the other stages' layouts do not
change its time), so the search picks layouts stage by stage and remembers them: the same stage
on a group of the same size is costed once per search. (The weight sync and the context switch
depend on the synced model's generation and training layouts: the search trades those afterwards,
among `alternatives`.) `LayoutOptions` restricts the space, so a baseline can be held to what its
system supports (FSDP only, ZeRO-3 only, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rpeg.graph import Graph, Kind, ParallelLayout, Stage
from rpeg.graph.layout import DEFAULT_LOGITS
from rpeg.graph.verify import layout_problems
from rpeg.hardware.device import Device
from rpeg.hardware.topology import Cluster
from rpeg.perf.cost import StageCost
from rpeg.perf.generation import engine_max_seqs
from rpeg.perf.stages import sleeping_engine_parts, stage_cost


@dataclass(frozen=True, slots=True)
class LayoutOptions:
    """What a system can do. None: anything our model covers."""

    train_tp: tuple[int, ...] | None = None
    train_pp: tuple[int, ...] | None = None
    train_cp: tuple[int, ...] = (1, 2)
    zero: tuple[int, ...] = (1, 3)
    infer_zero: tuple[int, ...] = (0, 3)  # forward passes: whole weights, or FSDP-sharded
    recompute: tuple[str, ...] = ("none", "selective", "full")
    gen_tp: tuple[int, ...] | None = None
    gen_pp: tuple[int, ...] = (1,)
    expert_parallel: bool = True
    sequence_parallel: bool = True
    max_pp: int = 16
    # what one micro-batch of a training or forward pass holds (ParallelLayout.micro_batch, packing)
    micro_batch: int = 1
    packing: bool = True
    # training stages may keep the optimizer state on the host (and, with ZeRO-3, the parameters):
    # tried in a shape only when nothing without offload fits in it (rpeg/perf/offload.py). RPEG's
    # own search turns it on; the peers' baselines keep their systems' defaults (no offload)
    offload: bool = False
    # the path from logits to log-probs of the passes of a model with vocabulary logits (ParallelLayout.logits,
    # rpeg/perf/logits.py): RPEG's own runtime's, or the path a peer's code takes
    logits: str = DEFAULT_LOGITS
    # how a packed pass's bins reach the data-parallel ranks (ParallelLayout.bins, rpeg/perf/packing.py)
    bins: str = "even"
    # the max_num_seqs a system passes to its vLLM engines (ParallelLayout.max_seqs: verl's
    # rollout.max_num_seqs); 0: it passes none, and vLLM's default for the engine and device applies
    # (rpeg/perf/generation.py engine_max_seqs)
    gen_max_seqs: int = 0
    # the engine batches statically (ParallelLayout.static_batch): RPEG's hf engine, where the runtime runs one
    gen_static_batch: bool = False
    # smaller values tried besides it in a partial-rollout plan, whose engines recompute the responses in
    # flight at each weight update, as many as they run at once (perf/generation.py carried_recompute_s):
    # RPEG's own search (RPEG_OPTIONS), whose runtime passes the chosen value to vLLM
    partial_max_seqs: tuple[int, ...] = ()


@dataclass
class LayoutCache:
    """Memo of the best layout per (stage shape, group size); one per search, no global state."""

    best: dict[tuple, tuple[ParallelLayout, StageCost] | None] = field(default_factory=dict)
    shapes: dict[tuple, list[tuple[ParallelLayout, StageCost]]] = field(default_factory=dict)  # each shape that fits
    # every layout that fits alone and is on the time / memory front (memfit.py), when a plan needs them
    frugal: dict[tuple, list[tuple[ParallelLayout, StageCost]]] = field(default_factory=dict)
    evaluated: int = 0


# the engine's max_num_seqs RPEG's search tries for a partial-rollout plan besides vLLM's default
# (perf/generation.py); the peers' baselines keep their systems' engines (LayoutOptions.gen_max_seqs)
GEN_MAX_SEQS = (256,)
# what RPEG's own search may choose: everything the model covers, host offload where nothing else fits, and
# the smaller engines above for partial rollout
RPEG_OPTIONS = LayoutOptions(offload=True, partial_max_seqs=GEN_MAX_SEQS)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(graph: Graph, stage: Stage, devices: int, node: int, opts: LayoutOptions,
               device: Device) -> list[ParallelLayout]:
    spec = graph.model(stage.model).spec
    train = stage.kind is Kind.TRAIN
    infer = stage.kind in (Kind.INFER, Kind.REWARD)
    out = []
    if stage.kind is Kind.GENERATE:
        # inside a node first; engines spanning nodes only when nothing smaller fits (best_layout)
        tps = opts.gen_tp or tuple(d for d in _divisors(devices) if d <= max(node, 1) * 8)
        for tp in tps:
            for pp in opts.gen_pp:
                if devices % (tp * pp):
                    continue
                ep_opts = [1]
                if spec.is_moe and opts.expert_parallel and tp > 1:
                    ep_opts.append(tp)
                for ep in ep_opts:
                    lay = ParallelLayout(dp=devices // (tp * pp), tp=tp, pp=pp, ep=ep, pp_uneven=bool(spec.layers % pp),
                                         max_seqs=opts.gen_max_seqs, static_batch=opts.gen_static_batch)
                    out.append(lay)
                    # with partial rollout the responses in flight at each weight update are recomputed
                    # (perf/generation.py carried_recompute_s), as many as the engine runs at once: a
                    # smaller max_num_seqs than the engine's can pay, where the system can set it
                    if graph.partial_rollout:
                        out += [lay.replace(max_seqs=m) for m in opts.partial_max_seqs
                                if m < engine_max_seqs(lay, device)]
        return out
    tps = opts.train_tp or tuple(d for d in _divisors(min(devices, node)))
    pps = opts.train_pp or tuple(d for d in _divisors(devices) if d <= min(opts.max_pp, spec.layers))
    cps = opts.train_cp if train else (1,)
    zeros = opts.zero if train else opts.infer_zero
    recs = opts.recompute if train else ("none",)
    logits = opts.logits if "lm" in graph.model(stage.model).heads else DEFAULT_LOGITS
    for tp in tps:
        for pp in pps:
            for cp in cps:
                if devices % (tp * pp * cp):
                    continue
                dp = devices // (tp * pp * cp)
                eps = [1]
                if spec.is_moe and opts.expert_parallel:
                    eps = [e for e in _divisors(spec.experts) if (dp * cp * tp) % e == 0 and e <= 64]
                for ep in eps:
                    for zero in zeros:
                        for rec in recs:
                            sp = opts.sequence_parallel and tp > 1 and (train or infer)
                            lay = ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, recompute=rec,
                                                 sequence_parallel=sp, pp_uneven=bool(spec.layers % pp),
                                                 micro_batch=opts.micro_batch, packing=opts.packing, logits=logits,
                                                 bins=opts.bins)
                            out.append(lay)
                            if train and opts.offload:
                                out.append(lay.replace(offload_optimizer=1.0))
                                if zero == 3:
                                    out.append(lay.replace(offload_optimizer=1.0, offload_params=True))
    return out


def offload_level(lay: ParallelLayout) -> int:
    """0 nothing on the host, 1 the optimizer, 2 the parameters too: tried in that order."""
    return 2 if lay.offload_params else (1 if lay.offload_optimizer else 0)


def _key(graph: Graph, stage: Stage, cluster: Cluster, opts: LayoutOptions) -> tuple:
    grp = graph.group(stage.group)
    colocated = any(s.kind is Kind.TRAIN and s.group and graph.group(s.group).overlaps(grp) for s in graph.stages)
    engines = tuple(b for _, b in sleeping_engine_parts(graph, stage)) if stage.kind is not Kind.GENERATE else ()
    # how the engine runs across steps changes a generation stage's cost (perf/generation.py), and one
    # search tries structures with and without it
    mode = ((graph.partial_rollout, graph.in_flight, graph.refill, graph.call_sequences)
            if stage.kind is Kind.GENERATE else ())
    return (graph.job, graph.config, stage.kind, stage.greedy, stage.sequences, stage.passes, stage.microbatches,
            graph.model(stage.model), grp.count, colocated, engines, cluster.name, cluster.gpus, opts, mode)


def best_layout(graph: Graph, stage: Stage, cluster: Cluster, opts: LayoutOptions,
                cache: LayoutCache) -> tuple[ParallelLayout, StageCost] | None:
    """The layout with the least time that fits, or None when none fits."""
    key = _key(graph, stage, cluster, opts)
    if key in cache.best:
        return cache.best[key]
    devices = graph.group(stage.group).count
    best: tuple[ParallelLayout, StageCost] | None = None
    fitting = cache.shapes.setdefault(key, [])
    # Within one shape (tp, pp, cp, ep) the options are tried from the cheapest up - ZeRO-1 before
    # ZeRO-3, no recomputation before selective before full, offload to the host last (the optimizer,
    # then the parameters too) - and the first that fits is kept: a costlier option that also fits is
    # never faster. Offload is so chosen only in a shape where nothing else fits, and wins over
    # the other shapes only where it is faster. Generation tries engines inside a node before
    # engines across nodes, and each engine size (max_num_seqs) it may choose.
    order = {"none": 0, "selective": 1, "full": 2}
    shapes: dict[tuple, list[ParallelLayout]] = {}
    for lay in candidates(graph, stage, devices, cluster.gpus_per_node, opts, cluster.device):
        # an engine's max_num_seqs is a shape of its own: neither size is cheaper than the other
        shapes.setdefault((lay.tp, lay.pp, lay.cp, lay.ep, lay.max_seqs), []).append(lay)
    node = cluster.gpus_per_node
    tiers = [[k for k in shapes if k[0] * k[1] <= node], [k for k in shapes if k[0] * k[1] > node]]
    for tier in tiers:
        for shape in tier:
            for lay in sorted(shapes[shape], key=lambda x: (offload_level(x), x.zero, order[x.recompute])):
                trial = stage.replace(layout=lay)
                if layout_problems(graph, trial):
                    continue
                cost = stage_cost(graph.with_stages([trial]), trial, cluster)
                cache.evaluated += 1
                if not cost.fits or not math.isfinite(cost.seconds):
                    continue
                fitting.append((lay, cost))
                if best is None or cost.seconds < best[1].seconds - 1e-12:
                    best = (lay, cost)
                break
        if best is not None and stage.kind is Kind.GENERATE:
            break
    cache.best[key] = best
    return best


def alternatives(graph: Graph, stage: Stage, cluster: Cluster, opts: LayoutOptions,
                 cache: LayoutCache) -> list[tuple[ParallelLayout, StageCost]]:
    """The stage's other layouts that fit (one per shape), after `best_layout` has run for it."""
    return [(lay, c) for lay, c in cache.shapes.get(_key(graph, stage, cluster, opts), ()) if lay != stage.layout]


def apply_layouts(graph: Graph, cluster: Cluster, opts: LayoutOptions, cache: LayoutCache) -> Graph | None:
    """Every model-running stage at its best layout; None if some stage fits in no layout. Generation
    first: what a sleeping engine keeps on its devices (its NCCL buffers) depends on its layout, and
    the other stages on those devices are costed with it."""
    for gen in (True, False):
        chosen = []
        for s in graph.stages:
            if s.model is None or s.kind is Kind.SYNC or (s.kind is Kind.GENERATE) is not gen:
                continue
            found = best_layout(graph, s, cluster, opts, cache)
            if found is None:
                return None
            chosen.append(s.replace(layout=found[0]))
        graph = graph.with_stages(chosen)
    return graph
