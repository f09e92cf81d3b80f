"""Faults injected on purpose, for the tests that check a run survives or reports them.

`RPEG_FAULTS` (in the environment of the process that starts Ray; its workers inherit it) lists them,
comma-separated, each `kind:argument...`:

    corrupt_weights:V   after loading weight version V, engine rank 1 (of the weight-sync group) adds 0.5
                        to one element of its first tensor: a weight that goes wrong on one engine while
                        it serves it, which the next verified sync must catch (runtime.weights.verify)
    hang_engine:V       after loading weight version V, engine rank 1 (a colocated worker: rank 0) stops
                        answering: its thread sleeps for an hour, as a process wedged in a collective
                        would; the driver's bounded wait must end it (runtime.waits)
    die:POINT:N         the first worker process to reach fault point POINT for the N-th time (counting
                        that process's own calls) kills itself with SIGKILL there, as a process the
                        kernel's OOM killer or a lost node takes: the driver's recovery must restart it
    stop:POINT:N        the same, with SIGSTOP: the process stops answering without dying, as a hung
                        collective leaves it; the driver's bounded wait must see it and recover
    soak:N:P            at every fault point, with probability P, die or stop (at random, one in two),
                        until N faults have fired in all: a randomized soak

The points are where a worker starts one of its calls: `generate` (an engine's generation, one call of a
step's part, or one turn of a partial rollout's pool), `train` (an update), `send_weights` (a training
rank's part of a weight sync), `receive_weights` (an engine's), `load_weights` (a colocated worker's
sync), `checkpoint_state` (a checkpoint's gathering of the trainer's state) and `logprobs` (an inference
pass). The other ranks of the call are in theirs (an FSDP rank blocked in its all-gather, the engines
generating their shares) when one dies there.

die, stop and soak fire once per run, not once per process (a restarted worker counts from 0 again):
each firing leaves a file in `RPEG_FAULTS_DIR`, which the tests set to a folder of their own; without
it, a die or stop fires again in every restarted worker, which `runtime.max_restarts` then bounds.

Unset (the default) nothing is injected; the checks cost one dictionary lookup.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter

import torch

HANG_S = 3600.0

ENV = "RPEG_FAULTS"
DIR = "RPEG_FAULTS_DIR"
POINTS = ("generate", "train", "send_weights", "receive_weights", "load_weights", "checkpoint_state", "logprobs")

_calls: Counter = Counter()  # this process's calls of each fault point
_rng = random.Random()  # a soak's draws: seeded from the process and the clock at import


def armed(kind: str) -> str | None:
    """The argument of fault `kind` if RPEG_FAULTS names it, else None."""
    for item in os.environ.get(ENV, "").split(","):
        name, _, arg = item.strip().partition(":")
        if name == kind:
            return arg
    return None


def _fire_once(name: str, limit: int = 1) -> bool:
    """Whether this firing of `name` is one of the run's first `limit`: each takes a file of its own in
    RPEG_FAULTS_DIR (created exclusively, so two processes never take the same one); always True without
    the folder."""
    folder = os.environ.get(DIR, "")
    if not folder:
        return True
    os.makedirs(folder, exist_ok=True)
    for i in range(limit):
        try:
            os.close(os.open(os.path.join(folder, f"{name}-{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            continue
    return False


def fired() -> int:
    """How many die, stop and soak faults have fired in this run (the files in RPEG_FAULTS_DIR)."""
    folder = os.environ.get(DIR, "")
    return len(os.listdir(folder)) if folder and os.path.isdir(folder) else 0


def point(name: str) -> None:
    """A worker starts a call at fault point `name`: die or stop here if RPEG_FAULTS says so."""
    if not os.environ.get(ENV):
        return
    _calls[name] += 1
    for kind, sig in (("die", signal.SIGKILL), ("stop", signal.SIGSTOP)):
        arg = armed(kind)
        if arg is None:
            continue
        where, _, n = arg.partition(":")
        if where == name and _calls[name] == int(n or 1) and _fire_once(f"{kind}-{name}"):
            os.kill(os.getpid(), sig)
    soak = armed("soak")
    if soak is not None:
        count, _, chance = soak.partition(":")
        if _rng.random() < float(chance or 0.05) and _fire_once("soak", int(count)):
            os.kill(os.getpid(), signal.SIGKILL if _rng.random() < 0.5 else signal.SIGSTOP)


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
