"""refit(gather): how a weight sync assembles each generation engine's weights.

`shard` (the default): each device gathers only the tensor-parallel shard its engine slice needs,
from the training shards of its model-parallel group: verl's 3D-HybridEngine with Megatron
(HybridFlow, arXiv 2409.19256, section 5: zero redundancy) and ReaL's parameter reallocation.
RPEG's runtime does `full` (below), and refuses `shard` where the two differ (training tensor- or
pipeline-parallel, or generation tensor-parallel: rpeg/runtime/plan_check.py).

`full`: each device gathers every tensor in full and its engine takes its slice, so every device
receives the whole model once per step: NeMo-RL's Megatron refit (nemo_rl/models/megatron/
refit_utils.py `gather_params`: a tensor-parallel all-gather, a broadcast of the full tensor over
the pipeline group, an all-gather of the experts over expert parallelism, tag v0.3.0), verl's FSDP
rollout sync (DTensor `full_tensor()` per parameter), DeepSpeed ZeRO-3's `GatheredParameters`
(DeepSpeed-Chat's Hybrid Engine, OpenRLHF's broadcast to vLLM). When generation has its own
devices, `full` also means one sender: the trainers gather full tensors and one rank broadcasts the
whole model to every generation device (NeMo-RL's `packed_broadcast_producer(src=0)` in
`broadcast_weights_for_collective`, tag v0.5.0; OpenRLHF's rank-0 broadcast, its issue #533),
where `shard` lets every shard holder send its part in parallel.
"""

from __future__ import annotations

from rpeg.graph import Graph
from rpeg.graph.graph import REFIT_GATHERS
from rpeg.passes.base import call_text, finish, refuse


def refit(graph: Graph, gather: str) -> Graph:
    call = call_text("refit", gather=gather)
    if gather not in REFIT_GATHERS:
        raise refuse(call, f"gather must be one of {', '.join(REFIT_GATHERS)}, got {gather!r}")
    return finish(graph, graph.replace(refit_gather=gather), call)
