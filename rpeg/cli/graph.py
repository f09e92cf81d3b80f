"""The graph commands of `rpeg`: show, analyze, and the algorithm, model and pass listings."""

from __future__ import annotations

import argparse

from rpeg.cli.common import FOLDER, MAX_STEPS, count, header, job_options, job_spec, print_json
from rpeg.outfolder import OutputFolder
from rpeg.report import params, si, table


def add_parsers(sub) -> None:
    show = sub.add_parser("show", help="stages, fields and bytes per step; writes DOT and PNG")
    job_options(show)
    show.add_argument("--out", type=FOLDER, default="rpeg-out",
                      help="folder for the DOT and PNG files (rpeg-out)")
    show.set_defaults(fn=cmd_show)
    an = sub.add_parser("analyze", help="work-depth analysis of a pipeline")
    job_options(an)
    an.add_argument("--steps", type=count(1, MAX_STEPS), default=8, help="steps to unroll for the async table (8)")
    an.add_argument("--json", action="store_true", help="print JSON")
    an.set_defaults(fn=cmd_analyze)
    sub.add_parser("algorithms", help="list algorithms").set_defaults(fn=cmd_algorithms)
    mo = sub.add_parser("models", help="list model presets (--all: and the catalogue of published models)")
    mo.add_argument("--all", action="store_true", help="also the catalogue: published models by Hugging Face id")
    mo.set_defaults(fn=cmd_models)
    sub.add_parser("passes", help="list graph passes").set_defaults(fn=cmd_passes)


def cmd_show(args: argparse.Namespace) -> int:
    from rpeg.graph.draw import draw_png, human_bytes, to_dot

    out = OutputFolder(args.out)
    spec = job_spec(args)
    g = spec.graph()
    print(header(g, spec))
    print("\nmodels")
    print(table(["role", "model", "params", "trainable", "heads"],
                [[m.name, m.spec.name, params(m.spec.params_total()), "yes" if m.trainable else "no", ",".join(m.heads)]
                 for m in g.models], right=[2]))
    print("\nstages")
    print(table(["stage", "kind", "model", "weights", "sequences", "reads", "writes"],
                [[s.name, s.kind.value, s.model or ("rule" if s.kind.value == "reward" else "-"), _version(s),
                  "-" if s.kind.value == "sync" else f"{g.stage_sequences(s):g}",
                  ", ".join(s.reads) or "-", ", ".join(s.writes) or "-"] for s in g.stages], right=[4]))
    prod = g.producers()
    cons: dict[str, list[str]] = {}
    for s in g.stages:
        for f in s.reads:
            cons.setdefault(f, []).append(s.name)
    print("\nfields (per step)")
    print(table(["field", "dtype", "shape", "bytes", "producer", "consumers"],
                [[f.name, f.dtype, "(" + ", ".join(f.shape) + ")", human_bytes(g.field_bytes(f.name)),
                  prod.get(f.name, "input"), ", ".join(cons.get(f.name, [])) or "-"] for f in g.fields], right=[3]))
    print("\nweight versions")
    print(table(["from", "to", "model", "read"],
                [[e.src, e.dst, e.model, "same step" if e.distance == 0 else f"{e.distance} step(s) later"]
                 for e in g.weight_edges()]))
    print(f"\ndata moved between stages: {human_bytes(g.bytes_per_step())} per step "
          f"over {len(g.data_edges())} edges")
    with out:
        with open(out.file(g.algorithm + ".dot"), "w", encoding="utf-8") as fh:
            fh.write(to_dot(g))
        draw_png(g, out.file(g.algorithm + ".png"))
        dot, png = out.commit()
    print(f"wrote {dot} and {png}")
    return 0


def _version(stage) -> str:
    """Which weight version of its model a stage reads (and writes) at step t."""
    if stage.model is None:
        return "-"
    if stage.kind.value == "train":
        return "v(t) -> v(t+1)"
    if stage.kind.value == "sync":
        return "v(t+1)"
    return f"v(t-{stage.lag})" if stage.lag else "v(t)"


