"""run(plan, job): train for real, as the plan says, on a Ray cluster.

A private local Ray cluster starts by itself (its own temp dir, no dashboard) unless the runtime
config or RAY_ADDRESS names one. Workers are placed per the plan (`roles.Roles`): a colocated plan
runs generation, reference and training in one worker process (the engine samples with the
trainer's model); a disaggregated plan runs `dp` generation engines and an FSDP2 training group of
`dp` ranks, and ships new weights through the Ray object store. The loop below sees neither: it
calls each role's uniform operations and names stages only as the graph does (`step_stages`).
Bounded asynchrony: generation for step s + j is launched as soon as it may run on the current
weights (j <= k); every sample records the weight version it came from.

Outputs under `out/`: metrics.jsonl (a line per step), reward.png, timeline.json (Chrome trace,
the simulator's format) and gantt.png, checkpoints/ (atomic; `resume=True` continues exactly).
"""

from __future__ import annotations

import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field

import torch

from rpeg.errors import RpegError
from rpeg.graph import Graph
from rpeg.runtime import algos, filters
from rpeg.runtime.batch import Batch, build_batch
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.outputs import ProgressBar, append_jsonl, load_latest, save_atomic, write_jsonl, write_outputs
from rpeg.runtime.plan_check import check_plan
from rpeg.runtime.roles import Roles, joined, step_stages
from rpeg.runtime.rollout import SamplingParams
from rpeg.runtime.sft import prepare_model
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
            ray.init(num_cpus=max(os.cpu_count() or 2, devices), include_dashboard=False, _temp_dir=self.tmp,
                     log_to_driver=False, configure_logging=False)
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
    from rpeg.tasks import get_task

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
    task = get_task(**rt.task) if isinstance(rt.task, dict) else get_task(rt.task)
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
    session = _Ray(rt.address, devices=max((g.first + g.count for g in graph.groups), default=1))
    runner = None
    try:
        runner = _Runner(graph, rt, task, tok, model_path, session.ray)
        return runner.loop(state, progress, {"warmup": warmup, "started": t0, "cluster": cluster})
    finally:
        if runner is not None:
            runner.roles.close()
        session.close()


@dataclass
class Rollout:
    """A step's generation, joined over the engines: what scoring and training read."""

    prompts: list  # token ids per sample (the prompt repeated samples_per_prompt times)
    responses: list
    logprobs: list  # the engine's logprobs of the sampled tokens
    versions: list  # the weight version each sample was generated with
    span: tuple[float, float]
    greedy: list | None = None  # ReMax: one greedy response per prompt
    greedy_span: tuple[float, float] | None = None

    def as_dict(self) -> dict:  # the checkpoint's format for generations in flight
        out = {"prompts": self.prompts, "responses": self.responses, "logprobs": self.logprobs,
               "versions": self.versions, "span": self.span}
        if self.greedy is not None:
            out |= {"greedy": self.greedy, "greedy_span": self.greedy_span}
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Rollout:
        return cls(d["prompts"], d["responses"], d["logprobs"], d["versions"], tuple(d["span"]), d.get("greedy"),
                   d.get("greedy_span"))


@dataclass
class Launched:
    """A step's generation as launched: its problems and prompts, and the engines' futures (or the
    result, once collected or restored from a checkpoint)."""

    problems: list
    prompts: list
    futures: list = field(default_factory=list)
    greedy_futures: list | None = None
    done: Rollout | None = None


