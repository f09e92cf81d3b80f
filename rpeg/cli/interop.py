"""`rpeg import` and `rpeg export`: a peer's job read into RPEG, and RPEG's plan written as a peer's config.

    rpeg import run_qwen2-7b_math.sh --from verl [--cluster C] [--model M] [--response-mean N]
    rpeg export rpeg-out/rpeg-plan.yaml --to verl [--out FILE]

`import` prints what it read (and, one line each, what it could not map or had to assume), the
peer's plan as that system runs it beside the plan `rpeg plan` finds for the same job and devices,
and writes both as RPEG job files plus RPEG's plan in the peer's own config (`--out`).
`export` writes a plan file (a job whose passes make a complete plan: `rpeg plan` and `rpeg import`
write them) as the peer's config, with a comment block naming what the peer cannot express and the
predicted cost of leaving it out.
"""

from __future__ import annotations

import argparse
import os
import stat

from rpeg.cli.common import CLUSTER, FOLDER, MAX_STALENESS, MAX_STEPS, PRESET, count, name, print_json, real
from rpeg.errors import RpegError
from rpeg.graph.bounds import MAX_TOKENS
from rpeg.interop import SYSTEMS
from rpeg.outfolder import OutputFolder, writable_file
from rpeg.report import table

DEFAULT_CLUSTER = "dgx-h100"
MAX_FILE_BYTES = 4 << 20  # a launch script or config; anything larger is not one
MODES = {"sync": "synchronous trainer", "one-step-off": "one-step-off trainer", "fully-async": "fully-async trainer",
         "async": "async trainer"}


def add_parsers(sub) -> None:
    im = sub.add_parser("import", help="read a verl / OpenRLHF / AReaL job; its predicted step beside RPEG's plan")
    im.add_argument("file", metavar="FILE", help="the peer's launch script or config file")
    im.add_argument("--from", dest="system", required=True, choices=SYSTEMS, help="the system the file is for")
    im.add_argument("--model", type=PRESET,
                    help="RPEG preset of the actor when the config's model path names none (`rpeg models`)")
    im.add_argument("--response-mean", type=real(1, MAX_TOKENS),
                    help="mean response tokens (a config gives only the cap; default: a third of it)")
    im.add_argument("--cluster", type=CLUSTER,
                    help=f"cluster preset or file the job runs on (default {DEFAULT_CLUSTER})")
    im.add_argument("--max-staleness", type=count(0, MAX_STALENESS), default=1,
                    help="largest async bound RPEG's search may use (1; 0: keep the job's own)")
    im.add_argument("--no-partial-rollout", action="store_true",
                    help="RPEG's plan may not add partial rollout (responses that span weight versions)")
    im.add_argument("--allow-share", action="store_true",
                    help="RPEG's plan may share the critic's trunk with the actor (a different value model)")
    im.add_argument("--steps", type=count(1, MAX_STEPS), default=8, help="steps to simulate (8)")
    im.add_argument("--out", type=FOLDER, default="rpeg-out",
                    help="folder for the job files and RPEG's plan as a config (rpeg-out)")
    im.add_argument("--json", action="store_true", help="print JSON")
    im.set_defaults(fn=cmd_import)

    ex = sub.add_parser("export", help="write a plan as a verl / OpenRLHF / AReaL config")
    ex.add_argument("plan", metavar="PLAN.yaml", help="a job file whose passes make a complete plan "
                    "(rpeg plan and rpeg import write them)")
    ex.add_argument("--to", dest="system", required=True, choices=SYSTEMS, help="the system to write for")
    ex.add_argument("--cluster", type=CLUSTER, help="cluster for the predicted costs (default: the plan's, else "
                    f"{DEFAULT_CLUSTER})")
    ex.add_argument("--out", type=name("a file to write"),
                    help="file to write (default: print to standard output)")
    ex.set_defaults(fn=cmd_export)


def _read_text(path: str) -> str:
    if not os.path.exists(path):
        raise RpegError(f"{path}: no such file")
    if os.path.isdir(path):
        raise RpegError(f"{path}: is a folder, not a file")
    if not stat.S_ISREG(os.stat(path).st_mode):  # /dev/zero, a FIFO: endless, or waiting for a writer
        raise RpegError(f"{path}: not a regular file")
    too_big = f"{path}: more than {MAX_FILE_BYTES >> 20} MiB is not a launch script or config"
    if os.path.getsize(path) > MAX_FILE_BYTES:
        raise RpegError(too_big)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)  # bounded: a /proc file reports size 0 whatever it holds
        if len(raw) > MAX_FILE_BYTES:
            raise RpegError(too_big)
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RpegError(f"{path}: not a text file (UTF-8)") from None
    except OSError as e:
        raise RpegError(f"{path}: {e.strerror}") from None