def cmd_analyze(args: argparse.Namespace) -> int:
    from rpeg.analysis import async_depth_table, work_depth

    spec = job_spec(args)
    g = spec.graph()
    wd = work_depth(g)
    rows = async_depth_table(g, steps=args.steps)
    if args.json:
        print_json({
            "algorithm": g.algorithm, "model": spec.models.actor.name,
            "stages": [{"stage": s.stage, "kind": s.kind.value, "flops": s.flops, "bytes": s.bytes,
                        "depth": s.depth, "parallelism": s.parallelism,
                        **({"tool_wait_s": s.wait_s} if s.wait_s else {})} for s in wd.stages],
            "total": {"flops": wd.flops, "bytes": wd.bytes, "depth": wd.depth, "parallelism": wd.parallelism,
                      "critical_path": list(wd.critical_path)},
            "async": rows})
        return 0
    print(header(g, spec))
    print("\nwork and depth per step (depth in layer steps: one layer's computation on a batch)")
    total = wd.flops or 1.0
    body = [[s.stage, s.kind.value, s.model or "-", si(s.flops, "FLOP"), f"{100 * s.flops / total:.1f}%",
             si(s.bytes, "B"), f"{s.depth:,.0f}", si(s.parallelism, "FLOP")] for s in wd.stages]
    body.append(["total (critical path)", "", "", si(wd.flops, "FLOP"), "100%", si(wd.bytes, "B"),
                 f"{wd.depth:,.0f}", si(wd.parallelism, "FLOP")])
    print(table(["stage", "kind", "model", "work W", "share", "bytes", "depth D", "W/D"], body,
                right=[3, 4, 5, 6, 7]))
    print(f"critical path: {' -> '.join(wd.critical_path)}")
    waits = [(s.stage, s.wait_s) for s in wd.stages if s.wait_s > 0]
    if waits:
        ep = g.job.episode
        print("tool waits beside the depth (wall seconds, not layer steps): " + ", ".join(
            f"{name} {w:g} s ({ep.tool_turns:g} calls x {ep.tool_latency_s:g} s)" for name, w in waits))
    print(f"\nasynchrony over {args.steps} steps (weights of step t - k feed generation at step t)")
    print(table(["k", "depth of all steps", "depth per step", "vs k=0", "W/D"],
                [[r["k"], f"{r['depth']:,.0f}", f"{r['depth_per_step']:,.0f}",
                  f"{rows[0]['depth'] / r['depth']:.2f}x", si(r["parallelism"], "FLOP")] for r in rows],
                right=[1, 2, 3, 4]))
    return 0


def cmd_algorithms(args: argparse.Namespace) -> int:
    from rpeg.algorithms import ALGORITHMS, Models, build_graph
    from rpeg.graph import Job, get_model

    actor = get_model("tiny-qwen2")
    rows = []
    for a in ALGORITHMS.values():
        g = build_graph(a.name, Job(), Models(actor=actor))
        rows.append([a.name, ", ".join(m.name for m in g.models), len(g.stages), a.summary])
    print(table(["algorithm", "models", "stages", "summary"], rows, right=[2]))
    print("\noptions of a job's `config:` section (each algorithm sets its own defaults)")
    print(table(["option", "choices", "default", "what it does"], algo_options()))
    return 0


def algo_options() -> list[list[str]]:
    """A row per AlgoConfig option: its name, its choices (a Literal's, or the registry's names), the
    dataclass default and what it does."""
    import dataclasses
    import typing

    from rpeg.graph import config as C

    hints = typing.get_type_hints(C.AlgoConfig)
    rows = []
    for f in dataclasses.fields(C.AlgoConfig):
        hint = hints[f.name]
        if f.name == "adv_estimator":
            choices = ", ".join(C.ADV_ESTIMATORS)
        elif typing.get_origin(hint) is typing.Literal:
            choices = ", ".join(map(str, typing.get_args(hint)))
        else:
            choices = "true, false" if hint is bool else "a number"
        default = "-" if f.default is dataclasses.MISSING else str(f.default)
        default = default.lower() if hint is bool else default
        rows.append([f.name, choices, default, C.OPTIONS[f.name]])
    return rows


def cmd_models(args: argparse.Namespace) -> int:
    from rpeg.graph import get_model, model_names
    from rpeg.graph.catalogue import catalogue

    print(table(["model", "params", "active", "layers", "hidden", "heads/kv", "attention", "mlp", "experts"],
                [_model_row(get_model(n)) for n in model_names()], right=[1, 2, 3, 4]))
    entries = catalogue()
    if not args.all:
        print(f"\nand {len(entries)} published models by Hugging Face id (`rpeg models --all`); any config.json or "
              "model folder also names a model (--model ~/models/Qwen3-8B)")
        return 0
    rows = []
    for e in entries.values():
        spec = e.spec()
        rows.append([e.id, params(spec.params_total()), params(spec.params_active()), spec.layers,
                     e.config.get("model_type", "?"), e.preset or "-", len(e.aliases)])
    print(f"\ncatalogue ({len(entries)} models, {sum(1 + len(e.aliases) for e in entries.values())} ids; "
          "rpeg/data/catalogue/models.yaml)")
    print(table(["id", "params", "active", "layers", "family", "preset", "aliases"], rows, right=[1, 2, 3, 6]))
    return 0


def _model_row(m) -> list:
    moe = f"{m.experts} (top {m.experts_per_token})" if m.is_moe else "-"
    return [m.name, params(m.params_total()), params(m.params_active()), m.layers, m.hidden,
            f"{m.heads}/{m.kv_heads}", m.attention, m.ffn_act, moe]


def cmd_passes(args: argparse.Namespace) -> int:
    import inspect

    from rpeg.passes import PASSES

    rows = []
    for name, (fn, doc) in PASSES.items():
        sig = [p for p in inspect.signature(fn).parameters if p != "graph"]
        rows.append([name, ", ".join(sig) or "-", doc])
    print(table(["pass", "arguments", "what it does"], rows))
    return 0
