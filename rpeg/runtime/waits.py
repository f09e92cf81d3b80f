"""Every wait of the driver on its workers is bounded: a worker that stops answering (a hung collective,
a process stopped or wedged) ends the run with one line naming what was awaited, where and which ranks,
instead of a run that waits for ever with Ray reporting every actor healthy.

The bound is `runtime.wait_timeout_factor` x the plan's predicted step time x (k + 1) (a generation may
be awaited up to k steps after it was launched), and at least `runtime.wait_timeout_s`; held-out
evaluation scales it by its problems over a step's. Until the first step ends (workers starting, models
loading, the first evaluation, every first call's warm-up: what no prediction states), and again from a
restart until the next step ends, a wait takes at least `runtime.startup_timeout_s` (600 s), whatever the
floor. Without a prediction (a cluster not calibrated) the floor alone.

A wait also ends as soon as one of the awaited workers has died or failed (it polls, POLL_S at a time,
and takes each result as it arrives), not when the slowest of the others would have answered: the
FSDP ranks of a dead rank's group block in their collective until their own timeout of minutes.
Either way the driver's recovery (runtime.run) takes over: a timeout is a `WorkerTimeout`.
"""

from __future__ import annotations

import time

from rpeg.errors import RpegError

STARTING = "starting the workers"
POLL_S = 1.0  # how often a wait looks for a worker that died while the others still work


class WorkerTimeout(RpegError):
    """A wait on the workers that outlasted its bound: the message names where, what and which ranks;
    `detail` is the message after where."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail or message


class BoundedRay:
    """The ray module as the roles use it, with `get` bounded (everything else passes through)."""

    def __init__(self, ray, bound_s: float, floor_s: float, startup_s: float = 600.0):
        self._ray = ray
        self.bound_s, self.floor_s, self.startup_s = bound_s, floor_s, startup_s
        self.where = STARTING  # what the driver is doing: the step, evaluation, a checkpoint
        self.starting = True  # until the first step ends (the first evaluation included): at least startup_s
        self.scale = 1.0  # the bound's multiple for the work under way (held-out evaluation's size)

    def __getattr__(self, name: str):
        if name.startswith("_"):  # not found on the object itself (while unpickling, say): never the module's
            raise AttributeError(name)
        return getattr(self._ray, name)

    def get(self, refs, timeout: float | None = None, what: str = "a worker's result"):
        if timeout is not None:  # a caller with a bound of its own
            return self._ray.get(refs, timeout=timeout)
        bound = max(self.floor_s, self.bound_s * self.scale, self.startup_s if self.starting else 0.0)
        flat = list(refs) if isinstance(refs, (list, tuple)) else [refs]
        got: dict = {}
        todo = list(dict.fromkeys(flat))
        deadline = time.monotonic() + bound
        while todo:
            left = deadline - time.monotonic()
            if left <= 0:
                late = [i for i, r in enumerate(flat) if r not in got]
                detail = (f"{what} gave no answer within {bound:.0f} s (still waiting on {len(late)} of {len(flat)}: "
                          f"rank(s) {', '.join(map(str, late))}); the bound is runtime.wait_timeout_factor x the "
                          "predicted step time, at least runtime.wait_timeout_s")
                raise WorkerTimeout(f"{self.where}: {detail}", detail) from None
            ready, todo = self._ray.wait(todo, num_returns=len(todo), timeout=min(left, POLL_S))
            # a dead or failed worker's result raises here, while the others may still be running
            got.update(zip(ready, self._ray.get(ready)))
        values = [got[r] for r in flat]
        return values if isinstance(refs, (list, tuple)) else values[0]
