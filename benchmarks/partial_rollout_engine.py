"""Partial rollout where generation is the bottleneck: one engine's measured time per step against the model's.

On this machine the tiny model's training outweighs its generation, so in `rpeg train` the engine waits
for the trainer and a step's generation never shares the engine with the next one's
(`cpu_local_prediction.py --partial-rollout` measures that run). This script takes the trainer out: a
driver launches each step's generation on one rollout worker (a Ray actor, as the runtime's) as soon as
the staleness bound k = 1 allows, the next step's as this one is collected, exactly as the runtime's loop
does when training takes no time. The engine then runs flat out, and a step costs what the planner's
generation stage predicts for it. Two ways, side by side in one run:

- drained: each step's generation one call (`generate`), decoded until its longest response ends;
- partial: partial rollout (`generate_partial`, segments of `runtime.partial_segment` tokens, a quarter of
  max_new_tokens by default), the engine's request pool batching every launched step's sequences.

The model is the job's warm-up model (examples/partial-rollout-tiny.yaml: 20 supervised steps, when its
replies are still of every length); no weights change during the run (no trainer), so every response
samples one policy. Prints JSON: per way, seconds per step measured (wall, and inside engine calls),
the calls and sequences per call, and the predicted generation time per step with its ratio.

    .venv/bin/python benchmarks/partial_rollout_engine.py [--steps 24] [--skip 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from rpeg.graph.serde import from_data
from rpeg.perf.step import predict_step
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.models import prompt_ids
from rpeg.runtime.plan_check import runnable_plan
from rpeg.runtime.rollout import SamplingParams
from rpeg.runtime.run import task_of
from rpeg.runtime.sft import prepare_model
from rpeg.runtime.step import partial_segment
from rpeg.spec import load_spec

K = 1  # the staleness bound of the plans (runnable_plan's)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="examples/partial-rollout-tiny.yaml")
    ap.add_argument("--steps", type=int, default=24, help="steps measured")
    ap.add_argument("--skip", type=int, default=4, help="steps run first and not measured")
    ap.add_argument("--reuse-calibration", action="store_true",
                    help="predict with the cpu-local file that exists instead of measuring it first, in this run")
    args = ap.parse_args()
    spec = load_spec(args.job)
    if not args.reuse_calibration:
        from rpeg.hardware.calibrate import calibrate

        calibrate(devices=spec.gpus or 1)
    _, cluster, gpus = spec.cluster_and_gpus(default="cpu-local")
    rt = from_data(RuntimeConfig, spec.runtime, "runtime")
    task = task_of(rt)
    plan = runnable_plan(spec.graph(), cluster, gpus, micro_batch=rt.micro_batch, engine=rt.engine, partial=True)
    predicted = {"partial": plan.prediction.stages["generate"],
                 "drained": predict_step(plan.graph.replace(partial_rollout=False), cluster).stages["generate"]}
    import ray

    with tempfile.TemporaryDirectory(prefix="rpeg-bench-") as out:
        path, tok, _ = prepare_model(rt.replace(out=out), task, out, False, False)
        ray.init(address="local", num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, _temp_dir=os.path.join(out, "ray"))
        try:
            from rpeg.runtime.workers import RolloutWorker

            results = {}
            for way in ("drained", "partial"):
                worker = ray.remote(num_cpus=1)(RolloutWorker).remote(path, threads=rt.threads, seed=rt.seed)
                results[way] = _measure(ray, worker, tok, task, spec, rt, args, partial_segment(rt) if way == "partial"
                                        else 0) | _predicted(predicted[way])
                ray.kill(worker)
        finally:
            ray.shutdown()
    for r in results.values():
        r["ratio"] = round(r["predicted_s"] / r["step_s"], 2)
    part, drained = results["partial"], results["drained"]
    print(json.dumps({"job": args.job, "plan": plan.name, "segment": partial_segment(rt),
                      "steps_measured": args.steps, **results,
                      "partial_over_drained": {"measured": round(part["step_s"] / drained["step_s"], 2),
                                               "predicted": round(part["predicted_s"] / drained["predicted_s"], 2)}},
                     indent=1))


def _measure(ray, worker, tok, task, spec, rt, args, segment: int) -> dict:
    """Steps launched as the bound allows (step j once step j - K - 1 is collected), the engine's results
    collected in order: the mean wall time between two collections, and the engine calls' figures."""
    job = spec.graph().job
    params = SamplingParams(max_new_tokens=rt.max_new_tokens, temperature=rt.temperature)
    total = args.skip + args.steps
    launched: dict[int, object] = {}
    done_at, calls, rows, busy, lengths = [], [], [], [], []

    def launch(j: int) -> None:
        problems = task.problems("train", job.prompts, seed=rt.seed * 1_000_003 + j)
        ids = [x for x in prompt_ids(tok, [p.prompt for p in problems], rt.chat) for _ in range(job.samples_per_prompt)]
        seed = rt.seed * 7919 + j * 31
        launched[j] = (worker.generate_partial.remote(ids, params, seed, segment) if segment
                       else worker.generate.remote(ids, params, seed))

    for step in range(total):
        for j in range(step, min(total, step + K + 1)):
            if j not in launched:
                launch(j)
        got = ray.get(launched.pop(step))
        while isinstance(got, ray.ObjectRef):  # partial rollout: the reference to the step's next turn
            got = ray.get(got)
        done_at.append(time.time())
        if step >= args.skip:
            lengths += [len(r) for r in got.responses]
            # the calls the step led (a drained step's: its one call; code before the pool recorded none)
            own = getattr(got, "engine_calls", None) or [(*got.span[:2], len(got.responses), rt.max_new_tokens)]
            calls.append(len(own))
            rows += [c[2] for c in own]
            busy.append(sum(c[1] - c[0] for c in own))
    gaps = [b - a for a, b in zip(done_at[args.skip - 1:], done_at[args.skip:])]
    return {"step_s": round(statistics.mean(gaps), 4), "engine_calls_s": round(statistics.mean(busy), 4),
            "calls_per_step": round(statistics.mean(calls), 2), "rows_per_call": round(statistics.mean(rows), 1),
            "response_len": round(statistics.mean(lengths), 2), "response_max": max(lengths)}


def _predicted(cost) -> dict:
    return {"predicted_s": round(cost.seconds, 4), "predicted_parts": {k: round(v, 4) for k, v in cost.parts if v}}


if __name__ == "__main__":
    main()
