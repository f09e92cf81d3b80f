"""run(plan, job): train for real, as the plan says, on a Ray cluster.

A private local Ray cluster starts by itself (its own temp dir, no dashboard) unless the runtime
config or RAY_ADDRESS names one. Workers are placed per the plan (`roles.Roles`): a colocated plan
runs generation, reference and training in one worker process (the engine samples with the
trainer's model); a disaggregated plan runs `dp` generation engines and an FSDP2 training group of
`dp` ranks, whose rank 0 broadcasts new weights to the engines over a process group of its own
(`runtime.weights`). The loop below sees neither: it
calls each role's uniform operations and names stages only as the graph does (`step_stages`);
one step's tasks (generation parts, scoring, inference, advantages, updates) are `step.Steps`'.
Bounded asynchrony: generation for step s + j is launched as soon as it may run on the current
weights (j <= k); every sample records the weight version it came from.

Outputs under `out/`: metrics.jsonl (a line per step), reward.png, timeline.json (Chrome trace,
the simulator's format; with episodes, a lane per episode and engine) and gantt.png (episodes.png with
episodes), checkpoints/ (atomic; `resume=True` continues exactly; each
holds the policy as a Hugging Face folder, `model/`), and model/: the trained policy at the end, a
folder `from_pretrained` and vLLM load as it is (rpeg.runtime.hf.save_policy).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch

from rpeg.errors import RpegError
from rpeg.graph import Graph
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.hf import copy_folder, save_policy
from rpeg.runtime.models import prompt_ids
from rpeg.runtime.outputs import ProgressBar, append_jsonl, load_latest, save_atomic, write_jsonl, write_outputs
from rpeg.runtime.plan_check import check_plan
from rpeg.runtime.roles import Roles, step_stages
from rpeg.runtime.rollout import SamplingParams
from rpeg.runtime.sft import prepare_model
from rpeg.runtime.step import Launched, Rollout, Steps
from rpeg.runtime.trackers import Trackers
from rpeg.sim.timeline import Record, Timeline


@dataclass
class RunResult:
    metrics: list[dict]
    timeline: Timeline
    accuracy_before: dict[str, float]  # held-out accuracy: {"sampled": ..., "greedy": ...}
    accuracy_after: dict[str, float]
    out: str
    files: list[str] = field(default_factory=list)
    warmup: dict = field(default_factory=dict)  # what the supervised warm-up did (sft.WarmupResult.as_dict)
    recoveries: list[dict] = field(default_factory=list)  # each restart after a worker's fault (recoveries.jsonl)


class _Ray:
    """A Ray session: the user's cluster, or a private local one we start and stop."""

    def __init__(self, address: str, devices: int = 1):
        import ray

        self.ray = ray
        self.tmp = None
        if ray.is_initialized():
            self.owned = False
            return
        address = address or os.environ.get("RAY_ADDRESS", "")
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            self.tmp = tempfile.mkdtemp(prefix="rpeg-ray-")
            # one CPU bundle per plan device (roles.Placement): a plan may have more devices than cores,
            # which then share them, as the cpu-local calibration measured (`rpeg calibrate --devices D`)
            # address="local": always a new cluster, never one another process on this machine just started
            # (two test processes starting Ray at once: one joined the other's and failed on num_cpus)
            ray.init(address="local", num_cpus=max(os.cpu_count() or 2, devices), include_dashboard=False,
                     _temp_dir=self.tmp, log_to_driver=False, configure_logging=False)
        self.owned = True

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


