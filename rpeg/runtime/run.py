"""run(plan, job): train for real, as the plan says, on a Ray cluster.

A private local Ray cluster starts by itself (its own temp dir, no dashboard) unless the runtime
config or RAY_ADDRESS names one. Workers are placed per the plan: a colocated plan runs
generation, reference and training in one worker process (the engine samples with the trainer's
model); a disaggregated plan runs `dp` generation engines and an FSDP2 training group of `dp`
ranks, and ships new weights through the Ray object store. Bounded asynchrony: generation for
step s + j is launched as soon as it may run on the current weights (j <= k); every sample
records the weight version it came from.

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
from rpeg.runtime import algos
from rpeg.runtime.batch import Batch, build_batch
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.outputs import ProgressBar, append_jsonl, load_latest, save_atomic, write_jsonl, write_outputs
from rpeg.runtime.plan_check import check_plan
from rpeg.runtime.rollout import SamplingParams
from rpeg.runtime.sft import prepare_model
from rpeg.runtime.trainer import OptimConfig
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

    def __init__(self, address: str):
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
            ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, _temp_dir=self.tmp, log_to_driver=False,
                     configure_logging=False)
        self.owned = True

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)


def run(graph: Graph, rt: RuntimeConfig, *, resume: bool = False, progress: bool = True) -> RunResult:
    from rpeg.tasks import get_task

    check_plan(graph)
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
    session = _Ray(rt.address)
    try:
        runner = _Runner(graph, rt, task, tok, model_path, session.ray)
        return runner.loop(state, progress, {"warmup": warmup, "started": t0})
    finally:
        session.close()


class _Runner:
    def __init__(self, graph: Graph, rt: RuntimeConfig, task, tok, model_path: str, ray):
        from rpeg.runtime import workers as W

        self.g, self.rt, self.task, self.tok, self.ray = graph, rt, task, tok, ray
        self.job = graph.job
        cfg = graph.config
        gen, train = graph.stage("generate"), graph.stage("actor_update")
        self.colocated = graph.group(gen.group).overlaps(graph.group(train.group))
        self.k = graph.async_bound
        self.fused = any(set(f) == {"generate", "actor_logprobs"} for f in graph.fusion)
        self.has_ref = graph.has_model("ref")
        self.greedy_baseline = any(s.greedy for s in graph.stages)  # ReMax
        self.dynamic_sampling = any(s.name == "dynamic_sampling" for s in graph.stages)  # DAPO
        self.has_critic = graph.has_model("critic")
        self.shared_value = "value" in graph.model("actor").heads
        optim = OptimConfig(lr=rt.lr, warmup_steps=rt.warmup_steps, grad_clip=rt.grad_clip, micro_batch=rt.micro_batch,
                            temperature=rt.temperature)
        cores = os.cpu_count() or 2
        remote = lambda cls: ray.remote(num_cpus=0)(cls)  # noqa: E731  placement is ours, not Ray's CPU count
        if self.colocated:
            threads = rt.threads or cores
            self.coloc = remote(W.ColocatedWorker).remote(model_path, cfg, optim, reference=self.has_ref,
                                                          critic=self.has_critic, shared_value=self.shared_value,
                                                          threads=threads, deterministic=rt.deterministic,
                                                          seed=rt.seed, engine=rt.engine,
                                                          engine_memory=rt.engine_memory,
                                                          engine_kv_cache_mib=rt.engine_kv_cache_mib)
            self.rollouts = [self.coloc]
            self.trainers = [self.coloc]
            self.ref = self.coloc
            self.critics = [self.coloc] if self.has_critic or self.shared_value else []
        else:
            ngen, ntrain, tp = gen.layout.dp, train.layout.devices, train.layout.tp
            threads = rt.threads or max(1, cores // (ngen + ntrain))
            self.rollouts = [remote(W.RolloutWorker).remote(model_path, threads, rt.deterministic, rt.engine,
                                                            rt.seed + j, rt.engine_memory, rt.engine_kv_cache_mib)
                         for j in range(ngen)]
            port = 29500 + random.Random(os.getpid()).randrange(2000)
            self.trainers = [remote(W.TrainerWorker).remote(model_path, cfg, optim, lm=True, value=self.shared_value,
                                                            rank=r, world=ntrain, master=f"127.0.0.1:{port}", tp=tp,
                                                            threads=threads, deterministic=rt.deterministic,
                                                            seed=rt.seed) for r in range(ntrain)]
            self.tp = {id(w): tp for w in self.trainers}
            self.ref = remote(W.InferenceWorker).remote(model_path, threads, rt.temperature, rt.micro_batch) \
                if self.has_ref else None
            if self.has_critic:
                clay = graph.stage("critic_update").layout
                cport = port + 1
                self.critics = [remote(W.TrainerWorker).remote(model_path, cfg, optim, lm=False, value=True, rank=r,
                                                               world=clay.devices, master=f"127.0.0.1:{cport}",
                                                               tp=clay.tp, threads=threads,
                                                               deterministic=rt.deterministic, seed=rt.seed)
                                for r in range(clay.devices)]
                self.tp.update({id(w): clay.tp for w in self.critics})
            else:
                self.critics = self.trainers if self.shared_value else []
        if self.colocated:
            self.tp = {}
        self.groups = {s.name: graph.group(s.group) for s in graph.stages if s.group}
        self.t0 = time.time()
        self.records: list[Record] = []

    # ---- helpers -----------------------------------------------------------------------------------
    def _problems(self, step: int):
        """The step's prompts: the job's, or more of them under DAPO's dynamic sampling (`oversample`)."""
        count = math.ceil(self.job.prompts * self.g.config.oversample - 1e-9)
        return self.task.problems("train", count, seed=self.rt.seed * 1_000_003 + step)

    def _fan_out(self, prompts: list[list[int]], params: SamplingParams, seed: int) -> list:
        shards = _split(len(prompts), len(self.rollouts))
        return [w.generate.remote([prompts[i] for i in idx], params, seed + j)
                for j, (w, idx) in enumerate(zip(self.rollouts, shards))]

    def _launch(self, step: int):
        problems = self._problems(step)
        n = self.job.samples_per_prompt
        ids = [self.tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
        prompts = [x for x in ids for _ in range(n)]
        params = SamplingParams(max_new_tokens=self.rt.max_new_tokens, temperature=self.rt.temperature)
        item = {"problems": problems, "prompts": prompts,
                "futures": self._fan_out(prompts, params, self.rt.seed * 7919 + step * 31)}
        if self.greedy_baseline:  # ReMax: one greedy response per prompt, on the same engines and weights
            greedy = SamplingParams(max_new_tokens=self.rt.max_new_tokens, greedy=True)
            item["greedy_futures"] = self._fan_out(ids, greedy, 0)
        return item

    def _collect(self, item: dict) -> dict:
        """Wait for a step's generation and join the engines' results."""
        outs = self.ray.get(item["futures"])
        res = {"prompts": item["prompts"], "responses": [r for o in outs for r in o[0]],
               "logprobs": [lp for o in outs for lp in o[1]], "versions": [o[2] for o in outs for _ in o[0]],
               "span": (min(o[3][0] for o in outs), max(o[3][1] for o in outs))}
        if "greedy_futures" in item:
            outs = self.ray.get(item["greedy_futures"])
            res["greedy"] = [r for o in outs for r in o[0]]
            res["greedy_span"] = (min(o[3][0] for o in outs), max(o[3][1] for o in outs))
        return res

    def _record(self, unit: str, kind: str, step: int, span, stage: str | None = None) -> None:
        grp = self.groups.get(stage or unit)
        self.records.append(Record(unit=unit, kind=kind, step=step, microbatch=0, group=grp.name if grp else "host",
                                   devices=(grp.first, grp.count) if grp else (0, 0), start=span[0] - self.t0,
                                   end=span[1] - self.t0))

    def _call_trainers(self, workers, method: str, batch: Batch, *args):
        """Each data-parallel rank gets its shard; the tensor-parallel ranks of one shard all get it, and
        the results of the first of them stand for the shard."""
        tp = self.tp.get(id(workers[0]), 1)
        shards = _split(batch.size, len(workers) // tp)
        futs = [getattr(w, method).remote(batch.select(shards[r // tp]), *args) for r, w in enumerate(workers)]
        outs = self.ray.get(futs)
        spans = [s for _, s in outs]
        span = (min(s[0] for s in spans), max(s[1] for s in spans))
        return [o for r, (o, _) in enumerate(outs) if r % tp == 0], span

    def _push_weights(self, version: int) -> tuple[float, float]:
        """New actor weights into the engines: in-process when colocated, else through the object store."""
        if self.colocated:
            return self.ray.get(self.coloc.load_weights.remote(None, version))
        t = time.time()
        ref = self.ray.put(self._collective(self.trainers, "state_dict"))
        spans = self.ray.get([w.load_weights.remote(ref, version) for w in self.rollouts])
        return t, max(s[1] for s in spans)

    def _sync(self, version: int, step: int) -> None:
        self._record("actor_sync", "sync", step, self._push_weights(version), "generate")

    def evaluate(self) -> dict[str, float]:
        """Held-out accuracy of the policy: sampled as in training (what RL optimizes: the expected
        reward of one sample on unseen problems) and greedy."""
        problems = self.task.problems("test", self.rt.eval_size, seed=self.rt.seed + 99)
        prompts = [self.tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
        out = {}
        for name, params in (("sampled", SamplingParams(max_new_tokens=self.rt.max_new_tokens,
                                                        temperature=self.rt.temperature)),
                             ("greedy", SamplingParams(max_new_tokens=self.rt.max_new_tokens, greedy=True))):
            resp, _, _, _ = self.ray.get(self.rollouts[0].generate.remote(prompts, params, self.rt.seed + 4242))
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
                pending[int(s)] = {"problems": self._problems(int(s)), "prompts": res["prompts"], "done": res}
        acc_before = state["accuracy_before"] if state else self.evaluate()
        bar = ProgressBar(rt.steps, start, progress)
        version = start
        try:
            for step in range(start, rt.steps):
                t_step = time.time()
                for j in range(step, min(rt.steps, step + self.k + 1)):  # may run on version `step` (>= j - k)
                    if j not in pending:
                        pending[j] = self._launch(j)
                item = pending.pop(step)
                m = self._one_step(step, item)
                version = step + 1
                self._sync(version, step)
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
                   "wall_s": time.time() - about["started"]}
        files = write_outputs(rt.out, metrics, timeline, acc_before, acc_after, summary)
        return RunResult(metrics, timeline, acc_before, acc_after, rt.out, files, about["warmup"])

    def _score(self, step: int, problems: list, res: dict) -> tuple[dict, torch.Tensor | None, Batch | None]:
        """Rewards for a step's samples (and ReMax's greedy responses), then DAPO's dynamic sampling.
        Returns the step's sample metrics (over every sample drawn), the greedy scores, and the batch
        to train on (None when dynamic sampling kept no group)."""
        job = self.job
        n = job.samples_per_prompt
        self._record("generate", "generate", step, res["span"])
        t = time.time()
        texts = self.tok.batch_decode(res["responses"], skip_special_tokens=True)
        scores = torch.tensor([self.task.reward(problems[i // n], txt) for i, txt in enumerate(texts)])
        self._record("reward", "reward", step, (t, time.time()))
        staleness = [step - v for v in res["versions"]]
        m = {"step": step + 1, "reward": float(scores.mean()), "accuracy": float((scores >= 1.0).float().mean()),
             "response_len": sum(map(len, res["responses"])) / len(res["responses"]),
             "staleness_mean": sum(staleness) / len(staleness), "staleness_max": max(staleness)}
        greedy_scores = None
        if "greedy" in res:
            self._record("generate_greedy", "generate", step, res["greedy_span"])
            t = time.time()
            greedy_texts = self.tok.batch_decode(res["greedy"], skip_special_tokens=True)
            greedy_scores = torch.tensor([self.task.reward(p, txt) for p, txt in zip(problems, greedy_texts)])
            self._record("reward_greedy", "reward", step, (t, time.time()))
            m["greedy_reward"] = float(greedy_scores.mean())
        rows = list(range(len(scores)))
        if self.dynamic_sampling:
            t = time.time()
            keep = _mixed_groups(scores, n, job.prompts)
            rows = [g * n + j for g in keep for j in range(n)]
            m["kept_groups"] = float(len(keep))
            self._record("dynamic_sampling", "compute", step, (t, time.time()))
            if not rows:  # every group's samples scored alike: nothing to learn from this step
                return m | {"skipped": 1.0}, greedy_scores, None

        def pick(xs: list) -> list:
            return [xs[i] for i in rows]

        batch = build_batch(pick(res["prompts"]), pick(res["responses"]), pick(res["logprobs"]),
                            [i // n for i in range(len(rows))], pick(res["versions"]), self.tok.pad_token_id)
        batch.scores = scores[rows]
        return m, greedy_scores, batch

    def _one_step(self, step: int, item: dict) -> dict:
        rt, job, g = self.rt, self.job, self.g
        res = item["done"] if "done" in item else self._collect(item)
        m, greedy_scores, batch = self._score(step, item["problems"], res)
        if batch is None:
            return m
        scores = batch.scores
        if self.fused:
            batch.extras["old_logprobs"] = batch.rollout_logprobs
        else:
            outs, span = self._call_trainers(self.trainers, "logprobs", batch)
            batch.extras["old_logprobs"] = torch.cat(outs)
            self._record("actor_logprobs", "infer", step, span)
            # how far the engine's logprobs are from the trainer's for the same tokens: ~1e-6 when both hold
            # the same weights; larger when samples are stale (async) or the engines' numerics differ
            gap = (batch.rollout_logprobs - batch.extras["old_logprobs"]) * batch.mask
            m["logprob_gap_max"] = float(gap.abs().max())
        if self.has_ref:
            method = "ref_logprobs" if self.colocated else "logprobs"
            out, span = self.ray.get(getattr(self.ref, method).remote(batch))
            batch.extras["ref_logprobs"] = out
            # the policy's KL to the reference on the sampled tokens (k1, mean per token): what a KL penalty holds
            diff = (batch.extras["old_logprobs"] - out) * batch.mask
            m["kl_ref"] = float(diff.sum() / batch.mask.sum().clamp(min=1))
            self._record("ref_logprobs", "infer", step, span)
        if self.critics:
            outs, span = self._call_trainers(self.critics, "values", batch)
            batch.extras["values"] = torch.cat(outs)
            self._record("critic_values", "infer", step, span, "critic_values" if self.has_critic else "actor_update")
        t = time.time()
        cfg = g.config
        adv, returns = algos.compute_advantages(
            cfg.adv_estimator, scores=scores, mask=batch.mask, group_index=batch.group_index,
            values=batch.extras.get("values"), old_logprobs=batch.extras["old_logprobs"],
            ref_logprobs=batch.extras.get("ref_logprobs"), greedy_scores=greedy_scores, config=cfg)
        batch.extras["advantages"] = adv
        if returns is not None:
            batch.extras["returns"] = returns
        self._record("advantages", "compute", step, (t, time.time()))
        seed = rt.seed * 104729 + step
        outs, span = self._call_trainers(self.trainers, "train", batch, job.ppo_epochs, job.mini_batches, seed)
        self._record("actor_update", "train", step, span)
        train_metrics = outs[0]
        if self.has_critic:
            method = "train_critic" if self.colocated else "train"
            outs, span = self._call_trainers(self.critics, method, batch, job.ppo_epochs, job.mini_batches, seed)
            self._record("critic_update", "train", step, span)
            train_metrics.update({f"critic_{k}": v for k, v in outs[0].items()})
        return m | {k: float(v) for k, v in train_metrics.items()}

    # ---- checkpoints -------------------------------------------------------------------------------------
    def _checkpoint(self, step: int, metrics: list, pending: dict, acc_before: float) -> None:
        inflight = {}
        for s, item in pending.items():  # generations already running on older weights: keep their results
            if "done" in item:
                inflight[s] = item["done"]
                continue
            res = self._collect(item)
            item["done"] = res
            inflight[s] = res
        state = {"step": step, "metrics": metrics, "inflight": inflight, "accuracy_before": acc_before,
                 "actor": self._collective(self.trainers, "checkpoint_state"),
                 "critic": self._critic_state(),
                 "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
                 # the measured timeline so far, on the run's own clock: a resumed run's timeline
                 # continues it (with the gap while it was down) instead of starting over
                 "timeline": {"t0": self.t0, "records": [r for r in self.records if r.step < step]}}
        save_atomic(os.path.join(self.rt.out, "checkpoints"), step, state, self.rt.keep_checkpoints)

    def _collective(self, workers, method: str):
        """Gathering sharded weights is a collective: every rank of the group must take part; rank 0's
        copy is the result."""
        return self.ray.get([getattr(w, method).remote() for w in workers])[0]

    def _critic_state(self):
        if not self.has_critic:
            return None
        if self.colocated:
            return self.ray.get(self.coloc.critic_checkpoint_state.remote())
        return self._collective(self.critics, "checkpoint_state")

    def _restore(self, state: dict) -> None:
        if "timeline" in state:
            self.t0, self.records = state["timeline"]["t0"], list(state["timeline"]["records"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        self.ray.get([w.restore.remote(state["actor"]) for w in self.trainers])
        if state.get("critic") is not None:
            if self.colocated:
                self.ray.get(self.coloc.restore_critic.remote(state["critic"]))
            else:
                self.ray.get([w.restore.remote(state["critic"]) for w in self.critics])
        self._push_weights(state["step"])

    def _timeline(self, metrics: list) -> Timeline:
        steps = max((r.step for r in self.records), default=0) + 1
        ends = [max((r.end for r in self.records if r.step == s), default=0.0) for s in range(steps)]
        step_s = sum(m["step_s"] for m in metrics) / len(metrics) if metrics else 0.0
        return Timeline(records=tuple(sorted(self.records, key=lambda r: r.start)), steps=steps, step_s=step_s,
                        step_ends=tuple(ends), tokens_per_step=0.0, sequences_per_step=self.job.sequences,
                        max_staleness=max((m["staleness_max"] for m in metrics), default=0), source="measured")


# ---- files ---------------------------------------------------------------------------------------------
def _mixed_groups(scores: torch.Tensor, n: int, limit: int) -> list[int]:
    """DAPO's dynamic sampling: the first `limit` groups (of `n` consecutive samples) whose rewards are not
    all equal — a group scored alike has zero advantage under group normalization and teaches nothing."""
    groups = scores.view(-1, n)
    mixed = (groups != groups[:, :1]).any(dim=1)
    return [int(g) for g in torch.nonzero(mixed).flatten()[:limit]]


def _split(n: int, parts: int) -> list[torch.Tensor]:
    return [c for c in torch.tensor_split(torch.arange(n), parts)]


__all__ = ["RunResult", "run"]
