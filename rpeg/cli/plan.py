"""`rpeg plan`: the best RPEG plan beside every peer system's plan for the same job and cluster."""

from __future__ import annotations

import argparse

from rpeg.cli.common import CLUSTER, FOLDER, MAX_STALENESS, MAX_STEPS, count, job_options, job_spec, print_json
from rpeg.errors import DoesNotFit, RpegError
from rpeg.graph.bounds import MAX_GPUS
from rpeg.outfolder import OutputFolder
from rpeg.report import table


def add_parsers(sub) -> None:
    pl = sub.add_parser("plan", help="search the fastest (or cheapest) plan and compare the peers' plans")
    job_options(pl)
    pl.add_argument("--cluster", type=CLUSTER,
                    help="cluster preset or file (default: the job file's, else dgx-h100)")
    pl.add_argument("--gpus", type=count(1, MAX_GPUS), help="devices (default: the job file's, else one node)")
    pl.add_argument("--objective", choices=("time", "throughput", "cost"), default="time")
    pl.add_argument("--max-staleness", type=int, default=1, help="largest async bound allowed (1)")
    pl.add_argument("--allow-share", action="store_true",
                    help="the plan may share the critic's trunk with the actor (a different value model than the "
                         "job's critic, so not the same job; off unless given)")
    pl.add_argument("--steps", type=count(1, MAX_STEPS), default=8, help="steps to simulate for the timelines (8)")
    pl.add_argument("--out", type=FOLDER, default="rpeg-out", help="folder for the trace and Gantt files (rpeg-out)")
    pl.add_argument("--json", action="store_true", help="print JSON")
    pl.set_defaults(fn=cmd_plan)


def _row(name, cand, tl, cluster, ref_s: float):
    p = cand.prediction
    peak = p.peak_memory_bytes  # the fullest device, its co-resident models summed
    usd = cluster.usd(cand.gpus, p.step_s)
    return {"plan": name, "step_s": p.step_s, "tokens_per_s": p.tokens / p.step_s, "utilization": tl.utilization,
            "mfu": tl.mfu, "simulated_step_s": tl.step_s, "peak_memory_gb": peak / 1e9, "usd_per_step": usd,
            "speedup": p.step_s / ref_s, "gpus": cand.gpus}


