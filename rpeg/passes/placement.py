"""place(groups, assign): put stages on device groups.

Groups are ranges of global device ids; overlapping groups mean colocation (the stages take
turns, paying a context switch), disjoint ones disaggregation (they run at the same time and
move data and weights between them). Every stage but weight syncs (which span the groups they
connect) must be assigned; `default` assigns whatever `assign` does not name.
"""

from __future__ import annotations

from collections.abc import Mapping

from rpeg.errors import RpegError
from rpeg.graph import DeviceGroup, Graph, Kind
from rpeg.passes.base import call_text, finish, refuse


def place(graph: Graph, groups: Mapping[str, tuple[int, int] | int], assign: Mapping[str, str] | None = None,
          default: str | None = None) -> Graph:
    """groups: name -> (first device, count), or a count (groups of counts are laid end to end)."""
    call = f"place(groups={groups!r:.80}, assign={assign!r:.80}, default={default!r})"
    if not isinstance(groups, Mapping) or not groups:
        raise refuse(call, "groups must be a non-empty mapping of group name -> device count or [first, count]")
    if assign is not None and not (isinstance(assign, Mapping)
                                   and all(isinstance(k, str) and isinstance(v, str) for k, v in assign.items())):
        raise refuse(call, "assign must be a mapping of stage name -> group name")
    if default is not None and not isinstance(default, str):
        raise refuse(call, f"default must be a group name, got {default!r}")
    assign = dict(assign or {})
    call = call_text("place", groups=dict(groups), assign=assign or None, default=default)
    built, nxt = [], 0
    for name, spec in groups.items():
        if _count(spec):
            first, count = nxt, spec
        elif isinstance(spec, (list, tuple)) and len(spec) == 2 and _whole(spec[0]) and spec[0] >= 0 \
                and _count(spec[1]):
            first, count = spec
        else:
            raise refuse(call, f"bad device group {name!r}: expected a count or [first, count] of whole numbers, "
                               f"got {spec!r}")
        try:
            built.append(DeviceGroup(name=str(name), first=first, count=count))
        except RpegError as e:
            raise refuse(call, f"bad device group: {e}") from None
        nxt = max(nxt, first + count)
    names = {g.name for g in built}
    unknown = [s for s in assign if s not in graph.stage_names]
    if unknown:
        raise refuse(call, f"no stage {unknown[0]!r} (stages: {', '.join(graph.stage_names)})")
    for stage, grp in list(assign.items()) + ([("default", default)] if default else []):
        if grp not in names:
            raise refuse(call, f"{stage} -> group {grp!r}, which is not defined ({', '.join(sorted(names))})")
    stages = []
    for s in graph.stages:
        grp = assign.get(s.name, default)
        if grp is None and s.kind is not Kind.SYNC:
            raise refuse(call, f"stage {s.name!r} is assigned to no group and there is no default")
        stages.append(s.replace(group=grp))
    return finish(graph, graph.with_stages(stages).replace(groups=tuple(built)), call)


def colocate(graph: Graph, devices: int) -> Graph:
    """Every stage on the same `devices` devices (verl's and NeMo-RL's default)."""
    return place(graph, {"all": devices}, default="all")


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _count(x) -> bool:
    return _whole(x) and x > 0
