"""Recovery inside the run: a worker that dies (its process killed, its node lost), fails (an exception in
its code) or stops answering (runtime.waits.WorkerTimeout) is named on stderr and in recoveries.jsonl, and
the run goes on by itself.

- An engine of a split plan that dies before the step's update starts is restarted alone
  (Roles.restart_engines): the weight-sync group forms again with it, every engine gets the current
  weights, and its calls of every launched step are made again (Steps.resubmit). An engine that dies
  while a later step generates is seen at the weight sync, where the others are left inside the failed
  broadcast: every engine is restarted with the new weights.
- Anything else restarts every worker (Roles.kill, then the driver's loop starts them again) and goes on
  from the last checkpoint as --resume would, or from the start without one.

`runtime.max_restarts` bounds the restarts; past it the run stops with one line and its last checkpoint.
`Recovering` is the driver's (runtime.run._Runner) part that does it.
"""

from __future__ import annotations

import os
import random
import re
import sys
import time

import torch

from rpeg.errors import RpegError
from rpeg.runtime.outputs import ProgressBar, append_jsonl, load_latest, write_jsonl
from rpeg.sim.timeline import Record


class Recovering:
    """The recovery of runtime.run's driver; it reads the driver's roles, steps, waits, records and run
    config, and keeps `recoveries` (a row per restart) and `_recovery_records` (the timeline's lane)."""

    def _run_step(self, step: int, pending: dict) -> dict:
        """Step `step` on its launched generation (popped from `pending`): its metrics. An engine that dies
        before the step's update starts (a split plan's) is restarted on its own and its calls made again
        (`_engines_back`); the step then runs again from its first part, its records so far dropped."""
        item = pending.pop(step)
        marks = len(self.records), len(self.details)
        while True:
            try:
                m = self.steps.run(step, item)
                self.steps.forget(item)
                return m
            except Exception as err:  # noqa: BLE001 -- an engine's death is mended here; anything else raises
                if not self._engines_back(err, step, [item, *pending.values()]):
                    raise
                del self.records[marks[0]:], self.details[marks[1]:]

    def _sync_step(self, step: int, pending: dict) -> None:
        """The weight sync that ends step `step`. An engine that died meanwhile (under bounded asynchrony,
        while it generated a later step) leaves the other engines inside the failed broadcast: every engine
        is restarted and given the new weights, and the later steps' calls are made again (`_engines_back`)."""
        try:
            self._sync(step + 1, step)
        except Exception as err:  # noqa: BLE001 -- an engine's death is mended here; anything else raises
            if not self._engines_back(err, step, list(pending.values()), synced=True):
                raise

    def _engines_back(self, err: BaseException, step: int, items: list, synced: bool = False) -> bool:
        """After a fault in step `step` (`synced`: in its closing weight sync): if engines of a split plan
        died, and the trained weights have not moved this step (or the step's update is done: `synced`),
        restart just the engines (Roles.restart_engines: the dead ones; after a failed sync, every one), push
        them the current weights (version `step`, or `step` + 1 after the update), make their calls of every
        launched step in `items` again, and say True. The trainers and what they hold stay. Else False: the
        whole run's recovery takes over."""
        import ray

        if self.roles.colocated or (self.steps.updating and not synced) or not is_fault(err):
            return False
        if len(self.recoveries) >= self.rt.max_restarts:
            return False  # the run's recovery says so, in one line
        died = self.roles.engines.dead()
        if not died:
            return False
        dead = list(range(len(self.roles.engines.ranks))) if synced else died
        version = step + 1 if synced else step
        t, n = time.time(), len(self.recoveries) + 1
        what = f"{self.waits.where}: {describe_fault(err, self.roles.labels)}"
        if not isinstance(err, ray.exceptions.RayActorError):  # another worker's error said it: name the dead
            who = ", ".join(self.roles.labels.get(w._actor_id.hex(), f"engine {j}")
                            for j in died for w in self.roles.engines.ranks[j])
            what = f"{self.waits.where}: {who} died, and {describe_fault(err, self.roles.labels)}"
        log_line(f"rpeg: {what}; restarting engine(s) {', '.join(map(str, dead))} with the weights of version "
                 f"{version} and making their calls again (restart {n} of at most {self.rt.max_restarts})")
        self.waits.where, self.waits.starting = f"step {step + 1}: restarting engine(s)", True
        span = self.roles.restart_engines(dead, attempt=n, version=version)
        if synced:
            self._record(self.names.sync, step, span, self.names.generate)
        again = sum(self.steps.resubmit(item, dead) for item in items)
        self.waits.where = f"step {step + 1}"  # still `starting` until the step ends: the new engines' first calls
        row = {"restart": n, "fault": what, "step": step + 1, "engines": dead, "calls_again": again,
               "from_step": step, "steps_lost": 0, "restart_s": 0.0}
        self.recoveries.append(row)
        self._restarted(row, t)
        return True

    def _recover(self, err: BaseException, bar: ProgressBar) -> dict | None:
        """After a worker's fault: every worker killed (the loop starts them again) and the state to go on
        from (the last checkpoint's; None: the start). Logged on stderr and in recoveries.jsonl; past
        runtime.max_restarts, an RpegError naming the fault instead."""
        rt, t = self.rt, time.time()
        what = f"{self.waits.where}: {describe_fault(err, self.roles.labels if self.roles else {})}"
        state = load_latest(os.path.join(rt.out, "checkpoints"))
        stands = (f"its last checkpoint (step {state['step']}) stands for --resume" if state is not None else
                  "it wrote no checkpoint yet (runtime.checkpoint_every)")
        if len(self.recoveries) >= rt.max_restarts:
            raise RpegError(f"{what}; the run restarted its workers {len(self.recoveries)} time(s), "
                            f"runtime.max_restarts: the run stops here, and {stands}") from None
        n, frm = len(self.recoveries) + 1, state["step"] if state is not None else 0
        log_line(f"rpeg: {what}; restarting the workers from "
                 f"{f'the checkpoint of step {frm}' if state is not None else 'the start'} "
                 f"(restart {n} of at most {rt.max_restarts})")
        self.waits.where = "restarting the workers"
        if self.roles is not None:
            self.roles.kill()
        self.roles = None
        if state is None:  # the start again: the driver's generators as they were, nothing measured yet
            torch.set_rng_state(self.initial_rng["torch"])
            random.setstate(self.initial_rng["python"])
            self.records, self.details = [], []
        # metrics.jsonl holds exactly the steps the run goes on from (as --resume leaves it)
        write_jsonl(os.path.join(rt.out, "metrics.jsonl"), state["metrics"] if state else [])
        bar.back_to(frm)
        # the steps done since the checkpoint, run again (a fault in the last evaluation: none past the last)
        row = {"restart": n, "fault": what, "step": self.step + 1, "from_step": frm,
               "steps_lost": max(0, self.step - frm), "restart_s": 0.0}
        self.recoveries.append(row)
        self._restarting = (row, t)
        return state

    def _restarted(self, row: dict, t: float) -> None:
        """Restart `row` (the fault seen at `t`) is done, its workers started and the state restored: its time
        in recoveries.jsonl and the timeline's recovery lane, from the fault to now."""
        row["restart_s"] = time.time() - t
        append_jsonl(os.path.join(self.rt.out, "recoveries.jsonl"), row)
        self._recovery_records.append(Record(unit="recovery", kind="recovery", step=self.step, microbatch=0,
                                             group="host", devices=(0, 0), start=t - self.t0,
                                             end=time.time() - self.t0,
                                             label=f"restart {row['restart']}: {row['fault']}"))