def _predict(graph, cluster, steps: int):
    """(prediction, simulated timeline or None when it does not fit)."""
    from rpeg.perf.step import predict_step
    from rpeg.sim import simulate

    pred = predict_step(graph, cluster)
    return pred, simulate(graph, cluster, steps) if pred.fits else None


def _oom_text(pred, cluster) -> str:
    """The device group that overflows the most, by how much, and with which models."""
    worst = max(pred.oom, key=lambda m: m.peak_bytes - m.capacity_bytes) if pred.oom else None
    if worst is None:
        return "out of memory"
    return (f"device group {worst.name!r} holds {worst.peak_bytes / 1e9:.0f} GB per GPU of "
            f"{worst.capacity_bytes / 1e9:.0f} GB while {worst.peak_unit} runs: {', '.join(worst.models)}")


def _summary(name: str, pred, tl, cluster, gpus: int, ref_s: float | None) -> dict:
    if not pred.fits:
        return {"plan": name, "fits": False, "step_s": None, "does_not_fit": _oom_text(pred, cluster)}
    peak = pred.peak_memory_bytes
    return {"plan": name, "fits": True, "step_s": pred.step_s, "tokens_per_s": pred.tokens / pred.step_s,
            "utilization": tl.utilization, "mfu": tl.mfu, "peak_memory_gb": peak / 1e9,
            "usd_per_step": cluster.usd(gpus, pred.step_s), "bottleneck": pred.bottleneck,
            "speedup": None if ref_s is None else pred.step_s / ref_s}


def _stage_rows(graph, pred) -> list[list[str]]:
    rows = []
    for s in graph.stages:
        c = pred.stages[s.name]
        grp = graph.group(s.group) if s.group else None
        where = f"{grp.name} {grp.first}-{grp.first + grp.count - 1}" if grp else "-"
        rows.append([s.name, where, s.layout.describe() if s.layout else "-",
                     f"{c.seconds:.2f}" if c.fits else "-", f"{c.peak_memory_bytes / 1e9:.0f}" if c.fits else "NO"])
    return rows


