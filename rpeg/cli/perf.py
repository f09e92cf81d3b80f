"""The performance-model commands of `rpeg`: predict, validate, hardware, calibrate."""

from __future__ import annotations

import argparse
import os

from rpeg.cli.common import CLUSTER, count, header, job_options, job_spec, name, print_json, real
from rpeg.errors import DoesNotFit
from rpeg.graph.bounds import MAX_GPUS
from rpeg.report import table


def add_parsers(sub) -> None:
    pr = sub.add_parser("predict", help="per-stage time, memory per GPU and the bottleneck of a planned job")
    job_options(pr)
    pr.add_argument("--cluster", type=CLUSTER,
                    help="cluster preset or file (default: the job file's, else dgx-h100)")
    pr.add_argument("--gpus", type=count(1, MAX_GPUS), help="devices to use (default: the job file's, else one node)")
    pr.add_argument("--json", action="store_true", help="print JSON")
    pr.set_defaults(fn=cmd_predict)
    from rpeg.perf.validation import bundled

    va = sub.add_parser("validate", help="predicted vs measured for a file of published measurements")
    va.add_argument("file", nargs="?", help="a validation YAML file, or the name of one RPEG ships: "
                                            + ", ".join(bundled()) + " (rpeg/data/validation, sources in SOURCES.md)")
    va.add_argument("--all", action="store_true", help="every validation file RPEG ships, one after another")
    va.add_argument("--json", action="store_true", help="print JSON")
    va.add_argument("--loo", action="store_true",
                    help="also the fitted constants' rows (rpeg/data/fitted.yaml): in-sample and leave-one-out "
                         "predictions as scripts/fit_factors.py stored them, beside a fresh prediction")
    va.set_defaults(fn=cmd_validate)
    sub.add_parser("hardware", help="device and cluster presets").set_defaults(fn=cmd_hardware)
    ca = sub.add_parser("calibrate", help="measure this machine's matmul rate and memory bandwidth (cpu-local)")
    ca.add_argument("--out", type=name("a file to write"),
                    help="where to write the figures (default: $RPEG_CACHE_DIR/cpu-local.yaml, "
                         "else ~/.cache/rpeg/cpu-local.yaml: what loading cpu-local reads)")
    ca.add_argument("--seconds", type=real(0.05, 600), default=2.0, help="time budget of the measurements (2)")
    ca.add_argument("--if-missing", action="store_true",
                    help="measure only if the file does not exist yet (else print its figures)")
    ca.add_argument("--devices", type=count(1, 64), default=1,
                    help="measure this machine as D devices sharing its cores, each while all D run, for plans "
                         "on D cpu-local devices (writes cpu-local-xD.yaml; default 1)")
    ca.set_defaults(fn=cmd_calibrate)


def _gb(b: float) -> str:
    return f"{b / 1e9:.1f}"