def run(graph: Graph, rt: RuntimeConfig, *, resume: bool = False, progress: bool = True,
        cluster=None) -> RunResult:
    """`cluster`: the job's cluster (rpeg.hardware), if known: the summary then sets the model's
    predicted step time and peak memory per stage beside the measured ones."""
    check_plan(graph)
    if rt.device == "cuda" and not torch.cuda.is_available():
        raise RpegError("runtime.device is cuda, but torch sees no CUDA device on this machine (device: cpu runs "
                        "on the CPU)")
    names = step_stages(graph)
    if graph.stage(names.reward).model is not None and not rt.reward_model_path:
        _reward_path(rt)  # the one-line error, before anything starts
    if rt.engine == "vllm" and graph.stage(names.generate).layout.tp > 1:
        raise RpegError(f"the plan generates with {graph.stage(names.generate).layout.describe()}: tensor-parallel "
                        "generation runs in the hf engine; the vllm engine runs one device per engine here")
    if rt.engine == "vllm":
        from rpeg.runtime.vllm_engine import require

        require()
    task = task_of(rt)
    if rt.environment is not None:
        check_episodes(graph, rt, task, names)
    os.makedirs(rt.out, exist_ok=True)
    ckpt_dir = os.path.join(rt.out, "checkpoints")
    state = load_latest(ckpt_dir) if resume else None
    if resume and state is None:
        raise RpegError(f"--resume: no checkpoint under {ckpt_dir}")
    # metrics.jsonl holds exactly the steps the run will continue from: none for a new run, the
    # checkpoint's on resume (steps logged after the last checkpoint are run again, not kept twice)
    write_jsonl(os.path.join(rt.out, "metrics.jsonl"), state["metrics"] if state else [])
    t0 = time.time()
    model_path, tok, warmup = prepare_model(rt, task, rt.out, resume, progress)
    pred = _prediction(graph, cluster)
    trackers = Trackers(rt.loggers, rt.out, os.path.basename(os.path.normpath(rt.out)),
                        run_config(graph, rt, cluster, pred) if rt.loggers else {}, resume)
    try:
        session = _Ray(rt.address, devices=max((g.first + g.count for g in graph.groups), default=1))
    except BaseException:
        trackers.close("FAILED")
        raise
    runner, status = None, "FAILED"
    try:
        runner = _Runner(graph, rt, task, tok, model_path, session.ray, trackers)
        runner.waits.bound_s = _wait_bound(graph, rt, pred)
        result = runner.loop(state, progress, {"warmup": warmup, "started": t0, "prediction": pred})
        status = "FINISHED"
        return result
    finally:
        trackers.close(status)
        if runner is not None and runner.roles is not None:
            runner.roles.close()
        session.close()


def _prediction(graph: Graph, cluster):
    """The model's prediction for the plan on the job's cluster (perf.step.predict_step), once a run; None
    without a cluster or where the model cannot price the plan."""
    if cluster is None:
        return None
    from rpeg.perf.step import predict_step

    try:
        return predict_step(graph, cluster)
    except RpegError:
        return None


def _wait_bound(graph: Graph, rt: RuntimeConfig, pred) -> float:
    """The longest a wait on the workers may take beyond its floor (runtime/waits.py): the factor x the
    predicted step time x (k + 1); 0 (the floor alone) without a prediction."""
    step_s = pred.step_s if pred is not None and pred.fits and pred.step_s < float("inf") else 0.0
    return rt.wait_timeout_factor * (graph.async_bound + 1) * step_s


def run_config(graph: Graph, rt: RuntimeConfig, cluster, pred=None) -> dict:
    """What the trackers log as the run's config: the job, its plan (as passes), the prediction (`pred`,
    the model's for the plan on `cluster`)."""
    from rpeg.graph.serde import to_data
    from rpeg.interop.common import config_overrides, passes_of, view_of

    out = {"algorithm": graph.algorithm, "job": to_data(graph.job), "config": dict(config_overrides(graph)),
           "plan": passes_of(view_of(graph, actor=graph.model("actor").spec.name)),
           "runtime": to_data(rt)}
    if cluster is not None and pred is not None:
        out["prediction"] = {"cluster": cluster.name, "gpus": cluster.gpus,
                             "step_s": pred.step_s if pred.fits else None, "bottleneck": pred.bottleneck}
    return out


