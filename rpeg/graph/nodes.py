"""The IR's values: Kind, Field, Stage, ModelRole, Stream. All frozen; change with `replace()`.

A Stage reads and writes named Fields; data edges are derived from those names (the graph keeps
no edge list). A Stage that runs a model reads that model's weights at version t - lag at step t;
a TRAIN stage writes version t + 1 of its model. Execution annotations (device group, parallel
layout, micro-batches) live on the stage so a pass that moves a stage moves everything about it.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Literal

from rpeg.graph.layout import ParallelLayout
from rpeg.graph.lora import LoRA
from rpeg.graph.model import ModelSpec

DTYPE_BYTES = {"bool": 1, "int8": 1, "bf16": 2, "fp16": 2, "int32": 4, "fp32": 4, "int64": 8}
# Symbolic dimensions a field's shape may use; sizes come from Graph.dim_sizes().
DIMS = ("prompts", "batch", "gen_batch", "prompt", "response", "seq")

Granularity = Literal["sample", "group", "batch"]


class Kind(str, enum.Enum):
    GENERATE = "generate"  # autoregressive sampling with a model (rollout)
    INFER = "infer"  # one forward pass over given sequences (logprobs, values)
    TRAIN = "train"  # forward + backward + optimizer; writes the model's next weight version
    REWARD = "reward"  # scores responses: a reward model (model set) or a rule (model None)
    COMPUTE = "compute"  # light math on fields (advantages, filters), no model
    SYNC = "sync"  # moves new weights from the training layout to the generation layout

    def __str__(self) -> str:
        return self.value


MODEL_KINDS = (Kind.GENERATE, Kind.INFER, Kind.TRAIN, Kind.SYNC)  # must name a model


@dataclass(frozen=True, kw_only=True, slots=True)
class Field:
    """A named datum of one step, per sequence or per token: `shape` uses names from DIMS."""

    name: str
    dtype: str
    shape: tuple[str, ...]
    doc: str = ""

    def elements(self, sizes: dict[str, float]) -> float:
        n = 1.0
        for d in self.shape:
            n *= sizes[d]
        return n

    def bytes(self, sizes: dict[str, float]) -> float:
        return self.elements(sizes) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelRole:
    """A model in the pipeline: `actor`, `critic`, `ref`, `reward`. `heads` names the outputs on
    top of the trunk: `lm` (next-token logits), `value` (per-token value), `score` (reward). `lora`: a
    trained model that learns low-rank adapters, its weights frozen (rpeg/graph/lora.py)."""

    name: str
    spec: ModelSpec
    trainable: bool
    heads: tuple[str, ...] = ("lm",)
    lora: LoRA | None = None
    # the frozen base of this trained model, its adapters off: a reference that holds no weights of its own
    # where it runs on that model's trainer's devices (the reference of a LoRA job)
    base_of: str = ""

    def replace(self, **changes) -> ModelRole:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    """One node of the graph.

    sequences:   the dimension counting the sequences it processes (`batch`, or `gen_batch` where
                 more are generated than trained on, as in DAPO's dynamic sampling).
    granularity: the smallest part of its input it can start on: `sample` (any sequence),
                 `group` (all samples of one prompt), `batch` (the whole step's batch).
    lag:         a stage running a model reads that model's weights of version t - lag at step t.
    passes:      forward passes over its input per step (TRAIN: epochs; generation: 1).
    """

    name: str
    kind: Kind
    model: str | None = None
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    sequences: str = "batch"
    granularity: Granularity = "sample"
    lag: int = 0
    passes: int = 1
    greedy: bool = False  # GENERATE: one greedy sample per prompt (ReMax's baseline rollout)
    doc: str = ""
    # execution annotations, set by passes
    group: str | None = None
    layout: ParallelLayout | None = None
    microbatches: int = 1

    def replace(self, **changes) -> Stage:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True, slots=True)
class Stream:
    """Fine-grained scheduling: `consumer` starts on each of `microbatches` parts of its input
    as soon as `producer` has finished that part, instead of waiting for the whole batch."""

    producer: str
    consumer: str
    microbatches: int