def cmd_predict(args: argparse.Namespace) -> int:
    from rpeg.perf.step import predict_step
    from rpeg.search.default import default_plan

    spec = job_spec(args)
    graph = spec.graph()
    _, cluster, gpus = spec.cluster_and_gpus(args.cluster, args.gpus, graph=graph)
    planned_by = "the job's passes"
    if not graph.groups:
        graph = default_plan(graph, cluster, gpus)
        planned_by = "the default plan (everything colocated, the smallest tensor parallelism that fits)"
    pred = predict_step(graph, cluster)
    rows = []
    for s in graph.stages:
        c = pred.stages[s.name]
        grp = graph.group(s.group) if s.group else None
        where = f"{grp.name} {grp.first}-{grp.first + grp.count - 1}" if grp else "-"
        rows.append((s.name, where, s.layout.describe() if s.layout else "-", c))
    if "context_switch" in pred.stages:
        rows.append(("context_switch", "colocated", "-", pred.stages["context_switch"]))
    if args.json:
        print_json({
            "cluster": cluster.name, "gpus": gpus, "step_s": pred.step_s if pred.fits else None, "tokens_per_s_per_gpu": pred.tokens_per_s_per_gpu,
            "fits": pred.fits, "bottleneck": pred.bottleneck, "cost_usd_per_step": cluster.usd(gpus, pred.step_s) if pred.fits else None,
            "stages": [{"stage": n, "devices": w, "layout": lay, "seconds": c.seconds if c.fits else None,
                        "parts": {k: v for k, v in c.parts if v < float("inf")},
                        "peak_memory_gb": c.peak_memory_bytes / 1e9,
                        "memory_gb": {k: v / 1e9 for k, v in c.memory_parts}, "fits": c.fits} for n, w, lay, c in rows],
            "memory": [_memory_json(m) for m in pred.memory]})
        if not pred.fits:
            raise DoesNotFit(f"the plan does not fit in memory on {len(pred.oom)} device group(s): \"memory\" in the "
                             "JSON above names the models that overflow")
        return 0
    print(header(graph, spec))
    print(f"cluster: {cluster.name}, {gpus} x {cluster.device.name}; layout from {planned_by}")
    total = sum(c.seconds for *_, c in rows if c.fits) or 1.0
    body = []
    for n, w, lay, c in rows:
        top = sorted(c.parts, key=lambda kv: -kv[1])[:3]
        body.append([n, w, lay, f"{c.seconds:.2f}" if c.fits else "-",
                     f"{100 * c.seconds / total:.0f}%" if c.fits and total < float("inf") else "-",
                     ", ".join(f"{k} {v:.2f}" for k, v in top if 0 < v < float("inf")) or "-",
                     _gb(c.peak_memory_bytes) if c.peak_memory_bytes else "-", "yes" if c.fits else "NO"])
    print()
    print(table(["stage", "devices", "layout", "seconds", "share", "where the time goes", "GB/GPU", "fits"], body,
                right=[3, 4, 6]))
    print()
    print(memory_table(pred))
    if pred.fits:
        print(f"\nstep time: {pred.step_s:.2f} s  ({pred.tokens_per_s_per_gpu:,.0f} tokens/s/GPU; bottleneck: "
              f"{pred.bottleneck})")
    usd = cluster.usd(gpus, pred.step_s) if pred.fits else 0.0
    if usd:
        print(f"cost: ${usd:.2f} per step at ${cluster.gpu_hour_usd:g} per GPU-hour")
    if not pred.fits:
        for m in pred.oom:
            print(f"OUT OF MEMORY: {m.describe()}; try ZeRO-3, offload, full recomputation, more tensor or "
                  "pipeline parallelism, other devices for some models, or more GPUs")
        # the exit code of a plan that does not fit, with its one line on stderr as every refusal has
        raise DoesNotFit(f"the plan does not fit in memory on {len(pred.oom)} device group(s): "
                         "the OUT OF MEMORY line above names the models that overflow")
    return 0


def memory_table(pred) -> str:
    """Per set of devices, what each device holds at its peak: one line per co-resident item, named
    by model and stage, resident ones first (rpeg/perf/residency.py)."""
    body = []
    for m in pred.memory:
        where = f"{m.name} {m.devices}"
        for h in m.lines:
            if h.bytes > 0:
                body.append([where, h.model, h.stage, h.what, "step" if h.resident else "its stage", _gb(h.bytes)])
                where = ""
        for h in m.moved:
            body.append([where, h.model, h.stage, h.what, "moved out", f"({_gb(h.bytes)})"])
            where = ""
        body.append(["", "", "", f"sum while {m.peak_unit} runs", f"of {_gb(m.capacity_bytes)}",
                     _gb(m.peak_bytes) + ("" if m.fits else " NO")])
    return table(["devices", "model", "stage", "held per GPU", "held for", "GB"], body, right=[5])


