"""Every wait of the driver on its workers is bounded: a worker that stops answering (a hung collective,
a process stopped or wedged) ends the run with one line naming what was awaited, where and which ranks,
instead of a run that waits for ever with Ray reporting every actor healthy.

The bound is `runtime.wait_timeout_factor` x the plan's predicted step time x (k + 1) (a generation may
be awaited up to k steps after it was launched), and at least `runtime.wait_timeout_s`; held-out
evaluation scales it by its problems over a step's. Before the first step (workers starting, models
loading, the first evaluation's first generation: what no prediction states) a wait takes at least
STARTUP_S, whatever the floor. Without a
prediction (a cluster not calibrated) the floor alone. The run stops there, and its last checkpoint
stands for `--resume`.
"""

from __future__ import annotations

from rpeg.errors import RpegError

STARTING = "starting the workers"
# the least a wait takes before the first step (workers starting, models loading), whatever the floor
STARTUP_S = 600.0


class BoundedRay:
    """The ray module as the roles use it, with `get` bounded (everything else passes through)."""

    def __init__(self, ray, bound_s: float, floor_s: float):
        self._ray = ray
        self.bound_s, self.floor_s = bound_s, floor_s
        self.where = STARTING  # what the driver is doing: the step, evaluation, a checkpoint
        self.starting = True  # before the first step (the first evaluation included): at least STARTUP_S
        self.scale = 1.0  # the bound's multiple for the work under way (held-out evaluation's size)

    def __getattr__(self, name: str):
        if name.startswith("_"):  # not found on the object itself (while unpickling, say): never the module's
            raise AttributeError(name)
        return getattr(self._ray, name)

    def get(self, refs, timeout: float | None = None, what: str = "a worker's result"):
        if timeout is not None:  # a caller with a bound of its own
            return self._ray.get(refs, timeout=timeout)
        bound = max(self.floor_s, self.bound_s * self.scale, STARTUP_S if self.starting else 0.0)
        try:
            return self._ray.get(refs, timeout=bound)
        except self._ray.exceptions.GetTimeoutError:
            flat = list(refs) if isinstance(refs, (list, tuple)) else [refs]
            _, pending = self._ray.wait(flat, num_returns=len(flat), timeout=0)
            late = [i for i, r in enumerate(flat) if r in pending]
            raise RpegError(f"{self.where}: {what} gave no answer within {bound:.0f} s (still waiting on "
                            f"{len(late)} of {len(flat)}: rank(s) {', '.join(map(str, late))}); the bound is "
                            "runtime.wait_timeout_factor x the predicted step time, at least runtime.wait_timeout_s. "
                            "The run stops here; its last checkpoint stands for --resume") from None
