"""StageCost: what one stage costs per step, split so a reader sees where the time goes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StageCost:
    """Seconds per step on the stage's devices, and what they are made of.

    compute_s / memory_s / comm_s / overhead_s split `seconds` by what bounds each part;
    `parts` is a finer named breakdown (prefill, decode, pipeline bubble, gradient sync, ...)
    whose values add up to `seconds`. flops and bytes are totals over all devices of the stage.
    `microbatches` lets a simulator hand work downstream at that granularity.
    """

    stage: str
    seconds: float
    compute_s: float = 0.0
    memory_s: float = 0.0
    comm_s: float = 0.0
    overhead_s: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    peak_memory_bytes: float = 0.0  # per device
    capacity_bytes: float = 0.0  # per device
    memory_parts: tuple[tuple[str, float], ...] = ()
    devices: int = 1
    microbatches: int = 1
    parts: tuple[tuple[str, float], ...] = field(default=())

    @property
    def fits(self) -> bool:
        return self.capacity_bytes <= 0 or self.peak_memory_bytes <= self.capacity_bytes

    @property
    def per_microbatch_s(self) -> float:
        return self.seconds / max(self.microbatches, 1)

    def part(self, name: str) -> float:
        return dict(self.parts).get(name, 0.0)
