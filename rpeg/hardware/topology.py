"""Cluster topology: a device and a hierarchy of levels, GPU -> node -> rack -> system.

A level groups `gpus` devices into one unit (a node of 8, an NVLink rack of 72, the system).
Two devices whose smallest common unit is level L talk over L's links: `bandwidth_bytes_per_s`
per device per direction, after `latency_s`, divided by `oversubscription` when every device
sends across the level at once (a tapered fat tree or dragonfly global links).

Where ranks of a collective sit decides its cost, so `span` tells, for a group of ranks laid
out with a stride (Megatron's rank order puts tp innermost), which level it crosses and how many
of its ranks share each unit below that level.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from rpeg.errors import RpegError
from rpeg.hardware.device import Device

Link = Literal["nvlink", "xgmi", "infiniband", "slingshot", "ethernet", "pcie", "memory", "loopback"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Level:
    name: str
    gpus: int  # devices in one unit of this level
    link: Link
    bandwidth_bytes_per_s: float  # per device, per direction, across this level
    latency_s: float
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.bandwidth_bytes_per_s <= 0 or self.latency_s < 0 or self.oversubscription < 1:
            raise RpegError(f"topology level {self.name!r}: gpus >= 1, bandwidth > 0, latency >= 0 and "
                            f"oversubscription >= 1 required (got {self.gpus}, {self.bandwidth_bytes_per_s}, "
                            f"{self.latency_s}, {self.oversubscription})")

    @property
    def effective_bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_bytes_per_s / self.oversubscription


@dataclass(frozen=True, slots=True)
class Span:
    """Where a group of ranks sits: the outermost level its traffic crosses, how many of its
    ranks share one unit of the level below (and so can drive that many links in parallel), and
    how many such units it spans."""

    level: Level
    inner: Level | None  # the level below `level` (None when the group sits inside one node)
    ranks_per_unit: int
    units: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    name: str
    device: Device
    levels: tuple[Level, ...]  # innermost first; the last one spans the whole system
    gpus: int = 0  # devices available (0: as many as asked for)
    gpu_hour_usd: float = 0.0  # list price per device-hour; 0: none published
    sources: tuple[tuple[str, str], ...] = ()  # (key, where it comes from), e.g. ("levels.node.latency_us", ...)
    description: str = ""
    # devices that share one machine's cores (cpu-local as D devices): sharing[k - 1] is one device as
    # measured while k of them run (`rpeg calibrate --devices k`); empty where devices do not share
    sharing: tuple[Device, ...] = ()

    def __post_init__(self) -> None:
        if not self.levels:
            raise RpegError(f"cluster {self.name!r} has no topology levels")
        sizes = [lv.gpus for lv in self.levels]
        for a, b in zip(sizes, sizes[1:]):
            if b < a or b % a:
                raise RpegError(f"cluster {self.name!r}: level sizes must grow by whole multiples "
                                f"({' -> '.join(map(str, sizes))})")
        names = [lv.name for lv in self.levels]
        if len(set(names)) != len(names):
            raise RpegError(f"cluster {self.name!r}: level names must differ ({', '.join(names)})")
        if self.gpus < 0 or self.gpu_hour_usd < 0:
            raise RpegError(f"cluster {self.name!r}: gpus ({self.gpus}) and gpu_hour_usd "
                            f"({self.gpu_hour_usd}) must not be negative")
        if self.gpus > sizes[-1]:
            raise RpegError(f"cluster {self.name!r}: {self.gpus} devices do not fit its outermost level "
                            f"{self.levels[-1].name!r} of {sizes[-1]}")

    @property
    def gpus_per_node(self) -> int:
        return self.levels[0].gpus

    def usd(self, gpus: int, seconds: float) -> float:
        """What `gpus` of its devices cost for `seconds` at the list price; 0 when none is published
        (the one home of the $/step formula)."""
        return self.gpu_hour_usd * gpus * seconds / 3600 if self.gpu_hour_usd else 0.0

    def with_gpus(self, gpus: int) -> Cluster:
        """The same cluster sized to `gpus` devices (the system level grows to hold them)."""
        if gpus < 1:
            raise RpegError(f"a cluster needs at least one device, got {gpus}")
        if self.gpus and gpus > self.gpus:
            raise RpegError(f"cluster {self.name!r} has {self.gpus} devices, {gpus} asked for")
        # The system level becomes the fewest whole units of the level below that hold `gpus`.
        last = self.levels[-1]
        below = self.levels[-2].gpus if len(self.levels) > 1 else 1
        size = max(below, math.ceil(gpus / below) * below)
        levels = self.levels[:-1] + (dataclasses.replace(last, gpus=size),)
        return dataclasses.replace(self, levels=levels, gpus=gpus)

    def span(self, size: int, stride: int = 1) -> Span:
        """The span of ranks {r0 + i * stride : i < size}, r0 aligned to a unit boundary."""
        if size <= 1:
            return Span(self.levels[0], None, 1, 1)
        if stride < 1:
            raise RpegError(f"a rank stride must be at least 1, got {stride}")
        extent = (size - 1) * stride + 1
        for i, lv in enumerate(self.levels):
            if extent <= lv.gpus or i == len(self.levels) - 1:
                if i == 0:
                    return Span(lv, None, size, 1)
                inner = self.levels[i - 1]
                if stride >= inner.gpus:  # every rank in a unit of its own
                    return Span(lv, inner, 1, size)
                # Ranks 0, s, 2s, ... from a unit boundary: ceil(G/s) share a unit, and every
                # unit the extent touches holds one (s < G).
                per_unit = min(size, math.ceil(inner.gpus / stride))
                return Span(lv, inner, per_unit, math.ceil(extent / inner.gpus))
        raise AssertionError("unreachable")
