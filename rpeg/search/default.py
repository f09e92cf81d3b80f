"""A simple, explainable default plan: everything colocated, the smallest tensor parallelism that
fits each model in memory, data parallelism over the rest; then, where the colocated models summed
overflow the devices (rpeg/perf/residency.py), the planner's trades of speed for memory (ZeRO-3,
offload, more model parallelism: search/memfit.py), each written as a `parallelize` call.

This is what `rpeg predict` uses when a job file places nothing; the planner searches far more
(placement splits, asynchrony, pipeline and expert parallelism) and should beat it.
"""

from __future__ import annotations

import dataclasses

from rpeg.errors import DoesNotFit
from rpeg.graph import Graph, Kind, Stage
from rpeg.graph.layout import ParallelLayout
from rpeg.hardware.topology import Cluster
from rpeg.passes import colocate, parallelize
from rpeg.perf import memory
from rpeg.search.layouts import RPEG_OPTIONS, LayoutCache
from rpeg.search.memfit import fit_together


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _fits(graph: Graph, stage: Stage, lay: ParallelLayout, capacity: float) -> bool:
    spec = graph.model(stage.model).spec
    job = graph.job
    if stage.kind is Kind.TRAIN:
        mem = memory.training_memory(spec, lay, seq_len=job.max_seq_len, micro_batch=1,
                                     lora=graph.model(stage.model).lora)
        return mem.total <= capacity
    weights = memory.weight_bytes_per_device(spec, lay.replace(ep=lay.tp) if spec.is_moe and lay.tp > 1 else lay)
    return weights <= 0.5 * capacity


def default_plan(graph: Graph, cluster: Cluster, gpus: int) -> Graph:
    g = colocate(graph, gpus)
    capacity = cluster.device.hbm_capacity_bytes
    node = min(cluster.gpus_per_node, gpus)
    for s in g.stages:
        if s.model is None or s.kind is Kind.SYNC:
            continue
        spec = g.model(s.model).spec
        chosen = None
        for pp in [p for p in _divisors(spec.layers) if gpus % p == 0]:
            for tp in [t for t in _divisors(node) if (gpus // pp) % t == 0]:
                if spec.heads % tp or (spec.attention != "mla" and spec.kv_heads % tp and tp % spec.kv_heads):
                    continue
                extra = {"zero": 1, "recompute": "full"} if s.kind is Kind.TRAIN else {}
                lay = ParallelLayout(dp=gpus // (tp * pp), tp=tp, pp=pp, sequence_parallel=tp > 1 and s.kind is Kind.TRAIN,
                                     **extra)
                if lay.dp <= g.stage_sequences(s) and _fits(g, s, lay, capacity):
                    chosen = lay
                    break
            if chosen:
                break
        if chosen is None:
            raise DoesNotFit(f"no layout of {spec.name} fits {gpus} x {cluster.device.name} for stage {s.name!r}: "
                            "use more GPUs or a larger device")
        g = parallelize(g, s.name, dp=chosen.dp, tp=chosen.tp, pp=chosen.pp, zero=chosen.zero,
                        recompute=chosen.recompute, sequence_parallel=chosen.sequence_parallel)
    sized = cluster.with_gpus(gpus) if not cluster.gpus or cluster.gpus < gpus else cluster
    fitted = fit_together(g, sized, RPEG_OPTIONS, LayoutCache())
    for s in fitted.stages if fitted is not None else ():  # None: nothing fits together; predict says why
        if s.layout != g.stage(s.name).layout:
            g = parallelize(g, s.name, **{f.name: getattr(s.layout, f.name) for f in dataclasses.fields(s.layout)})
    return g
