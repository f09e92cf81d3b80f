"""`rpeg calibrate`: measure this machine once, as the cpu-local device, so plans can be costed for it.

`calibrate()` times, within about `seconds` (2 by default):
- a numpy float32 square matmul (2 n^3 FLOP each; the best run counts). numpy has no bf16 or fp16
  matmul that runs at a CPU's full rate, so the fp32 rate stands in for bf16 and fp16, and the
  file says so; fp8 is 0 (unsupported);
- a copy of a large float64 array (`np.copyto`; bytes read + bytes written over the time of the
  best run): the memory bandwidth;
- total RAM from `os.sysconf` as the "HBM" capacity (a CPU's memory is its RAM).

It writes them, in the device file schema with how each was measured (the command, the date,
the numpy version) as its source, to `$RPEG_CACHE_DIR/cpu-local.yaml` (default
`~/.cache/rpeg/cpu-local.yaml`). `load_device("cpu-local")` only reads that file (rpeg.hardware
.loader): loading never measures and never writes; without the file it is an error that says to
run `rpeg calibrate`. Nothing here runs at import time.

Measure (again): `rpeg calibrate [--seconds S]`.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import sys
import time

import yaml

from rpeg.errors import RpegError
from rpeg.hardware.device import Device
from rpeg.hardware.loader import CACHE_ENV, cpu_local_path, device_from_data

MATMUL_N = 1024  # 2.1 GFLOP a run: tens of ms on a laptop core, so several runs fit the budget
COPY_BYTES = 128 * 2**20  # per array; well past any last-level cache


def calibrate(path: str | os.PathLike | None = None, seconds: float = 2.0) -> Device:
    """Measure this machine, write the cache file, and return the device it describes."""
    import numpy as np

    path = pathlib.Path(path) if path is not None else cpu_local_path()
    seconds = max(0.05, float(seconds))
    flop_per_s, matmul_runs = _matmul_flop_per_s(np, 0.6 * seconds)
    bytes_per_s, copy_runs = _copy_bytes_per_s(np, 0.4 * seconds)
    ram_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    how = (f"measured {when} by rpeg.hardware.calibrate.calibrate(seconds={seconds:g}) "
           f"(`rpeg calibrate`), numpy {np.__version__}, Python {sys.version.split()[0]}")
    matmul = (f"{how}: float32 {MATMUL_N}x{MATMUL_N} matmul, 2*n^3 FLOP over the best of {matmul_runs} runs")
    stand_in = "; the fp32 rate stands in for this dtype (numpy has no fast bf16/fp16 matmul on CPUs)"
    data = {
        "name": "cpu-local",
        "kind": "cpu",
        "description": f"this machine's CPU ({os.cpu_count()} logical cores), measured",
        "bf16_dense_gflop_per_s": round(flop_per_s / 1e9, 2),
        "fp16_dense_gflop_per_s": round(flop_per_s / 1e9, 2),
        "fp8_dense_gflop_per_s": 0,
        "hbm_capacity_gb": round(ram_bytes / 1e9, 3),
        "hbm_bandwidth_gb_per_s": round(bytes_per_s / 1e9, 2),
        "scaleup_bandwidth_gb_per_s": 0,
        "sources": {
            "bf16_dense_gflop_per_s": matmul + stand_in,
            "fp16_dense_gflop_per_s": matmul + stand_in,
            "fp8_dense_gflop_per_s": "none: numpy has no fp8 type; 0 means unsupported",
            "hbm_capacity_gb": f"{how}: total RAM, os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')",
            "hbm_bandwidth_gb_per_s": (f"{how}: np.copyto of a {COPY_BYTES // 2**20} MiB float64 array, "
                                       f"bytes read + bytes written over the best of {copy_runs} runs"),
            "scaleup_bandwidth_gb_per_s": "none: one CPU has no scale-up link (NVLink/xGMI); 0 means none",
        },
    }
    header = ("# cpu-local: this machine, as rpeg.hardware.calibrate measured it. Delete this file, or run\n"
              "# `rpeg calibrate`, to measure again. 'hbm' is the machine's RAM here.\n")
    text = header + yaml.safe_dump(data, sort_keys=False, width=1000, allow_unicode=True)
    device = device_from_data(yaml.safe_load(text), str(path), default_name="cpu-local")
    _write(path, text)
    return device


def _matmul_flop_per_s(np, budget_s: float) -> tuple[float, int]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
    b = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, b, out=out)  # warm-up: thread pool start, page faults
    return _best_rate(lambda: np.matmul(a, b, out=out), 2.0 * MATMUL_N**3, budget_s)


def _copy_bytes_per_s(np, budget_s: float) -> tuple[float, int]:
    src = np.ones(COPY_BYTES // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # warm-up: first touch of dst's pages
    return _best_rate(lambda: np.copyto(dst, src), 2.0 * src.nbytes, budget_s)


def _best_rate(run, work: float, budget_s: float) -> tuple[float, int]:
    """The best work/time over repeated runs within the budget (at least 2 runs)."""
    best, runs, deadline = 0.0, 0, time.perf_counter() + budget_s
    while runs < 2 or time.perf_counter() < deadline:
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        best, runs = max(best, work / max(elapsed, 1e-9)), runs + 1
    return best, runs


def _write(path: pathlib.Path, text: str) -> None:
    """Write through a temporary file so an interrupted run never leaves half a cache."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        raise RpegError(f"cannot write the cpu-local calibration to {path}: {e.strerror} "
                        f"(set {CACHE_ENV} to a writable folder)") from None