def cmd_import(args: argparse.Namespace) -> int:
    from rpeg.algorithms import build_graph
    from rpeg.hardware import load_cluster
    from rpeg.interop import system
    from rpeg.interop.common import graph_of, job_data, view_of
    from rpeg.search.ladder import Permit, Start, allowed, ladder
    from rpeg.search.layouts import LayoutCache
    from rpeg.spec import spec_data, spec_from_data

    out = OutputFolder(args.out)
    text = _read_text(args.file)
    mod = system(args.system)
    imported = mod.read(text, args.file, model=args.model, response_mean=args.response_mean, cluster=args.cluster)
    view = imported.view.replace(cluster=imported.view.cluster or DEFAULT_CLUSTER)
    cluster = load_cluster(view.cluster, view.gpus)
    peer_graph = graph_of(view)
    peer_pred, peer_tl = _predict(peer_graph, cluster, args.steps)

    job = {k: v for k, v in job_data(view).items() if k != "passes"}
    spec = spec_from_data(job, args.file)
    bare = build_graph(spec.algorithm, spec.job, spec.models, **spec.config)
    start = Start(view.async_bound, view.partial, view.share)
    permit = Permit(args.max_staleness, not args.no_partial_rollout, args.allow_share)
    cache = LayoutCache()
    rungs = ladder(bare, cluster, view.gpus, start, permit, cache=cache)
    result, no_plan = allowed(bare, cluster, view.gpus, start, permit, rungs, cache=cache)
    best = result.best if result is not None else None
    rows = [_summary(f"{args.system} (as configured)", peer_pred, peer_tl, cluster, view.gpus, None)]
    if best is not None:
        rpeg_pred, rpeg_tl = _predict(best.graph, cluster, args.steps)
        rows.append(_summary("rpeg", rpeg_pred, rpeg_tl, cluster, view.gpus, None))
        if peer_pred.fits:
            rows[1]["speedup"] = peer_pred.step_s / rpeg_pred.step_s
    breakdown = _breakdown(rungs, peer_pred.step_s if peer_pred.fits else None)

    with out:
        files = {}
        peer_file = out.file(f"{args.system}-job.yaml")
        _write_yaml(peer_file, job_data(view), f"{args.system}'s plan of {args.file}, as RPEG reads it "
                    f"({imported.mode} mode): `rpeg predict` or `rpeg plan` this file")
        files["peer_job"] = peer_file
        if best is not None:
            plan_file = out.file("rpeg-plan.yaml")
            plan_passes = _passes(best.graph, spec)
            _write_yaml(plan_file, spec_data(spec, plan_passes, cluster=view.cluster, gpus=view.gpus),
                        f"RPEG's plan for the job of {args.file} ({best.name}; predicted {best.step_s:.2f} s a step "
                        f"on {view.gpus} x {cluster.device.name})")
            files["rpeg_plan"] = plan_file
            rview = view_of(best.graph, actor=view.actor, critic=view.critic, reward=view.reward,
                            cluster=view.cluster, gpus=view.gpus)
            exported = _export(mod, rview, cluster)
            back = out.file(f"rpeg-plan-{args.system}{mod.SUFFIX}")
            with open(back, "w", encoding="utf-8") as f:
                f.write(exported["text"])
            files["rpeg_plan_for_peer"] = back
        written = out.commit()
    files = dict(zip(files, written))

    if args.json:
        print_json({"system": args.system, "mode": imported.mode, "source": args.file, "job": job,
                    "cluster": cluster.name, "gpus": view.gpus, "assumed": list(imported.assumed),
                    "unmapped": list(imported.unmapped), "plans": rows,
                    "rpeg_plan": best.name if best is not None else None, "structure": breakdown,
                    "export": ({k: exported[k] for k in ("left_out", "as_written_s", "full_plan_s", "does_not_fit")}
                               if best is not None else None),
                    "files": files})
        return 0
    j = view.job
    mode = MODES.get(imported.mode, imported.mode)
    print(f"read {args.system} job {args.file} ({mode}): {view.algorithm} on {view.actor}, "
          f"{view.gpus} x {cluster.device.name} ({cluster.name})")
    print(f"job: {j.describe()}")
    if imported.assumed:
        print("\nassumed (the config does not say):")
        for line in imported.assumed:
            print(f"  - {line}")
    if imported.unmapped:
        print(f"\nnot mapped ({len(imported.unmapped)} keys; none of them changes the plan RPEG predicts):")
        for line in imported.unmapped:
            print(f"  - {line}")
    print()
    body = []
    for r in rows:
        if not r["fits"]:
            body.append([r["plan"], "does not fit", r["does_not_fit"], "", "", "", ""])
            continue
        body.append([r["plan"], f"{r['step_s']:.1f}", f"{r['tokens_per_s']:,.0f}", f"{100 * r['utilization']:.0f}%",
                     f"{100 * r['mfu']:.1f}%", f"{r['peak_memory_gb']:.0f}",
                     "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"])
    print(table(["plan", "step s", "tokens/s", "util", "MFU", "GB/GPU", "speedup"], body, right=[1, 2, 3, 4, 5, 6]))
    print(f"\nwhere the time goes ({args.system} as configured):")
    print(table(["stage", "devices", "layout", "seconds", "GB/GPU"], _stage_rows(peer_graph, peer_pred),
                right=[3, 4]))
    if best is None:
        print(f"\nRPEG's search: {no_plan}")
    else:
        print(f"\nRPEG's plan: {best.name}")
        print(f"  searched {result.evaluated} candidates in {result.seconds:.1f} s")
        as_written = exported["as_written_s"]
        if exported["left_out"] or as_written is None:
            # what the peer cannot express may be what made the plan fit (reference on the host, a
            # shared critic): written without it, the plan can run out of memory
            without = f", without what {args.system} cannot express" if exported["left_out"] else ""
            print(f"  as {args.system} config ({os.path.basename(files['rpeg_plan_for_peer'])}){without}: "
                  + (f"{as_written:.1f} s a step" if as_written is not None else "does not fit in memory"))
            for line in exported["left_out"]:
                print(f"    - {line}")
    _print_breakdown(breakdown, args.system)
    print("\nwrote " + ", ".join(written))
    return 0


# the flag that permits each structural change (`rpeg.search.ladder`)
PERMIT_FLAGS = {"async": "--max-staleness", "partial": "without --no-partial-rollout", "share": "--allow-share"}


def _breakdown(rungs, peer_s: float | None) -> list[dict]:
    """The ladder's rungs as rows: each rung's best step, its speedup over the peer's plan as configured,
    and what its change adds over the rung above (the ratio of their steps)."""
    out, above = [], None
    for r in rungs:
        s = r.step_s
        out.append({"change": r.change, "key": r.key, "allowed": r.allowed, "step_s": s,
                    "speedup": peer_s / s if peer_s and s else None,
                    "this_change": above / s if above and s else None,
                    "plan": r.result.best.name if r.result is not None else None, "does_not_fit": r.why or None})
        above = s if s is not None else above
    return out