def _memory_json(m) -> dict:
    return {"group": m.name, "devices": m.devices, "peak_gb": m.peak_bytes / 1e9,
            "capacity_gb": m.capacity_bytes / 1e9, "fits": m.fits, "peak_while": m.peak_unit,
            "lines": [{"model": h.model, "stage": h.stage, "what": h.what, "gb": h.bytes / 1e9,
                       "resident": h.resident} for h in m.lines],
            "moved_out": [{"model": h.model, "stage": h.stage, "what": h.what, "gb": h.bytes / 1e9} for h in m.moved]}


def cmd_validate(args: argparse.Namespace) -> int:
    from rpeg.errors import RpegError
    from rpeg.perf.validation import bundled, resolve

    if args.all == (args.file is not None):
        raise RpegError("validate: name one file (a path, or one RPEG ships: " + ", ".join(bundled())
                        + ") or give --all, not " + ("both" if args.all else "neither"))
    if not args.all:
        path = resolve(args.file)
        code, report = _validate(path, args.json)
        stems = [s for s, p in bundled().items() if os.path.abspath(p) == os.path.abspath(path)]
        loo = _loo(stems, args.json) if args.loo else None
        if args.json:
            print_json({**report, "fitted": loo} if args.loo else report)
        return code
    codes, reports = [], {}
    for i, (stem, path) in enumerate(bundled().items()):
        if not args.json:
            print(("\n" if i else "") + f"== {stem} ({path.name}) ==")
        code, reports[stem] = _validate(str(path), args.json)
        codes.append(code)
    loo = _loo(None, args.json) if args.loo else None
    if args.json:
        print_json({"files": reports, **({"fitted": loo} if args.loo else {})})
    return max(codes)


def _loo(stems, as_json: bool):
    """The fitted constants' rows of these shipped files (None: all), in-sample and leave-one-out."""
    from rpeg.perf.fit import loo_report
    from rpeg.perf.fitted import FIT_COMMAND, fitted_file

    rows = loo_report(stems)
    values = {name: rec["value"] for name, rec in fitted_file().items()}
    if as_json:
        return {"constants": values, "rows": [{"group": r.group, "id": r.id, "measured": r.measured,
                                               "in_sample": r.in_sample, "loo": r.loo, "now": r.now,
                                               "stale": r.stale} for r in rows]}
    if not rows:
        print("\nno fitted constant is fitted on rows of this file")
        return None
    print("\nfitted constants (rpeg/data/fitted.yaml): " + ", ".join(f"{k} = {v:.4g}" for k, v in values.items()))
    body = [[r.group, r.id, f"{r.measured:.2f}", f"{r.in_sample:.2f}", f"{100 * (r.in_sample / r.measured - 1):+.0f}%",
             f"{r.loo:.2f}", f"{100 * (r.loo / r.measured - 1):+.0f}%", "STALE" if r.stale else ""] for r in rows]
    print(table(["group", "row", "measured s", "in-sample s", "error", "leave-one-out s", "error", ""], body,
                right=[2, 3, 4, 5, 6]))
    by_group: dict[str, list] = {}
    for r in rows:
        by_group.setdefault(r.group, []).append(r)
    print()
    for g, rs in by_group.items():
        ins = sum(abs(r.in_sample / r.measured - 1) for r in rs) / len(rs)
        loo = sum(abs(r.loo / r.measured - 1) for r in rs) / len(rs)
        print(f"mean absolute percentage error, {g}: in-sample {100 * ins:.1f}%, leave-one-out {100 * loo:.1f}% "
              f"({len(rs)} rows)")
    stale = [r.id for r in rows if r.stale]
    if stale:
        print(f"STALE: {len(stale)} row(s) predicted now differ from the stored in-sample prediction (the model "
              f"changed since the fit, first {stale[0]}): rerun `{FIT_COMMAND}`")
    return None


