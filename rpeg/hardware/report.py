"""Markdown tables of devices and clusters with every figure's source.

docs/hardware.md carries the tables for the presets; a test regenerates them and checks the
document still says the same, so the documentation cannot drift from the data files.

    python -m rpeg.hardware.report    # print the preset tables
"""

from __future__ import annotations

from rpeg.hardware.device import FIGURES, OPTIONAL, Device
from rpeg.hardware.topology import Cluster


def _num(x: float) -> str:
    return f"{x:,.1f}".rstrip("0").rstrip(".") if x else "0"


def device_summary(devices: list[Device]) -> str:
    rows = ["| device | bf16 TFLOP/s | fp16 TFLOP/s | fp8 TFLOP/s | HBM GB (reported) | HBM GB/s | scale-up GB/s (per direction) | host |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    for d in devices:
        rows.append(f"| `{d.name}` | {_num(d.bf16_flop_per_s / 1e12)} | {_num(d.fp16_flop_per_s / 1e12)} | "
                    f"{_num(d.fp8_flop_per_s / 1e12)} | {d.hbm_capacity_bytes / 1e9:.2f} | "
                    f"{_num(d.hbm_bandwidth_bytes_per_s / 1e9)} | {_num(d.scaleup_bandwidth_bytes_per_s / 1e9)} | "
                    f"{d.host} |")
    return "\n".join(rows)


def device_sources(devices: list[Device]) -> str:
    rows = ["| device | figure | source |", "|---|---|---|"]
    for d in devices:
        for figure in FIGURES:
            if figure in OPTIONAL and not d.source(figure):
                continue  # not measured for this device
            rows.append(f"| `{d.name}` | {figure} | {_cell(d.source(figure))} |")
        if d.source("host"):
            rows.append(f"| `{d.name}` | host | {_cell(d.source('host'))} |")
    return "\n".join(rows)


def cluster_summary(clusters: list[Cluster]) -> str:
    rows = ["| cluster | device | level | GPUs per unit | link | GB/s per GPU per direction | latency us | oversubscription | USD per GPU-hour |",
            "|---|---|---|---:|---|---:|---:|---:|---:|"]
    for c in clusters:
        for i, lv in enumerate(c.levels):
            last = i == len(c.levels) - 1
            size = (str(c.gpus) if c.gpus else "grows") if last else str(lv.gpus)
            rows.append(f"| {f'`{c.name}`' if i == 0 else ''} | {f'`{c.device.name}`' if i == 0 else ''} | {lv.name} | "
                        f"{size} | {lv.link} | {_num(lv.bandwidth_bytes_per_s / 1e9)} | {_num(lv.latency_s * 1e6)} | "
                        f"{_num(lv.oversubscription)} | {(f'{c.gpu_hour_usd:.3f}' if c.gpu_hour_usd else 'n/p') if i == 0 else ''} |")
    return "\n".join(rows)


def cluster_sources(clusters: list[Cluster]) -> str:
    rows = ["| cluster | figure | source |", "|---|---|---|"]
    for c in clusters:
        for key, text in c.sources:
            rows.append(f"| `{c.name}` | {key} | {_cell(text)} |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def preset_tables() -> str:
    """The four tables for the packaged presets (cpu-local is measured per machine: left out)."""
    from rpeg.hardware.loader import CPU_LOCAL, cluster_names, device_names, load_cluster, load_device

    devices = [load_device(n) for n in device_names() if n != CPU_LOCAL]
    clusters = [load_cluster(n) for n in cluster_names() if n != CPU_LOCAL]
    return "\n\n".join([device_summary(devices), device_sources(devices), cluster_summary(clusters),
                        cluster_sources(clusters)])


if __name__ == "__main__":
    print(preset_tables())
