"""bound_asynchrony(k): generation at step t may use actor weights of any step >= t - k.

k = 0 is on-policy (generation waits for the previous step's update); k = 1 is one-step-off
(verl `one_step_off`, NeMo-RL async GRPO, OpenRLHF's queue of 1); larger k bounds the
staleness of AReaL-style fully asynchronous training. Only weight-version edges change: every
generation stage now reads its model at lag k, so the weight edge into it spans 1 + k steps.
"""

from __future__ import annotations

from rpeg.graph import Graph, Kind
from rpeg.graph.bounds import MAX_STALENESS
from rpeg.passes.base import call_text, finish, refuse


def bound_asynchrony(graph: Graph, k: int) -> Graph:
    call = call_text("bound_asynchrony", k=k)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise refuse(call, f"k must be a whole number of steps >= 0, got {k!r}")
    if k > MAX_STALENESS:
        raise refuse(call, f"k = {k:,} exceeds {MAX_STALENESS} (published systems use 1-8)")
    for group in graph.fusion:
        kinds = {graph.stage(s).kind for s in group}
        if k > 0 and Kind.GENERATE in kinds and len({graph.stage(s).model for s in group} - {None}) == 1 \
                and any(graph.stage(s).kind is not Kind.GENERATE and graph.stage(s).model for s in group):
            raise refuse(call, f"fusion group ({', '.join(group)}) runs generation and another pass of the "
                         "same model in one engine; with k > 0 they would read different weight versions")
    stages = [s.replace(lag=k) for s in graph.stages if s.kind is Kind.GENERATE]
    return finish(graph, graph.with_stages(stages).replace(async_bound=k), call)
