"""The workers of a plan, one handle per model role, with the same calls wherever they run.

A colocated plan runs every role in one worker process (the engine samples with the trainer's
model); a split plan runs `dp` generation engines, an FSDP2 group for the actor, one for a
separate critic, and a reference worker. The driver sees neither: it asks a `Role` to `call` one
of a few uniform operations (`logprobs`, `values`, `train`, `state`, `restore`) and the role maps it
onto its workers' methods, shards the batch over its data-parallel ranks and joins the results.

`step_stages` finds the stages of one step by what they are (kind, model, what they read and
write), never by their names, so a graph's stage names are only labels in the measured timeline.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field, replace

import torch

from rpeg.errors import RpegError
from rpeg.graph import Graph, Kind
from rpeg.runtime.batch import Batch
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.trainer import MicroBatch, OptimConfig
from rpeg.runtime.engines import Engines, joined, shards
from rpeg.runtime.workers import Span, Timed


@dataclass(frozen=True, slots=True)
class StepStages:
    """The stages of one step, by what they do; each value is the graph's stage name (a label)."""

    generate: str
    reward: str
    sync: str
    actor_logprobs: str
    advantages: str
    actor_update: str
    greedy: str | None = None  # a greedy generation per prompt (ReMax's baseline)
    greedy_reward: str | None = None
    group_filter: str | None = None  # a per-group filter between scoring and training (DAPO)
    ref_logprobs: str | None = None
    values: str | None = None  # the pass that gives the values: a critic's, or the actor's with a value head
    critic_update: str | None = None


def micro_batch(graph: Graph, stage: str) -> MicroBatch:
    """What one forward (or forward and backward) call of `stage` takes, as its layout says."""
    return MicroBatch.of(graph.stage(stage).layout, int(math.ceil(graph.job.max_seq_len)))


def optim_configs(graph: Graph, names: StepStages, rt: RuntimeConfig) -> tuple[OptimConfig, OptimConfig | None,
                                                                               OptimConfig | None]:
    """The actor's, the reference's and a separate critic's trainer settings: the run's optimizer and
    each pass's micro-batch from its stage's layout (updates: the training stage's; logprobs and
    values: the forward stage's)."""
    base = OptimConfig(lr=rt.lr, warmup_steps=rt.warmup_steps, grad_clip=rt.grad_clip, temperature=rt.temperature)
    actor = replace(base, micro_batch=micro_batch(graph, names.actor_update),
                    forward_batch=micro_batch(graph, names.actor_logprobs))
    ref = replace(base, forward_batch=micro_batch(graph, names.ref_logprobs)) if names.ref_logprobs else None
    critic = None
    if names.critic_update:
        critic = replace(base, micro_batch=micro_batch(graph, names.critic_update),
                         forward_batch=micro_batch(graph, names.values or names.critic_update))
    return actor, ref, critic


def step_stages(graph: Graph) -> StepStages:
    stages = graph.stages

    def one(pred):
        return next((s for s in stages if pred(s)), None)

    def reads_from(producer, kind):
        return one(lambda s: s.kind is kind and producer is not None and set(s.reads) & set(producer.writes))

    generate = one(lambda s: s.kind is Kind.GENERATE and not s.greedy)
    greedy = one(lambda s: s.kind is Kind.GENERATE and s.greedy)
    reward = reads_from(generate, Kind.REWARD)
    greedy_reward = reads_from(greedy, Kind.REWARD)
    infer: dict = {}
    for s in stages:
        if s.kind is Kind.INFER:
            infer.setdefault(s.model, s)
    train = {s.model: s for s in stages if s.kind is Kind.TRAIN}
    actor_in = set(infer["actor"].reads)
    computes = [s for s in stages if s.kind is Kind.COMPUTE]
    group_filter = next((s for s in computes if set(s.writes) & actor_in), None)
    advantages = next(s for s in computes if s is not group_filter and set(s.writes) & set(train["actor"].reads))
    sync = next(s for s in stages if s.kind is Kind.SYNC and s.model == "actor")
    name = lambda s: s.name if s is not None else None  # noqa: E731
    return StepStages(generate=generate.name, reward=reward.name, sync=sync.name,
                      actor_logprobs=infer["actor"].name, advantages=advantages.name,
                      actor_update=train["actor"].name, greedy=name(greedy), greedy_reward=name(greedy_reward),
                      group_filter=name(group_filter), ref_logprobs=name(infer.get("ref")),
                      values=name(one(lambda s: s.kind is Kind.INFER and "values" in s.writes)),
                      critic_update=name(train.get("critic")))


