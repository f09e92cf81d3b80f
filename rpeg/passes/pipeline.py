"""A named, printable sequence of passes, built in Python or read from a job's YAML:

    passes:
      - bound_asynchrony: {k: 1}
      - fuse: {stages: [generate, reward]}
      - stream: {microbatches: 8}

Structure passes (asynchrony, sharing) come before execution passes (fusion, streaming,
placement, layout); the pipeline runs them in the order given and verifies after each.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rpeg.errors import RpegError
from rpeg.graph import Graph
from rpeg.passes.asynchrony import bound_asynchrony
from rpeg.passes.fusion import fuse
from rpeg.passes.parallelize import parallelize
from rpeg.passes.placement import colocate, place
from rpeg.passes.reference import reference_on_host
from rpeg.passes.refit import refit
from rpeg.passes.rollout import partial_rollout
from rpeg.passes.calls import serial_calls
from rpeg.passes.sharing import share_actor_critic
from rpeg.passes.streaming import stream

# name -> (function, what it does in one line)
PASSES: dict[str, tuple[Callable[..., Graph], str]] = {
    "bound_asynchrony": (bound_asynchrony, "generation may run up to k steps ahead of training"),
    "share_actor_critic": (share_actor_critic, "critic becomes a value head on the actor"),
    "fuse": (fuse, "stages run as one pass over the same micro-batches"),
    "stream": (stream, "consumers start on micro-batches as producers finish them"),
    "place": (place, "stages onto device groups"),
    "colocate": (colocate, "every stage on the same devices"),
    "parallelize": (parallelize, "a stage's DP/TP/PP/CP/EP layout, ZeRO stage, recomputation and offload"),
    "partial_rollout": (partial_rollout, "generation never drains: running responses carry into the next step (k >= 1)"),
    "refit": (refit, "how a colocated weight sync gathers the engine's weights: its shard, or every tensor in full"),
    "serial_calls": (serial_calls, "each engine gets calls of N sequences, served one at a time"),
    "reference_on_host": (reference_on_host, "the reference's weights wait in host memory and are swapped in for its pass"),
}


@dataclass(frozen=True, slots=True)
class PassCall:
    name: str
    args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in PASSES:
            raise RpegError(f"unknown pass {self.name!r} (known: {', '.join(PASSES)})")
        params = inspect.signature(PASSES[self.name][0]).parameters
        unknown = [a for a in self.args if a not in params or a == "graph"]
        if unknown:
            allowed = ", ".join(p for p in params if p != "graph")
            raise RpegError(f"pass {self.name}: unknown argument {unknown[0]!r} (takes: {allowed or 'nothing'})")

    def __call__(self, graph: Graph) -> Graph:
        try:
            return PASSES[self.name][0](graph, **self.args)
        except TypeError as e:  # a missing required argument
            raise RpegError(f"pass {self.name}: {e}") from None

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{self.name}({args})"


@dataclass(frozen=True, slots=True)
class PassPipeline:
    calls: tuple[PassCall, ...] = ()

    @classmethod
    def of(cls, *calls: PassCall) -> PassPipeline:
        return cls(tuple(calls))

    @classmethod
    def from_data(cls, data: Any, where: str = "passes") -> PassPipeline:
        """From YAML data: a list whose items are `name` or `{name: {arg: value, ...}}`."""
        if data is None:
            return cls()
        if not isinstance(data, list):
            raise RpegError(f"{where}: expected a list of passes, got {type(data).__name__}")
        calls = []
        for i, item in enumerate(data):
            if isinstance(item, str):
                try:
                    calls.append(PassCall(item))
                except RpegError as e:
                    raise RpegError(f"{where}[{i}]: {e}") from None
            elif isinstance(item, dict) and len(item) == 1:
                (name, args), = item.items()
                if args is not None and not isinstance(args, dict):
                    raise RpegError(f"{where}[{i}].{name}: arguments must be a mapping, got {args!r}")
                try:
                    calls.append(PassCall(name, dict(args or {})))
                except RpegError as e:
                    raise RpegError(f"{where}[{i}]: {e}") from None
            else:
                raise RpegError(f"{where}[{i}]: expected a pass name or {{name: {{args}}}}, got {item!r}")
        return cls(tuple(calls))

    def then(self, *calls: PassCall) -> PassPipeline:
        return PassPipeline(self.calls + tuple(calls))

    def apply(self, graph: Graph) -> Graph:
        for c in self.calls:
            graph = c(graph)
        return graph

    def __iter__(self) -> Iterable[PassCall]:
        return iter(self.calls)

    def __len__(self) -> int:
        return len(self.calls)

    def __str__(self) -> str:
        if not self.calls:
            return "(no passes)"
        width = max(len(str(c)) for c in self.calls)
        return "\n".join(f"{i + 1:>2}. {str(c):<{width}}  # {PASSES[c.name][1]}" for i, c in enumerate(self.calls))
