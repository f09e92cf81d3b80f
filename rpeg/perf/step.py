"""A whole step: every stage's cost, the schedule of one step, and the steady-state step time.

Synchronous plans (k = 0): stages run in dependency order; stages whose device groups overlap
take turns (a colocated plan runs generation, inference and training one after another and pays
a context switch); streamed edges let a consumer start after the producer's first micro-batch.
The step time is the makespan.

Bounded asynchrony (k >= 1): generation of step t + 1 needs only the weights of step t - k, so
stages on disjoint devices overlap across steps. The steady-state step time is the larger of
(a) the busiest device group's work per step (the weight sync counts on both sides: the engine
pauses while new weights arrive) and (b) the dependency cycle generation -> ... -> training ->
sync -> generation, which spans 1 + k steps (1 + k - (s - 1) with s steps' prompts in flight:
`scheduled_distance`). With s > 1 the generation stage's cost is already one step's share of an
engine that never drains (rpeg/perf/generation.py), so (a) is its steady state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rpeg.errors import RpegError
from rpeg.graph import Graph, Kind
from rpeg.hardware.topology import Cluster
from rpeg.perf.cost import StageCost
from rpeg.perf.residency import DeviceMemory, device_memory
from rpeg.perf.stages import stage_cost
from rpeg.perf.weightsync import context_switch_cost

SWITCH = "context_switch"


@dataclass(frozen=True, slots=True)
class StepPrediction:
    step_s: float
    stages: dict[str, StageCost]
    schedule: dict[str, tuple[float, float]]  # one synchronous step: stage -> (start, end)
    group_busy_s: dict[str, float]
    bottleneck: str
    sequences: float
    tokens: float  # prompt + response tokens per step
    gpus: int
    notes: tuple[str, ...] = field(default=())
    # what each set of devices holds at its peak, every model on it summed (rpeg/perf/residency.py)
    memory: tuple[DeviceMemory, ...] = field(default=())

    @property
    def fits(self) -> bool:
        """Every stage fits alone and every set of devices fits with its co-resident models summed."""
        return all(c.fits for c in self.stages.values()) and all(m.fits for m in self.memory)

    @property
    def oom(self) -> list[DeviceMemory]:
        """The sets of devices that overflow, each naming its groups, the stage at its peak and every
        model's lines (a stage that overflows alone overflows its devices too)."""
        return [m for m in self.memory if not m.fits]

    @property
    def peak_memory_bytes(self) -> float:
        """The most any device holds at any time of the step (the per-device sums)."""
        return max((m.peak_bytes for m in self.memory), default=0.0)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens / self.step_s / self.gpus if self.step_s > 0 else 0.0


SHARING_ROUNDS = 4  # fixed-point rounds of the shared-cores model: busy fractions settle within a few


def predict_step(graph: Graph, cluster: Cluster) -> StepPrediction:
    if not graph.groups:
        raise RpegError("the plan places no stage on devices: apply place(...) or colocate(...) first")
    gpus = max(g.first + g.count for g in graph.groups)
    cluster = cluster.with_gpus(gpus) if not cluster.gpus or cluster.gpus < gpus else cluster
    costs = {s.name: stage_cost(graph, s, cluster) for s in graph.stages}
    switch = _context_switch(graph, cluster)
    pred = _step(graph, costs, switch, gpus)
    if len(cluster.sharing) >= gpus > 1 and len({s.group for s in graph.stages if s.group}) > 1:
        # devices sharing one machine's cores (cpu-local as D devices): a stage runs at the rate one
        # device has while as many devices are busy as, on average, run beside it (its own group's,
        # and each other group's devices for the share of the step that group is busy), not as if all
        # D always were; a fixed point over the step's busy fractions
        for _ in range(SHARING_ROUNDS):
            costs = {s.name: stage_cost(graph, s, _sharing_at(cluster, _busy_beside(graph, s, pred)))
                     for s in graph.stages}
            pred = _step(graph, costs, switch, gpus)
    held = device_memory(graph, pred.stages, sleeping_engine=switch[0] if switch else None)
    return dataclasses.replace(pred, memory=held)