# A worker on a GPU asks Ray for this share of its bundle's one GPU: enough for Ray to give it that
# GPU (CUDA_VISIBLE_DEVICES), little enough that every role the plan puts on the device fits (a
# colocated reference, a scorer beside a trainer): the plan decides what shares a device, not Ray.
GPU_SHARE = 0.01
PLACEMENT_TIMEOUT_S = 60.0  # waiting longer for a Ray cluster's free devices means it has too few
# the ports one build of the workers' groups may take (training, critic, weight sync, an engine's each)
# above its base: a restart's build meets on the next ones, never on the killed workers' sockets
PORTS_PER_ATTEMPT = 64


class Placement:
    """The plan's device groups as Ray placement groups: one bundle per device, packed per node.
    Groups that overlap (a colocated plan's stages all on one group, a reference on the trainer's
    devices) share one placement group over their union; disjoint groups get one each. A rank on
    device d of the plan runs in that device's bundle, so Ray puts it on the node holding it."""

    def __init__(self, ray, graph: Graph, bundle: dict | None = None):
        from ray.util.placement_group import placement_group

        self.ray = ray
        spans = sorted({(g.first, g.count) for g in graph.groups})
        merged: list[list[int]] = []
        for first, count in spans:
            if merged and first < merged[-1][0] + merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], first + count - merged[-1][0])
            else:
                merged.append([first, count])
        bundle = bundle or {"CPU": 1}
        self.parts = [(first, count, placement_group([dict(bundle) for _ in range(count)], strategy="PACK"))
                      for first, count in merged]
        try:
            ray.get([pg.ready() for *_, pg in self.parts], timeout=PLACEMENT_TIMEOUT_S)
        except Exception:
            self.close()
            need = sum(c for _, c, _ in self.parts)
            raise RpegError(f"the Ray cluster could not place the plan's {need} device(s) within "
                            f"{PLACEMENT_TIMEOUT_S:.0f} s (one bundle of {bundle} each; it has "
                            f"{ray.cluster_resources().get('CPU', 0):g} CPUs): use a plan for fewer devices or a "
                            "larger cluster") from None

    def on(self, device: int) -> dict:
        """Ray actor options that put a worker on plan device `device`."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        for first, count, pg in self.parts:
            if first <= device < first + count:
                return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=device - first)}
        raise RpegError(f"device {device} is in none of the plan's device groups")

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for *_, pg in self.parts:
            try:
                remove_placement_group(pg)
            except Exception:  # the cluster is going away anyway
                pass


@dataclass
class Role:
    """One model role's workers. `tp` consecutive ranks hold one data shard (a shard's tensor- and
    pipeline-parallel ranks: each gets the same rows; the first one's result stands for them)."""

    ray: object
    workers: list
    methods: dict[str, str]  # uniform operation -> the workers' method
    tp: int = 1

    def submit(self, op: str, batch: Batch, *args) -> list:
        """Start `op` on the workers (their data shards) without waiting: the futures, for `wait`."""
        method = self.methods[op]
        rows = shards(batch.size, len(self.workers) // self.tp)
        return [getattr(w, method).remote(batch.select(rows[r // self.tp]), *args)
                for r, w in enumerate(self.workers)]

    def wait(self, futures: list, what: str = "") -> tuple[list, Span]:
        """Each data shard's result, in order, and the span from first start to last end."""
        outs = self.ray.get(futures, what=what or "the role's workers")  # each rank's workers.Timed
        return [o.value for r, o in enumerate(outs) if r % self.tp == 0], joined(o.span for o in outs)

    def collective(self, op: str):
        """A call every rank takes part in (gathering sharded weights); rank 0's result."""
        return self.each(op)[0]

    def each(self, op: str, *args) -> list:
        return self.ray.get(self.start_each(op, *args), what=f"{self.methods[op]} on every rank")

    def start_each(self, op: str, *args) -> list:
        """`op` started on every worker with the same arguments: the futures."""
        return [getattr(w, self.methods[op]).remote(*args) for w in self.workers]


@dataclass(frozen=True, slots=True)
class Updated:
    """A step's (or mini-batch's) update: the actor's metrics and span, and a trained critic's."""

    actor: Timed
    critic: Timed | None = None


@dataclass
class PendingUpdate:
    """An update's futures: the fused actor-critic call's, or the actor's and a trained critic's."""

    fused: list | None = None
    actor: list | None = None
    critic: list | None = None


@dataclass
class Roles:
    """Every worker of the plan: generation engines and a Role per model that runs."""

    ray: object
    colocated: bool
    engines: Engines
    actor: Role
    reference: Role | None = None
    critic: Role | None = None  # values, and `train` when the critic is its own model
    critic_trained: bool = False
    workers: list = field(default_factory=list)  # every distinct handle
    placement: Placement | None = None
    scorers: list = field(default_factory=list)  # a reward model's workers, one per device of its stage
    labels: dict = field(default_factory=dict)  # each worker's actor id (hex) -> what it is, for the logs
    # a split plan's: "engine"(j, attempt) -> engine j's new ranks; "sync"(attempt) forms the weight-sync group
    respawn: dict = field(default_factory=dict)

    def score(self, texts: list[str]) -> tuple[torch.Tensor, tuple[float, float]]:
        """The reward model's score of each text, the texts split over its scorers."""
        parts = shards(len(texts), len(self.scorers))
        outs = self.ray.get([w.score.remote([texts[i] for i in idx]) for w, idx in zip(self.scorers, parts)],
                            what="the reward model")
        return torch.cat([o.value for o in outs]), joined(o.span for o in outs)

    @classmethod
    def build(cls, graph: Graph, rt: RuntimeConfig, model_path: str, ray, reward_path: str = "",
              names: StepStages | None = None, attempt: int = 0) -> Roles:
        """`ray`: the module, or runtime.waits.BoundedRay (the module is wrapped in one bounded by the floor,
        runtime.wait_timeout_s, until the driver sets the plan's bound). `attempt`: how many times the run's
        workers were restarted before (their groups then meet on other ports than the killed ones')."""
        from rpeg.runtime.waits import BoundedRay

        if not isinstance(ray, BoundedRay):
            ray = BoundedRay(ray, 0.0, rt.wait_timeout_s, rt.startup_timeout_s)
        names = names or step_stages(graph)
        place = Placement(ray, graph, {"CPU": 1, "GPU": 1} if rt.device == "cuda" else None)
        try:
            return cls._with_scorers(cls._build(graph, names, rt, model_path, ray, place, attempt), graph, names, rt,
                                     ray, reward_path)
        except BaseException:  # a worker that failed to start: the devices back (Ray kills what they held)
            place.close()
            raise

    @classmethod
    def _with_scorers(cls, roles: Roles, graph: Graph, names: StepStages, rt: RuntimeConfig, ray,
                      reward_path: str) -> Roles:
        reward = graph.stage(names.reward)
        if reward.model is not None:  # a reward model: one scorer per device of its stage
            from rpeg.runtime import workers as W

            grp, n = graph.group(reward.group), reward.layout.dp
            threads = rt.threads or max(1, (os.cpu_count() or 2) // max(1, len(roles.workers) + n))
            gpus = GPU_SHARE if rt.device == "cuda" else 0
            roles.scorers = [ray.remote(num_cpus=0, num_gpus=gpus)(W.RewardWorker).options(
                **roles.placement.on(grp.first + d)).remote(reward_path, threads,
                                                          micro_batch(graph, reward.name), rt.device)
                for d in range(n)]
        roles.labels = roles._labels(graph, names)
        return roles

    def _labels(self, graph: Graph, names: StepStages) -> dict:
        """Each worker's actor id -> what it is and the plan device it sits on, as the logs name it."""
        out = {}

        def name(worker, what: str, device: int) -> None:
            out.setdefault(worker._actor_id.hex(), f"{what} (plan device {device})")
        first = {s: graph.group(graph.stage(s).group).first for s in (names.generate, names.actor_update)}
        if self.colocated:
            for r, w in enumerate(self.actor.workers):
                name(w, f"colocated worker {r} (engine, actor{', reference' if self.reference else ''}"
                        f"{', critic' if self.critic_trained else ''})", first[names.generate] + r)
        else:
            tp = len(self.engines.ranks[0])
            for j, ranks in enumerate(self.engines.ranks):
                for r, w in enumerate(ranks):
                    name(w, f"engine {j}" + (f" rank {r}" if tp > 1 else ""), first[names.generate] + j * tp + r)
            for r, w in enumerate(self.actor.workers):
                name(w, f"actor rank {r}", first[names.actor_update] + r)
            for role, stage in ((self.reference, names.ref_logprobs), (self.critic, names.critic_update)):
                if role is not None and role is not self.actor:
                    what = "reference" if role is self.reference else "critic"
                    for r, w in enumerate(role.workers):
                        name(w, f"{what} rank {r}", graph.group(graph.stage(stage).group).first + r)
        if self.scorers:
            reward = graph.stage(names.reward)
            for d, w in enumerate(self.scorers):
                name(w, f"reward model {d}", graph.group(reward.group).first + d)
        return out

    def kill(self) -> None:
        """Every worker killed (SIGKILL: a stopped or hung one too) and the devices given back: what a
        restart of the run's workers starts from."""
        self._kill(self.workers + self.scorers)
        self.close()

    def _kill(self, workers: list) -> None:
        for w in workers:
            try:
                self.ray.kill(w, no_restart=True)
            except Exception:  # already dead
                pass

    @classmethod
    def _build(cls, graph: Graph, names: StepStages, rt: RuntimeConfig, model_path: str, ray, place: Placement,
               attempt: int = 0) -> Roles:
        from rpeg.runtime import workers as W

        cfg = graph.config
        gen, train = graph.stage(names.generate), graph.stage(names.actor_update)
        colocated = graph.group(gen.group).overlaps(graph.group(train.group))
        has_ref, has_critic = graph.has_model("ref"), graph.has_model("critic")
        shared_value = "value" in graph.model("actor").heads
        optim, ref_optim, critic_optim = optim_configs(graph, names, rt)
        cores = os.cpu_count() or 2
        gpu = rt.device == "cuda"
        dev = {"device": rt.device}
        lora, critic_lora = graph.model("actor").lora, graph.model("critic").lora if has_critic else None
        # what the engines take: the adapters alone, or merged weights (vLLM always: docs/runtime.md, "LoRA")
        merged = lora is not None and (lora.sync == "merged" or rt.engine == "vllm")

        def remote(klass, device: int):  # on its plan device's bundle; threads are ours, not Ray's CPU count
            return ray.remote(num_cpus=0, num_gpus=GPU_SHARE if gpu else 0)(klass).options(**place.on(device))

        def first(stage: str) -> int:
            return graph.group(graph.stage(stage).group).first
        model_ops = {"logprobs": "logprobs", "values": "values", "train": "train", "state": "checkpoint_state",
                     "restore": "restore", "train_fused": "train_fused", "send": "send_weights",
                     "logprobs_values": "logprobs_values"}
        base = 29500 + random.Random(os.getpid()).randrange(2000)

        def port(attempt: int) -> int:
            return base + PORTS_PER_ATTEMPT * attempt

        def meet(device: int, offset: int = 0, attempt: int = attempt) -> str:
            """A group's rendezvous: its rank 0's node (here otherwise), on `attempt`'s ports."""
            return f"{_node_ip(ray, place.on(device))}:{port(attempt) + offset}"
        if colocated:  # one process per device, each hosting every role (FSDP2 shards across them)
            n = train.layout.devices
            master = meet(first(names.actor_update)) if n > 1 else ""
            cws = [remote(W.ColocatedWorker, first(names.generate) + r).remote(
                model_path, cfg, optim, ref_optim=ref_optim, critic_optim=critic_optim, reference=has_ref,
                critic=has_critic, shared_value=shared_value,
                threads=rt.threads or max(1, cores // n), deterministic=rt.deterministic, seed=rt.seed,
                engine=rt.engine, engine_memory=rt.engine_memory, engine_kv_cache_mib=rt.engine_kv_cache_mib,
                rank=r, world=n, master=master, max_seqs=gen.layout.max_seqs, lora=lora, critic_lora=critic_lora,
                merged=merged, **dev) for r in range(n)]
            actor = Role(ray, cws, model_ops)
            reference = Role(ray, cws, {"logprobs": "ref_logprobs"}) if has_ref else None
            critic = None
            if has_critic:
                critic = Role(ray, cws, {"values": "values", "train": "train_critic",
                                         "state": "critic_checkpoint_state", "restore": "restore_critic"})
            elif shared_value:
                critic = actor
            return cls(ray, True, Engines(ray, [[w] for w in cws]), actor, reference, critic, has_critic, cws, place)
        ngen, gtp, ntrain, tp, pp = gen.layout.dp, gen.layout.tp, train.layout.devices, train.layout.tp, train.layout.pp
        threads = rt.threads or max(1, cores // (ngen * gtp + ntrain))
        def engine(j: int, attempt: int) -> list:  # engine j: gtp consecutive devices, a group of its own if gtp > 1
            master = meet(first(names.generate) + j * gtp, 3 + j, attempt) if gtp > 1 else ""
            return [remote(W.RolloutWorker, first(names.generate) + j * gtp + r).remote(
                model_path, threads, rt.deterministic, rt.engine, rt.seed + j, rt.engine_memory,
                rt.engine_kv_cache_mib, rank=r, tp=gtp, master=master, max_seqs=gen.layout.max_seqs,
                adapters=lora if lora is not None and not merged else None, **dev)
                for r in range(gtp)]
        ranks = [engine(j, attempt) for j in range(ngen)]
        master = meet(first(names.actor_update))
        trainers = [remote(W.TrainerWorker, first(names.actor_update) + r).remote(
            model_path, cfg, optim, lm=True, value=shared_value, rank=r, world=ntrain, master=master,
            tp=tp, pp=pp, pp_schedule=rt.pp_schedule, threads=threads, deterministic=rt.deterministic, seed=rt.seed,
            lora=lora, merged=merged, **dev) for r in range(ntrain)]
        actor = Role(ray, trainers, model_ops, tp=tp * pp)  # the pp x tp ranks of a data shard take the same rows
        reference = None
        if has_ref and lora is not None:  # the LoRA reference: the actor's trainers with adapters off
            reference = Role(ray, trainers, {"logprobs": "ref_logprobs"}, tp=tp * pp)
        elif has_ref:  # one full copy per device of its stage, each scoring its share of the rows
            refs = [remote(W.InferenceWorker, first(names.ref_logprobs) + r).remote(
                model_path, threads, rt.temperature, ref_optim.forward_batch, **dev)
                for r in range(graph.stage(names.ref_logprobs).layout.dp)]
            reference = Role(ray, refs, {"logprobs": "logprobs"})
        critic = actor if shared_value else None
        if has_critic:
            clay = graph.stage(names.critic_update).layout
            critics = [remote(W.TrainerWorker, first(names.critic_update) + r).remote(
                model_path, cfg, critic_optim, lm=False, value=True, rank=r, world=clay.devices,
                master=meet(first(names.critic_update), 1), tp=clay.tp, threads=threads, deterministic=rt.deterministic,
                seed=rt.seed, lora=critic_lora, **dev) for r in range(clay.devices)]
            critic = Role(ray, critics, model_ops, tp=clay.tp)
        engines = Engines(ray, ranks)
        # the weight-sync group: the actor's rank 0 and every engine rank, meeting at rank 0 (runtime.weights)
        metas = ray.get([t.weight_manifest.remote() for t in trainers], what="the trainers' start")[0]

        def form_sync(attempt: int) -> None:
            sync, world, every = meet(first(names.actor_update), 2, attempt), 1 + len(engines.workers), \
                rt.verify_sync_every
            ray.get([trainers[0].open_channel.remote(sync, world, metas, every)] +
                    [w.open_channel.remote(sync, 1 + i, world, metas, every) for i, w in enumerate(engines.workers)],
                    what="the weight-sync group's forming")
        form_sync(attempt)
        everyone = engines.workers + trainers + (reference.workers if reference and lora is None else []) + \
            (critic.workers if critic is not None and critic is not actor else [])
        return cls(ray, False, engines, actor, reference, critic, has_critic, everyone, place,
                   respawn={"engine": engine, "sync": form_sync})

    def restart_engines(self, dead: list[int], attempt: int, version: int) -> Span:
        """Engines `dead` (a split plan's) killed and started again on their devices, the weight-sync group
        formed anew with them (on `attempt`'s ports) and weight `version` pushed to every engine: the span
        of the push. The other workers, and what they hold, stay as they are."""
        swap = {}  # a killed rank's actor id -> its new rank
        for j in dead:
            self._kill(self.engines.ranks[j])
            old, self.engines.ranks[j] = self.engines.ranks[j], self.respawn["engine"](j, attempt)
            for o, new in zip(old, self.engines.ranks[j]):
                swap[o._actor_id.hex()] = new
                self.labels[new._actor_id.hex()] = self.labels.get(o._actor_id.hex(), f"engine {j}")
        self.workers = [swap.get(w._actor_id.hex(), w) for w in self.workers]
        self.respawn["sync"](attempt)
        return self.push_weights(version)

    def update(self, batch: Batch, *args, fused: bool = False) -> Updated:
        """The actor's update and a trained critic's. Fused by the plan on one worker, their optimizer
        steps alternate in one call (one span for both); otherwise both start at once: on their own
        devices they run concurrently, sharing one worker it runs them in turn."""
        return self.finish_update(self.start_update(batch, *args, fused=fused))

    def start_update(self, batch: Batch, *args, fused: bool = False) -> PendingUpdate:
        """`update` started, not waited for (a streamed mini-batch's, while later ones are still scored)."""
        if fused and self.colocated and self.critic_trained:
            return PendingUpdate(fused=self.actor.submit("train_fused", batch, *args))
        return PendingUpdate(actor=self.actor.submit("train", batch, *args),
                             critic=self.critic.submit("train", batch, *args) if self.critic_trained else None)

    def finish_update(self, pending: PendingUpdate) -> Updated:
        if pending.fused is not None:
            outs, span = self.actor.wait(pending.fused, "the actor's and critic's update")
            actor, critic = outs[0]
            return Updated(Timed(actor, span), Timed(critic, span))
        outs, span = self.actor.wait(pending.actor, "the actor's update")
        if pending.critic is None:
            return Updated(Timed(outs[0], span))
        critic, cspan = self.critic.wait(pending.critic, "the critic's update")
        return Updated(Timed(outs[0], span), Timed(critic[0], cspan))

    def close(self) -> None:
        """Give the devices back (a private cluster goes away anyway; a user's keeps running)."""
        if self.placement is not None:
            self.placement.close()

    def push_weights(self, version: int) -> Span:
        """New actor weights into the engines: in-process when colocated, else the actor's ranks gather
        them and its rank 0 broadcasts them over the weight-sync group (never through the driver)."""
        if self.colocated:
            return self.engines.load(version)
        t = time.time()
        sends, receives = self.actor.start_each("send"), self.engines.receive(version)
        spans = self.ray.get(sends + receives, what="the weight sync (the trainer's rank 0, then the engines)")
        return Span(t, max(s.end for s in spans))

    def states(self) -> dict:
        """What a checkpoint keeps of the models: the actor's and a trained critic's state."""
        return {"actor": self.actor.collective("state"),
                "critic": self.critic.collective("state") if self.critic_trained else None}

    def restore(self, state: dict) -> None:
        self.actor.each("restore", state["actor"])
        if state.get("critic") is not None:
            self.critic.each("restore", state["critic"])


def _node_ip(ray, options: dict) -> str:
    """The IP address of the node a placement bundle sits on (where a training group's rank 0 runs)."""

    @ray.remote(num_cpus=0)
    def ip() -> str:
        import ray as module  # the worker's own (the driver's may be wrapped: runtime.waits.BoundedRay)

        return module.util.get_node_ip_address()

    return ray.get(ip.options(**options).remote())