def _print_breakdown(rows: list[dict], system: str) -> None:
    if len(rows) < 2 and rows and rows[0]["step_s"] is None:
        return
    print(f"\nwhat the speedup needs (each line adds one change to the line above; the speedup is over {system} "
          "as configured):")
    body = []
    for r in rows:
        allowed = "yes" if r["allowed"] else f"no ({PERMIT_FLAGS[r['key']]})"
        if r["step_s"] is None:
            body.append([r["change"], allowed, "does not fit", "", ""])
            continue
        body.append([r["change"], allowed, f"{r['step_s']:.1f}",
                     "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                     "-" if r["this_change"] is None else f"{r['this_change']:.2f}x"])
    print(table(["change", "allowed", "step s", "speedup", "this change"], body, right=[2, 3, 4]))


def _passes(graph, spec) -> list:
    from rpeg.interop.common import passes_of, view_of

    view = view_of(graph, actor=spec.models.actor.name)
    return passes_of(view)


def _write_yaml(path: str, data: dict, comment: str) -> None:
    from rpeg.graph.serde import dump_yaml

    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# {comment}\n" + dump_yaml(data))


def _export(mod, view, cluster) -> dict:
    """The peer config of `view` with the predicted cost of what it leaves out in its comment block."""
    from rpeg.interop.common import graph_of
    from rpeg.perf.step import predict_step

    exported = mod.write(view)
    full = predict_step(graph_of(view), cluster)
    written = predict_step(graph_of(exported.view), cluster)
    full_s = full.step_s if full.fits else None
    written_s = written.step_s if written.fits else None

    def show(s):
        return "does not fit in memory" if s is None else f"{s:.2f} s a step"

    lines = [f"predicted by RPEG on {cluster.gpus} x {cluster.device.name} ({cluster.name}): this config "
             f"{show(written_s)}"]
    if exported.left_out:
        lines.append(f"  the full RPEG plan, with what is left out: {show(full_s)}")
        if full_s and written_s:
            lines.append(f"  leaving it out costs {written_s - full_s:+.2f} s a step "
                         f"({100 * (written_s / full_s - 1):+.0f}%)")
    # the predictions go right after the exporter's "written by rpeg export" line (or at the top)
    text_lines = exported.text.split("\n")
    at = next((i + 1 for i, t in enumerate(text_lines) if "written by rpeg export" in t),
              1 if text_lines[0].startswith("#!") else 0)
    text_lines = text_lines[:at] + [f"# {line}" for line in lines] + text_lines[at:]
    if written_s is None:
        # a config that will not run says so before anything else (after a shebang, which must stay first)
        first = 1 if text_lines[0].startswith("#!") else 0
        text_lines.insert(first, f"# DOES NOT FIT: RPEG predicts this config runs out of memory on {cluster.gpus} x "
                                 f"{cluster.device.name} ({_oom_text(written, cluster)})")
    text = "\n".join(text_lines)
    return {"text": text, "left_out": list(exported.left_out), "as_written_s": written_s, "full_plan_s": full_s,
            "view": exported.view, "does_not_fit": None if written_s is not None else _oom_text(written, cluster)}


def cmd_export(args: argparse.Namespace) -> int:
    from rpeg.graph.serde import read_yaml_file
    from rpeg.hardware import load_cluster
    from rpeg.interop import system
    from rpeg.interop.common import load_view

    if args.out is not None:  # checked before any work
        folder = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise RpegError(f"--out {args.out}: cannot write in {folder}")
        writable_file(args.out)  # not a folder, a device, or in a folder where nothing can be made (/proc, /sys)
    data = read_yaml_file(args.plan)
    if not isinstance(data, dict):
        raise RpegError(f"{args.plan}: expected a job file (a mapping with algorithm, model, job, passes)")
    view = load_view(data, args.plan)
    name = args.cluster or view.cluster or DEFAULT_CLUSTER
    cluster = load_cluster(name, view.gpus)
    view = view.replace(cluster=name)
    mod = system(args.system)
    exported = _export(mod, view, cluster)
    if args.out is None:
        print(exported["text"], end="")
        return 0
    tmp = args.out + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(exported["text"])
        os.replace(tmp, args.out)
    except OSError as e:
        raise RpegError(f"--out {args.out}: {e.strerror}") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    if exported["as_written_s"] is None:
        print(f"DOES NOT FIT: wrote {args.out} ({args.system}), which RPEG predicts runs out of memory "
              f"({exported['does_not_fit']})")
    else:
        print(f"wrote {args.out} ({args.system}); predicted {exported['as_written_s']:.2f} s a step")
    for line in exported["left_out"]:
        print(f"  left out: {line}")
    return 0
