"""Graph: the whole RL pipeline of one step, plus the state (weights) that crosses steps.

Data edges are derived from the fields stages read and write; weight edges from the models
stages run and train. Nothing here mutates: passes build new graphs with `replace()`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from rpeg.errors import RpegError
from rpeg.graph.config import AlgoConfig
from rpeg.graph.job import Job
from rpeg.graph.layout import DeviceGroup
from rpeg.graph.nodes import Field, Kind, ModelRole, Stage, Stream


@dataclass(frozen=True, slots=True)
class DataEdge:
    src: str
    dst: str
    fields: tuple[str, ...]
    bytes: float  # per step


@dataclass(frozen=True, slots=True)
class WeightEdge:
    """`dst` at step t + distance reads the weights `src` produced at step t."""

    src: str
    dst: str
    model: str
    distance: int


REFIT_GATHERS = ("shard", "full")  # passes/refit.py says what each means


@dataclass(frozen=True, kw_only=True)
class Graph:
    algorithm: str
    job: Job
    config: AlgoConfig
    models: tuple[ModelRole, ...]
    fields: tuple[Field, ...]
    stages: tuple[Stage, ...]
    inputs: tuple[str, ...] = ("prompt_ids",)
    outputs: tuple[str, ...] = ()
    async_bound: int = 0
    refit_gather: str = "shard"  # how a colocated weight sync assembles the engine's weights (passes/refit.py)
    partial_rollout: bool = False  # generation engines never drain between steps (passes/rollout.py)
    in_flight: int = 1  # steps whose prompts generation holds at once; > 1: engines never drain (passes/asynchrony.py)
    refill: bool = False  # the next step's prompts enter as this step's finish, through weight updates: never drains
    call_sequences: int = 0  # > 0: generation reaches each engine in calls of this many sequences, one call at a time
    reference_on_host: bool = False  # reference weights swapped in from host memory (passes/reference.py)
    fusion: tuple[tuple[str, ...], ...] = ()
    streams: tuple[Stream, ...] = ()
    groups: tuple[DeviceGroup, ...] = ()
    history: tuple[str, ...] = ()  # passes applied, in order

    def replace(self, **changes) -> Graph:
        return dataclasses.replace(self, **changes)

    # ---- lookups -----------------------------------------------------------------------------
    def _find(self, items: tuple, name: str, what: str):
        for item in items:
            if item.name == name:
                return item
        known = ", ".join(i.name for i in items) or "none"
        raise RpegError(f"graph {self.algorithm!r} has no {what} {name!r} ({what}s: {known})")

    def stage(self, name: str) -> Stage:
        return self._find(self.stages, name, "stage")

    def field(self, name: str) -> Field:
        return self._find(self.fields, name, "field")

    def model(self, name: str) -> ModelRole:
        return self._find(self.models, name, "model")

    def group(self, name: str) -> DeviceGroup:
        return self._find(self.groups, name, "device group")

    def has_model(self, name: str) -> bool:
        return any(m.name == name for m in self.models)

    @property
    def engines_never_drain(self) -> bool:
        """Generation engines keep their batch full across steps: partial rollout, several steps'
        prompts in flight, or the next step's admitted as this one's finish (refill)."""
        return self.partial_rollout or self.in_flight > 1 or self.refill

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def with_stages(self, stages: Iterable[Stage]) -> Graph:
        """A copy with the given stages replacing those of the same name."""
        new = {s.name: s for s in stages}
        return self.replace(stages=tuple(new.get(s.name, s) for s in self.stages))

    def fusion_group_of(self, stage: str) -> tuple[str, ...] | None:
        return next((g for g in self.fusion if stage in g), None)

    # ---- sizes -------------------------------------------------------------------------------
    def dim_sizes(self) -> dict[str, float]:
        """Sizes of the symbolic dimensions for this job (response: the mean length)."""
        job = self.job
        return {
            "prompts": job.prompts,
            "batch": job.sequences,
            "gen_batch": job.sequences * self.config.oversample,
            "prompt": job.prompt_len,
            "response": job.response.mean,
            "seq": job.mean_seq_len,
        }

    def stage_sequences(self, stage: Stage) -> float:
        """Sequences a stage processes per step (a greedy baseline rollout: one per prompt)."""
        return self.job.prompts if stage.greedy else self.dim_sizes()[stage.sequences]

    def field_bytes(self, name: str) -> float:
        return self.field(name).bytes(self.dim_sizes())

    # ---- derived edges -----------------------------------------------------------------------
    def producers(self) -> dict[str, str]:
        """field -> the stage that writes it (the verifier guarantees at most one)."""
        return {f: s.name for s in self.stages for f in s.writes}

    def data_edges(self) -> list[DataEdge]:
        prod = self.producers()
        grouped: dict[tuple[str, str], list[str]] = {}
        for s in self.stages:
            for f in s.reads:
                if f in prod:
                    grouped.setdefault((prod[f], s.name), []).append(f)
        return [DataEdge(src, dst, tuple(fs), sum(self.field_bytes(f) for f in fs))
                for (src, dst), fs in grouped.items()]

    def predecessors(self) -> dict[str, set[str]]:
        # From the field names alone, not data_edges(): the verifier walks this on graphs whose
        # fields may have an unknown dtype or dimension, which have no size in bytes.
        prod = self.producers()
        preds: dict[str, set[str]] = {s.name: set() for s in self.stages}
        for s in self.stages:
            preds[s.name].update(prod[f] for f in s.reads if f in prod)
        return preds

    def topo_order(self, preds: dict[str, set[str]] | None = None) -> list[str]:
        """Stages in an order that respects `preds` (default: the data edges); builder order breaks ties."""
        preds = self.predecessors() if preds is None else preds
        done: list[str] = []
        placed: set[str] = set()
        while len(done) < len(self.stages):
            ready = [s.name for s in self.stages if s.name not in placed and preds[s.name] <= placed]
            if not ready:
                cyc = sorted(set(self.stage_names) - placed)
                raise RpegError(f"stages {', '.join(cyc)} depend on each other in a cycle")
            done.append(ready[0])
            placed.add(ready[0])
        return done

    def step_predecessors(self) -> dict[str, set[str]]:
        """Within one step: data predecessors plus same-step weight edges (a sync waits for the
        training whose weights it ships)."""
        preds = self.predecessors()
        for e in self.weight_edges():
            if e.distance == 0:
                preds[e.dst].add(e.src)
        return preds

    def ancestors(self, name: str) -> set[str]:
        preds = self.predecessors()
        seen: set[str] = set()
        todo = list(preds[name])
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(preds[n])
        return seen

    def weight_edges(self) -> list[WeightEdge]:
        """For each stage that reads a trainable model's weights, where its version comes from.

        TRAIN(m) at step t writes version t + 1. SYNC(m) at step t moves that version to the
        generation layout (distance 0). A stage with lag L at step t' reads version t' - L, which
        was written at step t' - L - 1: distance 1 + L. Generation reads through SYNC when there
        is one; everything else reads what TRAIN wrote.
        """
        train = {s.model: s.name for s in self.stages if s.kind is Kind.TRAIN}
        sync = {s.model: s.name for s in self.stages if s.kind is Kind.SYNC}
        edges = []
        for s in self.stages:
            if s.model is None or s.model not in train:
                continue
            if s.kind is Kind.SYNC:
                edges.append(WeightEdge(train[s.model], s.name, s.model, 0))
            elif s.kind is Kind.GENERATE and s.model in sync:
                edges.append(WeightEdge(sync[s.model], s.name, s.model, 1 + s.lag))
            else:
                edges.append(WeightEdge(train[s.model], s.name, s.model, 1 + s.lag))
        return edges

    def bytes_per_step(self) -> float:
        """Bytes that cross data edges in one step."""
        return sum(e.bytes for e in self.data_edges())
