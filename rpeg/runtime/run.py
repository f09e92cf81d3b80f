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
folder `from_pretrained` and vLLM load as it is (rpeg.runtime.hf.save_policy; with LoRA, the merged
weights, and peft's adapter folder in model/adapter/).
"""

from __future__ import annotations

import os
import random
import shutil
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
from rpeg.runtime.recovery import Recovering, is_fault
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


class _Runner(Recovering):
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
            self._restarted(*self._restarting)
            self._restarting = None
        if self.acc_before is None:
            self.acc_before = self.evaluate()
            self.trackers.accuracy(0, self.acc_before)
        for step in range(start, rt.steps):
            self.step = step
            t_step = time.time()
            self.waits.where = f"step {step + 1}"  # `starting` until a step ends (the first, the first after a restart)
            for j in range(step, min(rt.steps, step + self.k + 1)):  # may run on version `step` (>= j - k)
                if j not in pending:
                    pending[j] = self.steps.launch(j)
            m = self._run_step(step, pending)
            self._sync_step(step, pending)
            self.waits.starting = False  # a step has run on these workers: every first call is behind them
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
                    extra=lambda tmp: save_policy(state["actor"]["model"], self.model_path, os.path.join(tmp, "model"),
                                                  self.g.model("actor").lora))
        self.checkpointed = step

    def save_model(self) -> str:
        """The policy as it ends the run, as a Hugging Face folder: `out`/model (a copy of the last
        checkpoint's when this run wrote one of the last step; else gathered from the trainer now)."""
        out = os.path.join(self.rt.out, "model")
        if self.checkpointed == self.rt.steps:
            return copy_folder(os.path.join(self.rt.out, "checkpoints", f"step-{self.rt.steps:06d}", "model"), out)
        return save_policy(self.roles.states()["actor"]["model"], self.model_path, out, self.g.model("actor").lora)

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
