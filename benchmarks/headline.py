"""The paper's experiment shape: RPEG's plans against verl's and ReaL's on 256 GH200 GPUs.

alps-gh200 (4 GH200 per node, one 200 Gb/s Slingshot-11 NIC per GPU), 256 GPUs; PPO (actor,
critic, reference, reward model, all the same architecture) and GRPO; models from 7B to 70B;
long reasoning responses (log-normal, mean 4096, max 16384 tokens). For each job: the best RPEG
plan, verl's and ReaL's plans (and the other peers'), RPEG's speedup over each (their step time
over ours), the utilization gain (simulated busy fraction, RPEG minus verl, in points; and MFU
relative to verl's), and an ablation that searches with one family of optimizations at a time:

- layout:     synchronous, colocated, only per-stage layouts chosen (DP/TP/PP/CP/EP, ZeRO, recompute)
- placement:  layouts plus placement (colocated, generation split off, one group per model), synchronous
- async:      placement and layouts plus bounded asynchrony (k <= 1)
- sharing:    layouts plus actor-critic sharing, colocated, synchronous
- fusion:     layouts plus fusion and streaming, colocated, synchronous
- all:        the whole space (k <= 1) except sharing: the same job (the plan reported)
- all+share:  the whole space, the critic's trunk shared with the actor (a different value model, so
              not the same job: `rpeg plan --allow-share`; shown for what it would add)

Prints JSON. Everything is the analytic model's prediction (`rpeg/perf`) with the simulator's
utilization; nothing here ran on GPUs. Takes a few minutes on 2 cores:

    .venv/bin/python benchmarks/headline.py > docs/headline.json
"""

from __future__ import annotations

import json
import sys
import time

from rpeg.algorithms import Models, build_graph
from rpeg.graph import Job, LengthDistribution, get_model
from rpeg.hardware import load_cluster
from rpeg.perf.step import predict_step
from rpeg.search import LayoutCache, SpaceOptions, search
from rpeg.search.baselines import BASELINES
from rpeg.sim import simulate

GPUS = 256
MODELS = ("qwen2.5-7B", "llama-3.1-8B", "qwen2.5-32B", "llama-3.1-70B")
ABLATIONS = {
    "layout": (0, SpaceOptions(share=False, fuse=False, stream=False, placements=("colocated",))),
    "placement": (0, SpaceOptions(share=False, fuse=False, stream=False)),
    "async": (1, SpaceOptions(share=False, fuse=False, stream=False)),
    "sharing": (0, SpaceOptions(share=True, fuse=False, stream=False, placements=("colocated",))),
    "fusion": (0, SpaceOptions(share=False, fuse=True, stream=True, placements=("colocated",))),
    "all": (1, SpaceOptions(share=False)),
    "all+share": (1, SpaceOptions()),
}


def job_for(algorithm: str) -> Job:
    response = LengthDistribution(kind="lognormal", mean=4096, max=16384)
    if algorithm == "grpo":
        return Job(prompts=256, samples_per_prompt=16, prompt_len=1024, response=response, mini_batches=8)
    return Job(prompts=1024, samples_per_prompt=4, prompt_len=1024, response=response, mini_batches=8)


def run_one(algorithm: str, model: str, cluster) -> dict:
    spec = get_model(model)
    models = Models(actor=spec, critic=spec, reference=spec, reward=spec if algorithm == "ppo" else None)
    graph = build_graph(algorithm, job_for(algorithm), models)
    cache = LayoutCache()
    t0 = time.perf_counter()
    out: dict = {"algorithm": algorithm, "model": model, "gpus": GPUS}
    ablation = {}
    best = None
    for name, (k, space) in ABLATIONS.items():
        res = search(graph, cluster, GPUS, max_staleness=k, space=space, cache=cache)
        ablation[name] = round(res.best.step_s, 2)
        if name == "all":
            best = res.best
    tl = simulate(best.graph, cluster, 8)
    out["rpeg"] = {"plan": best.name, "step_s": round(best.step_s, 2), "simulated_step_s": round(tl.step_s, 2),
                   "utilization": round(tl.utilization, 3), "mfu": round(tl.mfu, 4)}
    peers = {}
    for name, b in BASELINES.items():
        g = b.build(graph, cluster, GPUS, cache)
        if g is None:
            peers[name] = None
            continue
        pred = predict_step(g, cluster)
        if not pred.fits:
            peers[name] = None
            continue
        ptl = simulate(g, cluster, 8)
        peers[name] = {"step_s": round(pred.step_s, 2), "utilization": round(ptl.utilization, 3),
                       "mfu": round(ptl.mfu, 4), "rpeg_speedup": round(pred.step_s / best.step_s, 2)}
    out["peers"] = peers
    for ref in ("verl", "real"):
        if peers.get(ref):
            out[f"speedup_vs_{ref}"] = peers[ref]["rpeg_speedup"]
    if peers.get("verl"):
        # two readings of "utilization": the simulated busy fraction of the devices (a colocated
        # synchronous plan is always busy, if not always useful), and MFU on the FLOPs each plan
        # executes (a plan that shares the critic executes fewer FLOPs for the same job)
        out["busy_fraction_gain_vs_verl_points"] = round(100 * (tl.utilization - peers["verl"]["utilization"]), 1)
        out["mfu_gain_vs_verl_percent"] = round(100 * (tl.mfu / peers["verl"]["mfu"] - 1), 1)
    out["ablation_step_s"] = ablation
    verl_s = peers["verl"]["step_s"] if peers.get("verl") else None
    if verl_s:
        out["ablation_speedup_vs_verl"] = {k: round(verl_s / v, 2) for k, v in ablation.items()}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main() -> None:
    cluster = load_cluster("alps-gh200", GPUS)
    rows = []
    for algorithm in ("ppo", "grpo"):
        for model in MODELS:
            print(f"{algorithm} {model} ...", file=sys.stderr, flush=True)
            rows.append(run_one(algorithm, model, cluster))
    speedups = [r[k] for r in rows for k in ("speedup_vs_verl", "speedup_vs_real") if k in r]
    print(json.dumps({"cluster": "alps-gh200", "gpus": GPUS, "jobs": rows,
                      "max_speedup_vs_verl": max((r.get("speedup_vs_verl", 0) for r in rows), default=None),
                      "max_speedup_vs_real": max((r.get("speedup_vs_real", 0) for r in rows), default=None),
                      "max_mfu_gain_vs_verl_percent": max((r.get("mfu_gain_vs_verl_percent", 0) for r in rows),
                                                          default=None),
                      "n_speedups": len(speedups)}, indent=1))


if __name__ == "__main__":
    main()
