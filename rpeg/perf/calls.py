"""The cost of generation reached in serial calls of a few sequences (`Graph.call_sequences`).

`rpeg.passes.calls.serial_calls` says why a system's engine sees only one caller's micro-batch
at a time (OpenRLHF v0.2: each actor rank sends its `micro_rollout_batch_size` prompts to engine
`rank % engines` and waits; the engine serves one call at a time). The engine is then a
continuous-batching engine (rpeg/perf/generation.py) run once per call: each call of c sequences
prefills its prompts and decodes until its own longest response is done, and the calls follow one
another. The engine costed is the one the step waits for, holding the batch's longest response
(`critical_lengths`), with its sequences cut into calls in the interleaved order a batch arrives in.

Its breakdown line is what the calls add to the same engine given its whole share at once:
"generate calls of c sequences, one at a time" = (the calls' time) - (the engine's time), so the
other lines stay those of rpeg/perf/generation.py.
"""

from __future__ import annotations

import dataclasses
import math

from rpeg.graph.layout import ParallelLayout
from rpeg.graph.model import ModelSpec
from rpeg.hardware.topology import Cluster
from rpeg.perf import memory
from rpeg.perf.cost import StageCost
from rpeg.perf.efficiency import KV_MEMORY_UTILIZATION, KV_MEMORY_UTILIZATION_COLOCATED
from rpeg.perf.generation import (SIM_SEQUENCES, TIME_PARTS, GenWorkload, critical_lengths, engine_layout,
                                  simulate_instance)


def serial_calls_s(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, work: GenWorkload, call: int,
                   colocated: bool = False) -> float:
    """Seconds the step waits for an engine that serves its share in calls of `call` sequences, one at a time."""
    n = max(1, math.ceil(work.sequences / layout.dp))
    sim_n = min(n, SIM_SEQUENCES)
    util = (KV_MEMORY_UTILIZATION_COLOCATED if colocated else KV_MEMORY_UTILIZATION).value
    typical = work.prompt_len + work.response.moments()[0]
    capacity = memory.kv_capacity_tokens(spec, engine_layout(spec, layout), cluster.device.hbm_capacity_bytes,
                                         memory_utilization=util, context=typical)
    lengths = critical_lengths(work.response, sim_n, work.sequences)
    total = 0.0
    for first in range(0, sim_n, call):
        chunk = lengths[first:first + call]
        sim = simulate_instance(spec, layout, cluster, n=len(chunk), prompt=work.prompt_len, lengths=chunk,
                                capacity_tokens=capacity, dtype=work.dtype)
        total += sum(sim[k] for k in TIME_PARTS)
    return total * n / sim_n


def with_serial_calls(cost: StageCost, spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, work: GenWorkload,
                      call: int, colocated: bool = False) -> StageCost:
    """`cost` (the engine given its whole share at once) with the serial calls' extra time as its own line."""
    if not cost.fits or call <= 0:
        return cost
    extra = max(0.0, serial_calls_s(spec, layout, cluster, work, call, colocated) - cost.seconds)
    label = f"generate calls of {call} sequences, one at a time"
    return dataclasses.replace(cost, seconds=cost.seconds + extra, overhead_s=cost.overhead_s + extra,
                               parts=cost.parts + ((label, extra),))


__all__ = ["serial_calls_s", "with_serial_calls"]
