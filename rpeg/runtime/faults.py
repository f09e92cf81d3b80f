"""Faults injected on purpose, for the tests that check a run survives or reports them.

`RPEG_FAULTS` (in the environment of the process that starts Ray; its workers inherit it) lists them,
comma-separated, each `kind:argument`:

    corrupt_weights:V   after loading weight version V, engine rank 1 (of the weight-sync group) adds 0.5
                        to one element of its first tensor: a weight that goes wrong on one engine while
                        it serves it, which the next verified sync must catch (runtime.weights.verify)
    hang_engine:V       after loading weight version V, engine rank 1 (a colocated worker: rank 0) stops
                        answering: its thread sleeps for an hour, as a process wedged in a collective
                        would; the driver's bounded wait must end the run (runtime.waits)

Unset (the default) nothing is injected; the checks cost one dictionary lookup.
"""

from __future__ import annotations

import os
import time

import torch

HANG_S = 3600.0

ENV = "RPEG_FAULTS"


def armed(kind: str) -> str | None:
    """The argument of fault `kind` if RPEG_FAULTS names it, else None."""
    for item in os.environ.get(ENV, "").split(","):
        name, _, arg = item.strip().partition(":")
        if name == kind:
            return arg
    return None


def after_load(engine, rank: int, version: int, hang_rank: int = 1) -> None:
    """corrupt_weights: one element of engine rank 1's first served tensor changed after loading `version`;
    hang_engine: rank `hang_rank` stops answering after loading `version`."""
    hang = armed("hang_engine")
    if hang is not None and rank == hang_rank and int(hang) == version:
        time.sleep(HANG_S)
    arg = armed("corrupt_weights")
    served = getattr(engine, "served", None)
    if arg is None or rank != 1 or served is None or int(arg) != version:
        return
    with torch.no_grad():
        first = next(iter(served().values()))
        first.view(-1)[0] += 0.5