def _step(graph: Graph, costs: dict[str, StageCost], switch, gpus: int) -> StepPrediction:
    costs = dict(costs)
    if switch is not None:
        costs[SWITCH] = switch[1]
    schedule = _schedule(graph, costs, switch[0] if switch else None)
    makespan = max(end for _, end in schedule.values())
    busy = _group_busy(graph, costs)
    if graph.async_bound == 0:
        step_s = makespan
        bottleneck = "the dependency chain of one step (synchronous)"
    else:
        group, load = max(busy.items(), key=lambda kv: kv[1])
        cycle, label = weight_cycle(graph, schedule, costs)
        step_s = max(load, cycle)
        bottleneck = f"device group {group!r} ({load:.1f} s of work per step)" if load >= cycle else label
    job = graph.job
    return StepPrediction(step_s=step_s, stages=costs, schedule=schedule, group_busy_s=busy, bottleneck=bottleneck,
                          sequences=job.sequences, tokens=job.sequences * job.mean_seq_len, gpus=gpus)


def scheduled_distance(graph: Graph, edge) -> int:
    """The steps a weight edge spans between the tasks that price one step's work. With in_flight = s
    steps' prompts in flight (rpeg/passes/asynchrony.py) a step's sequences enter the engine s - 1
    steps of engine time before the step that is charged their cost ends them: its first admission
    needs the weights of step t - k, which is the generation task of step t reading what was written
    1 + k - (s - 1) steps before it. Every other edge: its own distance."""
    if graph.in_flight > 1 and graph.stage(edge.dst).kind is Kind.GENERATE:
        return edge.distance - (graph.in_flight - 1)
    return edge.distance


def weight_cycle(graph: Graph, schedule: dict[str, tuple[float, float]],
                 costs: dict[str, StageCost]) -> tuple[float, str]:
    """The longest weight cycle per step: for every stage that reads a trained model's weights
    (Graph.weight_edges: the writer, training or its sync, at step t; the reader at step t + d), the
    reader's step t + d cannot start before the writer's step t ends, so d steps take at least the
    path from the reader's start to the writer's end in one step's schedule (the paper's
    max{D_G + D_A, D_T} for generation; a critic whose forward reads the weights its own update
    writes at distance 1 closes a one-step cycle whatever the generation's bound; with several steps'
    prompts in flight, generation's distance is `scheduled_distance`). A streamed
    reader's span in one step's schedule is stretched by its producer; on the cycle it counts from
    where its own work would start, its end less its duration."""
    fused = {n: g for g in graph.fusion for n in g}
    best, label = 0.0, ""
    for e in graph.weight_edges():
        e = dataclasses.replace(e, distance=scheduled_distance(graph, e))
        if e.distance < 1 or e.src not in schedule or e.dst not in schedule:
            continue
        members = fused.get(e.dst, (e.dst,))
        own = fused_seconds(graph, members, costs) if len(members) > 1 else costs[e.dst].seconds
        start = max(schedule[e.dst][0], schedule[e.dst][1] - own)
        path = schedule[e.src][1] - start
        if path / e.distance > best:
            best = path / e.distance
            label = (f"the {e.dst} -> ... -> {e.src} cycle of {e.model}'s weights over {e.distance} step"
                     f"{'s' if e.distance > 1 else ''}")
    return best, label


def _busy_beside(graph: Graph, stage, pred: StepPrediction) -> float:
    """How many of the machine's devices are busy, on average, while `stage` runs: its own group's,
    and every group on other devices for the share of the step it is busy."""
    if stage.group is None:
        return 1.0
    mine = graph.group(stage.group)
    busy = float(mine.count)
    for name, seconds in pred.group_busy_s.items():
        other = graph.group(name)
        if not other.overlaps(mine) and pred.step_s > 0:
            busy += other.count * min(1.0, seconds / pred.step_s)
    return busy


def _sharing_at(cluster: Cluster, busy: float) -> Cluster:
    """The cluster with its device as measured while `busy` of the machine's devices run, between
    the calibrations for the whole numbers around it (rates, bandwidths and per-call and per-token
    times interpolated; memory, links and the distributed-stack figures stay the plan's own)."""
    k = min(max(busy, 1.0), float(len(cluster.sharing)))
    lo, hi = cluster.sharing[int(k) - 1], cluster.sharing[min(int(k), len(cluster.sharing) - 1)]
    w = k - int(k)
    mix = {f: (1 - w) * getattr(lo, f) + w * getattr(hi, f)
           for f in ("bf16_flop_per_s", "fp16_flop_per_s", "hbm_bandwidth_bytes_per_s")}
    for f in ("layer_host_s", "layer_token_s"):  # measured in every calibration, or in none
        a, b = getattr(lo, f), getattr(hi, f)
        mix[f] = (1 - w) * a + w * b if a > 0 and b > 0 else getattr(cluster.device, f)
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, **mix))


