"""The performance model against the runtime on this machine: predicted vs measured step time.

Takes the demo job (examples/demo-grpo-tiny.yaml), lets `rpeg train`'s planner choose the plan for
`cpu-local` (the machine as `rpeg calibrate` measures it first, in the same run, unless
`--reuse-calibration`), trains it for a few GRPO steps after a
short supervised warm-up, and compares the measured mean step and stage times (the runtime's
timeline, first steps dropped as warm-up) with what the model predicted for the same plan. Prints
JSON; `ratio` is predicted / measured (1 is exact, above 1 the model is pessimistic).

    .venv/bin/python benchmarks/cpu_local_prediction.py [--steps 40]

The multi-turn agent job (docs/agents.md) keeps its own warm-up, so the model calls its tool, and drops
the RL steps before it calls it in nearly every episode (the job's `episode` says 2 turns):

    .venv/bin/python benchmarks/cpu_local_prediction.py --job examples/agent-calculator-tiny.yaml \
        --keep-warmup --skip 40 --steps 40

Partial rollout (docs/runtime.md) on the job whose responses have a long tail, on two devices (an engine
and a trainer), the fastest plan with partial rollout:

    .venv/bin/python benchmarks/cpu_local_prediction.py --job examples/partial-rollout-tiny.yaml \
        --keep-warmup --partial-rollout

The agent job with partial rollout (its episodes in each engine's pool) needs two devices:

    .venv/bin/python benchmarks/cpu_local_prediction.py --job examples/agent-calculator-tiny.yaml \
        --keep-warmup --skip 40 --steps 40 --gpus 2 --partial-rollout
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

from rpeg.graph.serde import from_data
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.plan_check import runnable_plan
from rpeg.runtime.run import run
from rpeg.spec import load_spec

WARMUP_STEPS = 5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="examples/demo-grpo-tiny.yaml")
    ap.add_argument("--steps", type=int, default=40, help="steps measured")
    ap.add_argument("--skip", type=int, default=WARMUP_STEPS, help="RL steps run first and not measured")
    ap.add_argument("--keep-warmup", action="store_true",
                    help="the job's own supervised warm-up (its target) instead of 300 steps")
    ap.add_argument("--gpus", type=int, default=0,
                    help="devices of cpu-local to plan on instead of the job's (each worker runs cores / gpus threads)")
    ap.add_argument("--partial-rollout", action="store_true",
                    help="the fastest runnable plan with partial rollout (engines on devices of their own)")
    ap.add_argument("--reuse-calibration", action="store_true",
                    help="predict with the cpu-local file that exists instead of measuring it first, in this run")
    args = ap.parse_args()
    spec = load_spec(args.job)
    if not args.reuse_calibration:  # the machine as it is now, not as an earlier, differently loaded run found it
        from rpeg.hardware.calibrate import calibrate

        calibrate(devices=args.gpus or spec.gpus or 1)
    _, cluster, gpus = spec.cluster_and_gpus(default="cpu-local", gpus=args.gpus or None)
    rt = from_data(RuntimeConfig, spec.runtime, "runtime")
    if args.gpus:
        import os

        rt = rt.replace(threads=max(1, (os.cpu_count() or 1) // args.gpus))  # the devices share the cores
    rt = rt.replace(steps=args.steps + args.skip, eval_every=0, eval_size=20, checkpoint_every=0,
                    out=tempfile.mkdtemp(prefix="rpeg-bench-"),
                    **({} if args.keep_warmup else {"warmup_sft_steps": 300}))
    cand = runnable_plan(spec.graph(), cluster, gpus, micro_batch=rt.micro_batch, engine=rt.engine,
                         partial=args.partial_rollout)
    result = run(cand.graph, rt, progress=False)
    kept = [m for m in result.metrics if m["step"] > args.skip]
    measured_step = statistics.mean(m["step_s"] for m in kept)
    stages: dict[str, list[float]] = {}
    for r in result.timeline.records:
        if r.step >= args.skip:
            stages.setdefault(r.unit, []).append(r.end - r.start)
    measured = {k: statistics.mean(v) for k, v in stages.items()}
    predicted = {k: c.seconds for k, c in cand.prediction.stages.items() if k in measured}
    episodes = {k: round(statistics.mean(m[k] for m in kept), 3)
                for k in ("turns_mean", "tool_calls_mean", "response_len", "mixed_version_frac")
                if all(k in m for m in kept)}
    if result.timeline.details:
        episodes["engine_calls"] = _engine_calls(result.timeline, kept, args.skip)
    print(json.dumps({
        "job": args.job, "plan": cand.name, "device": cluster.device.name, **episodes,
        "device_gflop_per_s": round(cluster.device.flop_per_s("bf16") / 1e9, 1),
        "steps_measured": len(kept),
        "step_s": {"predicted": round(cand.step_s, 3), "measured": round(measured_step, 3),
                   "ratio": round(cand.step_s / measured_step, 2)},
        "stages_s": {k: {"predicted": round(predicted[k], 4), "measured": round(measured[k], 4),
                         "ratio": round(predicted[k] / measured[k], 2) if measured[k] > 0 else None}
                     for k in predicted if predicted[k] > 0 or measured[k] > 1e-3},
    }, indent=1))


def _engine_calls(timeline, kept: list, skip: int) -> dict:
    """What the engine calls measured per step: how many, how long in all (the timeline's details); with
    episodes, their longest replies (the hf engine decodes each call until its longest reply ends) and the
    generation stage's time outside them (episodes' Python: codecs, environments, the event loop); with
    partial rollout, the sequences a segment call batched (of every step in flight on the engine)."""
    steps = len(kept)
    busy = sum(r.seconds for r in timeline.details if r.kind == "engine" and r.step >= skip)
    gen = sum(r.seconds for r in timeline.records if r.kind == "generate" and r.step >= skip)
    out = {"per_step": round(statistics.mean(m.get("engine_calls", 0.0) for m in kept), 2),
           "seconds_per_step": round(busy / steps, 4)}
    if all("engine_call_rows_mean" in m for m in kept):  # partial rollout: a step's segment calls (all steps' rows)
        return out | {"rows_mean": round(statistics.mean(m["engine_call_rows_mean"] for m in kept), 1)}
    return out | {"longest_reply_mean": round(statistics.mean(m.get("engine_call_longest_mean", 0.0) for m in kept), 2),
                  "generate_outside_calls_s": round((gen - busy) / steps, 4)}


if __name__ == "__main__":
    main()
