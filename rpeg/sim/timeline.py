"""Timeline: what ran where and when, and the figures people read off it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True, slots=True)
class Record:
    unit: str  # a stage, or fused stages joined by "+", or "context_switch"
    kind: str  # generate, infer, train, reward, compute, sync, switch
    step: int
    microbatch: int
    group: str  # the device group (or groups, for a sync) it ran on
    devices: tuple[int, int]  # (first, count) of the devices it occupied; (0, 0) for host-side work
    start: float
    end: float
    flops: float = 0.0
    weight_version: int = -1  # generation: the actor version it sampled with
    peak_memory_bytes: float = 0.0  # measured (a GPU run): the most device memory it allocated; 0 unknown
    label: str = ""  # the trace's name for it, where the unit and step do not say enough (details)

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class GroupStats:
    devices: int
    busy_fraction: float
    mfu: float
    bubble_s: float  # idle device-time per device per step
    peak_memory_bytes: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Timeline:
    records: tuple[Record, ...]
    steps: int
    step_s: float  # steady state
    step_ends: tuple[float, ...]
    tokens_per_step: float
    sequences_per_step: float
    groups: dict[str, GroupStats] = field(default_factory=dict)
    max_staleness: int = 0
    utilization: float = 0.0  # busy fraction over every device of the plan, steady state
    mfu: float = 0.0  # model FLOPs / (devices x peak x time), steady state
    source: str = "simulated"  # or "measured" (the runtime writes the same format)
    # what happened inside stages, drawn in the trace but in no figure above: multi-turn episodes' turns
    # (kind "turn"), tool calls ("tool") and other environment steps ("environment"), one lane (unit) per
    # episode, and the engine calls that batched the turns ("engine"), one lane per engine
    details: tuple[Record, ...] = ()

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s if self.step_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.sequences_per_step / self.step_s if self.step_s > 0 else 0.0

    @property
    def makespan(self) -> float:
        return max((r.end for r in self.records), default=0.0)