def cmd_plan(args: argparse.Namespace) -> int:
    from rpeg.perf.step import predict_step
    from rpeg.search.baselines import BASELINES
    from rpeg.search.layouts import LayoutCache
    from rpeg.search.search import Candidate, NoFeasiblePlan, nearest_feasible, search
    from rpeg.search.space import SpaceOptions
    from rpeg.sim import simulate
    from rpeg.sim.export import write_gantt, write_trace

    out = OutputFolder(args.out)  # a bad --out is refused before the search, not after it
    spec = job_spec(args)
    if args.max_staleness < 0:
        raise RpegError(f"--max-staleness must be >= 0, got {args.max_staleness}")
    if args.max_staleness > MAX_STALENESS:
        raise RpegError(f"--max-staleness must be <= {MAX_STALENESS}, got {args.max_staleness} (the search tries "
                        "every bound up to it; published systems use 1-8)")
    graph = _bare(spec)
    base, cluster, gpus = spec.cluster_and_gpus(args.cluster, args.gpus)
    cache = LayoutCache()
    space = SpaceOptions(share=args.allow_share)
    try:
        result = search(graph, cluster, gpus, objective=args.objective, max_staleness=args.max_staleness, cache=cache,
                        space=space)
    except NoFeasiblePlan as e:
        # more GPUs up to the cluster's own size (`cluster` is sized to the request: it would allow none)
        alt = nearest_feasible(graph, base, gpus, max_staleness=args.max_staleness, space=space)
        print(f"NO FEASIBLE PLAN: {e}")
        if alt:
            what, res = alt
            print(f"nearest feasible: {what}: {res.best.name}, step {res.best.step_s:.1f} s")
        else:
            print("nothing nearby fits either: a larger device or a smaller model")
        raise DoesNotFit(f"no feasible plan on {gpus} GPUs (see NO FEASIBLE PLAN above)") from None
    best = result.best
    rows, timelines = [], {}
    tl = simulate(best.graph, cluster, args.steps)
    timelines["rpeg"] = tl
    rows.append(("rpeg", best, tl))
    for bname, b in BASELINES.items():
        g = b.build(graph, cluster, gpus, cache)
        if g is None:
            rows.append((bname, None, None))
            continue
        pred = predict_step(g, cluster)
        cand = Candidate(name=bname, graph=g, prediction=pred, gpus=gpus)
        btl = simulate(g, cluster, args.steps) if pred.fits else None
        rows.append((bname, cand if pred.fits else None, btl))
    with out:
        _write_plan(out.file("rpeg-plan.yaml"), spec, best, cluster, gpus, args)
        write_trace(tl, out.file("plan-trace.json"), "rpeg plan")
        write_gantt(tl, out.file("plan-gantt.png"), f"rpeg: {best.name}")
        for bname, cand, btl in rows[1:]:
            if btl is not None and bname in ("verl", "real"):
                write_gantt(btl, out.file(f"{bname}-gantt.png"), bname)
        files = out.commit()
    ref = best.step_s
    # speedup: how much slower each plan is than RPEG's
    table_rows = [_row(n, c, t, cluster, ref) if c else {"plan": n, "step_s": None} for n, c, t in rows]
    if args.json:
        print_json({
            "job": {"algorithm": graph.algorithm, "model": spec.models.actor.name, "sequences": graph.job.sequences},
            "cluster": cluster.name, "gpus": gpus, "objective": args.objective,
            "search": {"candidates": result.evaluated, "pruned": result.pruned, "layouts_costed": result.layouts_costed,
                       "seconds": result.seconds},
            "plans": table_rows, "chosen": _chosen(best), "files": files})
        return 0
    print(f"plan {graph.algorithm} on {spec.models.actor.name}: {cluster.name}, {gpus} x {cluster.device.name}, "
          f"objective {args.objective}, max staleness {args.max_staleness}")
    print(f"searched {result.evaluated} candidates ({result.pruned} pruned by a lower bound, "
          f"{result.layouts_costed} stage layouts costed) in {result.seconds:.1f} s\n")
    body = []
    for r in table_rows:
        if r.get("step_s") is None:
            body.append([r["plan"], "does not fit", "", "", "", "", "", ""])
            continue
        body.append([r["plan"], f"{r['step_s']:.1f}", f"{r['tokens_per_s']:,.0f}", f"{100 * r['utilization']:.0f}%",
                     f"{100 * r['mfu']:.1f}%", f"{r['peak_memory_gb']:.0f}",
                     f"{r['usd_per_step']:.2f}" if r["usd_per_step"] else "-",
                     "1.00x" if r["plan"] == "rpeg" else f"{r['speedup']:.2f}x"])
    print(table(["plan", "step s", "tokens/s", "util", "MFU", "GB/GPU", "$/step", "RPEG speedup"], body,
                right=[1, 2, 3, 4, 5, 6, 7]))
    print("\nthe chosen plan")
    for k, v in _chosen(best).items():
        if isinstance(v, dict):
            print(f"  {k}:")
            for s, lay in v.items():
                print(f"    {s}: {lay}")
        else:
            print(f"  {k}: {v}")
    print("\nwrote " + ", ".join(files))
    return 0


def _write_plan(path: str, spec, best, cluster, gpus: int, args) -> None:
    """The chosen plan as a job file (its passes make the whole plan): `rpeg predict`, `rpeg train` and
    `rpeg export` read it."""
    from rpeg.graph.serde import dump_yaml
    from rpeg.interop.common import passes_of, view_of
    from rpeg.spec import spec_data

    passes = passes_of(view_of(best.graph, actor=spec.models.actor.name))
    data = spec_data(spec, passes, cluster=args.cluster or spec.cluster or cluster.name, gpus=gpus)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# rpeg plan: {best.name}; predicted {best.step_s:.2f} s a step on {gpus} x {cluster.device.name}\n"
                + dump_yaml(data))


def _bare(spec):
    """The algorithm's graph with the job's structure passes only (the search places and lays out)."""
    from rpeg.algorithms import build_graph
    from rpeg.passes import PassPipeline

    g = build_graph(spec.algorithm, spec.job, spec.models, **spec.config)
    structural = [c for c in spec.passes if c.name in ("share_actor_critic",)]
    return PassPipeline(tuple(structural)).apply(g)


def _chosen(best) -> dict:
    g = best.graph
    return {
        "structure": best.structure.describe() if best.structure else "",
        "placement": best.placement.describe(g) if best.placement else "",
        "layouts": {s.name: s.layout.describe() for s in g.stages if s.layout is not None},
        "fusion": [list(f) for f in g.fusion],
        "streams": [f"{s.producer}->{s.consumer} x{s.microbatches}" for s in g.streams],
        "async_bound": g.async_bound,
        "predicted_step_s": best.step_s,
        "bottleneck": best.prediction.bottleneck,
    }