def _validate(path: str, as_json: bool) -> tuple[int, dict | None]:
    """One validation file: the exit code (3 when a measured run is predicted not to fit) and, with
    `as_json`, the report as a dict (else it is printed)."""
    from rpeg.graph.serde import read_yaml_file
    from rpeg.perf.validation import stage_mapes, summary, validate_data
    from rpeg.search.ratios import ratios_data

    data = read_yaml_file(path)  # once: both sections' readers take the parsed file
    results = validate_data(data, path)
    ratios = ratios_data(data, path)
    mapes = summary(results)
    by_stage = stage_mapes(results)
    unfit = [r.id for r in results if not r.fits]
    code = 3 if unfit else 0
    if as_json:
        entries = []
        for r in results:
            e = {"id": r.id, "kind": r.kind, "predicted": r.predicted if r.fits else None, "measured": r.measured,
                 "error": r.error, "fits": r.fits, "parts": dict(r.parts)}
            if r.note:  # out of memory, and the run conditions the model does not read
                e["note"] = r.note
            if r.stages:
                e["stages"] = {s.stage: {"predicted": s.predicted, "measured": s.measured, "error": s.error}
                               for s in r.stages}
            entries.append(e)
        report = {"entries": entries, "mape": mapes["all"],
                  "mape_by_kind": {k: v for k, v in mapes.items() if k != "all"}, "not_fitting": unfit}
        if by_stage:
            report["mape_by_stage"] = by_stage
        if ratios:
            report["ratios"] = [{"id": r.id, "faster": r.faster, "slower": r.slower, "published": r.published,
                               "predicted": r.predicted, "predicted_over_published": r.off_by,
                               "per_model": [{"model": m, "faster_s": f, "slower_s": s, "ratio": q}
                                             for m, f, s, q in r.per_model]} for r in ratios]
        return code, report
    if results:
        _print_entries(results, mapes)
    if by_stage:
        _print_stages(results, by_stage)
    if ratios:
        _print_ratios(ratios)
    if unfit:
        print(f"\nDOES NOT FIT: the model predicts {len(unfit)} measured run(s) out of memory ({', '.join(unfit)}): "
              "the memory model, or the entry, is wrong there")
    return code, None


def _print_entries(results, mapes) -> None:
    body = []
    for r in results:
        top = sorted(r.parts, key=lambda kv: -kv[1])[:4] if r.fits else []  # an OOM entry: which stages
        body.append([r.id, r.kind, f"{r.predicted:.2f}" if r.fits else "does not fit", f"{r.measured:.2f}",
                     f"{100 * r.error:+.1f}%" if r.fits else "-",
                     ", ".join(f"{k} {v:.1f}" for k, v in top) + (f"  [{r.note}]" if r.note else "")])
    print(table(["entry", "kind", "predicted s", "measured s", "error", "largest parts (s)"], body, right=[2, 3, 4]))
    print()
    for kind, value in mapes.items():
        label = "all entries" if kind == "all" else f"{kind} entries"
        fitting = [r for r in results if r.fits and (kind == "all" or r.kind == kind)]
        if value is None:
            print(f"mean absolute percentage error, {label}: none predicted to fit")
            continue
        worst = max(abs(r.error) for r in fitting)
        print(f"mean absolute percentage error, {label}: {100 * value:.1f}% (worst {100 * worst:.1f}%)"
              + (f", over the {len(fitting)} that fit" if len(fitting) < sum(
                  1 for r in results if kind == "all" or r.kind == kind) else ""))


def _print_ratios(ratios) -> None:
    """Predicted against published step-time ratios between two systems' plans."""
    body = []
    for r in ratios:
        sizes = "; ".join(f"{m} {q:.2f}x" if q is not None else f"{m} does not fit" for m, _, _, q in r.per_model)
        body.append([r.id, f"{r.slower} / {r.faster}", f"{r.published:.2f}x",
                     f"{r.predicted:.2f}x" if r.predicted is not None else "does not fit",
                     f"{r.off_by:.2f}" if r.off_by is not None else "-", sizes if len(r.per_model) > 1 else ""])
    print("\nstep-time ratios between systems: published against predicted (plans as `rpeg plan` builds the peers')")
    print(table(["entry", "slower / faster", "published", "predicted", "predicted/published", "per model"], body,
                right=[2, 3, 4]))
    from rpeg.search.ratios import within

    print(f"\nwithin 0.75-1.33x of the published ratio: {len(within(ratios))} of {len(ratios)}")


