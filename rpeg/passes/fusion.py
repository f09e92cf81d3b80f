"""fuse(stages): run several stages as one pass over the same micro-batches and devices.

Legal fusions (the rules live in `rpeg.graph.verify.fusion_problem`, so loaded graphs obey them
too): train stages together (actor and critic in one pipeline schedule, RLHFuse's intra-stage
fusion); or stages that use one model at one weight version plus per-sample model-free stages
(generation that returns the policy's logprobs; a rule reward scored as each sample finishes).
Everything else is refused with the reason. Stages and fields are untouched, so every producer
-> consumer relation is kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from rpeg.graph import Graph
from rpeg.graph.verify import fusion_problem
from rpeg.passes.base import call_text, finish, refuse


def fuse(graph: Graph, stages: Sequence[str]) -> Graph:
    group = tuple(stages)
    call = call_text("fuse", stages=list(group))
    for s in group:
        already = graph.fusion_group_of(s)
        if already:
            raise refuse(call, f"stage {s!r} is already fused with ({', '.join(already)})")
    why = fusion_problem(graph, group)
    if why:
        raise refuse(call, why)
    return finish(graph, graph.replace(fusion=graph.fusion + (group,)), call)
