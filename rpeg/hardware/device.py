"""Device: one accelerator's (or CPU's) figures, each with its source.

Figures live in YAML files under `devices/`, in the units their keys name; loading converts to
SI (FLOP/s, bytes, bytes/s). Every figure key must have an entry in `sources` saying where it
comes from (datasheet, paper, or a measurement with its command).

Conventions every file follows:
- FLOP/s are dense tensor-core peaks (no 2:4 sparsity); 0 where the dtype is unsupported.
- HBM capacity is what the device reports to software (nvidia-smi "Memory-Usage" total, rocm-smi
  "VRAM Total Memory"), not the datasheet's round number: an H100 80GB reports 81559 MiB
  (85.52e9 bytes). It is what the allocator can see before the framework takes its share.
- Bandwidths are per device, per direction (NVLink 4's "900 GB/s" is 450 GB/s each way).
- The transformer-layer figures (`layer_host_us`, `layer_token_us`) are optional:
  `rpeg calibrate` measures them on cpu-local only (rpeg.hardware.calibrate); no preset has them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rpeg.errors import RpegError

# YAML figure -> Device field. A YAML key is the figure plus one unit suffix from UNITS, e.g.
# `bf16_dense_tflop_per_s`, `hbm_capacity_mib`, `scaleup_bandwidth_gbit_per_s`.
FIGURES = {
    "bf16_dense": "bf16_flop_per_s",
    "fp16_dense": "fp16_flop_per_s",
    "fp8_dense": "fp8_flop_per_s",
    "hbm_capacity": "hbm_capacity_bytes",
    "hbm_bandwidth": "hbm_bandwidth_bytes_per_s",
    "scaleup_bandwidth": "scaleup_bandwidth_bytes_per_s",
    "layer_host": "layer_host_s",
    "layer_token": "layer_token_s",
    "fsdp_unit": "fsdp_unit_s",
    "gather_tensor": "gather_tensor_s",
}
# The figures that may be 0: a dtype the device lacks, a device without a scale-up link.
MAY_BE_ZERO = ("fp16_dense", "fp8_dense", "scaleup_bandwidth")
# The figures a file may leave out (then 0 on the Device: not measured); positive when given.
OPTIONAL = ("layer_host", "layer_token", "fsdp_unit", "gather_tensor")

# Unit suffix -> (quantity, multiplier, divisor) to SI; two factors so that 5 us is exactly 5e-6 s
# and 400 Gb/s exactly 5e10 B/s.
UNITS = {
    "gflop_per_s": ("rate", 1e9, 1),
    "tflop_per_s": ("rate", 1e12, 1),
    "pflop_per_s": ("rate", 1e15, 1),
    "gb": ("bytes", 1e9, 1),
    "gib": ("bytes", 2.0**30, 1),
    "mib": ("bytes", 2.0**20, 1),
    "gb_per_s": ("bandwidth", 1e9, 1),
    "tb_per_s": ("bandwidth", 1e12, 1),
    "gbit_per_s": ("bandwidth", 1e9, 8),
    "us": ("time", 1, 1e6),
}
QUANTITY = {"bf16_dense": "rate", "fp16_dense": "rate", "fp8_dense": "rate", "hbm_capacity": "bytes",
            "hbm_bandwidth": "bandwidth", "scaleup_bandwidth": "bandwidth", "layer_host": "time",
            "layer_token": "time", "fsdp_unit": "time", "gather_tensor": "time"}


def to_si(value: float, unit: str) -> float:
    _, multiplier, divisor = UNITS[unit]
    return value * multiplier / divisor


def split_unit(key: str) -> tuple[str, str] | None:
    """`hbm_capacity_mib` -> ("hbm_capacity", "mib"); None when the key ends in no known unit."""
    for unit in sorted(UNITS, key=len, reverse=True):
        if key.endswith("_" + unit):
            return key[: -len(unit) - 1], unit
    return None


HOSTS = ("x86", "grace")  # host CPUs the model knows (rpeg.perf.efficiency.HOST_TIME)


@dataclass(frozen=True, kw_only=True, slots=True)
class Device:
    """One device. Bandwidths are per device, per direction. `scaleup` is the NVLink / xGMI
    bandwidth a device has to its scale-up domain (0 for none); NIC bandwidth belongs to the
    system the device is built into, so it lives with the cluster's levels.

    `layer_host_s` and `layer_token_s` are a transformer decoder layer's forward as PyTorch eager
    runs it: the fixed host time per call (micro-batch), and the time per token beyond the layer's
    FLOPs at the device's matmul rate (its elementwise ops and the attention kernel, which on a CPU
    cost per token at small widths). They are measured on cpu-local only (`rpeg calibrate`); where
    given (> 0) the perf model uses them for a layer's forward instead of the generic
    attention/elementwise roofline and kernel-launch terms. `fsdp_unit_s` and `gather_tensor_s`
    (cpu-local as D > 1 devices) are what PyTorch's FSDP2 costs there as the runtime runs it: per
    sharded unit of a forward, and per tensor of a full-weight gather; where given the perf model
    counts them instead of its collective model for ZeRO-3 gathers. 0: not measured."""

    name: str
    kind: Literal["gpu", "cpu"]
    bf16_flop_per_s: float
    fp16_flop_per_s: float
    fp8_flop_per_s: float  # 0 where unsupported
    hbm_capacity_bytes: float  # as the device reports it (see the module docstring)
    hbm_bandwidth_bytes_per_s: float
    scaleup_bandwidth_bytes_per_s: float
    sources: tuple[tuple[str, str], ...]  # (figure key as written in the file, where it comes from)
    description: str = ""
    host: Literal["x86", "grace"] = "x86"  # the CPU that drives it (launches, engine scheduling)
    layer_host_s: float = 0.0  # fixed host time of one decoder layer's forward per call; 0: not measured
    layer_token_s: float = 0.0  # a decoder layer's forward time per token beyond its FLOPs; 0: not measured
    fsdp_unit_s: float = 0.0  # what FSDP2 adds to a forward per sharded unit (gather and hooks); 0: not measured
    gather_tensor_s: float = 0.0  # one weight tensor gathered in full from its FSDP2 shards; 0: not measured

    def __post_init__(self) -> None:
        bad = [f for f in ("bf16_flop_per_s", "hbm_capacity_bytes", "hbm_bandwidth_bytes_per_s")
               if not getattr(self, f) > 0]
        bad += [f for f in ("fp16_flop_per_s", "fp8_flop_per_s", "scaleup_bandwidth_bytes_per_s", "layer_host_s",
                            "layer_token_s", "fsdp_unit_s", "gather_tensor_s") if not getattr(self, f) >= 0]
        if bad:
            raise RpegError(f"device {self.name!r}: {', '.join(bad)} must be positive "
                            f"(fp16, fp8 and scale-up may be 0: unsupported; the layer figures 0: not measured)")
        if self.host not in HOSTS:
            raise RpegError(f"device {self.name!r}: host {self.host!r} is not one of {', '.join(map(repr, HOSTS))}")

    def flop_per_s(self, dtype: str = "bf16") -> float:
        rate = {"bf16": self.bf16_flop_per_s, "fp16": self.fp16_flop_per_s, "fp8": self.fp8_flop_per_s}.get(dtype)
        if rate is None:
            raise RpegError(f"unknown compute dtype {dtype!r} (bf16, fp16, fp8)")
        if rate <= 0:
            raise RpegError(f"device {self.name} has no {dtype} tensor-core rate")
        return rate

    def source(self, figure: str) -> str:
        """Where a figure comes from; `figure` is the file's key (`hbm_capacity_mib`), the figure
        (`hbm_capacity`) or the field (`hbm_capacity_bytes`)."""
        for key, text in self.sources:
            split = split_unit(key)
            base = split[0] if split else key
            if figure in (key, base, FIGURES.get(base)):
                return text
        return ""
