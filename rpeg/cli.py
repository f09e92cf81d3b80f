"""The `rpeg` command.

    rpeg algorithms                         list algorithm builders
    rpeg models                             list model presets with parameter counts
    rpeg passes                             list graph passes
    rpeg show ALGO --model NAME [options]   stages, fields, bytes per step; writes DOT and PNG
    rpeg analyze ALGO --model NAME [...]    work-depth table and what async bounds do to depth
    rpeg predict JOB.yaml [--cluster C --gpus N]   per-stage time, memory per GPU, OOM verdict
    rpeg validate FILE.yaml [--json]        the performance model against published measurements
    rpeg plan JOB.yaml --cluster C --gpus N  the best plan beside verl's, ReaL's, ... (trace, Gantt)
    rpeg train JOB.yaml [--resume]          train for real on Ray + PyTorch (the job's runtime section)
    rpeg hardware                           device and cluster presets with their figures
    rpeg calibrate                          measure this machine (the cpu-local device)

ALGO may also be a job file (YAML/JSON, see rpeg/spec.py). Bad input prints one line,
`rpeg: error: ...`, and exits with 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence

from rpeg.cli_args import MAX_STALENESS, MAX_STEPS, count, real
from rpeg.errors import DoesNotFit, RpegError
from rpeg.graph.bounds import MAX_COEF, MAX_TOKENS
from rpeg.outfolder import OutputFolder
from rpeg.report import params, si, table


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's own prints the usage too)
        raise RpegError(f"{message} (see `{self.prog} --help`)")


def _job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("algorithm", metavar="ALGO|JOB.yaml", help="algorithm name, or a job file")
    p.add_argument("--model", help="actor model preset (see `rpeg models`)")
    p.add_argument("--critic", help="critic model preset (PPO; default: the actor's)")
    p.add_argument("--reference", help="reference model preset (default: the actor's)")
    p.add_argument("--reward", default="rule", help="reward model preset, or 'rule' (default)")
    g = p.add_argument_group("job")
    g.add_argument("--prompts", type=int, default=64, help="prompts per step (64)")
    g.add_argument("--samples", "-n", type=int, default=8, help="samples per prompt (8)")
    g.add_argument("--prompt-len", type=int, default=512, help="prompt tokens (512)")
    g.add_argument("--response-len", type=real(1, MAX_TOKENS), default=1024, help="mean response tokens (1024)")
    g.add_argument("--response-max", type=count(0, MAX_TOKENS), default=0,
                   help="max response tokens (default: the mean)")
    g.add_argument("--response-dist", choices=("fixed", "uniform", "lognormal"), default=None,
                   help="length distribution (fixed; lognormal when --response-max > mean)")
    g.add_argument("--epochs", type=int, default=1, help="PPO epochs per step (1)")
    g.add_argument("--mini-batches", type=int, default=1, help="optimizer steps per epoch (1)")
    g.add_argument("--kl-coef", type=real(0, MAX_COEF), default=None,
                   help="reference KL coefficient (0 drops the reference)")
    s = p.add_argument_group("passes")
    s.add_argument("--async", dest="async_bound", type=int, default=None, metavar="K",
                   help="bounded asynchrony: generation up to K steps ahead")
    s.add_argument("--share", action="store_true", help="share actor and critic (value head on the actor)")
    s.add_argument("--stream", type=int, default=None, metavar="M", help="stream every edge that can in M micro-batches")


def _spec(args: argparse.Namespace):
    from rpeg.algorithms import Models
    from rpeg.graph import Job, LengthDistribution, get_model
    from rpeg.passes import PassCall, PassPipeline
    from rpeg.spec import JobSpec, load_spec

    if os.path.splitext(args.algorithm)[1] in (".yaml", ".yml", ".json") or os.path.isfile(args.algorithm):
        spec = load_spec(args.algorithm)
    else:
        if not args.model:
            raise RpegError(f"rpeg {args.command}: --model is required with an algorithm name (see `rpeg models`)")
        from rpeg.algorithms import get_algorithm

        algo = get_algorithm(args.algorithm)
        mean, top = args.response_len, args.response_max
        if top and top < mean:
            raise RpegError(f"--response-max {top} is below --response-len {mean:g}: the mean cannot exceed the cap")
        kind = args.response_dist or ("lognormal" if top > mean else "fixed")
        if kind == "uniform":
            dist = LengthDistribution(kind="uniform", min=max(1, int(2 * mean - top)) if top else 1,
                                      max=top or int(2 * mean))
        elif kind == "lognormal":
            dist = LengthDistribution(kind="lognormal", mean=mean, max=top or int(4 * mean))
        else:
            dist = LengthDistribution(kind="fixed", mean=mean, max=int(mean))
        job = Job(prompts=args.prompts, samples_per_prompt=args.samples, prompt_len=args.prompt_len, response=dist,
                  ppo_epochs=args.epochs, mini_batches=args.mini_batches)
        models = Models(actor=get_model(args.model),
                        critic=get_model(args.critic) if args.critic else None,
                        reference=get_model(args.reference) if args.reference else None,
                        reward=None if args.reward == "rule" else get_model(args.reward))
        config = {} if args.kl_coef is None else {"kl_coef": args.kl_coef}
        spec = JobSpec(algorithm=algo.name, models=models, job=job, config=config, passes=PassPipeline())
    extra = []
    if args.share:
        extra.append(PassCall("share_actor_critic"))
    if args.async_bound is not None:
        if args.async_bound > MAX_STALENESS:
            raise RpegError(f"--async {args.async_bound} exceeds {MAX_STALENESS} (published systems use 1-8)")
        extra.append(PassCall("bound_asynchrony", {"k": args.async_bound}))
    if args.stream is not None:
        extra.append(PassCall("stream", {"microbatches": args.stream}))
    return dataclasses.replace(spec, passes=spec.passes.then(*extra))


def _header(graph, spec) -> str:
    from rpeg.report import params as p

    lines = [f"{graph.algorithm} on {spec.models.actor.name} ({p(spec.models.actor.params_total())} params)",
             f"job:    {graph.job.describe()}"]
    cfg = graph.config
    kl = f"{cfg.kl_estimator} x {cfg.kl_coef:g} in the {cfg.kl_in}" if cfg.uses_reference else "none"
    lines.append(f"config: advantages {cfg.adv_estimator}, loss {cfg.loss_agg}, clip [{1 - cfg.clip_low:g}, "
                 f"{1 + cfg.clip_high:g}], KL {kl}" + (f", oversample {cfg.oversample:g}" if cfg.oversample > 1 else ""))
    lines.append(f"async bound k = {graph.async_bound}")
    lines.append("passes:\n" + "\n".join("  " + line for line in str(spec.passes).splitlines()))
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> int:
    from rpeg.graph.draw import draw_png, human_bytes, to_dot

    out = OutputFolder(args.out)
    spec = _spec(args)
    g = spec.graph()
    print(_header(g, spec))
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

    spec = _spec(args)
    g = spec.graph()
    wd = work_depth(g)
    rows = async_depth_table(g, steps=args.steps)
    if args.json:
        print(json.dumps({
            "algorithm": g.algorithm, "model": spec.models.actor.name,
            "stages": [{"stage": s.stage, "kind": s.kind.value, "flops": s.flops, "bytes": s.bytes,
                        "depth": s.depth, "parallelism": s.parallelism} for s in wd.stages],
            "total": {"flops": wd.flops, "bytes": wd.bytes, "depth": wd.depth, "parallelism": wd.parallelism,
                      "critical_path": list(wd.critical_path)},
            "async": rows}, indent=1))
        return 0
    print(_header(g, spec))
    print("\nwork and depth per step (depth in layer steps: one layer's computation on a batch)")
    total = wd.flops or 1.0
    body = [[s.stage, s.kind.value, s.model or "-", si(s.flops, "FLOP"), f"{100 * s.flops / total:.1f}%",
             si(s.bytes, "B"), f"{s.depth:,.0f}", si(s.parallelism, "FLOP")] for s in wd.stages]
    body.append(["total (critical path)", "", "", si(wd.flops, "FLOP"), "100%", si(wd.bytes, "B"),
                 f"{wd.depth:,.0f}", si(wd.parallelism, "FLOP")])
    print(table(["stage", "kind", "model", "work W", "share", "bytes", "depth D", "W/D"], body,
                right=[3, 4, 5, 6, 7]))
    print(f"critical path: {' -> '.join(wd.critical_path)}")
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
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from rpeg.graph import get_model, model_names

    rows = []
    for n in model_names():
        m = get_model(n)
        moe = f"{m.experts} (top {m.experts_per_token})" if m.is_moe else "-"
        rows.append([m.name, params(m.params_total()), params(m.params_active()), m.layers, m.hidden,
                     f"{m.heads}/{m.kv_heads}", m.attention, m.ffn_act, moe])
    print(table(["model", "params", "active", "layers", "hidden", "heads/kv", "attention", "mlp", "experts"], rows,
                right=[1, 2, 3, 4]))
    return 0


def cmd_passes(args: argparse.Namespace) -> int:
    import inspect

    from rpeg.passes import PASSES

    rows = []
    for name, (fn, doc) in PASSES.items():
        sig = [p for p in inspect.signature(fn).parameters if p != "graph"]
        rows.append([name, ", ".join(sig) or "-", doc])
    print(table(["pass", "arguments", "what it does"], rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rpeg", description="Plan and run RL post-training of reasoning LMs from one graph IR.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    show = sub.add_parser("show", help="stages, fields and bytes per step; writes DOT and PNG")
    _job_options(show)
    show.add_argument("--out", default="rpeg-out", help="folder for the DOT and PNG files (rpeg-out)")
    show.set_defaults(fn=cmd_show)
    an = sub.add_parser("analyze", help="work-depth analysis of a pipeline")
    _job_options(an)
    an.add_argument("--steps", type=count(1, MAX_STEPS), default=8, help="steps to unroll for the async table (8)")
    an.add_argument("--json", action="store_true", help="print JSON")
    an.set_defaults(fn=cmd_analyze)
    sub.add_parser("algorithms", help="list algorithms").set_defaults(fn=cmd_algorithms)
    sub.add_parser("models", help="list model presets").set_defaults(fn=cmd_models)
    sub.add_parser("passes", help="list graph passes").set_defaults(fn=cmd_passes)
    from rpeg import cli_perf

    cli_perf.add_parsers(sub, _job_options)
    from rpeg import cli_plan

    cli_plan.add_parser(sub, _job_options)
    from rpeg import cli_train

    cli_train.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.fn(args)
    except DoesNotFit as e:  # a valid job, too large for the devices: the exit code of a plan that does not fit
        print(f"rpeg: error: {e}", file=sys.stderr)
        return 3
    except RpegError as e:
        print(f"rpeg: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rpeg: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