class _Runner:
    def __init__(self, graph: Graph, rt: RuntimeConfig, task, tok, model_path: str, ray, trackers: Trackers):
        from rpeg.runtime.waits import BoundedRay

        self.g, self.rt, self.task, self.tok = graph, rt, task, tok
        self.trackers = trackers
        self.job = graph.job
        self.names = step_stages(graph)
        self.k = graph.async_bound
        # every wait on the workers, bounded (runtime.waits)
        self.waits = BoundedRay(ray, 0.0, rt.wait_timeout_s, rt.startup_timeout_s)
        self.model_path = model_path  # the folder the run started from: its config and tokenizer
        self.reward_path = _reward_path(rt) if graph.stage(self.names.reward).model is not None else ""
        self.roles: Roles | None = None
        self._start_workers(attempt=0)
        self._restarting: tuple[dict, float] | None = None  # a restart under way: its row, when the fault came
        self.groups = {s.name: graph.group(s.group) for s in graph.stages if s.group}
        self.t0 = time.time()
        self.records: list[Record] = []
        self.details: list[Record] = []  # inside generation: episodes' turns and tool calls, engine calls
        self.recoveries: list[dict] = []  # each restart of the workers: the fault, the step, what it cost
        self._recovery_records: list[Record] = []  # the same in the timeline: a lane of its own
        self.checkpointed = -1  # the step of the last checkpoint this run wrote
        self.logged = 0  # the last step whose metrics the trackers have (a step run again is not logged twice)
        self.step = 0  # the step under way (what a fault interrupted)

    def _start_workers(self, attempt: int) -> None:
        """The plan's workers (Roles) and the step's tasks on them; `attempt` > 0: a restart's."""
        self.waits.starting, self.waits.where = True, "starting the workers"
        self.roles = Roles.build(self.g, self.rt, self.model_path, self.waits, self.reward_path, names=self.names,
                                 attempt=attempt)
        self.steps = Steps(self.g, self.rt, self.task, self.tok, self.roles, self.names, self._record, self._episodes)

    # ---- helpers -----------------------------------------------------------------------------------
    def _record(self, stage: str, step: int, span, group_of: str | None = None, microbatch: int = 0) -> None:
        """A measured record of `stage`, on the devices of `group_of` (default: its own)."""
        self.records.append(Record(unit=stage, kind=self.g.stage(stage).kind.value, step=step, microbatch=microbatch,
                                   start=span[0] - self.t0, end=span[1] - self.t0,
                                   peak_memory_bytes=span[2] if len(span) > 2 else 0.0,
                                   **self._where(group_of or stage)))

    def _where(self, stage: str) -> dict:
        """The device group a stage's records sit on ("host" for host-side stages), and its devices."""
        grp = self.groups.get(stage)
        return {"group": grp.name if grp else "host", "devices": (grp.first, grp.count) if grp else (0, 0)}

    def _episodes(self, stage: str, step: int, part: int, first: int, res) -> None:
        """A generated part's episodes in the timeline's details: a lane per episode (its turns, from the
        request to the reply, and its tool calls) and per engine (its calls, with the turns each batched;
        under partial rollout, the segment calls that were the step's turn, with the sequences of every
        step in flight that each batched)."""
        where = self._where(stage) | {"step": step, "microbatch": part}
        what = "turns" if res.events is not None else "sequences"
        for i, events in enumerate(res.events or ()):
            turn = 0
            for kind, start, end in events:
                turn += kind == "generate"
                kind = "turn" if kind == "generate" else kind  # tool | environment as they are
                self.details.append(Record(unit=f"{stage} · episode {first + i}", kind=kind, start=start - self.t0,
                                           end=end - self.t0, label=f"{kind} {turn} s{step}", **where))
        for engine, start, end, turns, longest in res.engine_calls or ():
            self.details.append(Record(unit=f"{stage} · engine {engine}", kind="engine", start=start - self.t0,
                                       end=end - self.t0, label=f"{turns} {what}, {longest} tokens s{step}", **where))

    def _sync(self, version: int, step: int) -> None:
        self._record(self.names.sync, step, self.roles.push_weights(version), self.names.generate)

    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy of the policy: sampled as in training (what RL optimizes: the expected
        reward of one sample on unseen problems) and greedy."""
        waits = self.roles.ray
        where, waits.where = waits.where, "held-out evaluation"
        waits.scale = max(1.0, self.rt.eval_size / max(1, self.job.sequences))  # more problems than a step's
        try:
            return self._evaluate()
        finally:
            waits.where, waits.scale = where, 1.0

    def _evaluate(self) -> dict[str, float]:
        problems = self.task.problems("test", self.rt.eval_size, seed=self.rt.seed + 99)
        prompts = prompt_ids(self.tok, [p.prompt for p in problems], self.rt.chat)
        out = {}
        for name, params in (("sampled", SamplingParams(max_new_tokens=self.rt.max_new_tokens,
                                                        temperature=self.rt.temperature)),
                             ("greedy", SamplingParams(max_new_tokens=self.rt.max_new_tokens, greedy=True))):
            if self.steps.env is not None:  # episodes, with their tools: the share whose outcome is correct
                ep = self.roles.engines.one_episodes(problems, self.steps.env, params, self.rt.seed + 4242).episodes
                out[name] = sum(o >= 1.0 for o in ep.outcomes) / len(problems)
                out[f"{name}_tool_calls"] = sum(ep.tool_calls) / len(problems)
                continue
            resp = self.roles.engines.one(prompts, params, self.rt.seed + 4242).responses
            out[name] = self.task.accuracy(problems, self.tok.batch_decode(resp, skip_special_tokens=True))
        return out

    # ---- the loop ------------------------------------------------------------------------------------
    def loop(self, state: dict | None, progress: bool, about: dict) -> RunResult:
        rt = self.rt
        # what a restart before the first checkpoint starts again from: the driver's generators as they were
        self.initial_rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        self.acc_before = state["accuracy_before"] if state else None
        self.logged = state["step"] if state else 0
        bar = ProgressBar(rt.steps, state["step"] if state else 0, progress)
        try:
            while True:
                try:
                    if self.roles is None:  # restarting: the workers, as at the start
                        self._start_workers(attempt=len(self.recoveries))
                    metrics, acc_after = self._attempt(state, bar)
                    break
                except Exception as err:  # noqa: BLE001 -- a worker's fault is recovered; anything else raises
                    if not is_fault(err):
                        raise
                    state = self._recover(err, bar)
        finally:
            bar.close()
        acc_before = self.acc_before
        if not metrics or "test_accuracy" not in metrics[-1]:  # else logged with the last step (the same policy)
            self.trackers.accuracy(rt.steps, acc_after)
        timeline = self._timeline(metrics)
        summary = {"seed": rt.seed, "threads": rt.threads or os.cpu_count(), "eval_size": rt.eval_size,
                   "task": rt.task, "torch": torch.__version__, "warmup": about["warmup"],
                   "wall_s": time.time() - about["started"], "device": rt.device}
        if self.recoveries:
            summary["recoveries"] = self.recoveries
        summary |= self._beside_prediction(timeline, about.get("prediction"))
        files = write_outputs(rt.out, metrics, timeline, acc_before, acc_after, summary) + [self.save_model()]
        return RunResult(metrics, timeline, acc_before, acc_after, rt.out, files, about["warmup"], self.recoveries)

    def _attempt(self, state: dict | None, bar: ProgressBar) -> tuple[list, dict]:
        """The run from `state` (a checkpoint's; None: from the start) on the workers as they are now: the
        steps' metrics and the held-out accuracy after the last. A worker's fault raises out of it."""
        rt = self.rt
        start, metrics, pending = 0, [], {}
        if state is not None:
            start, metrics = state["step"], list(state["metrics"])
            self._restore(state)
            for s, res in state.get("inflight", {}).items():
                done = Rollout.from_dict(res)
                pending[int(s)] = Launched(self.steps.problems(int(s)), done.prompts, done=done)
        if self._restarting is not None:  # the workers are back, with the weights they go on from
            self._restarted()
        if self.acc_before is None:
            self.acc_before = self.evaluate()
            self.trackers.accuracy(0, self.acc_before)
        for step in range(start, rt.steps):
            self.step = step
            t_step = time.time()
            self.waits.where, self.waits.starting = f"step {step + 1}", False
            for j in range(step, min(rt.steps, step + self.k + 1)):  # may run on version `step` (>= j - k)
                if j not in pending:
                    pending[j] = self.steps.launch(j)
            m = self._run_step(step, pending)
            self._sync_step(step, pending)
            m["step_s"] = time.time() - t_step
            if rt.eval_every and ((step + 1) % rt.eval_every == 0 or step + 1 == rt.steps):
                acc = self.evaluate()
                m["test_accuracy"], m["test_accuracy_greedy"] = acc["sampled"], acc["greedy"]
                if "sampled_tool_calls" in acc:
                    m["test_tool_calls"] = acc["sampled_tool_calls"]
            metrics.append(m)
            append_jsonl(os.path.join(rt.out, "metrics.jsonl"), m)
            if m["step"] > self.logged:  # a step run again after a restart was logged the first time
                self.trackers.log(m)
                self.logged = m["step"]
            if rt.checkpoint_every and ((step + 1) % rt.checkpoint_every == 0 or step + 1 == rt.steps):
                self.waits.where = f"step {step + 1}'s checkpoint"
                self._checkpoint(step + 1, metrics, pending, self.acc_before)
            bar.update(m)
        self.waits.where = "the last held-out evaluation"
        return metrics, self.evaluate()

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
        _log(f"rpeg: {what}; restarting engine(s) {', '.join(map(str, dead))} with the weights of version "
             f"{version} and making their calls again (restart {n} of at most {self.rt.max_restarts})")
        self.waits.where, self.waits.starting = f"step {step + 1}: restarting engine(s)", True
        span = self.roles.restart_engines(dead, attempt=n, version=version)
        if synced:
            self._record(self.names.sync, step, span, self.names.generate)
        again = sum(self.steps.resubmit(item, dead) for item in items)
        self.waits.where, self.waits.starting = f"step {step + 1}", False
        row = {"restart": n, "fault": what, "step": step + 1, "engines": dead, "calls_again": again,
               "from_step": step, "steps_lost": 0, "restart_s": 0.0}
        self.recoveries.append(row)
        self._restarting = (row, t)
        self._restarted()
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
        _log(f"rpeg: {what}; restarting the workers from "
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

    def _restarted(self) -> None:
        """A restart is done (its workers started, the state restored): its time in recoveries.jsonl and the
        timeline's recovery lane, from the fault to now."""
        row, t = self._restarting
        self._restarting = None
        row["restart_s"] = time.time() - t
        append_jsonl(os.path.join(self.rt.out, "recoveries.jsonl"), row)
        self._recovery_records.append(Record(unit="recovery", kind="recovery", step=self.step, microbatch=0,
                                             group="host", devices=(0, 0), start=t - self.t0,
                                             end=time.time() - self.t0,
                                             label=f"restart {row['restart']}: {row['fault']}"))

    # ---- checkpoints -------------------------------------------------------------------------------------
    def _checkpoint(self, step: int, metrics: list, pending: dict, acc_before: float) -> None:
        inflight = {}
        for s, item in pending.items():  # generations already running on older weights: keep their results
            if item.done is None:
                item.done = self.steps.collect(item)
            inflight[s] = item.done.as_dict()
        state = {"step": step, "metrics": metrics, "inflight": inflight, "accuracy_before": acc_before,
                 **self.roles.states(),
                 "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
                 # the measured timeline so far, on the run's own clock: a resumed run's timeline
                 # continues it (with the gap while it was down) instead of starting over
                 "timeline": {"t0": self.t0, "records": [r for r in self.records if r.step < step],
                              "recoveries": list(self._recovery_records),
                              "details": [r for r in self.details if r.step < step]}}
        save_atomic(os.path.join(self.rt.out, "checkpoints"), step, state, self.rt.keep_checkpoints,
                    extra=lambda tmp: save_policy(state["actor"]["model"], self.model_path, os.path.join(tmp, "model")))
        self.checkpointed = step

    def save_model(self) -> str:
        """The policy as it ends the run, as a Hugging Face folder: `out`/model (a copy of the last
        checkpoint's when this run wrote one of the last step; else gathered from the trainer now)."""
        out = os.path.join(self.rt.out, "model")
        if self.checkpointed == self.rt.steps:
            return copy_folder(os.path.join(self.rt.out, "checkpoints", f"step-{self.rt.steps:06d}", "model"), out)
        return save_policy(self.roles.states()["actor"]["model"], self.model_path, out)

    def _restore(self, state: dict) -> None:
        if "timeline" in state:
            self.t0, self.records = state["timeline"]["t0"], list(state["timeline"]["records"])
            self.details = list(state["timeline"].get("details", ()))
            # a resumed run takes the restarts recorded before; a restart inside the run knows them all already
            self._recovery_records = self._recovery_records or list(state["timeline"].get("recoveries", ()))
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        self.roles.restore(state)
        self.roles.push_weights(state["step"])

    def _beside_prediction(self, timeline: Timeline, pred) -> dict:
        """The model's step time and peak memory per stage for this plan on the job's cluster, beside the
        measured ones (peak memory is measured on GPUs only: torch.cuda.max_memory_allocated per part)."""
        peaks: dict[str, float] = {}
        for r in timeline.records:
            peaks[r.unit] = max(peaks.get(r.unit, 0.0), r.peak_memory_bytes)
        out: dict = {}
        if pred is not None:  # the model's, for this plan on the job's cluster (run's _prediction)
            out["predicted_step_s"] = pred.step_s
        memory = {}
        for stage, peak in peaks.items():
            row = {"measured_gb": peak / 1e9} if peak > 0 else {}
            if pred is not None and stage in pred.stages and pred.stages[stage].peak_memory_bytes > 0:
                row["predicted_gb"] = pred.stages[stage].peak_memory_bytes / 1e9
            if row:
                memory[stage] = row
        if memory:
            out["peak_memory"] = memory
        return out

    def _timeline(self, metrics: list) -> Timeline:
        steps = max((r.step for r in self.records), default=0) + 1
        ends = [max((r.end for r in self.records if r.step == s), default=0.0) for s in range(steps)]
        step_s = sum(m["step_s"] for m in metrics) / len(metrics) if metrics else 0.0
        records = self.records + self._recovery_records
        return Timeline(records=tuple(sorted(records, key=lambda r: r.start)), steps=steps, step_s=step_s,
                        step_ends=tuple(ends), tokens_per_step=0.0, sequences_per_step=self.job.sequences,
                        max_staleness=max((m["staleness_max"] for m in metrics), default=0), source="measured",
                        details=tuple(sorted(self.details, key=lambda r: r.start)))


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


def _log(line: str) -> None:
    """A line on stderr that does not break the progress bar."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


def check_episodes(graph: Graph, rt: RuntimeConfig, task, names) -> None:
    """Refuse, in one line, what the runtime does not yet run with multi-turn episodes."""
    gen = graph.stage(names.generate)
    why = ("the plan has ReMax's greedy baseline" if names.greedy else
           "the plan scores with a reward model" if graph.stage(names.reward).model is not None else
           f"the plan generates with {gen.layout.describe()} (a tensor-parallel engine)" if gen.layout.tp > 1 else
           "the vllm engine is asked for" if rt.engine == "vllm" else "")
    if why:
        raise RpegError(f"runtime.environment runs multi-turn episodes on whole hf engines, with the environment's "
                        f"reward; {why}: plan without it, or leave out runtime.environment")
    rt.env_spec(task).factory()  # the environment refuses a task or option value here, once


def task_of(rt: RuntimeConfig):
    """The job's task: runtime.task, a name or a mapping of the name and its options."""
    from rpeg.tasks import get_task

    return get_task(**rt.task) if isinstance(rt.task, dict) else get_task(rt.task)


def check_reward_path(rt: RuntimeConfig) -> None:
    """A plan that scores with a reward model needs runtime.reward_model_path: one line if it is not set."""
    if not rt.reward_model_path:
        raise RpegError("the plan scores with a reward model: set runtime.reward_model_path to a local Hugging Face "
                        "sequence-classification folder (or `tiny` for a tiny random one)")


def _reward_path(rt: RuntimeConfig) -> str:
    """The reward model's folder: the job's, or the tiny one built under the run's folder."""
    check_reward_path(rt)
    if rt.reward_model_path == "tiny":
        from rpeg.runtime.models import build_tiny_reward

        return build_tiny_reward(os.path.join(rt.out, "tiny-reward"), seed=rt.seed)
    return rt.reward_model_path


__all__ = ["RunResult", "run"]