def fused_seconds(graph: Graph, group: tuple[str, ...], costs: dict[str, StageCost]) -> float:
    """Seconds of a fused group: its stages share one pass over the same micro-batches.

    An inference stage fused with generation of the same model and weight version costs nothing
    more (the engine returns the sampled tokens' logprobs as it samples). Otherwise the members'
    work adds up, less what each loses to pipeline bubbles (the fused schedule fills one
    member's bubble with another's work, as in RLHFuse), and never less than the longest member.
    """
    stages = [graph.stage(n) for n in group]
    gen = next((s for s in stages if s.kind is Kind.GENERATE), None)
    total, longest = 0.0, 0.0
    for s in stages:
        c = costs[s.name]
        if gen is not None and s.kind is Kind.INFER and s.model == gen.model and s.lag == gen.lag:
            continue
        total += c.seconds - c.part("pipeline bubble")
        longest = max(longest, c.seconds)
    return max(total, longest)


def _context_switch(graph: Graph, cluster: Cluster | None = None) -> tuple[str, StageCost] | None:
    """A colocated plan (generation sharing devices with training) switches twice per step."""
    train = next((s for s in graph.stages if s.kind is Kind.TRAIN and s.model == "actor"), None)
    gen = next((s for s in graph.stages if s.kind is Kind.GENERATE), None)
    if train is None or gen is None or train.layout is None:
        return None
    if not graph.group(train.group).overlaps(graph.group(gen.group)):
        return None
    return gen.name, context_switch_cost(SWITCH, graph.model("actor").spec, train.layout, gen.layout,
                                         cluster.device if cluster is not None else None,
                                         graph.model("actor").lora)


def _devices(graph: Graph, name: str) -> set[int]:
    s = graph.stage(name)
    if s.kind is Kind.SYNC:  # spans the training and generation groups it connects
        groups = {x.group for x in graph.stages if x.model == s.model and x.kind in (Kind.TRAIN, Kind.GENERATE)}
        return {d for g in groups if g for d in graph.group(g).devices}
    return set(graph.group(s.group).devices) if s.group else set()


def _schedule(graph: Graph, costs: dict[str, StageCost], switch_after: str | None) -> dict[str, tuple[float, float]]:
    """List-schedule one step: dependency order, devices shared in turn, fused stages together."""
    preds = graph.step_predecessors()
    streams = {(st.producer, st.consumer): st.microbatches for st in graph.streams}
    fused = {n: g for g in graph.fusion for n in g}
    free: dict[int, float] = {}
    times: dict[str, tuple[float, float]] = {}
    order = graph.topo_order(preds)
    for name in order:
        if name in times:
            continue
        members = fused.get(name, (name,))
        start, floor = 0.0, 0.0
        for m in members:
            for p in preds[m]:
                if p in members:
                    continue
                ps, pf = times[p]
                k = streams.get((p, m))
                if k:
                    start = max(start, ps + (pf - ps) / k)
                    floor = max(floor, pf + costs[m].seconds / k)
                else:
                    start = max(start, pf)
        dur = fused_seconds(graph, members, costs) if len(members) > 1 else costs[name].seconds
        # host-side stages (rule rewards, advantage math) cost nothing on the devices and hold none
        devs = set().union(*(_devices(graph, m) for m in members)) if dur > 0 else set()
        start = max([start] + [free.get(d, 0.0) for d in devs])
        end = max(start + dur, floor)
        for m in members:
            times[m] = (start, end)
        for d in devs:
            free[d] = end
        if switch_after in members and SWITCH in costs:
            s_end = end + costs[SWITCH].seconds
            times[SWITCH] = (end, s_end)
            for d in devs:
                free[d] = s_end
    return times


def _group_busy(graph: Graph, costs: dict[str, StageCost]) -> dict[str, float]:
    busy: dict[str, float] = {}
    units: dict[tuple[str, ...], float] = {}
    for s in graph.stages:
        group = graph.fusion_group_of(s.name) or (s.name,)
        if group not in units:
            units[group] = fused_seconds(graph, group, costs) if len(group) > 1 else costs[s.name].seconds
    for grp in graph.groups:
        devs = set(grp.devices)
        total = 0.0
        for members, seconds in units.items():
            if any(_devices(graph, m) & devs for m in members):
                total += seconds
        if SWITCH in costs:
            gen = next(s for s in graph.stages if s.kind is Kind.GENERATE)
            if set(graph.group(gen.group).devices) & devs:
                total += costs[SWITCH].seconds
        busy[grp.name] = total
    return busy
