"""The demo's figures from its runs' summary.json files: a table for the README, and the CI check.

    python scripts/demo_figures.py table RUN [RUN ...]            # print the Markdown table
    python scripts/demo_figures.py table RUN [RUN ...] --write README.md docs/runtime.md
    python scripts/demo_figures.py check RUN --min-gain 0.15 --min-z 6
    python scripts/demo_figures.py table RUN ... --block agent-figures --write README.md docs/agents.md
    python scripts/demo_figures.py check RUN --min-gain 0.3 --min-z 10 --min-tool-gain 0.3

RUN is a run's output folder (`rpeg train --out RUN`) or its summary.json. `--write` replaces the
text between `<!-- BLOCK:start -->` and `<!-- BLOCK:end -->` (BLOCK: `--block`, `demo-figures` by
default) in each file, so the figures there are always the ones a run produced. `check` fails (exit 1)
unless held-out sampled accuracy rose by at least `--min-gain` and by at least `--min-z` standard
errors, and, with `--min-tool-gain`, the held-out tool calls per episode rose by at least that much.
A run with an environment (runtime.environment) gets a column of its tool calls per held-out episode.

The standard error of a gain is that of two independent binomial proportions on `eval_size`
problems each, sqrt(p0 (1 - p0) / n + p1 (1 - p1) / n). The two evaluations use the same problems,
which makes the true error smaller, so the z figure is conservative.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

def markers(block: str) -> tuple[str, str]:
    return f"<!-- {block}:start -->", f"<!-- {block}:end -->"


class Bad(Exception):
    """A run or file this script cannot use; printed as one line."""


def load(run: str) -> dict:
    path = os.path.join(run, "summary.json") if os.path.isdir(run) else run
    try:
        with open(path, encoding="utf-8") as fh:
            s = json.load(fh)
    except (OSError, ValueError) as e:
        raise Bad(f"{path}: cannot read a run summary ({e})") from None
    missing = [k for k in ("accuracy_before", "accuracy_after", "eval_size", "mean_step_s") if k not in s]
    if missing:
        raise Bad(f"{path}: not a run summary from this version of rpeg train (no {', '.join(missing)})")
    return s


def gain(s: dict, kind: str = "sampled") -> tuple[float, float]:
    """(gain, its standard error) of held-out accuracy `kind`."""
    p0, p1, n = s["accuracy_before"][kind], s["accuracy_after"][kind], s["eval_size"]
    return p1 - p0, math.sqrt((p0 * (1 - p0) + p1 * (1 - p1)) / n)


def _predicted(s: dict) -> str:
    return f" ({s['predicted_step_s']:.2f})"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(round(seconds % 60))} s"


def table(summaries: list[dict]) -> str:
    tools = all("sampled_tool_calls" in s["accuracy_before"] for s in summaries)
    predicted = all(s.get("predicted_step_s") for s in summaries)  # the performance model's, beside the run's
    rows = ["| seed | threads | warm-up steps | dev acc. at stop | sampled before -> after | gain (z) "
            "| greedy before -> after |" + (" tool calls per episode, before -> after |" if tools else "")
            + (" s per RL step (predicted) |" if predicted else " s per RL step |") + " wall |",
            "|---:|---:|---:|---:|---|---|---|" + ("---|" if tools else "") + "---:|---:|"]
    for s in summaries:
        w = s.get("warmup") or {}
        g, se = gain(s)
        b, a = s["accuracy_before"], s["accuracy_after"]
        dev = w.get("dev_accuracy")
        calls = f" {b['sampled_tool_calls']:.3f} -> {a['sampled_tool_calls']:.3f} |" if tools else ""
        rows.append(f"| {s.get('seed', '?')} | {s.get('threads', '?')} | {w.get('steps', 0)} "
                    f"| {'-' if dev is None else f'{dev:.3f}'} | {b['sampled']:.3f} -> {a['sampled']:.3f} "
                    f"| {g:+.3f} ({g / se:.1f}) | {b['greedy']:.3f} -> {a['greedy']:.3f} |{calls}"
                    f" {s['mean_step_s']:.2f}{_predicted(s) if predicted else ''} "
                    f"| {_minutes(s.get('wall_s', 0.0))} |")
    gains = [gain(s)[0] for s in summaries]
    n = summaries[0]["eval_size"]
    rows.append("")
    # the mean over independent runs: its standard error is the runs' combined, sqrt(sum se^2) / k
    mean = sum(gains) / len(gains)
    se_mean = math.sqrt(sum(gain(s)[1] ** 2 for s in summaries)) / len(summaries)
    pooled = f", {mean / se_mean:.1f} standard errors of the mean ({se_mean:.3f})" if len(gains) > 1 and se_mean else ""
    rows.append(f"Held-out sampled accuracy on {n} unseen problems rose in {sum(g > 0 for g in gains)} of "
                f"{len(gains)} runs, by {min(gains):+.3f} to {max(gains):+.3f} "
                f"(mean {mean:+.3f}{pooled}); z is the gain over its standard error.")
    return "\n".join(rows)


def write(text: str, path: str, block: str = "demo-figures") -> None:
    START, END = markers(block)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = fh.read()
    except OSError as e:
        raise Bad(f"{path}: {e.strerror}") from None
    if doc.count(START) != 1 or doc.count(END) != 1 or doc.index(START) > doc.index(END):
        raise Bad(f"{path}: needs exactly one {START} ... {END} block")
    head, rest = doc.split(START)
    tail = rest.split(END)[1]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"{head}{START}\n{text}\n{END}{tail}")


def check(s: dict, min_gain: float, min_z: float, min_tool_gain: float | None = None) -> list[str]:
    """The reasons the run fails the check (none: it passes)."""
    g, se = gain(s)
    out = []
    if min_tool_gain is not None:
        b, a = s["accuracy_before"].get("sampled_tool_calls"), s["accuracy_after"].get("sampled_tool_calls")
        if b is None or a is None:
            out.append("the run has no tool-call figures (it ran no environment)")
        elif a - b < min_tool_gain:
            out.append(f"tool calls per held-out episode rose by {a - b:+.3f}, less than {min_tool_gain}")
    if g < min_gain:
        out.append(f"held-out sampled accuracy rose by {g:+.3f}, less than {min_gain}")
    if se > 0 and g / se < min_z:
        out.append(f"the gain is {g / se:.1f} standard errors ({se:.3f} each), fewer than {min_z}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="the Markdown table of one or more runs")
    t.add_argument("runs", nargs="+")
    t.add_argument("--write", nargs="*", default=[], metavar="FILE", help="replace the figures block in these files")
    t.add_argument("--block", default="demo-figures", help="the marker name of the block --write replaces")
    c = sub.add_parser("check", help="fail unless held-out sampled accuracy rose by the margin")
    c.add_argument("run")
    c.add_argument("--min-gain", type=float, required=True)
    c.add_argument("--min-z", type=float, default=0.0)
    c.add_argument("--min-tool-gain", type=float, default=None, help="also the least rise in tool calls per episode")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "table":
            text = table([load(r) for r in args.runs])
            for path in args.write:
                write(text, path, args.block)
            print(text)
            return 0
        s = load(args.run)
        b, a = s["accuracy_before"], s["accuracy_after"]
        g, se = gain(s)
        calls = (f", tool calls per episode {b['sampled_tool_calls']:.3f} -> {a['sampled_tool_calls']:.3f}"
                 if "sampled_tool_calls" in b and "sampled_tool_calls" in a else "")
        print(f"held-out sampled accuracy {b['sampled']:.3f} -> {a['sampled']:.3f} ({g:+.3f}, {g / se:.1f} "
              f"standard errors), greedy {b['greedy']:.3f} -> {a['greedy']:.3f}{calls}")
        fails = check(s, args.min_gain, args.min_z, args.min_tool_gain)
        for f in fails:
            print(f"demo check failed: {f}")
        return 1 if fails else 0
    except Bad as e:
        print(f"demo_figures: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
