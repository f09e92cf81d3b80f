"""The demo job with generation two steps ahead of training (bounded asynchrony k = 2), trained with
and without an off-policy correction, side by side: the held-out accuracy curves and the importance
weights as a PNG, and the figures as JSON on stdout.

    python scripts/offpolicy_compare.py --seed 0 1            # each seed's two runs (in parallel), then the figure
    python scripts/offpolicy_compare.py --correction decoupled --steps 200
    python scripts/offpolicy_compare.py --seed 0 1 --plot-only  # the figure from runs already there

Both runs take examples/demo-grpo-tiny.yaml as it is (same seed, warm-up and evaluation) with one
plan stated in full, so only the loss differs: every stage colocated on one device, k = 2, the
policy's logprobs recomputed by the trainer (the proximal policy) and the engine's kept as the
behaviour policy's. Without a correction the loss still reports how far apart the two are
(is_ratio_mean / is_ratio_max); with one it also reports the weights it applied.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "examples", "demo-grpo-tiny.yaml")


class Bad(Exception):
    """A run this script cannot use; printed as one line."""


def job(correction: str, k: int, steps: int | None, threads: int, seed: int = 0) -> dict:
    with open(DEMO, encoding="utf-8") as fh:
        spec = yaml.safe_load(fh)
    spec["config"] = dict(spec.get("config") or {}, off_policy=correction)
    layout = {"dp": 1, "micro_batch": 64, "packing": False}
    spec["passes"] = [{"bound_asynchrony": {"k": k}}, {"colocate": {"devices": 1}}] + [
        {"parallelize": {"stage": s, **layout}} for s in ("generate", "actor_logprobs", "actor_update")]
    spec["runtime"] = dict(spec["runtime"], threads=threads, seed=seed, **({"steps": steps} if steps else {}))
    return spec


def train(spec: dict, out: str) -> subprocess.Popen:
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "job.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(spec, fh, sort_keys=False)
    log = open(os.path.join(out, "train.log"), "w", encoding="utf-8")
    return subprocess.Popen([sys.executable, "-m", "rpeg", "train", path, "--out", out, "--no-progress"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def read(out: str) -> tuple[list[dict], dict]:
    try:
        with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        with open(os.path.join(out, "summary.json"), encoding="utf-8") as fh:
            summary = json.load(fh)
    except (OSError, ValueError) as e:
        raise Bad(f"{out}: no finished run there ({e}); see {os.path.join(out, 'train.log')}") from None
    return rows, summary


def figures(rows: list[dict], summary: dict) -> dict:
    def mean(key):
        vals = [r[key] for r in rows if key in r]
        return sum(vals) / len(vals) if vals else None

    out = {"accuracy_before": summary["accuracy_before"], "accuracy_after": summary["accuracy_after"],
           "steps": len(rows), "staleness_max": max(r["staleness_max"] for r in rows),
           "is_ratio_mean": mean("is_ratio_mean"), "is_ratio_max": max(r.get("is_ratio_max", 0.0) for r in rows),
           "mean_step_s": summary.get("mean_step_s")}
    for key in ("is_weight_mean", "is_truncated_frac", "is_masked_frac"):
        if mean(key) is not None:
            out[key] = mean(key)
    return out


def plot(runs: dict[int, dict[str, tuple[list[dict], dict]]], path: str, k: int) -> None:
    """Left: held-out accuracy per arm (colour) and seed (line style); right: the first seed's
    per-step maximum of pi_old / pi_behaviour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, ratio) = plt.subplots(1, 2, figsize=(11, 4))
    styles = ["-", "--", ":", "-."]
    first = min(runs)
    for n, (seed, arms) in enumerate(sorted(runs.items())):
        for c, (label, (rows, summary)) in enumerate(arms.items()):
            steps = [0] + [r["step"] for r in rows if "test_accuracy" in r]
            vals = [summary["accuracy_before"]["sampled"]] + [r["test_accuracy"] for r in rows if "test_accuracy" in r]
            acc.plot(steps, vals, marker="o", ms=3, ls=styles[n % 4], color=f"C{c}", label=f"{label}, seed {seed}")
            if seed == first:
                ratio.plot([r["step"] for r in rows], [r["is_ratio_max"] for r in rows], lw=0.8, color=f"C{c}",
                           label=label)
    acc.set(xlabel="step", ylabel="held-out sampled accuracy (1,000 problems)", title=f"demo job, async k = {k}")
    ratio.set(xlabel="step", ylabel="max over tokens of pi_old / pi_behaviour", yscale="log",
              title=f"how far the samples' policy is from the trained one (seed {first})")
    ratio.axhline(1.0, color="grey", lw=0.5)
    for ax in (acc, ratio):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "rpeg-out", "offpolicy"))
    ap.add_argument("--correction", default="tis", help="the off_policy option of the corrected run (default tis)")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="fewer steps than the demo's")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (the two run at once)")
    ap.add_argument("--seed", type=int, nargs="+", default=[0],
                    help="the runs' seeds (warm-up, prompts, sampling); each seed's pair runs after the last")
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "offpolicy-k2.png"))
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args(argv)
    arms = {"no correction": "none", f"off_policy = {args.correction}": args.correction}
    runs: dict[int, dict[str, tuple[list[dict], dict]]] = {}
    try:
        for seed in args.seed:
            outs = {label: os.path.join(args.out, f"seed{seed}", mode) for label, mode in arms.items()}
            if not args.plot_only:
                procs = {label: train(job(mode, args.k, args.steps, args.threads, seed), outs[label])
                         for label, mode in arms.items()}
                failed = [label for label, p in procs.items() if p.wait() != 0]
                if failed:
                    raise Bad(f"the run '{failed[0]}' failed: see {os.path.join(outs[failed[0]], 'train.log')}")
            runs[seed] = {label: read(out) for label, out in outs.items()}
    except Bad as e:
        print(f"offpolicy_compare: {e}", file=sys.stderr)
        return 1
    plot(runs, args.png, args.k)
    print(json.dumps({"k": args.k, "png": os.path.relpath(args.png, ROOT),
                      "runs": {f"seed {seed}": {label: figures(*run) for label, run in arms_.items()}
                               for seed, arms_ in runs.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
