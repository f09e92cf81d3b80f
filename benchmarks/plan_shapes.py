"""Plan shapes on this machine: for one job, each plan shape the runtime runs, its predicted and its
measured step time side by side, and the measured speedup over the synchronous colocated plan.

The job is the demo's (examples/demo-grpo-tiny.yaml: GRPO on the tiny model; PPO shapes use the
same job with a critic). Each shape is built with the passes, its training and forward passes in
micro-batches of MICRO_BATCH padded rows (what the runtime then runs), predicted on `cpu-local` sized to
its devices (measured as that many devices sharing the cores: this benchmark runs
`rpeg calibrate --devices D` for every D it needs, in the same run, so every count is measured
under the same load), run for `--warmup` + `--steps` steps, and its step time taken as the median
of the steps after the warm-up. This machine's speed drifts by tens of percent within minutes, so
the calibration is measured in `--calibrations` rounds (5, evenly spaced from before the first
shape to after the last; each into its own folder) and a shape's prediction is the median of its
predictions with each round's figures (their range is in the JSON); `--reuse-calibration`
predicts with the files already in the cache folder instead. Shapes the runtime refuses are listed
with its reason. Prints JSON, including Kendall's tau between the predicted and the measured order
of the shapes.

    .venv/bin/python benchmarks/plan_shapes.py [--steps 6] [--warmup 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.graph.serde import from_data
from rpeg.passes import bound_asynchrony, colocate, fuse, parallelize, place, refit, share_actor_critic, stream
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.plan_check import check_plan
from rpeg.spec import load_spec


MICRO_BATCH = 64  # rows per training and forward micro-batch, padded (the runtime pads; it does not pack)


def _laid_out(g, layouts=None):
    """Every model stage laid out (`layouts`: stage -> degrees; dp 1 otherwise), training and forward
    passes in micro-batches of MICRO_BATCH padded rows: the plan states what the runtime runs."""
    layouts = layouts or {}
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            micro = {} if s.kind.value == "generate" else {"micro_batch": MICRO_BATCH, "packing": False}
            g = parallelize(g, s.name, **(micro | layouts.get(s.name, {"dp": 1})))
    return g


def shapes(job, spec) -> dict:
    """name -> a function building the plan (each call builds it afresh)."""
    tiny = Models(actor=spec)

    def grpo():
        return build_graph("grpo", job, tiny, kl_coef=0.0)

    def ppo():
        return build_graph("ppo", job, tiny)

    def split(g, train=None, gen=None):
        groups = {"gen": (gen or {}).get("devices", 1), "train": (train or {}).get("devices", 1)}
        g = place(g, groups, {"generate": "gen"}, default="train")
        lay = {s.name: {"dp": 1} for s in g.stages}
        if train:
            lay.update({s.name: train["layout"] for s in g.stages if s.group == "train" and s.model})
        if gen:
            lay["generate"] = gen["layout"]
        # the runtime's sync gathers every tensor in full and broadcasts it from rank 0 (plan_check)
        return _laid_out(refit(g, "full") if train or gen else g, lay)

    return {
        "colocated synchronous": lambda: _laid_out(colocate(grpo(), 1)),
        "logprobs fused into generation": lambda: _laid_out(fuse(colocate(grpo(), 1), ["generate", "actor_logprobs"])),
        "split, async k=1": lambda: split(bound_asynchrony(grpo(), 1)),
        "split, async k=1, training tp 2": lambda: split(bound_asynchrony(grpo(), 1),
                                                         {"devices": 2, "layout": {"tp": 2}}),
        "ppo, critic shared": lambda: _laid_out(colocate(share_actor_critic(ppo()), 1)),
        "ppo, critic separate": lambda: _laid_out(colocate(ppo(), 1)),
        "ppo, actor and critic fused": lambda: _laid_out(fuse(colocate(ppo(), 1), ["actor_update", "critic_update"])),
        "grpo, reward model": lambda: _laid_out(colocate(build_graph("grpo", job, Models(actor=spec, reward=spec),
                                                                     kl_coef=0.0), 1)),
        "streaming 4": lambda: _laid_out(stream(colocate(grpo(), 1), 4)),
        "split, streaming 4": lambda: stream(split(grpo()), 4),
        "colocated on 2 devices": lambda: _laid_out(colocate(grpo(), 2), {
            "generate": {"dp": 2}, "actor_logprobs": {"dp": 2, "zero": 3}, "actor_update": {"dp": 2, "zero": 3}}),
        "pipeline parallel 2": lambda: split(bound_asynchrony(grpo(), 1), {"devices": 2, "layout": {"pp": 2}}),
        "split, generation tp 2": lambda: split(bound_asynchrony(grpo(), 1), gen={"devices": 2, "layout": {"tp": 2}}),
    }


def calibration_points(shapes: int, rounds: int) -> list[int]:
    """Before which shape each calibration round runs (`shapes`: after the last), evenly spaced from
    the first shape to after the last."""
    if rounds <= 1:
        return [0]
    return sorted({round(i * shapes / (rounds - 1)) for i in range(rounds)})


@contextlib.contextmanager
def cache_folder(folder: str | None):
    """cpu-local read from (and calibrated into) `folder` meanwhile; None: the cache folder as it is."""
    from rpeg.hardware.loader import CACHE_ENV

    before = os.environ.get(CACHE_ENV)
    if folder is not None:
        os.environ[CACHE_ENV] = folder
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before


def devices(g) -> int:
    return max(grp.first + grp.count for grp in g.groups)


def kendall_tau(a: list[float], b: list[float]) -> float:
    n, score = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            score += (1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1 if (a[i] - a[j]) * (b[i] - b[j]) < 0 else 0)
    return score / (n * (n - 1) / 2) if n > 1 else 1.0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="examples/demo-grpo-tiny.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--only", nargs="*", help="run only these shapes (names as printed)")
    ap.add_argument("--calibrations", type=int, default=5,
                    help="rounds of calibration spread over the run (before the first shape, ..., after the last); "
                         "each shape's prediction is the median of its prediction with each round's figures")
    ap.add_argument("--reuse-calibration", action="store_true",
                    help="predict with the cpu-local files that exist (one round) instead of measuring in this run")
    args = ap.parse_args(argv)
    if args.calibrations < 1:
        ap.error("--calibrations must be at least 1")

    from rpeg.hardware import load_cluster
    from rpeg.hardware.calibrate import calibrate
    from rpeg.hardware.loader import cpu_local_path
    from rpeg.perf.step import predict_step
    from rpeg.runtime.run import run

    spec = load_spec(args.job)
    job = spec.graph().job
    base_rt = from_data(RuntimeConfig, spec.runtime, "runtime").replace(
        steps=args.warmup + args.steps, warmup_sft_steps=0, warmup_target=0.0, eval_every=0, eval_size=20,
        checkpoint_every=0, threads=0, reward_model_path="tiny")  # the reward-model shape scores with a tiny random one
    rows, refused, plans = [], [], {}
    for name, build in shapes(job, spec.models.actor).items():
        if args.only and name not in args.only:
            continue
        try:
            g = build()
            check_plan(g)
            plans[name] = g
        except RpegError as e:
            refused.append({"shape": name, "refused": str(e)})
    # every device count is measured in this run, side by side with the steps it predicts (a file left by
    # an earlier, differently loaded run would skew one count against another), and more than once: this
    # machine's speed drifts by tens of percent within minutes, so one round catches one moment of it
    counts = sorted({1} | {devices(g) for g in plans.values()})
    rounds: list[str | None] = []

    def calibration_round() -> None:
        if args.reuse_calibration:
            rounds.append(None)  # the files in the cache folder as they are
            return
        folder = tempfile.mkdtemp(prefix=f"rpeg-calibration-{len(rounds)}-")
        with cache_folder(folder):
            for need in counts:
                print(f"calibration round {len(rounds) + 1}: cpu-local as {need} device(s) "
                      f"(rpeg calibrate --devices {need})", file=sys.stderr, flush=True)
                calibrate(devices=need)
        rounds.append(folder)

    def predictions(g) -> list[float]:
        out = []
        for folder in rounds:
            with cache_folder(folder):
                out.append(predict_step(g, load_cluster("cpu-local", devices(g))).step_s)
        return out

    if args.reuse_calibration and not all(cpu_local_path(n).is_file() for n in counts):
        ap.error(f"--reuse-calibration needs cpu-local files for {counts} device(s): run rpeg calibrate --devices D")
    n_rounds = 1 if args.reuse_calibration else args.calibrations
    due = calibration_points(len(plans), n_rounds)
    measured_rows = []
    for i, (name, g) in enumerate(plans.items()):
        while len(rounds) < len(due) and due[len(rounds)] <= i:
            calibration_round()
        out = tempfile.mkdtemp(prefix="rpeg-shapes-")
        result = run(g, base_rt.replace(out=out), progress=False)
        measured = statistics.median(m["step_s"] for m in result.metrics[args.warmup:])
        measured_rows.append((name, g, measured))
        print(f"{name}: measured {measured:.3f} s", file=sys.stderr, flush=True)
    while len(rounds) < len(due):
        calibration_round()
    for name, g, measured in measured_rows:
        each = predictions(g)
        predicted = statistics.median(each)
        rows.append({"shape": name, "devices": devices(g), "predicted_s": predicted, "measured_s": measured,
                     "measured_over_predicted": measured / predicted,
                     "predicted_range_s": [min(each), max(each)]})
        print(f"{name}: predicted {predicted:.3f} s ({min(each):.3f}-{max(each):.3f} over {len(each)} calibration "
              f"round(s)), measured {measured:.3f} s", file=sys.stderr, flush=True)
    base = next((r["measured_s"] for r in rows if r["shape"] == "colocated synchronous"), None)
    for r in rows:
        r["measured_speedup"] = base / r["measured_s"] if base else None
    tau = kendall_tau([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows])
    report = {"job": args.job, "steps": args.steps, "warmup_steps": args.warmup, "cores": os.cpu_count(),
              "calibration_rounds": len(rounds), "shapes": rows, "refused": refused, "kendall_tau": tau,
              "within_0.75_1.33": sum(0.75 <= r["measured_over_predicted"] <= 1.33 for r in rows)}
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
