"""What each device holds over a whole step: the models that share it, summed.

A stage's own StageCost says what that stage needs while it runs (rpeg/perf/memory.py,
rpeg/perf/generation.py). Devices shared by several stages hold more than any one of them: the
models that live there stay in memory while the other stages run, unless the plan moves them out
(and pays for the move). This module sums them, per set of devices that hold the same stages:

  held while unit u runs = what stays resident across the step (less what u's phase moves out)
                           + what u itself needs only while it runs (its transient),

and the devices' peak is the largest over the units (a stage, or the stages fused into one
schedule) that run there: the stages on shared devices take turns (rpeg/perf/step.py), so their
transients never overlap, but the resident state of every model is under all of them.

What stays resident, and why (how the peers hold models on shared GPUs):

- A model trained on the devices keeps its trainer state there: bf16 weights, the optimizer's fp32
  master weights and moments, as sharded and as offloaded as its layout says (the TRAIN stage's
  `weights` and `optimizer` lines). verl's colocated worker keeps each FSDP model's parameters and
  optimizer state on the GPU unless `fsdp_config.param_offload` / `optimizer_offload` is set
  (workers/fsdp_workers.py offloads after a phase only under those flags); OpenRLHF's actor and
  critic DeepSpeed engines stay on the GPUs unless `--ds.enable_sleep` (older
  `--deepspeed_enable_sleep`) calls DeepSpeed's offload_states; NeMo-RL's Megatron policy moves its
  state out only for the refit around generation (offload_optimizer_for_refit; rpeg/perf/offload.py)
  and keeps its reference on the host (rpeg/passes/reference.py). Gradients: Megatron's
  distributed optimizer and DeepSpeed ZeRO-1/2 keep their gradient buffers allocated between steps
  (Megatron-Core's param_and_grad_buffer is freed only by an explicit offload_to_cpu), so with
  zero < 3 they stay; FSDP (zero = 3) frees them after the optimizer step
  (zero_grad(set_to_none=True)), so there they are a transient of the training stage.
- A frozen model whose stage runs there (reference, reward, or a trained model's forward pass on
  devices that do not train it) keeps its weights: verl's reference worker unless
  `ref.fsdp_config.param_offload`, OpenRLHF's reference and reward models unless
  `--ref_reward_offload`. A forward pass of a model trained on the same devices borrows the
  trainer's weights (verl's compute_log_prob and compute_values run on the training module); what
  it holds beyond the trainer's shard (a whole copy where the trainer is ZeRO-3-sharded) is its
  transient.
- A generation engine that sleeps between its phases (a colocated engine: the context switch of
  rpeg/perf/weightsync.py costs its sleep and wake, vLLM's sleep mode level 1 - weights backed up to
  host memory, KV cache discarded; verl's free_cache_engine) holds its gpu_memory_utilization share
  only while it generates. One that never sleeps (nothing is costed to wake it) holds it all step.

What the plan moves out is not counted where it is out:
- the context switch moves the actor's trainer state to the host while its colocated engine
  generates, all but the parts `ParallelLayout.resident` keeps (gradients are freed, not moved:
  rpeg/perf/offload.py); the engine then needs its share free beside what stays, as vLLM checks at
  start-up;
- `graph.reference_on_host` (rpeg/passes/reference.py): the reference's weights live in host memory
  and are swapped into the actor's place for the reference pass, so the actor's weights are out
  during that pass and the reference's are its transient;
- `offload_optimizer` / `offload_params` of a training layout: already out of the TRAIN stage's
  lines (rpeg/perf/memory.py `_state_bytes`).

The fixed per-device allowance (`buffers`: CUDA context, NCCL, fragmentation) is part of every
stage's transient, so it is counted once per device: verl fuses all the models of a colocated
group into one worker process (one CUDA context). OpenRLHF's separate Ray actors per model each
have their own context (about 0.5-1 GB each); that difference is not modelled.

Tests: tests/perf/test_perf_residency.py (a worked case by hand, the PPO plans of issue 25);
the planner's use of it: rpeg/search/memfit.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpeg.graph import Graph, Kind, Stage
from rpeg.perf.cost import StageCost

GB = 1e9
STATE = ("weights", "gradients", "optimizer")  # a TRAIN stage's memory lines that can outlive it


@dataclass(frozen=True, slots=True)
class Held:
    """One thing on each device of a set: what it is, whose, which stage put it there, bytes."""

    what: str  # e.g. "trainer optimizer", "weights", "activations", "kv_cache"
    model: str
    stage: str
    bytes: float
    resident: bool  # stays across the step (else: only while its stage runs)

    def label(self) -> str:
        return f"{self.model} {self.what} ({self.stage})"


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """The summed account of one set of devices that hold the same stages.

    `lines`: what each device holds at the peak, the resident items first, then the transient of
    the unit running then (`peak_unit`); `moved`: what the plan has moved out of the devices at
    that moment (the context switch, the reference swap), for the reader."""

    name: str  # the device groups that cover these devices, "+"-joined
    first: int
    count: int
    capacity_bytes: float
    peak_unit: str
    lines: tuple[Held, ...]
    moved: tuple[Held, ...] = ()
    units: tuple[tuple[str, float], ...] = ()  # every unit that runs there and the bytes held while it does

    def overflow_bytes(self) -> float:
        """Bytes over capacity, summed over the units that overflow (0 when all fit): a plan repair
        that helps one of two overflowing units shows here while the peak stays (search/memfit.py)."""
        if self.capacity_bytes <= 0:
            return 0.0
        return sum(max(0.0, b - self.capacity_bytes) for _, b in self.units)

    @property
    def peak_bytes(self) -> float:
        return sum(h.bytes for h in self.lines)

    @property
    def fits(self) -> bool:
        return self.capacity_bytes <= 0 or self.peak_bytes <= self.capacity_bytes

    @property
    def devices(self) -> str:
        return f"{self.first}-{self.first + self.count - 1}" if self.count > 1 else str(self.first)

    @property
    def models(self) -> tuple[str, ...]:
        """The models with something on the devices at the peak, in order of appearance."""
        return tuple(dict.fromkeys(h.model for h in self.lines))

    def describe(self) -> str:
        """One line: where, how much of how much, while what runs, and by whom."""
        body = ", ".join(f"{h.label()} {h.bytes / GB:.1f}" for h in self.lines if h.bytes > 0)
        return (f"device group {self.name!r} (GPUs {self.devices}) holds {self.peak_bytes / GB:.1f} GB per GPU of "
                f"{self.capacity_bytes / GB:.1f} GB while {self.peak_unit} runs ({body})")


def device_memory(graph: Graph, costs: dict[str, StageCost], *, sleeping_engine: str | None = None,
                  while_running: str | None = None) -> tuple[DeviceMemory, ...]:
    """The summed memory account of every set of devices of a planned graph, at its peak.

    `costs`: each stage's StageCost (rpeg/perf/stages.py stage_cost). `sleeping_engine`: the
    generation stage whose engine sleeps between phases and around which the actor's trainer
    state is moved out (the stage rpeg/perf/step.py's context switch follows; None: no switch).
    `while_running`: a stage name: the account of the devices it runs on while it runs, not the peak."""
    out = []
    for first, count, names, stages in _device_sets(graph):
        capacity = max((costs[s.name].capacity_bytes for s in stages), default=0.0)
        best: tuple[float, str, tuple[Held, ...], tuple[Held, ...]] | None = None
        totals: list[tuple[str, float]] = []
        resident = _resident(graph, stages, costs, sleeping_engine)
        for unit in _units(graph, stages):
            if while_running is not None and while_running not in {s.name for s in unit}:
                continue
            moved = _moved_during(graph, unit, resident, sleeping_engine)
            held = tuple(h for h in resident if h not in moved) + _transient(graph, unit, stages, costs,
                                                                             resident, sleeping_engine)
            total = sum(h.bytes for h in held)
            totals.append(("+".join(s.name for s in unit), total))
            if best is None or total > best[0]:
                best = (total, "+".join(s.name for s in unit), held, moved)
        if best is not None:
            out.append(DeviceMemory(name=names, first=first, count=count, capacity_bytes=capacity,
                                    peak_unit=best[1], lines=best[2], moved=best[3], units=tuple(totals)))
    return tuple(out)


def _runs_model(s: Stage) -> bool:
    return s.model is not None and s.kind is not Kind.SYNC and s.group is not None


def _device_sets(graph: Graph) -> list[tuple[int, int, str, list[Stage]]]:
    """Runs of consecutive devices that hold the same model-running stages: (first, count, the
    names of the groups covering them, the stages). Membership changes only at a group's edge."""
    placed = [s for s in graph.stages if _runs_model(s)]
    spans = {s.name: graph.group(s.group) for s in placed}
    edges = sorted({e for g in spans.values() for e in (g.first, g.first + g.count)})
    runs: list[tuple[int, int, str, list[Stage]]] = []
    for lo, hi in zip(edges, edges[1:]):
        here = [s for s in placed if spans[s.name].first <= lo < spans[s.name].first + spans[s.name].count]
        if not here:
            continue
        used = {s.group for s in here}
        names = "+".join(g.name for g in graph.groups if g.name in used)
        if runs and runs[-1][0] + runs[-1][1] == lo and [s.name for s in runs[-1][3]] == [s.name for s in here]:
            runs[-1] = (runs[-1][0], runs[-1][1] + hi - lo, names, here)
        else:
            runs.append((lo, hi - lo, names, here))
    return runs


def sleeping_engine(graph: Graph) -> str | None:
    """The generation stage whose engine sleeps between its phases: the one the actor's trainer
    shares devices with, around which the context switch moves the trainer's state out and the
    engine's weights to the host (rpeg/perf/step.py `_context_switch` costs it); None without."""
    train = next((s for s in graph.stages if s.kind is Kind.TRAIN and s.model == "actor"), None)
    gen = next((s for s in graph.stages if s.kind is Kind.GENERATE), None)
    if train is None or gen is None or train.layout is None or not train.group or not gen.group:
        return None
    return gen.name if graph.group(train.group).overlaps(graph.group(gen.group)) else None


def _units(graph: Graph, stages: list[Stage]) -> list[tuple[Stage, ...]]:
    """What runs at one time on the devices: a fusion group's members there, or one stage."""
    names = {s.name for s in stages}
    units, seen = [], set()
    for s in stages:
        if s.name in seen:
            continue
        group = graph.fusion_group_of(s.name) or (s.name,)
        unit = tuple(graph.stage(n) for n in group if n in names)
        seen.update(n.name for n in unit)
        units.append(unit)
    return units


def _trainer(stages: list[Stage], model: str) -> Stage | None:
    return next((s for s in stages if s.kind is Kind.TRAIN and s.model == model), None)


def _resident(graph: Graph, stages: list[Stage], costs: dict[str, StageCost],
              sleeping_engine: str | None) -> tuple[Held, ...]:
    """What stays on each device across the step (module docstring)."""
    held: list[Held] = []
    for model in dict.fromkeys(s.model for s in stages):
        train = _trainer(stages, model)
        if train is not None:
            parts = dict(costs[train.name].memory_parts)
            keep = ("weights", "optimizer") + (("gradients",) if train.layout.zero < 3 else ())
            held += [Held(f"trainer {p}", model, train.name, parts[p], True) for p in keep if parts.get(p)]
            continue
        if model == "ref" and graph.reference_on_host:
            continue  # in host memory between its passes
        if model and _trainer(stages, graph.model(model).base_of) is not None:
            continue  # a LoRA model's base, adapters off: the trainer's weights, already held
        frozen = [s for s in stages if s.model == model and s.kind in (Kind.INFER, Kind.REWARD)]
        if frozen:
            top = max(frozen, key=lambda s: dict(costs[s.name].memory_parts).get("weights", 0.0))
            w = dict(costs[top.name].memory_parts).get("weights", 0.0)
            if w:
                held.append(Held("weights", model, top.name, w, True))
    for s in stages:
        if s.kind is Kind.GENERATE and s.name != sleeping_engine:  # an engine that never sleeps
            held += [Held(f"engine {p}", s.model, s.name, b, True) for p, b in costs[s.name].memory_parts if b]
    return tuple(held)


def _moved_during(graph: Graph, unit: tuple[Stage, ...], resident: tuple[Held, ...],
                  sleeping_engine: str | None) -> tuple[Held, ...]:
    """The resident items the plan moves off the devices while `unit` runs."""
    names = {s.name for s in unit}
    moved: list[Held] = []
    if sleeping_engine in names:  # the context switch: the actor's state out, but what its layout keeps
        train = next((s for s in graph.stages if s.kind is Kind.TRAIN and s.model == "actor"), None)
        keep = train.layout.resident if train is not None and train.layout is not None else ()
        moved += [h for h in resident if h.model == "actor" and h.what.startswith("trainer ")
                  and h.what.removeprefix("trainer ") not in keep]
    if graph.reference_on_host and any(s.model == "ref" and s.kind is Kind.INFER for s in unit):
        moved += [h for h in resident if h.model == "actor" and h.what == "trainer weights" and h not in moved]
    return tuple(moved)


def _transient(graph: Graph, unit: tuple[Stage, ...], stages: list[Stage], costs: dict[str, StageCost],
               resident: tuple[Held, ...], sleeping_engine: str | None) -> tuple[Held, ...]:
    """What the unit's stages need only while they run, on top of what is resident."""
    gen = next((s for s in unit if s.kind is Kind.GENERATE), None)
    out: list[Held] = []
    for s in unit:
        parts = costs[s.name].memory_parts
        if s.kind is Kind.GENERATE:
            if s.name == sleeping_engine:  # awake only now: its whole share
                out += [Held(f"engine {p}", s.model, s.name, b, False) for p, b in parts if b]
            continue  # else already resident
        if gen is not None and s.kind is Kind.INFER and s.model == gen.model and s.lag == gen.lag:
            continue  # the engine returns the logprobs as it samples (rpeg/perf/step.py fused_seconds)
        if s.kind is Kind.TRAIN:
            keep = ("weights", "optimizer") + (("gradients",) if s.layout.zero < 3 else ())
            out += [Held(p, s.model, s.name, b, False) for p, b in parts if b and p not in keep]
            continue
        own = [(p, b) for p, b in parts if b and p != "weights"]
        weights = dict(parts).get("weights", 0.0)
        owner = graph.model(s.model).base_of or s.model  # a LoRA reference runs its trained model's base
        train = _trainer(stages, owner)
        if train is not None:  # borrows the trainer's model: only what it holds beyond the trainer's shard
            shard = next((h.bytes for h in resident if h.model == owner and h.what == "trainer weights"), 0.0)
            if weights > shard:
                own.insert(0, ("weights beyond the trainer's shard", weights - shard))
        elif s.model == "ref" and graph.reference_on_host:
            own.insert(0, ("weights swapped in from the host", weights))
        out += [Held(p, s.model, s.name, b, False) for p, b in own]
    return tuple(out)
