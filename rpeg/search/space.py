"""The plan space the planner searches: structure choices and placements.

Structure: async bound k (0..max staleness), partial rollout (k >= 1: generation engines that
never drain between steps), actor-critic sharing (where there is a critic),
fusion (generation that returns the policy's logprobs, k = 0 only; actor and critic trained in one
schedule), streaming micro-batches. Placement: everything colocated; generation on its own
devices and the rest on the others (split in whole nodes); one group per model (actor with its
generation, critic, frozen models) for pipelines with several models. Layouts are then chosen per
stage (layouts.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rpeg.graph import Graph, Kind
from rpeg.passes import bound_asynchrony, fuse, partial_rollout, place, share_actor_critic, stream


@dataclass(frozen=True, slots=True)
class SpaceOptions:
    """Which parts of the space a search may use (the ablations switch parts off)."""

    share: bool = True
    fuse: bool = True
    stream: bool = True
    placements: tuple[str, ...] = ("colocated", "split", "per-model")
    partial_rollout: bool = True  # with k >= 1: engines that never drain (passes/rollout.py)


@dataclass(frozen=True, slots=True, order=True)
class Structure:
    async_bound: int = 0
    share: bool = False
    fuse_logprobs: bool = False
    fuse_train: bool = False
    stream: int = 0
    partial: bool = False  # partial rollout (k >= 1)

    def describe(self) -> str:
        parts = [f"async k={self.async_bound}" if self.async_bound else "synchronous"]
        if self.partial:
            parts.append("partial rollout")
        if self.share:
            parts.append("critic shared with the actor")
        if self.fuse_logprobs:
            parts.append("logprobs fused into generation")
        if self.fuse_train:
            parts.append("actor and critic trained in one schedule")
        if self.stream:
            parts.append(f"streaming in {self.stream} micro-batches")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True, order=True)
class Placement:
    name: str
    groups: tuple[tuple[str, int, int], ...]  # (name, first, count)
    assign: tuple[tuple[str, str], ...]  # (stage, group)

    def describe(self, graph: Graph) -> str:
        by_group: dict[str, list[str]] = {}
        for stage, grp in self.assign:
            by_group.setdefault(grp, []).append(stage)
        return "; ".join(f"{g} ({c} GPUs: {first}-{first + c - 1}): {', '.join(by_group.get(g, []))}"
                         for g, first, c in self.groups)


def structures(graph: Graph, max_staleness: int, space: SpaceOptions = SpaceOptions()) -> Iterator[Structure]:
    has_critic = graph.has_model("critic")
    streams = ((0, 4, 16) if graph.job.mini_batches >= 2 else (0, 4)) if space.stream else (0,)
    for k in range(0, max_staleness + 1):
        for share in ((False, True) if has_critic and space.share else (False,)):
            # an off-policy correction weighs tokens by the trainer's logprobs over the engine's: never fused
            for fl in ((False, True) if k == 0 and space.fuse and not graph.config.corrects_off_policy else (False,)):
                for ft in ((False, True) if has_critic and not share and space.fuse else (False,)):
                    for m in streams:
                        for partial in ((False, True) if k >= 1 and space.partial_rollout else (False,)):
                            yield Structure(k, share, fl, ft, m, partial)


def apply_structure(graph: Graph, s: Structure) -> Graph:
    g = graph
    if s.share:
        g = share_actor_critic(g)
    if s.async_bound:
        g = bound_asynchrony(g, s.async_bound)
    if s.partial:
        g = partial_rollout(g)
    return g


def apply_execution(graph: Graph, s: Structure, p: Placement) -> Graph:
    g = place(graph, {name: (first, count) for name, first, count in p.groups}, dict(p.assign))
    if s.fuse_logprobs:
        g = fuse(g, ["generate", "actor_logprobs"])
    if s.fuse_train:
        g = fuse(g, ["actor_update", "critic_update"])
    if s.stream:
        g = stream(g, s.stream)
    return g


def _units(gpus: int, node: int) -> tuple[int, int]:
    """(granularity, units): split in whole nodes when there are at least two, else in GPUs."""
    if gpus >= 2 * node and gpus % node == 0:
        return node, gpus // node
    return 1, gpus


def placements(graph: Graph, gpus: int, node: int, space: SpaceOptions = SpaceOptions()) -> Iterator[Placement]:
    stages = [s for s in graph.stages if s.kind is not Kind.SYNC]
    everything = tuple((s.name, "all") for s in stages)
    if "colocated" in space.placements:
        yield Placement("colocated", (("all", 0, gpus),), everything)
    size, units = _units(gpus, node)
    if units < 2:
        return
    fractions = sorted({max(1, round(units * f)) for f in (1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4, 7 / 8)} - {units})
    gen_stages = {s.name for s in stages if s.kind is Kind.GENERATE}
    for u in (fractions if "split" in space.placements else ()):
        g = u * size
        assign = tuple((s.name, "generation" if s.name in gen_stages else "training") for s in stages)
        yield Placement(f"split {g}/{gpus - g}", (("generation", 0, g), ("training", g, gpus - g)), assign)
    models = {s.model for s in stages if s.model}
    if "per-model" in space.placements and ("critic" in models or "ref" in models or "reward" in models):
        def role(s) -> str:
            if s.model in (None, "actor"):
                return "actor"
            return "critic" if s.model == "critic" else "frozen"
        roles = sorted({role(s) for s in stages}, key=["actor", "critic", "frozen"].index)
        shares = {"actor": (1 / 2, 5 / 8, 3 / 4), "critic": (1 / 4, 3 / 8), "frozen": (1 / 8, 1 / 4)}
        seen = set()  # shares that round to the same counts give one placement, not several
        for a in shares["actor"]:
            for c in (shares["critic"] if "critic" in roles else (0.0,)):
                f = 1 - a - c if "frozen" in roles else 0.0
                if "frozen" in roles and f <= 0:
                    continue
                counts = {"actor": round(units * a), "critic": round(units * c), "frozen": round(units * f)}
                if "frozen" not in roles:
                    counts["actor"] = units - counts["critic"]
                else:
                    counts["actor"] = units - counts["critic"] - counts["frozen"]
                if any(counts[r] < 1 for r in roles):
                    continue
                groups, first = [], 0
                for r in roles:
                    groups.append((r, first * size, counts[r] * size))
                    first += counts[r]
                name = "per model " + "/".join(f"{counts[r] * size}" for r in roles)
                if name in seen:
                    continue
                seen.add(name)
                yield Placement(name, tuple(groups), tuple((s.name, role(s)) for s in stages))

