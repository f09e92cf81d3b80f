"""Reading device and cluster files: the presets packaged under `devices/` and `clusters/`, or a
user's file by path. The schema is in `rpeg/hardware/__init__.py` and docs/hardware.md.

Every problem is an RpegError that names the file and the key (`.../h100-sxm.yaml: sources:
no source for bf16_dense_tflop_per_s`), never a traceback.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
import os
import pathlib
from typing import Any, get_args

from rpeg.errors import RpegError
from rpeg.graph.bounds import MAX_GPUS, show
from rpeg.graph.serde import parse_yaml, read_yaml_file
from rpeg.hardware.device import FIGURES, HOSTS, MAY_BE_ZERO, OPTIONAL, QUANTITY, UNITS, Device, split_unit, to_si
from rpeg.hardware.topology import Cluster, Level, Link

CPU_LOCAL = "cpu-local"  # measured on this machine by `rpeg calibrate`, not read from a preset
CACHE_ENV = "RPEG_CACHE_DIR"
CPU_LOCAL_FILE = "cpu-local.yaml"
DEVICE_KEYS = ("name", "kind", "description", "host", "sources")
CLUSTER_KEYS = ("name", "description", "device", "gpus", "gpu_hour_usd", "levels", "sources")
LEVEL_KEYS = ("name", "gpus", "link", "latency_us", "oversubscription", "sources")  # and bandwidth_<unit>
# The range of a device or link figure, in SI units by quantity: far around every device built (an H100:
# 9.9e14 bf16 FLOP/s, 8.6e10 bytes at 3.35e12 bytes/s; links' latencies are microseconds), so that a slip
# (`bf16_dense_tflop_per_s: 1.0e-300`) is refused in one line, not turned into a step of 1e300 seconds.
SI_RANGES = {"rate": (1e6, 1e18, "FLOP/s"), "bytes": (1e6, 1e15, "bytes"), "bandwidth": (1e3, 1e15, "bytes/s"),
             "time": (0.0, 10.0, "s")}
MAX_OVERSUBSCRIPTION = 1_000  # published fabrics taper 1:1 to 1:8
MAX_GPU_HOUR_USD = 10_000.0  # list prices are 1-100 USD per device-hour


# ---- names and files ---------------------------------------------------------------------------
def _preset_dir(kind: str):
    return importlib.resources.files("rpeg.hardware") / kind


def _preset_names(kind: str) -> list[str]:
    return sorted(p.name[:-5] for p in _preset_dir(kind).iterdir() if p.name.endswith(".yaml"))


def device_names() -> list[str]:
    """Every device `load_device` knows by name (cpu-local once `rpeg calibrate` has measured it)."""
    return sorted(_preset_names("devices") + [CPU_LOCAL])


def cluster_names() -> list[str]:
    return _preset_names("clusters")


def _is_path(name_or_path: str) -> bool:
    return os.sep in name_or_path or "/" in name_or_path or name_or_path.endswith((".yaml", ".yml", ".json"))


def _read(kind: str, name_or_path: str) -> tuple[Any, str, str | None]:
    """(data, where to say it came from, preset name or None for a user's file)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise RpegError(f"a {kind[:-1]} is a preset name or a path, got {name_or_path!r}")
    name_or_path = os.fspath(name_or_path)
    if _is_path(name_or_path):
        return read_yaml_file(name_or_path), name_or_path, None
    names = _preset_names(kind)
    if name_or_path not in names:
        known = ", ".join(device_names() if kind == "devices" else names)
        raise RpegError(f"unknown {kind[:-1]} {name_or_path!r} (known: {known}; or give a path to a YAML file)")
    text = (_preset_dir(kind) / f"{name_or_path}.yaml").read_text(encoding="utf-8")
    where = f"rpeg/hardware/{kind}/{name_or_path}.yaml"
    return parse_yaml(text, where), where, name_or_path


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


# ---- devices -----------------------------------------------------------------------------------
def load_device(name_or_path: str | os.PathLike) -> Device:
    """A preset device by name (`h100-sxm`), `cpu-local` (this machine, as `rpeg calibrate` measured
    it), or a device file by path."""
    if name_or_path == CPU_LOCAL:
        return load_cpu_local()
    data, where, preset = _read("devices", name_or_path)
    device = device_from_data(data, where, default_name=preset or _stem(where))
    if preset and device.name != preset:
        raise RpegError(f"{where}: name: {device.name!r} differs from the file name {preset!r}")
    return device


def device_from_data(data: Any, where: str, default_name: str = "") -> Device:
    """A Device from one parsed device file (or a cluster's inline `device:` mapping)."""
    if not isinstance(data, dict):
        raise RpegError(f"{where}: expected a mapping of device figures, got {_show(data)}")
    figures: dict[str, tuple[str, float]] = {}  # figure -> (key as written, SI value)
    for key, value in data.items():
        if key in DEVICE_KEYS:
            continue
        split = split_unit(str(key))
        if split is None or split[0] not in FIGURES or UNITS[split[1]][0] != QUANTITY[split[0]]:
            raise RpegError(f"{where}: {key}: unknown key (known: {', '.join(DEVICE_KEYS)}, and "
                            f"{', '.join(f + '_<unit>' for f in FIGURES)}; units: {_units_text()})")
        figure, unit = split
        if figure in figures:
            raise RpegError(f"{where}: {key}: {figure} is already given as {figures[figure][0]}")
        number = _number(value, f"{where}: {key}", zero_ok=figure in MAY_BE_ZERO, unit=unit)
        figures[figure] = (key, to_si(number, unit))
    missing = [f for f in FIGURES if f not in figures and f not in OPTIONAL]
    if missing:
        raise RpegError(f"{where}: missing {', '.join(f + '_<unit>' for f in missing)} "
                        f"(every device states {', '.join(f for f in FIGURES if f not in OPTIONAL)})")
    host = data.get("host", "x86")
    if host not in HOSTS:
        raise RpegError(f"{where}: host: {_show(host)} is not one of {', '.join(map(repr, HOSTS))}")
    sourced = [k for k, _ in figures.values()] + (["host"] if "host" in data else [])
    sources = _sources(data.get("sources"), sourced, where)
    kind = data.get("kind", "gpu")
    if kind not in ("gpu", "cpu"):
        raise RpegError(f"{where}: kind: {kind!r} is not one of 'gpu', 'cpu'")
    name = _name(data.get("name", default_name), f"{where}: name")
    try:
        return Device(name=name, kind=kind,
                      description=_text(data.get("description", ""), f"{where}: description"),
                      host=host, sources=sources, **{FIGURES[f]: v for f, (_, v) in figures.items()})
    except RpegError as e:
        raise RpegError(f"{where}: {e}") from None


class NotCalibrated(RpegError):
    """cpu-local is asked for on a machine `rpeg calibrate` has not measured."""


def cpu_local_path(devices: int = 1) -> pathlib.Path:
    """Where `rpeg calibrate` writes this machine's figures: $RPEG_CACHE_DIR/cpu-local.yaml
    (default ~/.cache/rpeg/cpu-local.yaml); as D devices sharing its cores, cpu-local-x{D}.yaml
    beside it."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "rpeg")
    name = CPU_LOCAL_FILE if devices == 1 else f"{CPU_LOCAL}-x{devices}.yaml"
    return pathlib.Path(root) / name


def load_cpu_local(path: str | os.PathLike | None = None, devices: int = 1) -> Device:
    """The cpu-local device as `rpeg calibrate` wrote it (one of `devices` sharing this machine).
    Reading never measures: a machine not yet measured is an error that says how to measure it."""
    return _load_cpu_local(path, devices)[0]


def _load_cpu_local(path: str | os.PathLike | None, devices: int) -> tuple[Device, dict | None]:
    """The device and its file's `loopback:` section (None without one), from one read of the file."""
    path = pathlib.Path(path) if path is not None else cpu_local_path(devices)
    command = "`rpeg calibrate" + (f" --devices {devices}" if devices > 1 else "") + "`"
    if not path.is_file():
        what = "this machine" if devices == 1 else f"this machine as {devices} devices sharing its cores"
        raise NotCalibrated(f"cpu-local ({what}) has not been measured: run {command} first (about 2 s; it "
                            f"writes {path})")
    try:
        data = read_yaml_file(str(path))
        device = device_from_data(without_loopback(data), str(path), default_name=CPU_LOCAL)
        return device, _loopback(data, f"{path}: {LOOPBACK}")
    except RpegError as e:
        raise RpegError(f"{e} (delete the file or run {command} to measure again)") from None


LOOPBACK = "loopback"  # a D-device calibration's measured link between its D processes


def without_loopback(data: Any) -> Any:
    """A cpu-local file's figures without its `loopback:` section (the link is the cluster's)."""
    return {k: v for k, v in data.items() if k != LOOPBACK} if isinstance(data, dict) else data


def _loopback(data: Any, where: str) -> dict | None:
    """The loopback link `rpeg calibrate --devices D` measured between its D processes
    (`bandwidth_gbit_per_s`, `latency_us`, `sources`), or None when the file has none."""
    link = data.get(LOOPBACK) if isinstance(data, dict) else None
    if link is None:
        return None
    if not isinstance(link, dict) or set(link) != {"bandwidth_gbit_per_s", "latency_us", "sources"}:
        raise RpegError(f"{where}: expected bandwidth_gbit_per_s, latency_us and sources")
    for key in ("bandwidth_gbit_per_s", "latency_us"):
        _number(link[key], f"{where}.{key}", unit=split_unit(key)[1])
    return link


# ---- clusters ----------------------------------------------------------------------------------
def load_cluster(name_or_path: str | os.PathLike, gpus: int | None = None) -> Cluster:
    """A preset cluster by name (`dgx-h100`) or a cluster file by path, sized to `gpus` devices
    when given (the outermost level grows to hold them)."""
    data, where, preset = _read("clusters", name_or_path)
    shared = None
    if preset == CPU_LOCAL and gpus and gpus > 1:  # D devices share this machine's cores: each has what it
        shared, link = _load_cpu_local(None, gpus)  # measured while all D ran (`rpeg calibrate --devices D`)
        if link is not None:  # ... and the loopback between them, measured instead of assumed
            data = dict(data, levels=[_measured_loopback(lv, link) if lv.get("name") == "system" else lv
                                      for lv in data["levels"]])
    sharing = ()
    if shared is not None and all(cpu_local_path(k).is_file() for k in range(1, gpus)):
        # one device as measured while k = 1 .. D of them run: the step model costs each stage by how
        # many of the machine's devices are busy beside it (perf.step)
        sharing = tuple(load_cpu_local(devices=k) for k in range(1, gpus)) + (shared,)
    cluster = cluster_from_data(data, where, default_name=preset or _stem(where), device=shared)
    if preset and cluster.name != preset:
        raise RpegError(f"{where}: name: {cluster.name!r} differs from the file name {preset!r}")
    if sharing:
        cluster = dataclasses.replace(cluster, sharing=sharing)
    if gpus is None:
        return cluster
    try:
        return cluster.with_gpus(gpus)
    except RpegError as e:
        raise RpegError(f"{where}: {e}") from None


def _measured_loopback(level: dict, link: dict) -> dict:
    sources = dict(level.get("sources", {}), **link["sources"])
    return dict(level, bandwidth_gbit_per_s=link["bandwidth_gbit_per_s"], latency_us=link["latency_us"],
                sources=sources)


def cluster_from_data(data: Any, where: str, default_name: str = "", device: Device | None = None) -> Cluster:
    """A Cluster from one parsed cluster file; `device`, when given, stands for the file's."""
    if not isinstance(data, dict):
        raise RpegError(f"{where}: expected a mapping with device and levels, got {_show(data)}")
    for key in data:
        if key not in CLUSTER_KEYS:
            raise RpegError(f"{where}: {key}: unknown key (known: {', '.join(CLUSTER_KEYS)})")
    for key in ("device", "levels"):
        if key not in data:
            raise RpegError(f"{where}: {key}: missing (a cluster names its device and its levels)")
    name = _name(data.get("name", default_name), f"{where}: name")
    device = device if device is not None else _cluster_device(data["device"], where, name)
    gpus = _integer(data["gpus"], f"{where}: gpus", zero_ok=True, most=MAX_GPUS) if "gpus" in data else 0
    price = (_number(data["gpu_hour_usd"], f"{where}: gpu_hour_usd", zero_ok=True, most=MAX_GPU_HOUR_USD)
             if "gpu_hour_usd" in data else 0.0)
    sources = list(_sources(data.get("sources"), [k for k in ("gpus", "gpu_hour_usd") if k in data], where))
    raw_levels = data["levels"]
    if not isinstance(raw_levels, list) or not raw_levels:
        raise RpegError(f"{where}: levels: expected a list of levels, innermost first, got {_show(raw_levels)}")
    levels: list[Level] = []
    for i, raw in enumerate(raw_levels):
        last = i == len(raw_levels) - 1
        level, level_sources = _level(raw, f"{where}: levels[{i}]", device, levels[-1].gpus if levels else 1,
                                      outermost_gpus=gpus if last else None)
        levels.append(level)
        sources += [(f"levels.{level.name}.{k}", v) for k, v in level_sources]
    try:
        return Cluster(name=name, device=device, levels=tuple(levels), gpus=gpus, gpu_hour_usd=price,
                       sources=tuple(sources), description=_text(data.get("description", ""), f"{where}: description"))
    except RpegError as e:
        raise RpegError(f"{where}: {e}") from None


def _cluster_device(value: Any, where: str, cluster_name: str) -> Device:
    if isinstance(value, dict):
        return device_from_data(value, f"{where}: device", default_name=f"{cluster_name}-device")
    if not isinstance(value, str):
        raise RpegError(f"{where}: device: expected a device name, a path or a mapping, got {_show(value)}")
    if _is_path(value) and not os.path.isabs(value) and os.path.exists(where):
        value = os.path.join(os.path.dirname(where), value)  # relative to the cluster file
    try:
        return load_device(value)
    except NotCalibrated:
        raise  # what to do is the same whichever cluster names cpu-local
    except RpegError as e:
        raise RpegError(f"{where}: device: {e}") from None


def _level(raw: Any, where: str, device: Device, below: int, outermost_gpus: int | None) -> tuple[Level, tuple]:
    """One level. The outermost may leave out `gpus` (it then holds the cluster's `gpus`, or one
    unit of the level below until `with_gpus` grows it); a `memory` level may leave out its
    bandwidth (then the device's own memory bandwidth)."""
    if not isinstance(raw, dict):
        raise RpegError(f"{where}: expected a mapping, got {_show(raw)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise RpegError(f"{where}.name: missing (every level has a name: node, rack, system, ...)")
    where = f"{where} ({name})"
    bandwidth_key = None
    for key in raw:
        split = split_unit(str(key))
        if split and split[0] == "bandwidth" and UNITS[split[1]][0] == "bandwidth":
            if bandwidth_key:
                raise RpegError(f"{where}.{key}: the bandwidth is already given as {bandwidth_key}")
            bandwidth_key = key
        elif key not in LEVEL_KEYS:
            raise RpegError(f"{where}.{key}: unknown key (known: {', '.join(LEVEL_KEYS)}, "
                            f"bandwidth_<unit> with unit gb_per_s, gbit_per_s or tb_per_s)")
    link = raw.get("link")
    if link not in get_args(Link):
        raise RpegError(f"{where}.link: {link!r} is not one of {', '.join(get_args(Link))}")
    if "gpus" in raw:
        gpus = _integer(raw["gpus"], f"{where}.gpus", most=MAX_GPUS)
    elif outermost_gpus is not None:
        gpus = max(below, math.ceil(outermost_gpus / below) * below)
    else:
        raise RpegError(f"{where}.gpus: missing (devices in one unit; only the outermost level may leave it out)")
    if bandwidth_key:
        unit = split_unit(bandwidth_key)[1]
        bandwidth = to_si(_number(raw[bandwidth_key], f"{where}.{bandwidth_key}", unit=unit), unit)
    elif link == "memory":
        bandwidth = device.hbm_bandwidth_bytes_per_s
    else:
        raise RpegError(f"{where}.bandwidth_gb_per_s: missing (per device, per direction; "
                        f"or bandwidth_gbit_per_s for a NIC)")
    if "latency_us" not in raw:
        raise RpegError(f"{where}.latency_us: missing")
    latency = to_si(_number(raw["latency_us"], f"{where}.latency_us", unit="us"), "us")
    oversubscription = _number(raw.get("oversubscription", 1.0), f"{where}.oversubscription",
                               most=MAX_OVERSUBSCRIPTION)
    if oversubscription < 1:
        raise RpegError(f"{where}.oversubscription: must be at least 1 (1 = full bandwidth), got {oversubscription}")
    figures = [k for k in ("gpus", bandwidth_key, "latency_us", "oversubscription") if k and k in raw]
    sources = _sources(raw.get("sources"), figures, where, sep=".")
    try:
        level = Level(name=name, gpus=gpus, link=link, bandwidth_bytes_per_s=bandwidth, latency_s=latency,
                      oversubscription=oversubscription)
    except RpegError as e:
        raise RpegError(f"{where}: {e}") from None
    return level, sources


# ---- values ------------------------------------------------------------------------------------
def _sources(value: Any, keys: list[str], where: str, sep: str = ": ") -> tuple[tuple[str, str], ...]:
    """Every figure key has a non-empty source, and every source belongs to a figure."""
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise RpegError(f"{where}{sep}sources: expected a mapping of figure key -> citation, got {_show(value)}")
    for key, text in value.items():
        if key not in keys:
            raise RpegError(f"{where}{sep}sources.{key}: no such figure here (figures: {', '.join(keys) or 'none'})")
        if not isinstance(text, str) or not text.strip():
            raise RpegError(f"{where}{sep}sources.{key}: expected a citation (datasheet and year, paper, "
                            f"or how it was measured), got {_show(text)}")
    missing = [k for k in keys if k not in value]
    if missing:
        raise RpegError(f"{where}{sep}sources.{missing[0]}: missing (every figure needs a source)")
    return tuple((k, value[k].strip()) for k in keys)


def _number(value: Any, where: str, zero_ok: bool = False, unit: str | None = None,
            most: float | None = None) -> float:
    """A finite number, positive (or zero where `zero_ok`), within its quantity's SI_RANGES when `unit`
    names its unit and at most `most` when given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RpegError(f"{where}: expected a number, got {_show(value)}")
    if value < 0 or (value == 0 and not zero_ok):
        raise RpegError(f"{where}: must be {'zero or ' if zero_ok else ''}positive, got {value}")
    if unit is not None and value:
        lo, hi, si = SI_RANGES[UNITS[unit][0]]
        one = to_si(1.0, unit)
        if not lo <= to_si(value, unit) <= hi:
            raise RpegError(f"{where}: {value:g} is outside [{lo / one:g}, {hi / one:g}] ({lo:g} to {hi:g} {si}; "
                            "every device built lies far inside)")
    if most is not None and value > most:
        raise RpegError(f"{where}: {show(value)} exceeds {show(most)}")
    return float(value)


def _integer(value: Any, where: str, zero_ok: bool = False, most: float | None = None) -> int:
    number = _number(value, where, zero_ok, most=most)
    if not number.is_integer():
        raise RpegError(f"{where}: expected a whole number, got {value}")
    return int(number)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise RpegError(f"{where}: expected a string, got {_show(value)}")
    return value


def _name(value: Any, where: str) -> str:
    if isinstance(value, str) and not value.strip():
        raise RpegError(f"{where}: an empty name (it labels the plans and tables; leave the key out for the file's)")
    return _text(value, where)


def _units_text() -> str:
    by_quantity: dict[str, list[str]] = {}
    for unit, (quantity, _, _) in UNITS.items():
        by_quantity.setdefault(quantity, []).append(unit)
    return "; ".join(f"{q} {'|'.join(us)}" for q, us in by_quantity.items())


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 40 else text[:37] + "..."