def is_fault(err: BaseException) -> bool:
    """Whether `err` is a worker's fault the run recovers from: a worker that died (its process killed, its
    node lost), failed (an exception in its code) or stopped answering (runtime.waits.WorkerTimeout). A
    worker's RpegError (a weight sync that verified wrong, a plan's contract broken) is not: it stops the run."""
    from rpeg.runtime.waits import WorkerTimeout

    if isinstance(err, WorkerTimeout):
        return True
    if isinstance(err, RpegError):
        return False
    try:
        import ray
    except ImportError:
        return False
    return isinstance(err, ray.exceptions.RayError)


def describe_fault(err: BaseException, labels: dict) -> str:
    """One line: which worker (by `labels`, actor id -> what it is) did what."""
    import ray

    from rpeg.runtime.waits import WorkerTimeout

    if isinstance(err, WorkerTimeout):
        return err.detail
    if isinstance(err, ray.exceptions.RayActorError):
        who = labels.get(err.actor_id or "", "a worker")
        return f"{who} died ({type(err).__name__}: its process exited or was killed)"
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip()
    lines = text.splitlines() or [type(err).__name__]
    # a worker's exception: "ray::Class.method() (pid=..., ip=..., actor_id=..., repr=...)", its traceback, the error
    call = re.match(r"ray::(\S+?)\(\)\s*\(pid=(\d+).*?actor_id=([0-9a-f]+)", lines[0])
    if call is not None:
        who = labels.get(call.group(3), f"process {call.group(2)}")
        return f"{call.group(1)} failed on {who} ({lines[-1][:200]})"
    return f"a worker failed ({type(err).__name__}: {lines[0][:300]})"


def log_line(line: str) -> None:
    """A line on stderr that does not break the progress bar."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)
