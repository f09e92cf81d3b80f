"""How long the joint plan search takes for a 256-GPU, four-model PPO job on this machine.

The issue's target: under 60 s on 2 cores. Prints JSON with the search time, the candidates it
evaluated and pruned, the stage layouts it costed, and the ratio of the time to the 60 s target
(below 1 is within it).

    .venv/bin/python benchmarks/search_speed.py
"""

from __future__ import annotations

import json
import time

from rpeg.algorithms import Models, build_graph
from rpeg.graph import Job, LengthDistribution, get_model
from rpeg.hardware import load_cluster
from rpeg.search import search

TARGET_S = 60.0


def main() -> None:
    m = get_model("llama-3.1-70B")
    job = Job(prompts=512, samples_per_prompt=8, prompt_len=1024,
              response=LengthDistribution(kind="lognormal", mean=4096, max=16384), mini_batches=8)
    graph = build_graph("ppo", job, Models(actor=m, critic=m, reference=m, reward=m))
    cluster = load_cluster("alps-gh200", 256)
    t0 = time.perf_counter()
    result = search(graph, cluster, 256, max_staleness=2)
    seconds = time.perf_counter() - t0
    print(json.dumps({
        "job": "ppo, 4 x llama-3.1-70B, 4096 sequences of 1024 + ~4096 tokens",
        "cluster": "alps-gh200 x 256",
        "search_s": round(seconds, 2),
        "ratio_to_60s_target": round(seconds / TARGET_S, 3),
        "candidates": result.evaluated, "pruned": result.pruned, "layouts_costed": result.layouts_costed,
        "best": result.best.name, "best_step_s": round(result.best.step_s, 2),
    }, indent=1))


if __name__ == "__main__":
    main()
