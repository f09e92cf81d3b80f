"""What a fault costs a run that recovers by itself (runtime.run's recovery), measured side by side with the
same run uninterrupted, in one process, one after the other.

The job: GRPO on the tiny model, a split plan (one engine on device 0, the trainer on device 1; on-policy,
so the runs end with the same weights), `--steps` steps with a checkpoint every `--checkpoint-every`. Runs:
- clean: no fault;
- engine: the engine is killed (SIGKILL) as it starts generating step 3: the engine alone is restarted,
  given the current weights, and its calls made again (no step lost);
- trainer: the trainer is killed as it starts step `--checkpoint-every` + 3's update: every worker is
  restarted from the last checkpoint, and the steps since are run again;
- stopped: the engine is stopped (SIGSTOP) as it starts generating step `--checkpoint-every` + 1: the
  driver's wait gives up at the floor (`--floor` seconds) and every worker is restarted from the last
  checkpoint.

Prints JSON: each run's wall time and training time (its first step's start to its end), the cost (its
training time over the clean run's), each restart's own time (from the fault
seen to the workers back with their weights) and the steps run again, the clean run's mean step time, and
whether the final weights equal the clean run's bit for bit.

    PYTHONPATH=. .venv/bin/python benchmarks/recovery.py [--steps 10] [--checkpoint-every 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rpeg.algorithms import Models, build_graph  # noqa: E402
from rpeg.graph import Job, LengthDistribution, get_model  # noqa: E402
from rpeg.passes import parallelize, place  # noqa: E402
from rpeg.runtime.config import RuntimeConfig  # noqa: E402
from rpeg.runtime.outputs import load_latest  # noqa: E402


def plan():
    g = build_graph("grpo", Job(prompts=8, samples_per_prompt=4, prompt_len=6, response=LengthDistribution.fixed(4),
                                mini_batches=2), Models(actor=get_model("tiny-qwen2")), kl_coef=0.0)
    g = place(g, {"gen": 1, "train": 1}, {"generate": "gen"}, default="train")
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            g = parallelize(g, s.name, dp=1, micro_batch=64, packing=False)
    return g


def one(name: str, fault: str, args, root: str) -> dict:
    from rpeg.runtime.run import run

    os.environ["RPEG_FAULTS"] = fault
    os.environ["RPEG_FAULTS_DIR"] = os.path.join(root, name, "fired")
    out = os.path.join(root, name, "run")
    rt = RuntimeConfig(model_path="tiny", task={"name": "arithmetic", "ops": ["add"], "level": 1}, steps=args.steps,
                       lr=1e-3, max_new_tokens=3, eval_every=0, eval_size=20, checkpoint_every=args.checkpoint_every,
                       out=out, threads=1, wait_timeout_s=args.floor)
    t = time.time()
    result = run(plan(), rt, progress=False)
    wall = time.time() - t
    path = os.path.join(out, "recoveries.jsonl")
    rows = [json.loads(line) for line in open(path, encoding="utf-8")] if os.path.exists(path) else []
    # the training itself: from the first step's first record to the last record (Ray's start, the models'
    # loading and the first evaluation, alike in every run, left out)
    first = min(r.start for r in result.timeline.records if r.step == 0 and r.unit != "recovery")
    return {"wall_s": wall, "train_s": max(r.end for r in result.timeline.records) - first,
            "step_s_mean": sum(m["step_s"] for m in result.metrics) / len(result.metrics),
            "restarts": [{k: r[k] for k in ("fault", "restart_s", "steps_lost") if k in r} | {
                "kind": "engines alone" if "engines" in r else "every worker, from the last checkpoint"}
                for r in rows],
            "weights": load_latest(os.path.join(out, "checkpoints"))["actor"]["model"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--checkpoint-every", type=int, default=4)
    ap.add_argument("--floor", type=float, default=10.0, help="runtime.wait_timeout_s of every run (seconds)")
    args = ap.parse_args()
    # generate calls of the engine: the first evaluation's 2, then one a step; train calls: one a step
    runs = {"clean": "", "engine": "die:generate:5", "trainer": f"die:train:{args.checkpoint_every + 3}",
            "stopped": f"stop:generate:{args.checkpoint_every + 3}"}
    root = tempfile.mkdtemp(prefix="rpeg-recovery-")
    try:
        got = {name: one(name, fault, args, root) for name, fault in runs.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    clean = got["clean"]
    out = {"job": f"grpo tiny, split plan (1 engine + 1 trainer), {args.steps} steps, checkpoint every "
                  f"{args.checkpoint_every}, wait floor {args.floor:g} s",
           "clean_wall_s": round(clean["wall_s"], 2), "clean_train_s": round(clean["train_s"], 2),
           "clean_step_s": round(clean["step_s_mean"], 3)}
    for name in ("engine", "trainer", "stopped"):
        r = got[name]
        out[name] = {"fault": runs[name], "wall_s": round(r["wall_s"], 2), "train_s": round(r["train_s"], 2),
                     "cost_s": round(r["train_s"] - clean["train_s"], 2),
                     "cost_in_steps": round((r["train_s"] - clean["train_s"]) / clean["step_s_mean"], 1),
                     "restarts": [{k: round(v, 2) if isinstance(v, float) else v for k, v in x.items()}
                                  for x in r["restarts"]],
                     "same_weights_as_clean": all(torch.equal(r["weights"][k], clean["weights"][k])
                                                  for k in clean["weights"])}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
