"""The `rpeg` command.

    rpeg algorithms                         list algorithm builders
    rpeg models [--all]                     list model presets (--all: and the catalogue) with parameter counts
    rpeg passes                             list graph passes
    rpeg show ALGO --model NAME [options]   stages, fields, bytes per step; writes DOT and PNG
    rpeg analyze ALGO --model NAME [...]    work-depth table and what async bounds do to depth
    rpeg predict JOB.yaml [--cluster C --gpus N]   per-stage time, memory per GPU, OOM verdict
    rpeg validate FILE.yaml [--json --loo]  the performance model against published measurements
    rpeg plan JOB.yaml --cluster C --gpus N  the best plan beside verl's, ReaL's, ... (trace, Gantt)
    rpeg train JOB.yaml [--resume]          train for real on Ray + PyTorch (the job's runtime section)
    rpeg train JOB.yaml --dry-run           what can fail before the first step, checked in seconds
    rpeg model convert GGUF --out DIR       a GGUF file (or smollm2) as a Hugging Face folder for the runtime
    rpeg import FILE --from verl|openrlhf|areal   a peer's job: its predicted step beside RPEG's plan
    rpeg export PLAN.yaml --to verl|openrlhf|areal  a plan as the peer's config, with what it leaves out
    rpeg hardware                           device and cluster presets with their figures
    rpeg calibrate [--devices D]            measure this machine (the cpu-local device; D sharing its cores)

ALGO may also be a job file (YAML/JSON, see rpeg/spec.py). Bad input prints one line,
`rpeg: error: ...`, and exits with 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from rpeg.cli import graph, interop, perf, plan, train
from rpeg.cli.common import Parser
from rpeg.errors import DoesNotFit, RpegError


def build_parser() -> Parser:
    p = Parser(prog="rpeg", description="Plan and run RL post-training of reasoning LMs from one graph IR.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in (graph, perf, plan, train, interop):
        module.add_parsers(sub)
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

