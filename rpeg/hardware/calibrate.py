"""`rpeg calibrate`: measure this machine once, as the cpu-local device, so plans can be costed for it.

`calibrate()` times, within about `seconds` (2 by default):
- a numpy float32 square matmul (2 n^3 FLOP each; the best run counts). numpy has no bf16 or fp16
  matmul that runs at a CPU's full rate, so the fp32 rate stands in for bf16 and fp16, and the
  file says so; fp8 is 0 (unsupported);
- a copy of a large float64 array (`np.copyto`; bytes read + bytes written over the time of the
  best run): the memory bandwidth;
- total RAM from `os.sysconf` as the "HBM" capacity (a CPU's memory is its RAM);
- a transformer layer as PyTorch eager runs it here, which the matmul rate alone understates (a
  fixed per-op host cost; elementwise ops and the attention kernel that cost per token at small
  widths): `layer_host_us`, the fixed host time of one decoder layer's forward per call, and
  `layer_token_us`, its time per token beyond its FLOPs at the matmul rate measured above.
  `python -m rpeg.runtime.probe` measures them in a subprocess (this package never imports
  torch): a 2-layer Qwen2 of random weights, forward over 16-token rows at 2 and 32 rows, a line
  through the two times (see that module). The probe's budget is a third of `seconds`, at
  least PROBE_MIN_S, on top of the numpy measurements; starting torch adds a few seconds more.
  Without torch in this interpreter, or if the probe fails, the file goes without these two
  figures (planning on cpu-local then uses the generic host-time figures) and a line on stderr
  says why.

It writes them, in the device file schema with how each was measured (the command, the date,
the numpy version) as its source, to `$RPEG_CACHE_DIR/cpu-local.yaml` (default
`~/.cache/rpeg/cpu-local.yaml`). `load_device("cpu-local")` only reads that file (rpeg.hardware
.loader): loading never measures and never writes; without the file it is an error that says to
run `rpeg calibrate`. Nothing here runs at import time.

Several devices on one machine (`--devices D`, D > 1): the runtime runs a plan for D devices as D
worker processes that share this machine's cores (each with cores // D threads), so a device's
rate is what it reaches while the other D - 1 run too. D processes, each with that many threads,
start together and time the same matmul and copy, each taking the median of its runs (with more
processes than cores a process's best run is one the others left it alone for; the median is what
it gets while all D run), then the layer probe, D processes at once (medians too), the loopback
link between them (gloo all-reduces, written as the file's `loopback:` section, which
`load_cluster("cpu-local", D)` takes for the system level instead of its assumed figures) and what
FSDP2 adds over them (`fsdp_unit_us`, `gather_tensor_us`). A device's figures are their mean (the
spread is in the source), its memory RAM / D. They go to `cpu-local-x{D}.yaml` beside
`cpu-local.yaml`; `load_cluster("cpu-local", D)` reads them and is an error until they exist.

Measure (again): `rpeg calibrate [--seconds S] [--devices D]`.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time

import yaml

from rpeg.errors import RpegError
from rpeg.hardware.device import Device
from rpeg.hardware.loader import CACHE_ENV, CPU_LOCAL, cpu_local_path, device_from_data, without_loopback
from rpeg.outfolder import writable_file

MATMUL_N = 1024  # 2.1 GFLOP a run: tens of ms on a laptop core, so several runs fit the budget
COPY_BYTES = 128 * 2**20  # per array; well past any last-level cache


MAX_DEVICES = 64  # processes sharing one machine's cores; more is a typo, not a plan
PROBE_MODULE = "rpeg.runtime.probe"  # run as `python -m`: torch stays out of this process
PROBE_NEEDS = "torch"  # looked up with find_spec, never imported here
PROBE_MIN_S = 1.5  # the probe's least budget: a few dozen 32-row forwards
PROBE_START_S = 120  # the probe's allowance beyond its budget: starting torch, building the model


def calibrate(path: str | os.PathLike | None = None, seconds: float = 2.0, devices: int = 1) -> Device:
    """Measure this machine as `devices` devices sharing its cores, write the cache file, and
    return the device (one of them) it describes."""
    import numpy as np

    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= MAX_DEVICES:
        raise RpegError(f"calibrate: devices = {devices!r} must be a whole number from 1 to {MAX_DEVICES}")
    given = path is not None
    path = pathlib.Path(path) if given else cpu_local_path(devices)
    try:  # before the measurements: a file that cannot be written (/proc/x, /dev/null, a folder) is an error now
        writable_file(str(path), "--out" if given else "the cpu-local calibration")
    except RpegError as e:
        raise RpegError(str(e) if given else f"{e} (set {CACHE_ENV} to a writable folder, or give --out)") from None
    seconds = max(0.05, float(seconds))
    ram_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cores = os.cpu_count() or 1
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    call = f"seconds={seconds:g}" + (f", devices={devices}" if devices > 1 else "")
    how = (f"measured {when} by rpeg.hardware.calibrate.calibrate({call}) "
           f"(`rpeg calibrate`), numpy {np.__version__}, Python {sys.version.split()[0]}")
    threads = cores if devices == 1 else max(1, cores // devices)
    if devices == 1:
        flop_per_s, matmul_runs = _matmul_flop_per_s(np, 0.6 * seconds)
        bytes_per_s, copy_runs = _copy_bytes_per_s(np, 0.4 * seconds)
        shared = ""
        description = f"this machine's CPU ({cores} logical cores), measured"
    else:
        rates = _concurrent(devices, threads, seconds)
        flop_per_s = sum(r[0] for r in rates) / devices
        bytes_per_s = sum(r[2] for r in rates) / devices
        matmul_runs, copy_runs = min(r[1] for r in rates), min(r[3] for r in rates)
        ram_bytes //= devices
        shared = (f"; one of {devices} processes with {threads} thread(s) each, all measuring at "
                  f"once, the mean of theirs (matmul {min(r[0] for r in rates) / 1e9:.1f}-"
                  f"{max(r[0] for r in rates) / 1e9:.1f} GFLOP/s, copy {min(r[2] for r in rates) / 1e9:.1f}-"
                  f"{max(r[2] for r in rates) / 1e9:.1f} GB/s)")
        description = f"one of {devices} devices sharing this machine's CPU ({cores} logical cores), measured"
    matmul = (f"{how}: float32 {MATMUL_N}x{MATMUL_N} matmul, 2*n^3 FLOP over the best of {matmul_runs} runs"
              f"{shared}")
    stand_in = "; the fp32 rate stands in for this dtype (numpy has no fast bf16/fp16 matmul on CPUs)"
    data = {
        "name": CPU_LOCAL,
        "kind": "cpu",
        "description": description,
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
            "hbm_capacity_gb": (f"{how}: total RAM, os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')"
                                + (f", divided by the {devices} devices" if devices > 1 else "")),
            "hbm_bandwidth_gb_per_s": (f"{how}: np.copyto of a {COPY_BYTES // 2**20} MiB float64 array, "
                                       f"bytes read + bytes written over the best of {copy_runs} runs{shared}"),
            "scaleup_bandwidth_gb_per_s": "none: one CPU has no scale-up link (NVLink/xGMI); 0 means none",
        },
    }
    probe = _run_probe(threads, max(PROBE_MIN_S, seconds / 3), devices, flop_per_s)
    _add_layer_figures(data, probe, when, call)
    again = "`rpeg calibrate" + (f" --devices {devices}" if devices > 1 else "") + "`"
    header = (f"# cpu-local: this machine{f' as {devices} devices' if devices > 1 else ''}, as "
              f"rpeg.hardware.calibrate measured it. Delete this file, or run\n# {again}, to measure again. "
              "'hbm' is the machine's RAM here.\n")
    text = header + yaml.safe_dump(data, sort_keys=False, width=1000, allow_unicode=True)
    device = device_from_data(without_loopback(yaml.safe_load(text)), str(path), default_name="cpu-local")
    _write(path, text)
    return device


def _run_probe(threads: int, seconds: float, devices: int, flop_per_s: float) -> dict | None:
    """The layer probe's JSON (rpeg.runtime.probe), or None, with one line on stderr saying why,
    when torch is not importable or the probe fails."""
    command = [sys.executable, "-m", PROBE_MODULE, "--threads", str(threads), "--seconds", f"{seconds:g}",
               "--devices", str(devices), "--matmul-gflop-per-s", f"{flop_per_s / 1e9:.2f}"]
    why = None
    if importlib.util.find_spec(PROBE_NEEDS) is None:
        why = f"{PROBE_NEEDS} is not importable in {sys.executable}"
    else:
        try:
            proc = subprocess.run(command, capture_output=True, text=True, check=False,
                                  timeout=PROBE_START_S + 4 * seconds)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
                why = f"the layer probe exited with {proc.returncode}: {last}"
            else:
                result = json.loads(proc.stdout)
                host, token = result["layer_host_s"], result["layer_token_s"]
                if math.isfinite(host + token) and round(host * 1e6, 1) > 0 and round(token * 1e6, 3) > 0:
                    result["command"] = " ".join(["python"] + command[1:])
                    return result
                why = (f"the layer probe measured no usable fit (layer_host_s {host:g}, layer_token_s "
                       f"{token:g}; a loaded machine?): {result.get('fit', '')}")
        except subprocess.TimeoutExpired:
            why = f"the layer probe took over {PROBE_START_S + 4 * seconds:g} s"
        except (OSError, ValueError, KeyError, TypeError) as e:  # no JSON, or not the probe's
            why = f"the layer probe's output is unreadable ({type(e).__name__}: {e})"
    print(f"rpeg calibrate: no transformer-layer figures ({why}); planning on cpu-local will use the "
          "generic host-time figures", file=sys.stderr)
    return None


def _add_layer_figures(data: dict, probe: dict | None, when: str, call: str) -> None:
    """`layer_host_us` and `layer_token_us`, with their sources, before `sources`."""
    if probe is None:
        return
    sources = data.pop("sources")
    dims = ", ".join(f"{k} {v}" for k, v in probe["dims"].items())
    (r1, r2), (t1, t2) = probe["rows"], probe["times_s"]
    how = (f"measured {when} by rpeg.hardware.calibrate.calibrate({call}) running `{probe['command']}`, torch "
           f"{probe['torch']}, {probe['threads']} thread(s): a Qwen2ForCausalLM of random weights ({dims}; fp32, "
           f"sdpa, eval, no_grad), forward over {probe['seq']}-token rows, median of repeated runs: {r1} rows "
           f"{t1 * 1e3:.3f} ms, {r2} rows {t2 * 1e3:.3f} ms; {probe['fit']}")
    spread = probe.get("spread")
    if spread:
        (h0, h1), (f0, f1) = spread["layer_host_s"], spread["layer_token_s"]
        how += (f"; one of {probe['devices']} processes, all measuring at once, the mean of theirs (host "
                f"{h0 * 1e6:.1f}-{h1 * 1e6:.1f} us, per token {f0 * 1e6:.3f}-{f1 * 1e6:.3f} us; the times are means)")
    data["layer_host_us"] = round(probe["layer_host_s"] * 1e6, 1)
    data["layer_token_us"] = round(probe["layer_token_s"] * 1e6, 3)
    units = probe["units"]
    sources["layer_host_us"] = (f"{how}. The fixed time a over {units} units: the model's "
                                f"{units - 1} layers and one for the model call and the output head (a / {units})")
    sources["layer_token_us"] = (f"{how}. The time per row b less the row's FLOPs ({probe['flops_per_row'] / 1e6:.2f} "
                                 f"MFLOP as the perf model counts them, the head's included) at the matmul rate "
                                 f"above, per token and unit ((b - FLOPs / rate) / ({probe['seq']} x {units}))")
    data["sources"] = sources
    link = probe.get("loopback")
    shard = (link or {}).get("fsdp")
    if shard and shard["unit_s"] > 0 and shard["tensor_s"] > 0:  # D processes: FSDP2 as the trainer runs it
        base = (f"measured {when} by rpeg.hardware.calibrate.calibrate({call}) running `{probe['command']}`, torch "
                f"{probe['torch']}: the probe model in the runtime's Trainer over {link['world']} processes, the "
                f"median of 15 each: logprobs over {shard['rows']} rows whole {shard['whole_s'] * 1e3:.2f} ms and FSDP2-sharded "
                f"(fully_shard per layer and the root) {shard['sharded_s'] * 1e3:.2f} ms; the full weights gathered "
                f"(full_state_dict, {shard['tensors']} tensors) {shard['gather_s'] * 1e3:.2f} ms")
        sources = data.pop("sources")
        data["fsdp_unit_us"] = round(shard["unit_s"] * 1e6, 1)
        data["gather_tensor_us"] = round(shard["tensor_s"] * 1e6, 1)
        sources["fsdp_unit_us"] = f"{base}; (sharded - whole) / {shard['units']} units"
        sources["gather_tensor_us"] = f"{base}; the gather over its {shard['tensors']} tensors"
        data["sources"] = sources
    if link:  # D processes: the loopback link between them, as their gloo groups run it
        (b0, b1), (t0, t1) = link["bytes"], link["times_s"]
        text = (f"measured {when} by rpeg.hardware.calibrate.calibrate({call}) running `{probe['command']}`, torch "
                f"{probe['torch']}: {link['world']} processes, gloo all_reduce of {b0} and {b1} bytes, the median "
                f"of {link['runs']} each: {t0 * 1e6:.0f} us and {t1 * 1e6:.0f} us; as a ring")
        data["loopback"] = {
            "bandwidth_gbit_per_s": round(link["bandwidth_bytes_per_s"] * 8 / 1e9, 3),
            "latency_us": round(link["latency_s"] * 1e6, 1),
            "sources": {"bandwidth_gbit_per_s": f"{text}: 2 (n - 1) / n x the bytes between them over the time "
                                                "between them",
                        "latency_us": f"{text}: the small one's time over its 2 (n - 1) steps"}}


def _concurrent(devices: int, threads: int, seconds: float) -> list[tuple[float, int, float, int]]:
    """(matmul FLOP/s, runs, copy bytes/s, runs) of each of `devices` processes measuring at once."""
    return measure_together(_device_process, [(threads, seconds)] * devices, 120 + 4 * seconds)


def measure_together(target, args: list[tuple], timeout_s: float) -> list:
    """Start one fresh process per entry of `args` (spawned: thread counts set in the child apply
    before numpy or torch loads), each calling `target(barrier, results, *its args)`, and return what
    each put on `results`. The barrier lets them measure at the same moments; a process that dies
    before reporting is an RpegError."""
    import multiprocessing as mp
    import queue

    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(len(args)), ctx.Queue()
    procs = [ctx.Process(target=target, args=(start, results, *a), daemon=True) for a in args]
    for p in procs:
        p.start()
    try:
        return [results.get(timeout=timeout_s) for _ in procs]
    except queue.Empty:
        raise RpegError(f"calibrate: a measuring process of {len(args)} did not report (out of memory?)") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def _device_process(start, results, threads: int, seconds: float) -> None:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    import numpy as np

    start.wait()  # everyone measures matmul together, then the copy together
    flop, mruns = _matmul_flop_per_s(np, 0.6 * seconds, shared=True)
    start.wait()
    copy, cruns = _copy_bytes_per_s(np, 0.4 * seconds, shared=True)
    results.put((flop, mruns, copy, cruns))


def _matmul_flop_per_s(np, budget_s: float, shared: bool = False) -> tuple[float, int]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
    b = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, b, out=out)  # warm-up: thread pool start, page faults
    return _best_rate(lambda: np.matmul(a, b, out=out), 2.0 * MATMUL_N**3, budget_s, shared)


def _copy_bytes_per_s(np, budget_s: float, shared: bool = False) -> tuple[float, int]:
    src = np.ones(COPY_BYTES // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # warm-up: first touch of dst's pages
    return _best_rate(lambda: np.copyto(dst, src), 2.0 * src.nbytes, budget_s, shared)


def _best_rate(run, work: float, budget_s: float, shared: bool = False) -> tuple[float, int]:
    """The best work/time over repeated runs within the budget (at least 2 runs); `shared` (one of
    D processes measuring together): the median instead, since with more processes than cores a
    process's best run is one the others happened to leave it alone for, and the median is what it
    gets while all of them run."""
    rates, deadline = [], time.perf_counter() + budget_s
    while len(rates) < 2 or time.perf_counter() < deadline:
        start = time.perf_counter()
        run()
        rates.append(work / max(time.perf_counter() - start, 1e-9))
    return (statistics.median(rates) if shared else max(rates)), len(rates)


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
