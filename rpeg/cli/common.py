"""What the `rpeg` commands share: the parser that fails in one line, the flag number types, the
job options every planning command takes, and how they become a JobSpec.

Number types: each flag's value is checked where it is parsed, so a bad one is one line naming the
flag and its range (`--gpus: 0 must be in [1, 1,000,000]`), never a traceback deeper in, and never
a silent fall-back to a default. Names likewise (`name`): `--cluster ''` is an error, not the
default cluster. Command modules import this module, never each other.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os

from rpeg.errors import RpegError
from rpeg.graph.bounds import MAX_COEF, MAX_STALENESS, MAX_TOKENS
from rpeg.report import params

MAX_STEPS = 10_000  # steps unrolled or simulated: the steady state shows within a few (k + 2)


def count(lo: int, hi: int):
    """An integer in [lo, hi]."""
    return _ranged(int, "an integer", lo, hi)


def real(lo: float, hi: float):
    """A finite number in [lo, hi]."""
    return _ranged(float, "a number", lo, hi)


def name(what: str):
    """A name or a path that is not empty: an empty one (`--cluster ''`) would silently mean the default."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty name; expected {what}")
        return text

    parse.__name__ = "name"
    return parse


# the flag types of the names most commands take
CLUSTER = name("a cluster preset name or a cluster file")
FOLDER = name("an output folder")
PRESET = name("a model: a preset, a catalogue id, a config.json or a model folder")


def _ranged(convert, what: str, lo: float, hi: float):
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} must be a finite number")
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{_num(value)} must be in [{_num(lo)}, {_num(hi)}]")
        return value

    parse.__name__ = convert.__name__
    return parse


def _num(x: float) -> str:
    if float(x).is_integer() and abs(x) < 1e18:
        return f"{int(x):,}"
    return f"{x:.6g}"


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's own prints the usage too)
        raise RpegError(f"{message} (see `{self.prog} --help`)")


def job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("algorithm", metavar="ALGO|JOB.yaml", help="algorithm name, or a job file")
    p.add_argument("--model", type=PRESET, help="actor model: a preset or catalogue id (`rpeg models --all`), a "
                   "config.json or a model folder")
    p.add_argument("--critic", type=PRESET, help="critic model, as --model (PPO; default: the actor's)")
    p.add_argument("--reference", type=PRESET, help="reference model, as --model (default: the actor's)")
    p.add_argument("--reward", type=name("a model preset name or rule"), default="rule",
                   help="reward model preset, or 'rule' (default)")
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


def job_spec(args: argparse.Namespace):
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


def header(graph, spec) -> str:
    lines = [f"{graph.algorithm} on {spec.models.actor.name} ({params(spec.models.actor.params_total())} params)",
             f"job:    {graph.job.describe()}"]
    cfg = graph.config
    kl = f"{cfg.kl_estimator} x {cfg.kl_coef:g} in the {cfg.kl_in}" if cfg.uses_reference else "none"
    lines.append(f"config: advantages {cfg.adv_estimator}, loss {cfg.loss_agg}, clip [{1 - cfg.clip_low:g}, "
                 f"{1 + cfg.clip_high:g}], KL {kl}" + (f", oversample {cfg.oversample:g}" if cfg.oversample > 1 else "")
                 + "".join(f", {x}" for x in cfg.loss_notes()))
    lines.append(f"async bound k = {graph.async_bound}")
    if spec.models.lora is not None:
        lines.append(f"lora:   {spec.models.lora.describe()}")
    lines += model_lines(spec.models)
    lines.append("passes:\n" + "\n".join("  " + line for line in str(spec.passes).splitlines()))
    return "\n".join(lines)


def model_lines(models) -> list[str]:
    """One line per thing to know about the job's models: a vision tower and how it is planned, and what
    was assumed reading a config.json (rpeg.graph.catalogue.model_notes)."""
    from rpeg.graph.catalogue import model_notes

    out, seen = [], set()
    for m in (models.actor, models.critic, models.reference, models.reward):
        if m is None or m.name in seen:
            continue
        seen.add(m.name)
        out += [f"model:  {m.name}: {note}" for note in (m.vision_note(), *model_notes(m.name)) if note]
    return out


def print_json(data) -> None:
    """`--json` output: strict JSON, so a number that is not finite (a stage that does not fit) is
    null, never `Infinity` or `NaN`, which JSON parsers refuse."""
    print(json.dumps(_finite(data), indent=1, allow_nan=False))


def _finite(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
