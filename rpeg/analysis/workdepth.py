"""Work–depth analysis of an RL step, after the Foundations paper (arXiv 2608.27046).

Work W is what a stage computes and moves, independent of how many devices share it: FLOPs,
and bytes read from memory in a reference execution (each pass reads the weights once per
micro-batch; generation decodes its sequences as one continuous batch, reading the weights once
per decode iteration and the KV cache of every context token). Depth D is the critical path in
*layer steps* — one layer's computation on a batch — as the plan schedules the stage:

- generation: (1 prefill + the longest response of the batch - 1) x layers (the prefill samples
  the first token, each decode step one more): decoding is sequential in tokens, so the tail of
  the length distribution, not its mean, sets the depth. A multi-turn episode (job.episode) decodes
  only its sampled tokens and prefills each observation before the next reply: (turns prefills + the
  longest episode's sampled tokens - turns) x layers; its tool calls wait in wall seconds, not layer
  steps, so they are reported beside the depth (`wait_s`: turns - 1 calls of the longest episode);
- inference: layers/pp x (micro-batches + pp - 1) (micro-batches of one stage run in sequence on
  its devices; pipeline parallelism overlaps them);
- training: per optimizer step, forward + backward (+ recomputation) over the micro-batches of a
  mini-batch, then the optimizer; times mini-batches and epochs;
- GAE: its recurrence A_t = delta_t + (gamma lambda) A_{t+1} is a linear first-order recurrence, an
  associative scan: log2 of the response length (a few FLOPs per token, not a layer step per
  token); group or batch normalization: log2 of the reduction; rule rewards and weight syncs: 1.

The step's depth is the longest path through the stage DAG; a fused group counts once (its
stages run together per micro-batch), and a streamed edge lets the consumer start after the
producer's first micro-batch. Over several steps, weight-version edges join the steps: with an
async bound k, generation of step t waits only for the weights of step t - k - 1. Each stage also
runs its steps in order (step t + 1 of a stage starts after its step t: one engine, one trainer),
so the depth per step with asynchrony falls at most to the deepest stage's: the Foundations paper's
max{D_G + D_A, D_T} for a rollout (generation and advantages) overlapped with training. When
generation is nearly all of a step's depth, asynchrony shortens the depth by little; what it buys
on real devices is overlap of generation with training on different devices (the simulator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rpeg.graph import Graph, Kind, Stage
from rpeg.passes import bound_asynchrony
from rpeg.perf.flops import expected_forward_flops, expected_generation_flops, expected_train_flops

BYTES_PER_PARAM = 2  # bf16 weights
ADAM_BYTES_PER_PARAM = 16  # fp32 master weights, gradients, two moments: read and written once each step


@dataclass(frozen=True, slots=True)
class StageWorkDepth:
    stage: str
    kind: Kind
    model: str | None
    flops: float
    bytes: float
    depth: float  # layer steps
    wait_s: float = 0.0  # a multi-turn episode's tool calls on the stage's critical path (wall seconds)

    @property
    def parallelism(self) -> float:
        """Average parallelism W/D in FLOPs per layer step."""
        return self.flops / self.depth if self.depth else 0.0


@dataclass(frozen=True, slots=True)
class WorkDepth:
    stages: tuple[StageWorkDepth, ...]
    depth: float  # critical path of one step, layer steps
    critical_path: tuple[str, ...]

    @property
    def flops(self) -> float:
        return sum(s.flops for s in self.stages)

    @property
    def bytes(self) -> float:
        return sum(s.bytes for s in self.stages)

    @property
    def parallelism(self) -> float:
        return self.flops / self.depth if self.depth else 0.0


def work_depth(graph: Graph) -> WorkDepth:
    stages = tuple(_stage(graph, s) for s in graph.stages)
    depth, path = _critical_path(graph, {s.stage: s.depth for s in stages})
    return WorkDepth(stages=stages, depth=depth, critical_path=tuple(path))


def async_depth_table(graph: Graph, ks: tuple[int, ...] = (0, 1, 2, 4), steps: int = 8) -> list[dict]:
    """Depth of `steps` consecutive steps for each async bound k: what asynchrony buys."""
    rows = []
    for k in ks:
        g = bound_asynchrony(graph, k)
        wd = work_depth(g)
        total = multi_step_depth(g, {s.stage: s.depth for s in wd.stages}, steps)
        rows.append({"k": k, "steps": steps, "depth": total, "depth_per_step": total / steps,
                     "step_depth": wd.depth, "parallelism": wd.flops * steps / total})
    return rows


# ---- per stage ---------------------------------------------------------------------------------
def _scalar_head(g: Graph, s: Stage) -> bool:
    """A critic's value head or a reward model's score head (hidden x 1), not the vocabulary's."""
    return "lm" not in g.model(s.model).heads


