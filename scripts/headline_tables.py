"""The headline tables of docs/plan.md and the README's summary of them, from the JSON that
benchmarks/headline.py prints, so the figures in the docs are always the benchmark's.

    .venv/bin/python benchmarks/headline.py > docs/headline.json
    .venv/bin/python scripts/headline_tables.py docs/headline.json --write docs/plan.md README.md

Each file gets the text between its markers replaced: `<!-- headline:start -->` ... `end` (the
tables and the ranges, docs/plan.md) and `<!-- headline-summary:start -->` ... `end` (one
paragraph, the README). Without --write the tables are printed.
"""

from __future__ import annotations

import argparse
import json
import sys

MARKS = {"headline": ("<!-- headline:start -->", "<!-- headline:end -->"),
         "headline-summary": ("<!-- headline-summary:start -->", "<!-- headline-summary:end -->")}
ABLATION = ("layout", "placement", "async", "sharing", "fusion", "all", "all+share")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _range(values: list[float], fmt) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if lo == hi else f"{fmt(lo)} to {fmt(hi)}"


def tables(data: dict) -> str:
    jobs = data["jobs"]
    peers = list(jobs[0]["peers"])
    out = ["| algorithm | model | RPEG plan | RPEG step s | verl step s | ReaL step s | speedup vs verl | "
           "speedup vs ReaL | MFU RPEG / verl | busy RPEG / verl |", "|---|---|---|---|---|---|---|---|---|---|"]
    for j in jobs:
        r, v, q = j["rpeg"], j["peers"]["verl"], j["peers"]["real"]
        gain = j["mfu_gain_vs_verl_percent"]
        out.append(f"| {j['algorithm']} | {j['model']} | {r['plan'].removeprefix('rpeg: ')} | {r['step_s']:.2f} | "
                   f"{v['step_s']:.2f} | {q['step_s']:.2f} | {j['speedup_vs_verl']:.2f}x | {j['speedup_vs_real']:.2f}x | "
                   f"{_pct(r['mfu'])} / {_pct(v['mfu'])} ({gain:+.0f}%) | {100 * r['utilization']:.0f}% / "
                   f"{100 * v['utilization']:.0f}% |")
    out += ["", "Ablation: speedup over verl when the search may use one family of optimizations (`all`: every "
            "family but sharing, the plan above; `all+share`: with the critic shared, a different value model, so "
            "not the same job):", "",
            "| algorithm | model | " + " | ".join(ABLATION) + " |", "|---|---|" + "---|" * len(ABLATION)]
    for j in jobs:
        out.append(f"| {j['algorithm']} | {j['model']} | "
                   + " | ".join(f"{j['ablation_speedup_vs_verl'][k]:.2f}x" for k in ABLATION) + " |")
    out += ["", "Every peer's plan, step seconds:", "", "| algorithm | model | " + " | ".join(peers) + " |",
            "|---|---|" + "---|" * len(peers)]
    for j in jobs:
        out.append(f"| {j['algorithm']} | {j['model']} | "
                   + " | ".join(f"{j['peers'][p]['step_s']:.2f}" if j['peers'][p].get('step_s') else "-"
                                for p in peers) + " |")
    out += ["", summary(data)]
    return "\n".join(out)


def summary(data: dict) -> str:
    jobs = data["jobs"]
    verl = [j["speedup_vs_verl"] for j in jobs]
    real = [j["speedup_vs_real"] for j in jobs]
    grpo = [j["mfu_gain_vs_verl_percent"] for j in jobs if j["algorithm"] == "grpo"]
    ppo = [j["mfu_gain_vs_verl_percent"] for j in jobs if j["algorithm"] == "ppo"]
    layout = [j["ablation_speedup_vs_verl"]["layout"] for j in jobs]
    share = [j["ablation_speedup_vs_verl"]["all+share"] for j in jobs if j["algorithm"] == "ppo"]
    x = lambda v: f"{v:.2f}x"  # noqa: E731
    pc = lambda v: f"{v:+.0f}%"  # noqa: E731
    return (f"On these jobs the model finds RPEG's plans {_range(verl, x)} faster than verl's and "
            f"{_range(real, x)} faster than ReaL's; layouts alone give {_range(layout, x)}; by MFU on the "
            f"FLOPs each plan executes, RPEG's GRPO plans reach {_range(grpo, pc)} against verl's and its PPO plans "
            f"{_range(ppo, pc)}. The plans keep every model of the job: sharing the critic's trunk with the actor "
            f"(`--allow-share`, a different value model) would give PPO {_range(share, x)} over verl. These are "
            f"the performance model's predictions, not GPU runs.")


def write(text: str, path: str, mark: str) -> None:
    start, end = MARKS[mark]
    with open(path, encoding="utf-8") as fh:
        doc = fh.read()
    if start not in doc or end not in doc:
        raise SystemExit(f"{path}: no {start} ... {end} markers")
    head, rest = doc.split(start, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"{head}{start}\n{text}\n{end}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="benchmarks/headline.py's output")
    ap.add_argument("--write", nargs="*", default=None, metavar="FILE",
                    help="files to update between their markers (docs/plan.md: tables; README.md: summary)")
    args = ap.parse_args(argv)
    with open(args.json, encoding="utf-8") as fh:
        data = json.load(fh)
    if args.write is None:
        print(tables(data))
        return 0
    for path in args.write:
        with open(path, encoding="utf-8") as fh:
            doc = fh.read()
        for mark, text in (("headline", tables(data)), ("headline-summary", summary(data))):
            if MARKS[mark][0] in doc:
                write(text, path, mark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
