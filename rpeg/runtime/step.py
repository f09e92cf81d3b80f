"""One step of a plan, run as its tasks: generation launched in the plan's parts, each part scored,
batched and sent through the inference stages as soon as the engines finish it, advantages and
updates per part or mini-batch where the plan streams into them (`Steps.run`). The driver
(`runtime.run`) decides when a step's generation may start (bounded asynchrony), syncs weights,
evaluates and checkpoints; this module does the step itself, through the roles' uniform calls."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from rpeg.errors import RpegError
from rpeg.graph import Graph
from rpeg.runtime import algos, filters
from rpeg.runtime.batch import Batch, build_batch
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.models import prompt_ids
from rpeg.runtime.roles import Roles, StepStages, joined, shards
from rpeg.runtime.rollout import SamplingParams


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
    token_versions: list | None = None  # partial rollout: per sample, the weight version of each token
    # multi-turn episodes (runtime.agent_engine): per sample, its response tokens' loss mask (0 on observation
    # tokens), the environment's reward, the outcome (accuracy reads it), turns, successful tool calls and
    # the timeline's events (generate | tool | environment, start, end); `versions` holds each episode's
    # first sampled token's weights
    loss_masks: list | None = None
    env_rewards: list | None = None
    outcomes: list | None = None
    turns: list | None = None
    tool_calls: list | None = None
    events: list | None = None
    token_rewards: list | None = None  # episodes: per response token, the rewards earned there (turns', outcome)
    # per engine call, (engine, start, end, turns batched, longest reply) with episodes; with partial rollout,
    # (engine, start, end, sequences batched (of every step in flight on the engine), tokens decoded)
    engine_calls: list | None = None

    EPISODE_FIELDS = ("loss_masks", "env_rewards", "outcomes", "turns", "tool_calls", "events",  # per sample
                      "token_rewards")
    SAVED_EPISODE_FIELDS = EPISODE_FIELDS + ("engine_calls",)  # what a checkpoint keeps of a generation in flight

    def as_dict(self) -> dict:  # the checkpoint's format for generations in flight
        out = {"prompts": self.prompts, "responses": self.responses, "logprobs": self.logprobs,
               "versions": self.versions, "span": self.span}
        if self.greedy is not None:
            out |= {"greedy": self.greedy, "greedy_span": self.greedy_span}
        if self.token_versions is not None:
            out["token_versions"] = self.token_versions
        if self.loss_masks is not None:
            out |= {k: getattr(self, k) for k in self.SAVED_EPISODE_FIELDS}
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Rollout:
        return cls(d["prompts"], d["responses"], d["logprobs"], d["versions"], tuple(d["span"]), d.get("greedy"),
                   d.get("greedy_span"), d.get("token_versions"),
                   **{k: d.get(k) for k in cls.SAVED_EPISODE_FIELDS})

    def rows(self, rows: slice) -> Rollout:
        """The samples at `rows` (a streamed part of the step's generation)."""
        tv = None if self.token_versions is None else self.token_versions[rows]
        ep = {k: None if getattr(self, k) is None else getattr(self, k)[rows] for k in self.EPISODE_FIELDS}
        calls = self.engine_calls if not rows.start else None  # the engines' calls go with the first part
        return Rollout(self.prompts[rows], self.responses[rows], self.logprobs[rows], self.versions[rows], self.span,
                       token_versions=tv, engine_calls=calls, **ep)


@dataclass
class Launched:
    """A step's generation as launched: its problems and prompts, and the engines' futures (or the
    result, once collected or restored from a checkpoint)."""

    problems: list
    prompts: list
    futures: list = field(default_factory=list)
    greedy_futures: list | None = None
    done: Rollout | None = None


class Steps:
    """The step's tasks for one plan: `launch` a step's generation, `run` the step on it."""

    def __init__(self, graph: Graph, rt: RuntimeConfig, task, tok, roles: Roles, names: StepStages, record,
                 details=None):
        """`record(stage, step, span, group_of=None, microbatch=0)`: the driver's measured timeline;
        `details(stage, step, part, first, rollout)`: what happened inside a generated part (episodes)."""
        self.g, self.rt, self.task, self.tok, self.roles, self.names, self.record = (
            graph, rt, task, tok, roles, names, record)
        self.details = details
        self.env = rt.env_spec(task)  # multi-turn episodes on the engines, or None
        self.job = graph.job
        self.fused = graph.fusion_group_of(names.actor_logprobs) is not None  # logprobs from the engine
        self.reward_model = graph.stage(names.reward).model is not None
        fused_with = graph.fusion_group_of(names.actor_update) or ()
        self.fused_updates = names.critic_update is not None and names.critic_update in fused_with
        # streaming: a step's prompt groups go through generation, scoring and inference in `chunks`
        # parts; advantages per part where the plan streams into them, updates per mini-batch where it
        # streams into training -- started early only when no pass on the trained weights is still to
        # come this step (the old logprobs and values must see the weights the samples came from)
        into = {s.consumer for s in graph.streams}
        self.chunks = max((s.microbatches for s in graph.streams), default=1)
        self.part_advantages = names.advantages in into
        self.part_updates = bool(into & {names.actor_update, names.critic_update})
        self.updates_early = self.fused and names.values is None and self.part_advantages
        # partial rollout: generation in segments, so in-flight responses take new weights as they arrive
        self.segment = partial_segment(rt) if graph.partial_rollout else 0
        self.updating = False  # `run`'s: whether the step under way has started an update

    def problems(self, step: int):
        """The step's prompts: the job's, or more of them under DAPO's dynamic sampling (`oversample`)."""
        count = math.ceil(self.job.prompts * self.g.config.oversample - 1e-9)
        return self.task.problems("train", count, seed=self.rt.seed * 1_000_003 + step)

    def launch(self, step: int) -> Launched:
        """Start a step's generation: its prompt groups in `chunks` parts (the plan's streamed
        micro-batches; one part when nothing streams), each split over the engines."""
        problems = self.problems(step)
        n = self.job.samples_per_prompt
        ids = prompt_ids(self.tok, [p.prompt for p in problems], self.rt.chat)
        prompts = [x for x in ids for _ in range(n)]
        params = SamplingParams(max_new_tokens=self.rt.max_new_tokens, temperature=self.rt.temperature)
        seed = self.rt.seed * 7919 + step * 31
        if self.env is not None:  # episodes: each engine runs its prompt groups' turns with their tools
            return Launched(problems, prompts, [self.roles.engines.submit_episodes(
                [problems[i] for i in idx for _ in range(n)], self.env, params, seed + 104_729 * c, self.segment > 0)
                for c, idx in enumerate(shards(len(ids), self.chunks))])
        item = Launched(problems, prompts, [self.roles.engines.submit([ids[i] for i in idx for _ in range(n)], params,
                                                                      seed + 104_729 * c, self.segment)
                                            for c, idx in enumerate(shards(len(ids), self.chunks))])
        if self.names.greedy:  # ReMax: one greedy response per prompt, on the same engines and weights
            greedy = SamplingParams(max_new_tokens=self.rt.max_new_tokens, greedy=True)
            item.greedy_futures = self.roles.engines.submit(ids, greedy, 0)
        return item

    def collect(self, item: Launched) -> Rollout:
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
        for c, idx in enumerate(shards(len(item.problems), self.chunks)):
            rows = slice(first, first + len(idx) * n)
            if item.done is not None:  # collected earlier (a checkpoint) or restored: cut as it was launched
                part = item.done.rows(rows)
            else:
                part = _joined(item.prompts[rows], self.roles.engines.wait(item.futures[c]))
            yield c, first, part
            first = rows.stop

    def forget(self, item: Launched) -> None:
        """A step's generation is done with: its engine calls are not made again after a restart."""
        for part in item.futures + ([item.greedy_futures] if item.greedy_futures else []):
            self.roles.engines.forget(part)

    def resubmit(self, item: Launched, dead: list[int]) -> int:
        """A launched step's calls on engines `dead` (restarted since) made again: how many."""
        if item.done is not None:
            return 0
        return sum(self.roles.engines.resubmit(part, dead)
                   for part in item.futures + ([item.greedy_futures] if item.greedy_futures else []))

    def run(self, step: int, item: Launched) -> dict:
        """One step as the plan's tasks: each generated part is scored, batched and run through the
        inference stages (old logprobs, reference, values) as soon as it is done, while the engines
        generate the next; advantages per part where the plan streams into them (else on the whole
        batch); updates per mini-batch where it streams into training, started as soon as their
        parts are ready and no pass of the step on the trained weights is still to come."""
        names, n = self.names, self.job.samples_per_prompt
        self.updating = False  # whether an update of this step has started (the trained weights then move)
        drawn: list[tuple[torch.Tensor, torch.Tensor, Rollout]] = []  # every sample's scores, for the metrics
        parts: list[Batch] = []
        updates: list = []
        m: dict = {"step": step + 1}
        for c, first, res in self._parts(item):
            check_staleness(step, first, res.token_versions or res.versions, self.g.async_bound)
            self.record(names.generate, step, res.span, microbatch=c)
            if (res.events is not None or res.engine_calls) and self.details is not None:
                self.details(names.generate, step, c, first, res)
            if res.env_rewards is not None:  # the environment scored each episode as it ended
                scores, rule = torch.tensor(res.env_rewards), torch.tensor(res.outcomes)
                span = (res.span[1], res.span[1])
            else:
                texts = self.tok.batch_decode(res.responses, skip_special_tokens=True)
                scores, rule, span = self._rewards([item.problems[(first + i) // n] for i in range(len(texts))], texts)
            self.record(names.reward, step, span, microbatch=c)
            drawn.append((scores, rule, res))
            rows = list(range(len(scores)))
            if names.group_filter:  # DAPO's dynamic sampling (a whole-batch stage: nothing streams into it)
                t = time.time()
                keep = filters.mixed_groups(scores, n, self.job.prompts)
                rows = [g * n + j for g in keep for j in range(n)]
                m["kept_groups"] = float(len(keep))
                self.record(names.group_filter, step, (t, time.time()))
                if not rows:  # every group's samples scored alike: nothing to learn from this part
                    continue
            batch = build_batch(*([x[i] for i in rows] for x in (res.prompts, res.responses, res.logprobs)),
                                [first // n + i // n for i in range(len(rows))], [res.versions[i] for i in rows],
                                self.tok.pad_token_id,
                                None if res.loss_masks is None else [res.loss_masks[i] for i in rows],
                                None if res.token_rewards is None else [res.token_rewards[i] for i in rows])
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
        if self.env is not None:
            m["turns_mean"] = sum(t for d in drawn for t in d[2].turns) / len(responses)
            m["tool_calls_mean"] = sum(t for d in drawn for t in d[2].tool_calls) / len(responses)
            calls = [c for d in drawn for c in d[2].engine_calls or ()]
            if calls:  # the engines' calls: how many, and the longest reply each decoded until (the hf engine)
                m["engine_calls"] = float(len(calls))
                m["engine_call_longest_mean"] = sum(c[4] for c in calls) / len(calls)
        if self.segment:  # how many weight versions the step's responses span (1: none changed mid-response)
            spans = [len(set(tv)) for d in drawn for tv in d[2].token_versions or [] if tv]
            m["versions_per_response_max"] = max(spans, default=1)
            m["mixed_version_frac"] = sum(x > 1 for x in spans) / max(1, len(spans))
            calls = [c for d in drawn for c in d[2].engine_calls or ()]
            if calls:  # the segment calls that were this step's turn, and the sequences each batched (all steps')
                m["engine_calls"] = float(len(calls))
                m["engine_call_rows_mean"] = sum(c[3] for c in calls) / len(calls)
        greedy_scores = None
        if names.greedy:
            greedy, span = self._greedy(item)
            self.record(names.greedy, step, span)
            texts = self.tok.batch_decode(greedy, skip_special_tokens=True)
            greedy_scores, _, span = self._rewards(item.problems, texts)
            self.record(names.greedy_reward, step, span)
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
        # (stage, what it writes, role, operation); a value head on the policy whose plan computes old
        # logprobs and values in one stage gets both from the same forward passes
        both = not self.fused and roles.critic is roles.actor and names.values == names.actor_logprobs
        calls = []
        if both:
            calls.append((names.actor_logprobs, ("old_logprobs", "values"), roles.actor, "logprobs_values"))
        elif not self.fused:
            calls.append((names.actor_logprobs, ("old_logprobs",), roles.actor, "logprobs"))
        if roles.reference is not None:
            calls.append((names.ref_logprobs, ("ref_logprobs",), roles.reference, "logprobs"))
        if roles.critic is not None and not both:  # a critic's pass, or the actor's with a value head
            calls.append((names.values, ("values",), roles.critic, "values"))
        pending = [(stage, keys, role, role.submit(op, batch)) for stage, keys, role, op in calls]
        for stage, keys, role, futures in pending:
            outs, span = role.wait(futures, stage)
            parts = [out if len(keys) > 1 else (out,) for out in outs]  # each shard's tensors, one per key
            for i, key in enumerate(keys):
                batch.extras[key] = torch.cat([p[i] for p in parts])
            self.record(stage, step, span, microbatch=c)

    def _advantages(self, step: int, c: int, batch: Batch, greedy_scores: torch.Tensor | None) -> None:
        t = time.time()
        cfg = self.g.config
        adv, returns = algos.compute_advantages(
            cfg.adv_estimator, scores=batch.scores, mask=batch.mask, group_index=batch.group_index,
            values=batch.extras.get("values"), old_logprobs=batch.extras["old_logprobs"],
            ref_logprobs=batch.extras.get("ref_logprobs"), greedy_scores=greedy_scores,
            token_scores=batch.extras.get("token_scores"), config=cfg)
        batch.extras["advantages"] = adv
        if returns is not None:
            batch.extras["returns"] = returns
        self.record(self.names.advantages, step, (t, time.time()), microbatch=c)

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
            self.updating = True
            out.append(self.roles.start_update(mini, 1, 1, self.rt.seed * 104729 + step * 131 + b,
                                               fused=self.fused_updates))
        return out

    def _train(self, step: int, batch: Batch, parts: list[Batch], updates: list) -> dict:
        """The step's updates: on the whole batch (PPO epochs x mini-batches, as the plan's job says), or
        one per streamed mini-batch in generation order; their records and mean metrics."""
        from rpeg.runtime.trainer import mean_metrics

        names = self.names
        self.updating = True
        if self.part_updates:
            updates += self._start_updates(step, parts, len(updates))
            done = [self.roles.finish_update(u) for u in updates]
        else:
            done = [self.roles.update(batch, self.job.ppo_epochs, self.job.mini_batches, self.rt.seed * 104729 + step,
                                      fused=self.fused_updates)]
        for b, up in enumerate(done):
            self.record(names.actor_update, step, up.actor.span, microbatch=b)
            if up.critic is not None:
                self.record(names.critic_update, step, up.critic.span, microbatch=b)
        metrics = mean_metrics(up.actor.value for up in done)
        if done[0].critic is not None:
            metrics |= {f"critic_{k}": v for k, v in mean_metrics(up.critic.value for up in done).items()}
        return {k: float(v) for k, v in metrics.items()}


def check_staleness(step: int, first: int, versions: list, k: int) -> None:
    """The plan's staleness contract, checked as a step's batch is built: every sample of step `step`
    (numbered from `first` in the step's batch) was generated with weights at most `k` versions older
    than the ones it trains (version v = the weights after v updates; step s trains version s), and
    none newer. `versions` holds per sample its version, or with partial rollout the list of its
    tokens' versions, each checked. A violation is an RpegError naming the step and the sample (the
    run stops there; its last checkpoint stands)."""
    for i, v in enumerate(versions):
        tokens = v if isinstance(v, list) else [v]
        for j, t in enumerate(tokens):
            lag = step - int(t)
            if not 0 <= lag <= k:
                where = f"sample {first + i}" + (f", token {j}" if isinstance(v, list) else "")
                raise RpegError(f"staleness bound broken at step {step + 1}, {where}: generated with weights version "
                                f"{t}, {lag} update(s) behind the weights trained (the plan allows 0 to k = {k})")


def partial_segment(rt: RuntimeConfig) -> int:
    """Tokens an engine generates between two chances to take new weights under partial rollout:
    `runtime.partial_segment`, or a quarter of max_new_tokens (at least 1)."""
    return rt.partial_segment or max(1, -(-rt.max_new_tokens // 4))


def _joined(prompts: list, outs: list) -> Rollout:
    """The engines' results (workers.Generated, in order) for `prompts`, as one Rollout (episodes: their
    openings are the prompts, and their masks, rewards, turns and tool calls come along)."""
    partial = all(o.token_versions is not None for o in outs)
    ep = {}
    if outs and all(o.episodes is not None for o in outs):
        prompts = [x for o in outs for x in o.episodes.openings]
        # Rollout's field <- Episodes' field
        sources = {"loss_masks": "loss_masks", "env_rewards": "rewards", "outcomes": "outcomes", "turns": "turns",
                   "tool_calls": "tool_calls", "events": "events", "token_rewards": "token_rewards"}
        ep = {k: [x for o in outs for x in getattr(o.episodes, src)] for k, src in sources.items()}
    # an episode's staleness counts from its first sampled token's weights (Episodes.versions)
    versions = ([v for o in outs for v in o.episodes.versions] if ep else
                [o.version for o in outs for _ in o.responses])
    if ep:
        ep["engine_calls"] = [(e, *call) for e, o in enumerate(outs) for call in o.episodes.engine_calls]
    elif partial:  # the segment calls it was the turn of (a call may carry other steps' sequences too)
        ep["engine_calls"] = [(e, *call) for e, o in enumerate(outs) for call in o.engine_calls or ()]
    return Rollout(prompts, [r for o in outs for r in o.responses], [lp for o in outs for lp in o.logprobs],
                   versions, joined(o.span for o in outs),
                   token_versions=[tv for o in outs for tv in o.token_versions] if partial else None, **ep)
