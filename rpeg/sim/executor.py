"""simulate(plan, cluster, steps): run a planned graph for several steps at micro-batch granularity.

Tasks are (unit, step, micro-batch), a unit being one stage or a fused group. A task starts when
- its data inputs are ready: the whole output of a producer, or for a streamed edge only the
  producer's micro-batches that cover it;
- the weights it reads exist: weight-version edges span 1 + k steps into generation (bounded
  asynchrony), 1 step into everything else that reads a trained model, 0 from training to its sync;
- its own previous micro-batch (and, for the first, its previous step) is done;
- its devices are free. Stages on overlapping device groups take turns; a device switching
  between generation and training first pays half the context switch (offload one side, onload
  the other). Host-side stages (rule rewards, advantage math) hold no devices.
Among startable tasks the earlier step goes first, then the graph's order; a task that waits for
busy devices holds them against later tasks (the rest of a unit's step under way excepted), and
host-side work that takes no time is done at once. Every generation task records the actor
version it sampled with; staleness never exceeds k by construction, and the timeline checks it.
With several steps' prompts in flight (Graph.in_flight = s), a generation task is one step's
share of an engine that never drains: that step's sequences entered s - 1 tasks earlier, with the
version that task started with, which is the version recorded, and the weight edge into
generation spans 1 + k - (s - 1) tasks (perf/step.py `scheduled_distance`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from rpeg.errors import RpegError
from rpeg.graph import Graph, Kind
from rpeg.hardware.topology import Cluster
from rpeg.perf.cost import StageCost
from rpeg.perf.residency import device_memory
from rpeg.perf.stages import stage_cost
from rpeg.perf.step import SWITCH, _context_switch, fused_seconds, scheduled_distance
from rpeg.sim.core import Simulator
from rpeg.sim.timeline import GroupStats, Record, Timeline


@dataclass(eq=False)
class _Task:
    unit: str
    step: int
    mb: int
    seconds: float
    devices: frozenset[int]
    role: str  # engine | trainer | host
    deps: list[_Task] = field(default_factory=list)
    done: bool = False
    started: bool = False
    start: float = 0.0
    end: float = 0.0
    version: int = -1


class _Plan:
    """The static shape of one step: units, their devices, micro-batches and dependencies."""

    def __init__(self, graph: Graph, cluster: Cluster):
        self.graph = graph
        self.costs: dict[str, StageCost] = {s.name: stage_cost(graph, s, cluster) for s in graph.stages}
        bad = [c.stage for c in self.costs.values() if not c.fits or not math.isfinite(c.seconds)]
        if bad:
            raise RpegError(f"the plan does not fit in memory: stage {bad[0]!r} (see `rpeg predict`)")
        switch = _context_switch(graph, cluster)
        # what each set of devices holds, its co-resident models summed (the same account as predict_step)
        self.memory = device_memory(graph, self.costs, sleeping_engine=switch[0] if switch else None)
        over = [m for m in self.memory if not m.fits]
        if over:
            raise RpegError(f"the plan does not fit in memory: {over[0].describe()} (see `rpeg predict`)")
        self.switch_s = switch[1].seconds if switch else 0.0
        self.unit_of = {s.name: s.name for s in graph.stages}
        for grp in graph.fusion:
            for s in grp:
                self.unit_of[s] = "+".join(grp)
        self.units: list[str] = []
        for s in graph.stages:
            if self.unit_of[s.name] not in self.units:
                self.units.append(self.unit_of[s.name])
        self.members = {u: [s for s in graph.stage_names if self.unit_of[s] == u] for u in self.units}
        self.seconds = {u: fused_seconds(graph, tuple(m), self.costs) if len(m) > 1 else self.costs[m[0]].seconds
                        for u, m in self.members.items()}
        self.mbs = {u: max(graph.stage(s).microbatches for s in m) if any(
            (st.producer in m or st.consumer in m) for st in graph.streams) else 1 for u, m in self.members.items()}
        self.kind = {u: graph.stage(m[0]).kind for u, m in self.members.items()}
        self.devices = {u: self._devices(u) for u in self.units}
        self.role = {u: self._role(u) for u in self.units}
        self.streams = {(self.unit_of[st.producer], self.unit_of[st.consumer]) for st in graph.streams}
        preds: dict[str, set[str]] = {u: set() for u in self.units}
        for e in graph.data_edges():
            a, b = self.unit_of[e.src], self.unit_of[e.dst]
            if a != b:
                preds[b].add(a)
        self.preds = preds
        self.weights = [(self.unit_of[e.src], self.unit_of[e.dst], scheduled_distance(graph, e))
                        for e in graph.weight_edges() if self.unit_of[e.src] != self.unit_of[e.dst] or e.distance > 0]
        self.order = {u: i for i, u in enumerate(self.units)}
        self.group_label = {u: self._group_label(u) for u in self.units}

    def _devices(self, unit: str) -> frozenset[int]:
        if self.seconds[unit] <= 0:
            return frozenset()
        g = self.graph
        out: set[int] = set()
        for s in self.members[unit]:
            st = g.stage(s)
            if st.kind is Kind.SYNC:
                for x in g.stages:
                    if x.model == st.model and x.kind in (Kind.TRAIN, Kind.GENERATE) and x.group:
                        out |= set(g.group(x.group).devices)
            elif st.group:
                out |= set(g.group(st.group).devices)
        return frozenset(out)

    def _role(self, unit: str) -> str:
        if not self.devices[unit]:
            return "host"
        kinds = {self.graph.stage(s).kind for s in self.members[unit]}
        if Kind.SYNC in kinds:
            return "sync"
        return "engine" if Kind.GENERATE in kinds else "trainer"

    def _group_label(self, unit: str) -> str:
        groups = sorted({self.graph.stage(s).group or "" for s in self.members[unit]} - {""})
        if self.kind[unit] is Kind.SYNC:
            return "sync"
        return "+".join(groups) or "host"


def simulate(graph: Graph, cluster: Cluster, steps: int = 8) -> Timeline:
    if steps < 1:
        raise RpegError(f"simulate needs at least one step, got {steps}")
    if not graph.groups:
        raise RpegError("the plan places no stage on devices: apply place(...) or colocate(...) first")
    gpus = max(g.first + g.count for g in graph.groups)
    if not cluster.gpus or cluster.gpus < gpus:
        cluster = cluster.with_gpus(gpus)
    plan = _Plan(graph, cluster)
    tasks: dict[tuple[str, int, int], _Task] = {}
    for s in range(steps):
        for u in plan.units:
            m = plan.mbs[u]
            for i in range(m):
                tasks[(u, s, i)] = _Task(u, s, i, plan.seconds[u] / m, plan.devices[u], plan.role[u])
    for (u, s, i), t in tasks.items():
        m = plan.mbs[u]
        if i > 0:
            t.deps.append(tasks[(u, s, i - 1)])
        elif s > 0:
            t.deps.append(tasks[(u, s - 1, m - 1)])
        for p in plan.preds[u]:
            mp = plan.mbs[p]
            need = math.ceil((i + 1) * mp / m) - 1 if (p, u) in plan.streams else mp - 1
            t.deps.append(tasks[(p, s, need)])
        if i == 0:
            for src, dst, dist in plan.weights:
                if dst == u and s - dist >= 0:
                    t.deps.append(tasks[(src, s - dist, plan.mbs[src] - 1)])
    return _run(graph, plan, tasks, steps, cluster)


def _run(graph: Graph, plan: _Plan, tasks: dict, steps: int, cluster: Cluster) -> Timeline:
    sim = Simulator()
    busy_until: dict[int, float] = {}
    role_of: dict[int, str] = {}
    pending = sorted(tasks.values(), key=lambda t: (t.step, plan.order[t.unit], t.mb))
    records: list[Record] = []
    synced = {"version": 0}  # the actor version the engine holds
    gen_units = {u for u in plan.units if plan.kind[u] is Kind.GENERATE}
    admitted: dict[tuple[str, int], int] = {}  # (unit, step) -> the version its generation task started with
    ahead = graph.in_flight - 1  # a step's sequences entered the engine this many generation tasks earlier
    half_switch = plan.switch_s / 2

    class Done:
        def __init__(self, task: _Task):
            self.task = task

        def fire(self, s: Simulator):
            t = self.task
            t.done = True
            if plan.kind[t.unit] is Kind.SYNC and t.mb == plan.mbs[t.unit] - 1:
                synced["version"] = max(synced["version"], t.step + 1)
            return dispatch(s)

    def dispatch(s: Simulator):
        out = []
        claimed: set[int] = set()
        for t in pending:
            if t.started or not all(d.done for d in t.deps):
                continue
            if not t.devices and t.seconds <= 0:  # host-side and instant: done now, so that what it
                t.started = t.done = True        # unblocks competes for devices by priority
                t.start = t.end = s.now
                return out + dispatch(s)
            # devices an earlier task waits for are held against later ones (a weight sync spanning
            # two groups would otherwise starve), except by the rest of a unit's step under way
            if (t.mb == 0 and claimed & t.devices) or any(busy_until.get(d, 0.0) > s.now + 1e-12 for d in t.devices):
                claimed |= t.devices
                continue
            pay = half_switch if (t.role in ("engine", "trainer") and any(
                role_of.get(d, t.role) not in (t.role, "sync") for d in t.devices)) else 0.0
            t.started, t.start = True, s.now + pay
            t.end = t.start + t.seconds
            if t.unit in gen_units:
                admitted.setdefault((t.unit, t.step), synced["version"])
                t.version = admitted[(t.unit, max(0, t.step - ahead))]
            for d in t.devices:
                busy_until[d] = t.end
                if t.role in ("engine", "trainer"):
                    role_of[d] = t.role
            if pay > 0:
                records.extend(Record(unit=SWITCH, kind="switch", step=t.step, microbatch=0,
                                      group=plan.group_label[t.unit], devices=run, start=s.now, end=t.start)
                               for run in _runs(t.devices))
            out.append((t.end, Done(t)))
        pending[:] = [t for t in pending if not t.started]
        return out

    sim.at(0.0, _Kick(dispatch))
    sim.run()
    if any(not t.done for t in tasks.values()):
        stuck = next(t for t in tasks.values() if not t.done)
        raise RpegError(f"simulation deadlocked at {stuck.unit} step {stuck.step}")
    for t in tasks.values():
        members = plan.members[t.unit]
        flops = sum(plan.costs[m].flops for m in members) / plan.mbs[t.unit]
        for run in _runs(t.devices):
            records.append(Record(unit=t.unit, kind=plan.kind[t.unit].value, step=t.step, microbatch=t.mb,
                                  group=plan.group_label[t.unit], devices=run, start=t.start, end=t.end,
                                  flops=flops * run[1] / len(t.devices) if t.devices else flops,
                                  weight_version=t.version))
    records.sort(key=lambda r: (r.start, r.unit))
    timeline = _timeline(graph, plan, tuple(records), steps, cluster)
    details = _episode_details(graph, plan, [t for t in tasks.values() if t.unit in gen_units])
    return dataclasses.replace(timeline, details=details) if details else timeline


def _episode_details(graph: Graph, plan: _Plan, gen_tasks: list) -> tuple[Record, ...]:
    """A multi-turn job's critical episode inside each generation task, as the model prices it: its
    rounds of turns (the engine's work, the stage's seconds less its tool waits, in equal shares) with
    its tool calls between them (the cost's `tool waits (critical path)`, in equal shares). Other
    episodes' turns and waits overlap these (perf/generation.py episode_parts); the runtime's measured
    timeline draws every episode."""
    ep = graph.job.episode
    if ep is None or ep.tool_turns <= 0:
        return ()
    rounds = max(2, ep.rounds)  # a tool turn: at least one call between two turns
    out = []
    for t in gen_tasks:
        waits = sum(dict(plan.costs[m].parts).get("tool waits (critical path)", 0.0)
                    for m in plan.members[t.unit]) / plan.mbs[t.unit]
        seconds = t.end - t.start
        waits = min(waits, seconds)
        turn, wait = (seconds - waits) / rounds, waits / (rounds - 1)
        first, count = min(t.devices, default=0), len(t.devices)
        where = dict(step=t.step, microbatch=t.mb, group=plan.group_label[t.unit], devices=(first, count))
        at = t.start
        for r in range(rounds):
            out.append(Record(unit=f"{t.unit} · critical episode", kind="turn", start=at, end=at + turn,
                              label=f"turn {r + 1} s{t.step}", **where))
            at += turn
            if r < rounds - 1:
                out.append(Record(unit=f"{t.unit} · critical episode", kind="tool", start=at, end=at + wait,
                                  label=f"tool {r + 1} s{t.step}", **where))
                at += wait
    return tuple(sorted(out, key=lambda r: r.start))


def _runs(devices: frozenset[int]) -> list[tuple[int, int]]:
    """(first, count) of each run of consecutive device ids: a record claims only devices the work
    used (a weight sync spans the generation and training groups, not a group between them)."""
    runs: list[tuple[int, int]] = []
    for d in sorted(devices):
        if runs and runs[-1][0] + runs[-1][1] == d:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((d, 1))
    return runs or [(0, 0)]


class _Kick:
    def __init__(self, dispatch):
        self.dispatch = dispatch

    def fire(self, sim: Simulator):
        return self.dispatch(sim)


def _timeline(graph: Graph, plan: _Plan, records: tuple[Record, ...], steps: int, cluster: Cluster) -> Timeline:
    ends = [max(r.end for r in records if r.step == s and r.unit != SWITCH) for s in range(steps)]
    # Steady state: the steps of the second half, less the last one (it drains: nothing follows it
    # to wait for, so its interval is short). Short runs fall back to the mean over all steps.
    if steps >= 4:
        a, b = steps // 2 - 1, steps - 2
        step_s = (ends[b] - ends[a]) / (b - a)
        window = (ends[a], ends[b])
    else:
        step_s = ends[-1] / steps
        window = (0.0, ends[-1])
    span = max(window[1] - window[0], 1e-12)
    peak = cluster.device.bf16_flop_per_s
    groups = {}
    for grp in graph.groups:
        devs = set(grp.devices)
        busy = flops = 0.0
        for r in records:
            if not r.devices[1]:
                continue
            rdevs = set(range(r.devices[0], r.devices[0] + r.devices[1]))
            shared = len(devs & rdevs)
            if not shared:
                continue
            overlap = max(0.0, min(r.end, window[1]) - max(r.start, window[0]))
            busy += overlap * shared
            if r.seconds > 0:
                flops += r.flops * overlap / r.seconds * shared / r.devices[1]
        # the fullest of its devices, every model there summed (rpeg/perf/residency.py)
        mem = max((m.peak_bytes for m in plan.memory
                   if grp.first < m.first + m.count and m.first < grp.first + grp.count), default=0.0)
        frac = min(1.0, busy / (span * grp.count))
        groups[grp.name] = GroupStats(devices=grp.count, busy_fraction=frac,
                                      mfu=flops / (span * grp.count * peak), bubble_s=(1 - frac) * step_s,
                                      peak_memory_bytes=mem)
    all_devs = set().union(*(set(g.devices) for g in graph.groups))
    busy_all = flops_all = 0.0
    for r in records:
        if r.devices[1]:
            overlap = max(0.0, min(r.end, window[1]) - max(r.start, window[0]))
            busy_all += overlap * r.devices[1]
            if r.seconds > 0:
                flops_all += r.flops * overlap / r.seconds
    staleness = max((r.step - r.weight_version for r in records if r.weight_version >= 0), default=0)
    if staleness > graph.async_bound:
        raise AssertionError(f"staleness {staleness} exceeds the async bound {graph.async_bound}")
    job = graph.job
    return Timeline(records=records, steps=steps, step_s=step_s, step_ends=tuple(ends),
                    tokens_per_step=job.sequences * job.mean_seq_len, sequences_per_step=job.sequences,
                    groups=groups, max_staleness=staleness,
                    utilization=min(1.0, busy_all / (span * len(all_devs))),
                    mfu=flops_all / (span * len(all_devs) * peak))