def _print_stages(results, by_stage) -> None:
    """Predicted against measured for each stage an entry's measurement splits out."""
    from rpeg.perf.validation import SCORED_STAGES, STAGES_S

    shown = [k for k in STAGES_S if any(s.stage == k for r in results for s in r.stages)]
    body = []
    for r in results:
        if not r.stages:
            continue
        given = {s.stage: s for s in r.stages}
        row = [r.id]
        for k in shown:
            s = given.get(k)
            if s is None:
                row.append("")
            elif not r.fits:
                row.append(f"- / {s.measured:g}")
            else:
                row.append(f"{s.predicted:.1f} / {s.measured:g}" + (f" ({100 * s.error:+.0f}%)" if s.error is not None
                                                                    else ""))
        body.append(row)
    print("\nper stage, predicted / measured seconds (error)")
    print(table(["entry", *shown], body, right=list(range(1, len(shown) + 1))))
    print()
    for k in shown:
        if by_stage.get(k) is not None:
            note = "" if k in SCORED_STAGES else " (the step's published remainder: not in the stage mean)"
            print(f"mean absolute percentage error, {k}: {100 * by_stage[k]:.1f}%{note}")
    if by_stage.get("all") is not None:
        print(f"mean absolute percentage error, stages ({', '.join(k for k in SCORED_STAGES if k in by_stage)}): "
              f"{100 * by_stage['all']:.1f}%")


def cmd_hardware(args: argparse.Namespace) -> int:
    from rpeg.hardware import cluster_names, device_names, load_cluster, load_device

    rows = []
    for n in device_names():
        if n == "cpu-local":
            continue
        d = load_device(n)
        rows.append([d.name, f"{d.bf16_flop_per_s / 1e12:g}", f"{d.fp8_flop_per_s / 1e12:g}",
                     f"{d.hbm_capacity_bytes / 1e9:.0f}", f"{d.hbm_bandwidth_bytes_per_s / 1e9:g}",
                     f"{d.scaleup_bandwidth_bytes_per_s / 1e9:g}"])
    print(table(["device", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GB", "HBM GB/s", "scale-up GB/s"], rows,
                right=[1, 2, 3, 4, 5]))
    rows = []
    for n in cluster_names():
        if n == "cpu-local":
            continue
        c = load_cluster(n)
        levels = " -> ".join(f"{lv.name} {lv.gpus} ({lv.link} {lv.bandwidth_bytes_per_s / 1e9:g} GB/s)"
                             for lv in c.levels)
        rows.append([c.name, c.device.name, levels])
    print()
    print(table(["cluster", "device", "levels (GPUs per unit, link, per-GPU bandwidth)"], rows))
    print("\nsources: docs/hardware.md; `rpeg calibrate` measures this machine as cpu-local")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from rpeg.hardware.calibrate import calibrate
    from rpeg.hardware.loader import cpu_local_path, load_cpu_local

    path = args.out or cpu_local_path(args.devices)
    if args.if_missing and os.path.isfile(path):
        dev, what = load_cpu_local(path, args.devices), "measured before; read from"
    else:
        dev, what = calibrate(path, args.seconds, args.devices), "written to"
    each = f" as {args.devices} devices, each" if args.devices > 1 else ""
    layer = (f", a torch decoder layer's forward {dev.layer_host_s * 1e6:.0f} us a call + "
             f"{dev.layer_token_s * 1e6:.2f} us a token" if dev.layer_token_s else "")
    print(f"cpu-local{each}: {dev.bf16_flop_per_s / 1e9:.1f} GFLOP/s matmul, {dev.hbm_bandwidth_bytes_per_s / 1e9:.1f} "
          f"GB/s memory, {dev.hbm_capacity_bytes / 1e9:.1f} GB{layer}; {what} {path}")
    return 0