def _stage(g: Graph, s: Stage) -> StageWorkDepth:
    job = g.job
    n = g.stage_sequences(s)
    field_bytes = sum(g.field_bytes(f) for f in s.reads + s.writes)
    spec = g.model(s.model).spec if s.model else None
    lay = s.layout
    pp = lay.pp if lay else 1
    mb = s.microbatches
    if s.kind is Kind.GENERATE:
        resp = job.response
        flops = n * expected_generation_flops(spec, job.prompt_len, resp)
        longest = resp.expected_max(int(n))
        kv_bytes = spec.kv_elements_per_token() * BYTES_PER_PARAM
        e_r, e_r2 = resp.moments()
        kv_reads = n * (max(0.0, e_r - 1) * job.prompt_len + (e_r2 - e_r) / 2) * kv_bytes  # r - 1 decode steps
        weights = spec.params_total() * BYTES_PER_PARAM
        passes = max(1.0, longest)  # the prefill, then longest - 1 decode steps
        ep, wait = job.episode, 0.0
        if ep is not None and ep.tool_turns > 0:
            # per turn a prefill, then that turn's sampled tokens less one: the episode's sampled share
            sampled = longest * ep.sampled_share(resp.mean)
            passes = max(ep.turns, sampled)
            wait = ep.tool_turns * ep.tool_latency_s
        return StageWorkDepth(s.name, s.kind, s.model, flops, passes * weights + kv_reads + field_bytes,
                              passes * spec.layers, wait)
    if s.kind in (Kind.INFER, Kind.REWARD) and spec is not None:
        flops = n * expected_forward_flops(spec, job.prompt_len, job.response, value_head=_scalar_head(g, s))
        weights = spec.params_total() * BYTES_PER_PARAM
        return StageWorkDepth(s.name, s.kind, s.model, flops, mb * weights + field_bytes,
                              spec.layers / pp * (mb + pp - 1))
    if s.kind is Kind.TRAIN:
        recompute = lay.recompute if lay else "none"
        flops = s.passes * n * expected_train_flops(spec, job.prompt_len, job.response, recompute,
                                                    value_head=_scalar_head(g, s))
        optimizer_steps = s.passes * job.mini_batches
        mb_per_step = max(1, math.ceil(mb / job.mini_batches))
        fwd_bwd = 3 if recompute == "full" else 2
        per_step = fwd_bwd * spec.layers / pp * (mb_per_step + pp - 1) + 1
        weights = spec.params_total()
        traffic = optimizer_steps * (mb_per_step * 3 * weights * BYTES_PER_PARAM + 2 * weights * ADAM_BYTES_PER_PARAM)
        return StageWorkDepth(s.name, s.kind, s.model, flops, traffic + field_bytes, optimizer_steps * per_step)
    if s.kind is Kind.SYNC:
        weights = spec.params_total() * BYTES_PER_PARAM
        return StageWorkDepth(s.name, s.kind, s.model, 0.0, weights, 1.0)
    # rule rewards and compute stages: a few operations per token or per sequence
    tokens = n * job.response.mean
    if s.granularity == "group":
        depth = math.ceil(math.log2(max(job.samples_per_prompt, 2)))
    elif s.granularity == "batch":
        depth = math.ceil(math.log2(max(n, 2)))
    else:
        depth = 1
    if s.kind is Kind.COMPUTE and g.config.adv_estimator == "gae" and "advantages" in s.writes:
        # an associative scan over the longest response's tokens
        depth = math.ceil(math.log2(max(job.response.expected_max(int(n)), 2)))
    return StageWorkDepth(s.name, s.kind, s.model, 10.0 * tokens, field_bytes, float(depth))


# ---- critical paths ------------------------------------------------------------------------------
def _units(g: Graph) -> dict[str, str]:
    """Map each stage to its scheduling unit (its fusion group's first stage, or itself)."""
    unit = {s.name: s.name for s in g.stages}
    for group in g.fusion:
        for s in group:
            unit[s] = group[0]
    return unit


def _step_times(g: Graph, depth: dict[str, float], ready: dict[str, float]) -> dict[str, tuple[float, float]]:
    """(start, finish) of every stage in one step, given the earliest start each may have."""
    unit = _units(g)
    udepth: dict[str, float] = {}
    for s, d in depth.items():
        udepth[unit[s]] = max(udepth.get(unit[s], 0.0), d)
    streams = {(st.producer, st.consumer): st.microbatches for st in g.streams}
    preds = g.step_predecessors()
    times: dict[str, tuple[float, float]] = {}
    for name in g.topo_order(preds):
        u = unit[name]
        d = udepth[u]
        start = ready.get(name, 0.0)
        finish_floor = 0.0
        for p in preds[name]:
            if unit[p] == u:
                continue  # fused: runs in the same pass
            ps, pf = times[p]
            m = streams.get((p, name))
            if m:
                start = max(start, ps + udepth[unit[p]] / m)
                finish_floor = max(finish_floor, pf + d / m)
            else:
                start = max(start, pf)
        # members of a fused group share one start
        for other, (os_, _of) in times.items():
            if unit[other] == u:
                start = max(start, os_)
        times[name] = (start, max(start + d, finish_floor))
    return times


def _critical_path(g: Graph, depth: dict[str, float]) -> tuple[float, list[str]]:
    times = _step_times(g, depth, {})
    end = max(f for _, f in times.values())
    # walk back along the predecessors that determined each start
    # ties go to the earliest stage in builder order (a set's order would change with the hash seed)
    preds = g.step_predecessors()
    order = {s.name: i for i, s in enumerate(g.stages)}
    node = max(times, key=lambda n: times[n][1])
    path = [node]
    while preds[node]:
        node = max(sorted(preds[node], key=order.__getitem__), key=lambda p: times[p][1])
        path.append(node)
    return end, path[::-1]


def multi_step_depth(g: Graph, depth: dict[str, float], steps: int) -> float:
    """Depth of `steps` steps joined by weight-version edges (infinite devices), each stage running its
    steps in order."""
    finish_of: list[dict[str, float]] = []
    wedges = g.weight_edges()
    for t in range(steps):
        ready: dict[str, float] = dict(finish_of[t - 1]) if t else {}  # a stage's step t after its step t - 1
        for e in wedges:
            src_step = t - e.distance
            if e.distance and 0 <= src_step < t:
                ready[e.dst] = max(ready.get(e.dst, 0.0), finish_of[src_step][e.src])
        times = _step_times(g, depth, ready)
        finish_of.append({n: f for n, (_, f) in times.items()})
    return max(max(f.values()) for f in finish_of)