class _Runner:
    def __init__(self, graph: Graph, rt: RuntimeConfig, task, tok, model_path: str, ray):
        self.g, self.rt, self.task, self.tok, self.ray = graph, rt, task, tok, ray
        self.job = graph.job
        self.names = step_stages(graph)
        self.k = graph.async_bound
        self.fused = graph.fusion_group_of(self.names.actor_logprobs) is not None  # logprobs from the engine
        self.reward_model = graph.stage(self.names.reward).model is not None
        fused_with = graph.fusion_group_of(self.names.actor_update) or ()
        self.fused_updates = self.names.critic_update is not None and self.names.critic_update in fused_with
        # streaming: a step's prompt groups go through generation, scoring and inference in `chunks`
        # parts; advantages per part where the plan streams into them, updates per mini-batch where it
        # streams into training -- started early only when no pass on the trained weights is still to
        # come this step (the old logprobs and values must see the weights the samples came from)
        into = {s.consumer for s in graph.streams}
        self.chunks = max((s.microbatches for s in graph.streams), default=1)
        self.part_advantages = self.names.advantages in into
        self.part_updates = bool(into & {self.names.actor_update, self.names.critic_update})
        self.updates_early = self.fused and self.names.values is None and self.part_advantages
        self.roles = Roles.build(graph, rt, model_path, ray, _reward_path(rt) if self.reward_model else "",
                                 names=self.names)
        self.groups = {s.name: graph.group(s.group) for s in graph.stages if s.group}
        self.t0 = time.time()
        self.records: list[Record] = []

    # ---- helpers -----------------------------------------------------------------------------------
    def _problems(self, step: int):
        """The step's prompts: the job's, or more of them under DAPO's dynamic sampling (`oversample`)."""
        count = math.ceil(self.job.prompts * self.g.config.oversample - 1e-9)
        return self.task.problems("train", count, seed=self.rt.seed * 1_000_003 + step)

    def _launch(self, step: int) -> Launched:
        """Start a step's generation: its prompt groups in `chunks` parts (the plan's streamed
        micro-batches; one part when nothing streams), each split over the engines."""
        problems = self._problems(step)
        n = self.job.samples_per_prompt
        ids = [self.tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
        prompts = [x for x in ids for _ in range(n)]
        params = SamplingParams(max_new_tokens=self.rt.max_new_tokens, temperature=self.rt.temperature)
        seed = self.rt.seed * 7919 + step * 31
        item = Launched(problems, prompts, [self.roles.engines.submit([ids[i] for i in idx for _ in range(n)], params,
                                                                      seed + 104_729 * c)
                                            for c, idx in enumerate(_split(len(ids), self.chunks))])
        if self.names.greedy:  # ReMax: one greedy response per prompt, on the same engines and weights
            greedy = SamplingParams(max_new_tokens=self.rt.max_new_tokens, greedy=True)
            item.greedy_futures = self.roles.engines.submit(ids, greedy, 0)
        return item

    def _collect(self, item: Launched) -> Rollout:
        """Wait for a step's whole generation and join the engines' results."""
        res = _joined(item.prompts, [o for part in item.futures for o in self.roles.engines.wait(part)])
        if item.greedy_futures is not None:
            res.greedy, res.greedy_span = self._greedy(item)
        return res

    def _greedy(self, item: Launched) -> tuple[list, tuple[float, float]]:
        if item.done is not None:
            return item.done.greedy, item.done.greedy_span
        outs = self.roles.engines.wait(item.greedy_futures)
        return [r for o in outs for r in o.responses], joined(o.span for o in outs)

    def _parts(self, item: Launched):
        """A step's generation part by part as each is done: (its index, its first sample, the part)."""
        n = self.job.samples_per_prompt
        first = 0
        for c, idx in enumerate(_split(len(item.problems), self.chunks)):
            rows = slice(first, first + len(idx) * n)
            if item.done is not None:  # collected earlier (a checkpoint) or restored: cut as it was launched
                d = item.done
                part = Rollout(d.prompts[rows], d.responses[rows], d.logprobs[rows], d.versions[rows], d.span)
            else:
                part = _joined(item.prompts[rows], self.roles.engines.wait(item.futures[c]))
            yield c, first, part
            first = rows.stop

    def _record(self, stage: str, step: int, span, group_of: str | None = None, microbatch: int = 0) -> None:
        """A measured record of `stage`, on the devices of `group_of` (default: its own)."""
        grp = self.groups.get(group_of or stage)
        self.records.append(Record(unit=stage, kind=self.g.stage(stage).kind.value, step=step, microbatch=microbatch,
                                   group=grp.name if grp else "host", devices=(grp.first, grp.count) if grp else (0, 0),
                                   start=span[0] - self.t0, end=span[1] - self.t0,
                                   peak_memory_bytes=span[2] if len(span) > 2 else 0.0))

    def _sync(self, version: int, step: int) -> None:
        self._record(self.names.sync, step, self.roles.push_weights(version), self.names.generate)

    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy of the policy: sampled as in training (what RL optimizes: the expected
        reward of one sample on unseen problems) and greedy."""
        problems = self.task.problems("test", self.rt.eval_size, seed=self.rt.seed + 99)
        prompts = [self.tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
        out = {}
        for name, params in (("sampled", SamplingParams(max_new_tokens=self.rt.max_new_tokens,
                                                        temperature=self.rt.temperature)),
                             ("greedy", SamplingParams(max_new_tokens=self.rt.max_new_tokens, greedy=True))):
            resp = self.roles.engines.one(prompts, params, self.rt.seed + 4242).responses
            out[name] = self.task.accuracy(problems, self.tok.batch_decode(resp, skip_special_tokens=True))
        return out

    # ---- the loop ------------------------------------------------------------------------------------
    def loop(self, state: dict | None, progress: bool, about: dict) -> RunResult:
        rt = self.rt
        start, metrics, pending = 0, [], {}
        if state is not None:
            start, metrics = state["step"], state["metrics"]
            self._restore(state)
            for s, res in state.get("inflight", {}).items():
                done = Rollout.from_dict(res)
                pending[int(s)] = Launched(self._problems(int(s)), done.prompts, done=done)
        acc_before = state["accuracy_before"] if state else self.evaluate()
        bar = ProgressBar(rt.steps, start, progress)
        try:
            for step in range(start, rt.steps):
                t_step = time.time()
                for j in range(step, min(rt.steps, step + self.k + 1)):  # may run on version `step` (>= j - k)
                    if j not in pending:
                        pending[j] = self._launch(j)
                m = self._one_step(step, pending.pop(step))
                self._sync(step + 1, step)
                m["step_s"] = time.time() - t_step
                if rt.eval_every and ((step + 1) % rt.eval_every == 0 or step + 1 == rt.steps):
                    acc = self.evaluate()
                    m["test_accuracy"], m["test_accuracy_greedy"] = acc["sampled"], acc["greedy"]
                metrics.append(m)
                append_jsonl(os.path.join(rt.out, "metrics.jsonl"), m)
                if rt.checkpoint_every and ((step + 1) % rt.checkpoint_every == 0 or step + 1 == rt.steps):
                    self._checkpoint(step + 1, metrics, pending, acc_before)
                bar.update(m)
        finally:
            bar.close()
        acc_after = self.evaluate()
        timeline = self._timeline(metrics)
        summary = {"seed": rt.seed, "threads": rt.threads or os.cpu_count(), "eval_size": rt.eval_size,
                   "task": rt.task, "torch": torch.__version__, "warmup": about["warmup"],
                   "wall_s": time.time() - about["started"], "device": rt.device}
        summary |= self._beside_prediction(timeline, about.get("cluster"))
        files = write_outputs(rt.out, metrics, timeline, acc_before, acc_after, summary)
        return RunResult(metrics, timeline, acc_before, acc_after, rt.out, files, about["warmup"])

    def _one_step(self, step: int, item: Launched) -> dict:
        """One step as the plan's tasks: each generated part is scored, batched and run through the
        inference stages (old logprobs, reference, values) as soon as it is done, while the engines
        generate the next; advantages per part where the plan streams into them (else on the whole
        batch); updates per mini-batch where it streams into training, started as soon as their
        parts are ready and no pass of the step on the trained weights is still to come."""
        names, n = self.names, self.job.samples_per_prompt
        drawn: list[tuple[torch.Tensor, torch.Tensor, Rollout]] = []  # every sample's scores, for the metrics
        parts: list[Batch] = []
        updates: list = []
        m: dict = {"step": step + 1}
        for c, first, res in self._parts(item):
            self._record(names.generate, step, res.span, microbatch=c)
            texts = self.tok.batch_decode(res.responses, skip_special_tokens=True)
            scores, rule, span = self._rewards([item.problems[(first + i) // n] for i in range(len(texts))], texts)
            self._record(names.reward, step, span, microbatch=c)
            drawn.append((scores, rule, res))
            rows = list(range(len(scores)))
            if names.group_filter:  # DAPO's dynamic sampling (a whole-batch stage: nothing streams into it)
                t = time.time()
                keep = filters.mixed_groups(scores, n, self.job.prompts)
                rows = [g * n + j for g in keep for j in range(n)]
                m["kept_groups"] = float(len(keep))
                self._record(names.group_filter, step, (t, time.time()))
                if not rows:  # every group's samples scored alike: nothing to learn from this part
                    continue
            batch = build_batch(*([x[i] for i in rows] for x in (res.prompts, res.responses, res.logprobs)),
                                [first // n + i // n for i in range(len(rows))], [res.versions[i] for i in rows],
                                self.tok.pad_token_id)
            batch.scores = scores[rows]
            self._infer(step, c, batch)
            if self.part_advantages:
                self._advantages(step, c, batch, None)
            parts.append(batch)
            if self.part_updates and self.updates_early:
                updates += self._start_updates(step, parts, len(updates))
        scores, rule = torch.cat([d[0] for d in drawn]), torch.cat([d[1] for d in drawn])
        responses = [r for d in drawn for r in d[2].responses]
        staleness = [step - v for d in drawn for v in d[2].versions]
        m |= {"reward": float(scores.mean()), "accuracy": float((rule >= 1.0).float().mean()),
              "response_len": sum(map(len, responses)) / len(responses),
              "staleness_mean": sum(staleness) / len(staleness), "staleness_max": max(staleness)}
        greedy_scores = None
        if names.greedy:
            greedy, span = self._greedy(item)
            self._record(names.greedy, step, span)
            texts = self.tok.batch_decode(greedy, skip_special_tokens=True)
            greedy_scores, _, span = self._rewards(item.problems, texts)
            self._record(names.greedy_reward, step, span)
            m["greedy_reward"] = float(greedy_scores.mean())
        if not parts:
            return m | {"skipped": 1.0}
        batch = Batch.join(parts, self.tok.pad_token_id)
        if not self.fused:
            # how far the engine's logprobs are from the trainer's for the same tokens: ~1e-6 when both hold
            # the same weights; larger when samples are stale (async) or the engines' numerics differ
            gap = (batch.rollout_logprobs - batch.extras["old_logprobs"]) * batch.mask
            m["logprob_gap_max"] = float(gap.abs().max())
        if "ref_logprobs" in batch.extras:
            # the policy's KL to the reference on the sampled tokens (k1, mean per token): what a KL penalty holds
            diff = (batch.extras["old_logprobs"] - batch.extras["ref_logprobs"]) * batch.mask
            m["kl_ref"] = float(diff.sum() / batch.mask.sum().clamp(min=1))
        if not self.part_advantages:
            self._advantages(step, 0, batch, greedy_scores)
            if self.part_updates:  # the mini-batches read the advantages: the parts as rows of the joined batch
                ends = torch.tensor([p.size for p in parts]).cumsum(0).tolist()
                parts = [batch.select(torch.arange(e - p.size, e)) for p, e in zip(parts, ends)]
        return m | self._train(step, batch, parts, updates)

    def _rewards(self, problems: list, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, tuple[float, float]]:
        """(the scores trained on, the task rule's scores, the span): the rule's, or with a reward model
        in the plan, its scores of prompt + response as text."""
        t = time.time()
        rule = torch.tensor([self.task.reward(p, txt) for p, txt in zip(problems, texts)])
        if not self.reward_model:
            return rule, rule, (t, time.time())
        scores, span = self.roles.score([p.prompt + txt for p, txt in zip(problems, texts)])
        return scores, rule, span

    def _infer(self, step: int, c: int, batch: Batch) -> None:
        """The passes that read a part before its advantages: old logprobs (unless the engine's are
        the old ones), reference logprobs, values; started together, each on its role's workers."""
        roles, names = self.roles, self.names
        if self.fused:
            batch.extras["old_logprobs"] = batch.rollout_logprobs
        calls = [(names.actor_logprobs, "old_logprobs", roles.actor)] if not self.fused else []
        if roles.reference is not None:
            calls.append((names.ref_logprobs, "ref_logprobs", roles.reference))
        if roles.critic is not None:  # a critic's pass, or the actor's with a value head
            calls.append((names.values, "values", roles.critic))
        pending = [(stage, key, role, role.submit("values" if key == "values" else "logprobs", batch))
                   for stage, key, role in calls]
        for stage, key, role, futures in pending:
            outs, span = role.wait(futures)
            batch.extras[key] = torch.cat(outs)
            self._record(stage, step, span, microbatch=c)

    def _advantages(self, step: int, c: int, batch: Batch, greedy_scores: torch.Tensor | None) -> None:
        t = time.time()
        cfg = self.g.config
        adv, returns = algos.compute_advantages(
            cfg.adv_estimator, scores=batch.scores, mask=batch.mask, group_index=batch.group_index,
            values=batch.extras.get("values"), old_logprobs=batch.extras["old_logprobs"],
            ref_logprobs=batch.extras.get("ref_logprobs"), greedy_scores=greedy_scores, config=cfg)
        batch.extras["advantages"] = adv
        if returns is not None:
            batch.extras["returns"] = returns
        self._record(self.names.advantages, step, (t, time.time()), microbatch=c)

    def _minis(self) -> list[range]:
        """The parts each streamed mini-batch trains on, in the order they are generated."""
        per = self.chunks // self.job.mini_batches
        return [range(b * per, (b + 1) * per) for b in range(self.job.mini_batches)]

    def _start_updates(self, step: int, parts: list[Batch], started: int) -> list:
        """Start every streamed mini-batch update whose parts are all ready, from the `started`-th on."""
        out = []
        for b, chunk in enumerate(self._minis()[started:], start=started):
            if chunk.stop > len(parts):
                break
            mini = Batch.join([parts[i] for i in chunk], self.tok.pad_token_id)
            out.append(self.roles.start_update(mini, 1, 1, self.rt.seed * 104729 + step * 131 + b,
                                               fused=self.fused_updates))
        return out

    def _train(self, step: int, batch: Batch, parts: list[Batch], updates: list) -> dict:
        """The step's updates: on the whole batch (PPO epochs x mini-batches, as the plan's job says), or
        one per streamed mini-batch in generation order; their records and mean metrics."""
        from rpeg.runtime.trainer import mean_metrics

        names = self.names
        if self.part_updates:
            updates += self._start_updates(step, parts, len(updates))
            done = [self.roles.finish_update(u) for u in updates]
        else:
            done = [self.roles.update(batch, self.job.ppo_epochs, self.job.mini_batches, self.rt.seed * 104729 + step,
                                      fused=self.fused_updates)]
        for b, up in enumerate(done):
            self._record(names.actor_update, step, up.actor.span, microbatch=b)
            if up.critic is not None:
                self._record(names.critic_update, step, up.critic.span, microbatch=b)
        metrics = mean_metrics(up.actor.value for up in done)
        if done[0].critic is not None:
            metrics |= {f"critic_{k}": v for k, v in mean_metrics(up.critic.value for up in done).items()}
        return {k: float(v) for k, v in metrics.items()}

    # ---- checkpoints -------------------------------------------------------------------------------------
    def _checkpoint(self, step: int, metrics: list, pending: dict, acc_before: float) -> None:
        inflight = {}
        for s, item in pending.items():  # generations already running on older weights: keep their results
            if item.done is None:
                item.done = self._collect(item)
            inflight[s] = item.done.as_dict()
        state = {"step": step, "metrics": metrics, "inflight": inflight, "accuracy_before": acc_before,
                 **self.roles.states(),
                 "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
                 # the measured timeline so far, on the run's own clock: a resumed run's timeline
                 # continues it (with the gap while it was down) instead of starting over
                 "timeline": {"t0": self.t0, "records": [r for r in self.records if r.step < step]}}
        save_atomic(os.path.join(self.rt.out, "checkpoints"), step, state, self.rt.keep_checkpoints)

    def _restore(self, state: dict) -> None:
        if "timeline" in state:
            self.t0, self.records = state["timeline"]["t0"], list(state["timeline"]["records"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        self.roles.restore(state)
        self.roles.push_weights(state["step"])

    def _beside_prediction(self, timeline: Timeline, cluster) -> dict:
        """The model's step time and peak memory per stage for this plan on the job's cluster, beside the
        measured ones (peak memory is measured on GPUs only: torch.cuda.max_memory_allocated per part)."""
        peaks: dict[str, float] = {}
        for r in timeline.records:
            peaks[r.unit] = max(peaks.get(r.unit, 0.0), r.peak_memory_bytes)
        out: dict = {}
        pred = None
        if cluster is not None:
            from rpeg.perf.step import predict_step

            pred = predict_step(self.g, cluster)
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
        return Timeline(records=tuple(sorted(self.records, key=lambda r: r.start)), steps=steps, step_s=step_s,
                        step_ends=tuple(ends), tokens_per_step=0.0, sequences_per_step=self.job.sequences,
                        max_staleness=max((m["staleness_max"] for m in metrics), default=0), source="measured")


def _reward_path(rt: RuntimeConfig) -> str:
    """The reward model's folder: the job's, or the tiny one built under the run's folder."""
    if not rt.reward_model_path:
        raise RpegError("the plan scores with a reward model: set runtime.reward_model_path to a local Hugging Face "
                        "sequence-classification folder (or `tiny` for a tiny random one)")
    if rt.reward_model_path == "tiny":
        from rpeg.runtime.models import build_tiny_reward

        return build_tiny_reward(os.path.join(rt.out, "tiny-reward"), seed=rt.seed)
    return rt.reward_model_path


def _joined(prompts: list, outs: list) -> Rollout:
    """The engines' results (workers.Generated, in order) for `prompts`, as one Rollout."""
    return Rollout(prompts, [r for o in outs for r in o.responses], [lp for o in outs for lp in o.logprobs],
                   [o.version for o in outs for _ in o.responses], joined(o.span for o in outs))


def _split(n: int, parts: int) -> list[torch.Tensor]:
    return [c for c in torch.tensor_split(torch.arange(n), parts)]


__all__ = ["RunResult", "run"]
