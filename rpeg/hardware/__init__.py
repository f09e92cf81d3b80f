"""Hardware: device figures with their sources, cluster topologies, and this machine measured.

    from rpeg.hardware import load_device, load_cluster
    load_device("h100-sxm").flop_per_s("bf16")      # 9.89e14
    c = load_cluster("dgx-h100", gpus=64)            # 8 nodes of 8 over 400 Gb/s NDR
    c.span(size=4, stride=8).level.link              # 'infiniband'

Presets live in `devices/*.yaml` and `clusters/*.yaml` (packaged; see `device_names()`,
`cluster_names()`); a user's file loads by path with the same schema. `cpu-local` is this
machine, as `rpeg calibrate` measured it (loading only reads that file: never measures, never writes).

Device file (units in the key names; loading converts to SI):

    name: h100-sxm                    # defaults to the file name
    kind: gpu                         # gpu | cpu
    description: ...                  # optional
    bf16_dense_tflop_per_s: 989       # dense tensor-core peaks (no 2:4 sparsity)
    fp16_dense_tflop_per_s: 989
    fp8_dense_tflop_per_s: 1979       # 0 where unsupported
    hbm_capacity_mib: 81559           # as the device reports it (nvidia-smi / rocm-smi total)
    hbm_bandwidth_gb_per_s: 3350
    scaleup_bandwidth_gb_per_s: 450   # NVLink/xGMI per direction; 0 for none
    layer_host_us: 650                # optional (cpu-local: `rpeg calibrate` measures them): a decoder
    layer_token_us: 3.1               # layer's forward in torch eager, fixed host time per call and
                                      # time per token beyond its FLOPs at the matmul rate
    sources:                          # every figure key above -> where it comes from
      bf16_dense_tflop_per_s: "NVIDIA H100 Tensor Core GPU datasheet (2023): ..."

Units: FLOP/s in `gflop_per_s`, `tflop_per_s` or `pflop_per_s`; capacity in `gb` (1e9 B), `gib`
or `mib`; bandwidth in `gb_per_s`, `tb_per_s` or `gbit_per_s`; time in `us`. Exactly one unit per
figure.

Cluster file:

    name: dgx-h100
    description: ...                  # optional
    device: h100-sxm                  # a preset name, a device file path (relative to this file),
                                      # or a device mapping inline
    gpus: 0                           # optional: devices available (0 or absent: as many as asked)
    gpu_hour_usd: 4.916               # optional list price per device-hour (0: none published)
    levels:                           # innermost first; the last spans the whole system
      - name: node
        gpus: 8                       # devices in one unit; the last level may leave it out
        link: nvlink                  # nvlink | xgmi | infiniband | slingshot | ethernet | pcie | memory
        bandwidth_gb_per_s: 450       # per device, per direction (or bandwidth_gbit_per_s for a NIC);
                                      # a `memory` level may leave it out: the device's own bandwidth
        latency_us: 2
        oversubscription: 1           # optional, >= 1: the taper when every device sends at once
        sources: {gpus: ..., bandwidth_gb_per_s: ..., latency_us: ...}   # every figure of the level
    sources: {gpu_hour_usd: ...}      # gpus and gpu_hour_usd, when given

Unknown keys, a figure without a source, a source without a figure, and values that are not
positive numbers (0 is allowed only where the schema says so) are `RpegError`s naming the file and
the key. docs/hardware.md tabulates every preset with its sources.
"""

from rpeg.hardware.device import Device
from rpeg.hardware.loader import cluster_from_data, cluster_names, device_from_data, device_names, load_cluster, load_device
from rpeg.hardware.topology import Cluster, Level, Span

__all__ = ["Device", "Cluster", "Level", "Span", "load_device", "device_names", "load_cluster", "cluster_names",
           "device_from_data", "cluster_from_data"]
