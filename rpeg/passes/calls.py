"""serial_calls(sequences): generation reaches each engine in calls of a few sequences, one call at a time.

A system whose trainer ranks each ask the generation engine for their own micro-batch and wait for
it, while the engine serves one call at a time, never gives the engine more than one micro-batch to
batch. OpenRLHF v0.2 (April 2024, version.txt 0.2.3) did this: every actor rank loops over its share
of the rollout batch in chunks of `--micro_rollout_batch_size` prompts (`PPOTrainer.fit`: one
`make_experience` per chunk), and `RemoteExperienceMaker._generate_vllm` sends each chunk to engine
`rank % vllm_num_engines` with a blocking `ray.get(llm.generate.remote(...))`; the engine is a Ray
actor (`LLMRayActor`, default concurrency 1), so the calls of the ranks that share it run one after
another, each until its longest response is done. The example scripts set 16
(examples/scripts/train_ppo_llama_ray.sh, 7B) and 2 (train_ppo_llama_ray_70b.sh, 70B).

The cost is in rpeg/perf/calls.py. Partial rollout and several steps in flight keep an engine's batch
full across steps, which serial calls cannot: refused with them.
"""

from __future__ import annotations

from rpeg.graph import Graph
from rpeg.passes.base import call_text, finish, refuse


def serial_calls(graph: Graph, sequences: int) -> Graph:
    call = call_text("serial_calls", sequences=sequences)
    if isinstance(sequences, bool) or not isinstance(sequences, int) or sequences < 1:
        raise refuse(call, f"sequences must be a whole number >= 1 (a generate call's micro-batch), got {sequences!r}")
    if graph.engines_never_drain:
        raise refuse(call, "with partial rollout, several steps in flight or refill the engine's batch stays full "
                           "across steps; one call at a time cannot keep it so")
    return finish(graph, graph.replace(call_sequences=sequences), call)
