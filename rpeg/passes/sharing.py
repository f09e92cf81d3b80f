"""share_actor_critic(): the critic becomes a value head on the actor's trunk.

One model instead of two: the critic's forward pass joins the actor's logprob pass (one
forward gives logprobs and values) and its update joins the actor's (policy loss + value loss,
one backward), which halves the weights, optimizer state and passes the critic cost. The value
estimate then has the actor's architecture whatever the critic's was. Refused where the
algorithm has no critic, and after execution passes (apply structure before execution).
"""

from __future__ import annotations

from rpeg.graph import Graph, Kind, Stage
from rpeg.passes.base import call_text, finish, refuse


def share_actor_critic(graph: Graph) -> Graph:
    call = call_text("share_actor_critic")
    if not graph.has_model("critic"):
        raise refuse(call, f"{graph.algorithm} has no critic to share")
    if graph.fusion or graph.streams or graph.groups or any(s.layout for s in graph.stages):
        raise refuse(call, "apply structure passes (sharing) before execution passes (fuse, stream, place, "
                     "parallelize)")
    into = {Kind.INFER: _actor_stage(graph, Kind.INFER), Kind.TRAIN: _actor_stage(graph, Kind.TRAIN)}
    merged: dict[str, Stage] = {}
    dropped = set()
    for s in graph.stages:
        if s.model != "critic":
            continue
        if s.kind not in into or into[s.kind] is None:
            raise refuse(call, f"critic stage {s.name!r} ({s.kind}) has no actor stage of the same kind to join")
        host = merged.get(into[s.kind].name, into[s.kind])
        merged[host.name] = host.replace(
            reads=host.reads + tuple(f for f in s.reads if f not in host.reads and f not in s.writes),
            writes=host.writes + s.writes,
            doc=f"{host.doc}; {s.doc} (shared trunk)")
        dropped.add(s.name)
    # A field the host now writes and also reads (values feed the value loss) stays an input of
    # the merged stage only if another stage produces it; otherwise it is produced internally.
    stages = []
    for s in graph.stages:
        if s.name in dropped:
            continue
        s = merged.get(s.name, s)
        stages.append(s.replace(reads=tuple(f for f in s.reads if f not in s.writes)))
    actor = graph.model("actor")
    heads = actor.heads + tuple(h for h in graph.model("critic").heads if h not in actor.heads)
    models = tuple(m.replace(heads=heads) if m.name == "actor" else m for m in graph.models if m.name != "critic")
    return finish(graph, graph.replace(stages=tuple(stages), models=models), call)


def _actor_stage(graph: Graph, kind: Kind) -> Stage | None:
    return next((s for s in graph.stages if s.model == "actor" and s.kind is kind and s.lag == 0), None)
