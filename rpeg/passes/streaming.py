"""stream(microbatches): consumers start on parts of a producer's output as they finish.

Fine-grained scheduling between producer and consumer (RLHFuse's inter-stage fusion,
StreamRL's and PipelineRL's streams): with m micro-batches the consumer's first part starts
after 1/m of the producer's work instead of all of it. A consumer that needs the whole batch
(batch-wide normalization, a single optimizer step) or whole groups smaller than a part cannot
stream; `edges=None` streams every edge that can and leaves the others, listing them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rpeg.graph import Graph, Stream
from rpeg.graph.bounds import MAX_MICROBATCHES
from rpeg.graph.verify import stream_problem
from rpeg.passes.base import call_text, finish, refuse


def stream(graph: Graph, microbatches: int, edges: Sequence[Sequence[str]] | None = None) -> Graph:
    call = call_text("stream", microbatches=microbatches, edges=[list(e) for e in edges] if edges else None)
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 2:
        raise refuse(call, f"microbatches must be a whole number >= 2, got {microbatches!r}")
    if microbatches > MAX_MICROBATCHES:
        raise refuse(call, f"microbatches = {microbatches:,} exceeds {MAX_MICROBATCHES:,} (per-sample streaming of the "
                     "largest published batches stays below; the simulator tracks every part of every step)")
    if edges is None:
        pairs = [(e.src, e.dst) for e in graph.data_edges()]
        chosen = [Stream(producer=p, consumer=c, microbatches=microbatches) for p, c in pairs
                  if stream_problem(graph, Stream(producer=p, consumer=c, microbatches=microbatches)) is None]
        if not chosen:
            raise refuse(call, "no producer -> consumer edge of this graph can stream with "
                         f"{microbatches} micro-batches")
    else:
        chosen = []
        for e in edges:
            if len(e) != 2:
                raise refuse(call, f"an edge is a [producer, consumer] pair, got {list(e)}")
            st = Stream(producer=e[0], consumer=e[1], microbatches=microbatches)
            why = stream_problem(graph, st)
            if why:
                raise refuse(call, f"{e[0]} -> {e[1]}: {why}")
            chosen.append(st)
    new_pairs = {(s.producer, s.consumer) for s in chosen}
    streams = tuple(s for s in graph.streams if (s.producer, s.consumer) not in new_pairs) + tuple(chosen)
    touched = {n for s in chosen for n in (s.producer, s.consumer)}
    stages = [s.replace(microbatches=max(s.microbatches, microbatches)) for s in graph.stages if s.name in touched]
    return finish(graph, graph.with_stages(stages).replace(streams=streams), call)


def unstreamable(graph: Graph, microbatches: int) -> list[tuple[str, str, str]]:
    """(producer, consumer, reason) for every data edge that cannot stream."""
    out = []
    for e in graph.data_edges():
        why = stream_problem(graph, Stream(producer=e.src, consumer=e.dst, microbatches=microbatches))
        if why:
            out.append((e.src, e.dst, why))
    return out
