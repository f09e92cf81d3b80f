"""What the baselines share: checking the input, splitting GPUs into device groups, finishing a plan.

Splits are deterministic. `split` gives each group whole nodes when the GPUs are a whole number
of nodes and every group can have at least one; otherwise single GPUs. Shares follow the weights
by largest remainder (ties go to the earlier group), and no group ever gets zero devices: with
fewer units than groups the split is None and the caller falls back to a coarser placement (each
baseline says which). Groups are laid end to end from device 0 in the order given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rpeg.errors import RpegError
from rpeg.graph import Graph, Kind, verify
from rpeg.hardware.topology import Cluster
from rpeg.passes import colocate, place
from rpeg.search.layouts import LayoutCache, LayoutOptions, apply_layouts
from rpeg.search.memfit import fit_together


def check_input(graph: Graph, cluster: Cluster, gpus: int, name: str) -> None:
    """Refuse what no baseline can start from: a bad GPU count or an already planned graph."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise RpegError(f"baseline {name}: gpus must be a whole number >= 1, got {gpus!r}")
    if cluster.gpus and gpus > cluster.gpus:
        raise RpegError(f"baseline {name}: {gpus} GPUs asked for, cluster {cluster.name!r} has {cluster.gpus}")
    planned = [what for what, present in (
        ("device groups", bool(graph.groups)), ("fusion", bool(graph.fusion)), ("streams", bool(graph.streams)),
        ("parallel layouts", any(s.layout for s in graph.stages))) if present]
    if planned:
        raise RpegError(f"baseline {name} builds from the algorithm's graph, but this one already has "
                        f"{', '.join(planned)} (history: {'; '.join(graph.history) or 'none'})")


def node_divisors(cluster: Cluster) -> tuple[int, ...]:
    """Tensor-parallel sizes that stay inside one node (vLLM's, SGLang's and NCCL-TP's usual limit)."""
    n = cluster.gpus_per_node
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def split(gpus: int, gpus_per_node: int, weights: Sequence[float]) -> tuple[int, ...] | None:
    """Device counts for groups in proportion to `weights`, in whole nodes where possible.

    8 nodes by (2, 2, 2, 1, 1) -> 16, 16, 16, 8, 8 GPUs; 8 GPUs (one node) by the same -> 2, 2, 2, 1, 1;
    3 nodes by (1, 3) -> 8, 16 (at least one node each). None when gpus < len(weights).
    """
    n = len(weights)
    if n == 0 or gpus < n:
        return None
    whole_nodes = gpus % gpus_per_node == 0 and gpus // gpus_per_node >= n
    unit = gpus_per_node if whole_nodes else 1
    units = gpus // unit
    total = float(sum(weights))
    ideal = [w / total * units for w in weights]
    counts = [max(1, math.floor(x)) for x in ideal]
    while sum(counts) < units:  # the largest shortfall gets the next unit; ties: the earlier group
        i = max(range(n), key=lambda j: (ideal[j] - counts[j], -j))
        counts[i] += 1
    while sum(counts) > units:  # minimums overshot: the most over-served group (ties: the later) gives back
        i = max((j for j in range(n) if counts[j] > 1), key=lambda j: (counts[j] - ideal[j], j))
        counts[i] -= 1
    return tuple(c * unit for c in counts)


def lay_out(names: Sequence[str], counts: Sequence[int], first: int = 0) -> dict[str, tuple[int, int]]:
    """Groups `names` of `counts` devices end to end from `first`: name -> (first, count)."""
    out, nxt = {}, first
    for name, count in zip(names, counts):
        out[name] = (nxt, count)
        nxt += count
    return out


def generation_stages(graph: Graph) -> list[str]:
    return [s.name for s in graph.stages if s.kind is Kind.GENERATE]


def split_generation(graph: Graph, cluster: Cluster, gpus: int, share: float, group: str) -> Graph:
    """Generation stages on their own `share` of the GPUs (group `group`, whole nodes when the job spans
    nodes), everything else on the rest; colocated on all `gpus` when they cannot be split."""
    counts = split(gpus, cluster.gpus_per_node, (share, 1 - share))
    if counts is None:
        return colocate(graph, gpus)
    return place(graph, {group: counts[0], "train": counts[1]}, assign={s: group for s in generation_stages(graph)},
                 default="train")


def finish(graph: Graph, cluster: Cluster, options: LayoutOptions, cache: LayoutCache, name: str) -> Graph | None:
    """Every model stage at its fastest layout the system supports, with the models that share devices
    fitting together (search/memfit.py), verified; None if they cannot."""
    planned = apply_layouts(graph, cluster, options, cache)
    if planned is not None:
        planned = fit_together(planned, cluster, options, cache)
    return None if planned is None else verify(planned, f"baseline {name}")
