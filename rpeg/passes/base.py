"""What every pass shares: record the call in the graph's history and re-verify the result."""

from __future__ import annotations

from rpeg.errors import PassRefused
from rpeg.graph import Graph, verify


def call_text(name: str, **kwargs) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items() if v is not None)
    return f"{name}({args})"


def finish(before: Graph, after: Graph, call: str) -> Graph:
    """The new graph with `call` appended to its history, verified."""
    return verify(after.replace(history=before.history + (call,)), f"after {call}")


def refuse(call: str, why: str) -> PassRefused:
    return PassRefused(f"{call} refused: {why}")
