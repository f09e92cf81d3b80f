"""Ray worker classes, one per role, and the colocated worker that hosts several roles in one
process (the engine samples with the trainer's own model, so a weight sync costs nothing — the
hybrid-engine arrangement verl and DeepSpeed-Chat use).

Each class is plain Python; `runtime.roles` wraps them with `ray.remote` and places them as the
plan says (each on its device's placement-group bundle). Every method that does a stage's work
returns the wall-clock (start, end) it ran, so the driver can write a measured timeline in the
simulator's format.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from rpeg.graph.config import AlgoConfig
from rpeg.runtime.agent_engine import Episodes, EnvSpec, episodes_on
from rpeg.runtime.batch import Batch
from rpeg.runtime.models import autocast
from rpeg.runtime.rollout import HFEngine, InFlight, SamplingParams, SegmentPool
from rpeg.runtime.trainer import MicroBatch, OptimConfig, Trainer
from rpeg.runtime import faults
from rpeg.runtime.weights import Channel, Meta, manifest, verify


class _Where:
    def where(self) -> tuple[str, int]:
        """(the Ray node this worker runs on, its process id): where the plan's ranks landed."""
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()


def _threads(n: int) -> None:
    if n > 0:
        torch.set_num_threads(n)


def _deterministic(on: bool) -> None:
    if on:
        torch.use_deterministic_algorithms(True, warn_only=True)


def _on(device: str) -> str | None:
    """The torch device a worker computes on: None for the CPU (the default path, bit for bit as it
    always was), "cuda" for the one GPU Ray gave the worker (CUDA_VISIBLE_DEVICES holds just it)."""
    return "cuda" if device == "cuda" else None


def _join_group(rank: int, world: int, master: str, device: str | None = None) -> None:
    """Join the process group of `world` ranks meeting at `master` (host:port): NCCL between GPUs,
    gloo on CPU."""
    import torch.distributed as dist

    host, port = master.split(":")
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=port)
    dist.init_process_group("nccl" if device else "gloo", rank=rank, world_size=world)


def _load(path: str):
    from rpeg.runtime.models import load

    return load(path)


def _engine(kind: str, model, tok, model_path: str, *, seed: int, threads: int, memory: float, kv_mib: int = 0,
            tp: bool = False, device: str | None = None, sleep: bool = False, max_seqs: int = 0):
    """The rollout engine the job asks for: `hf` samples with `model` itself; `vllm` loads its own
    copy of the weights from `model_path` and takes new ones through its `load_weights`. `tp`: `model`
    is tensor-parallel over this process group, whose ranks all generate the same batch. `max_seqs`:
    the plan's cap on the sequences a vllm engine runs at once (0: vLLM's default); the hf engine runs
    each call's prompts as one batch, the plan's calls sized by the runtime, so it has no such cap."""
    if kind == "vllm":
        from rpeg.runtime.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, tok.eos_token_id, seed=seed, threads=threads, memory_fraction=memory,
                          kv_cache_bytes=kv_mib * 2**20, dtype="bfloat16" if device else "float32", sleep=sleep,
                          max_num_seqs=max_seqs)
    if tp:
        import torch.distributed as dist

        return HFEngine(model, tok.eos_token_id, tok.pad_token_id, group=dist.group.WORLD, device=device,
                        bf16=device is not None)
    return HFEngine(model, tok.eos_token_id, tok.pad_token_id, device=device, bf16=device is not None)


class Span(NamedTuple):
    """When a worker's part ran (wall clock) and, on a GPU, the peak memory it allocated meanwhile."""

    start: float
    end: float
    peak_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class Timed:
    """A worker's result and the span it took: what the driver records."""

    value: Any
    span: Span


@dataclass(frozen=True, slots=True)
class Generated:
    """An engine's responses to its prompts: token ids, their logprobs, the weight version, the span."""

    responses: list[list[int]]
    logprobs: list[list[float]]
    version: int  # the version generation started with (partial rollout: its first segment's; episodes: the oldest)
    span: Span
    token_versions: list[list[int]] | None = None  # partial rollout: each token's version
    episodes: Episodes | None = None  # multi-turn: openings, observation masks, the environment's rewards
    engine_calls: list[tuple[float, float, int, int]] | None = None  # partial rollout: its calls (InFlight.calls)


def _episodes(engine, tok, problems, spec: EnvSpec, params: SamplingParams, seed: int) -> Generated:
    out = _timed(episodes_on, engine, tok, problems, spec, params, seed)
    ep = out.value
    return Generated(ep.responses, ep.logprobs, min(ep.versions, default=engine.version), out.span, episodes=ep)


def _timed(fn, *args, **kwargs) -> Timed:
    gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    out = fn(*args, **kwargs)
    return Timed(out, Span(t0, time.time(), float(torch.cuda.max_memory_allocated()) if gpu else 0.0))


def _next_turn(method: str, *args):
    """The reference to this actor's `method`(*args), queued behind whatever arrived meanwhile (a weight
    update, another step's turn): a pool's next turn, which `Engines.wait` follows to the result."""
    import ray

    return getattr(ray.get_runtime_context().current_actor, method).remote(*args)


class RolloutWorker(_Where):
    """One generation engine instance with its own copy of the weights; or, with `tp` > 1, one rank
    of a tensor-parallel engine (its process group the engine's `tp` ranks, each holding a
    Megatron-style slice of every decoder layer; every rank runs the same batch)."""

    def __init__(self, model_path: str, threads: int = 0, deterministic: bool = True, engine: str = "hf",
                 seed: int = 0, engine_memory: float = 0.4, engine_kv_cache_mib: int = 0, *, rank: int = 0,
                 tp: int = 1, master: str = "", device: str = "cpu", max_seqs: int = 0, adapters=None):
        """`adapters` (a LoRA): the engine's model holds the job's adapters too, and a weight sync sends
        it the adapters alone (an hf engine; else the trainer sends merged weights)."""
        _threads(threads)
        _deterministic(deterministic)
        dev = _on(device)
        model, tok = _load(model_path)
        if adapters is not None:
            from rpeg.runtime.adapters import attach

            attach(model, adapters, seed)
        if dev and engine == "hf":
            model = model.to(dev)
        if tp > 1:
            from torch.distributed.device_mesh import init_device_mesh

            from rpeg.runtime.trainer import tensor_parallel

            _join_group(rank, tp, master, dev)
            tensor_parallel(model, init_device_mesh(dev or "cpu", (tp,), mesh_dim_names=("tp",)), adapters)
        self.engine = _engine(engine, model, tok, model_path, seed=seed, threads=threads, memory=engine_memory,
                              kv_mib=engine_kv_cache_mib, tp=tp > 1, device=dev, max_seqs=max_seqs)
        self.tok = tok
        self.device = dev
        self.channel: Channel | None = None
        self.pool = SegmentPool()  # partial rollout: every launched step's generations in flight here
        self.episode_pool = None  # partial rollout with episodes (agent_engine.EpisodePool), made when first used
        self.verified: tuple[int, torch.Tensor] | None = None  # the last verified sync: its version, fingerprints

    def generate(self, prompts, params: SamplingParams, seed: int):
        faults.point("generate")
        out = _timed(self.engine.generate, prompts, params, seed)
        return Generated(*out.value, self.engine.version, out.span)

    def episodes(self, problems, spec: EnvSpec, params: SamplingParams, seed: int):
        """One multi-turn episode per problem (runtime.agent_engine): their turns batched on this engine."""
        faults.point("generate")
        return _episodes(self.engine, self.tok, problems, spec, params, seed)

    def episodes_partial(self, problems, spec: EnvSpec, params: SamplingParams, seed: int, key: int = -1):
        """Partial rollout with episodes: these problems' episodes join the worker's episode pool
        (agent_engine.EpisodePool) and the engine serves one call of any step's turns; then either the
        result (every episode done) or the reference to the next turn, queued behind whatever was queued
        meanwhile (a weight update, another step's turn), as `generate_partial` does."""
        faults.point("generate")
        if self.episode_pool is None:
            from rpeg.runtime.agent_engine import EpisodePool

            self.episode_pool = EpisodePool(self.engine, self.tok)
        if key < 0:
            key = self.episode_pool.add(problems, spec, params, seed)
        got = self.episode_pool.turn(key)
        if got is None:
            return _next_turn("episodes_partial", None, spec, params, seed, key)
        ep, versions, started = got
        return Generated(ep.responses, ep.logprobs, min(ep.versions, default=self.engine.version),
                         Span(started, time.time()), token_versions=versions, episodes=ep)

    def generate_partial(self, prompts, params: SamplingParams, seed: int, segment: int, key: int = -1):
        """Partial rollout: these generations join the engine's pool (rollout.SegmentPool) and advance a
        segment, batched with every other launched step's in flight here; then either the result (every
        sequence done) or the reference to their next turn (`key`: their place in the pool), queued on this
        same engine behind whatever was queued meanwhile (a weight update, another step's turn).
        `Engines.wait` follows the references to the result."""
        faults.point("generate")
        if key < 0:
            key = self.pool.add(InFlight(prompts, params, seed, segment, start=time.time()))
        state = self.pool.advance(key, self.engine)
        if state is None:
            return _next_turn("generate_partial", None, params, seed, segment, key)
        return Generated(state.tokens, state.logprobs, state.start_version, Span(state.start, time.time()),
                         token_versions=state.versions, engine_calls=state.calls)

    def open_channel(self, master: str, rank: int, world: int, metas: tuple[Meta, ...], verify_every: int = 1) -> None:
        """Join the weight-sync group (runtime.weights) as rank `rank` of `world`: a receiver."""
        self.channel = Channel(master, rank, world, metas, self.device, verify_every)

    def receive_weights(self, version: int):
        """The trainer's new weights, broadcast over the weight-sync group, into the engine, checked against
        the trainer's fingerprints where the sync carries them (runtime.weights.verify): the span."""
        faults.point("receive_weights")
        t = time.time()
        ch = self.channel
        state = ch.receive()
        served = getattr(self.engine, "served", None)
        where = f"engine rank {ch.rank}"
        if ch.expected is not None and self.verified is not None and served is not None:
            verify(ch.metas, self.verified[1], None, served(), where,
                   served_as=f"was served since version {self.verified[0]}")  # what it sampled with meanwhile
        self.engine.load_weights(state, version)
        if ch.expected is not None:
            verify(ch.metas, ch.expected, state, served() if served else None, f"{where} (version {version})")
        self.verified = (version, ch.expected) if ch.expected is not None else None
        faults.after_load(self.engine, ch.rank, version)
        return Span(t, time.time())


class TrainerWorker(_Where):
    """One rank of a training group: FSDP2 over its `world / (pp tp)` data-parallel ranks, `pp`
    pipeline stages, and DTensor tensor parallelism over `tp` consecutive ranks (gloo on CPU)."""

    def __init__(self, model_path: str, config: AlgoConfig, optim: OptimConfig, *, lm: bool, value: bool, rank: int,
                 world: int, master: str, tp: int = 1, pp: int = 1, pp_schedule: str = "1f1b", threads: int = 0,
                 deterministic: bool = True, seed: int = 0, device: str = "cpu", lora=None, merged: bool = False):
        """`lora`: the model trains the job's adapters (runtime.adapters); a weight sync then sends the
        engines the adapters alone, or with `merged` the weights with the adapters folded in."""
        _threads(threads)
        _deterministic(deterministic)
        dev = _on(device)
        if world > 1:
            _join_group(rank, world, master, dev)
        torch.manual_seed(seed)
        model, _ = _load(model_path)
        self.trainer = Trainer(model, config, optim, lm=lm, value=value, shard=world > tp * pp, tp=tp, pp=pp,
                               pp_schedule=pp_schedule, device=dev, bf16=dev is not None, lora=lora, seed=seed)
        self.rank, self.device, self.merged = rank, dev, merged
        self.channel: Channel | None = None

    def logprobs(self, batch: Batch):
        faults.point("logprobs")
        return _timed(self.trainer.logprobs, batch)

    def ref_logprobs(self, batch: Batch):
        """The reference's logprobs with LoRA: this model with its adapters off (the base policy)."""
        faults.point("logprobs")
        return _timed(self.trainer.base_logprobs, batch)

    def values(self, batch: Batch):
        return _timed(self.trainer.values, batch)

    def logprobs_values(self, batch: Batch):
        return _timed(self.trainer.logprobs_and_values, batch)

    def train(self, batch: Batch, epochs: int, mini_batches: int, seed: int):
        faults.point("train")
        return _timed(self.trainer.train, batch, epochs, mini_batches, seed)

    def weight_manifest(self) -> tuple[Meta, ...]:
        """The full weights' names, shapes and dtypes (every rank gathers; rank 0's stands)."""
        return manifest(self.trainer.engine_weights(self.merged))

    def open_channel(self, master: str, world: int, metas: tuple[Meta, ...], verify_every: int = 1) -> None:
        """Rank 0: form the weight-sync group (runtime.weights) with the `world - 1` engine ranks."""
        self.channel = Channel(master, 0, world, metas, self.device, verify_every)

    def send_weights(self):
        """Every rank gathers the full weights; rank 0 broadcasts them to the engines: the span."""
        faults.point("send_weights")
        t = time.time()
        state = self.trainer.engine_weights(self.merged, keep_device=True)
        if self.channel is not None:
            self.channel.send(state)
        return Span(t, time.time())

    def checkpoint_state(self):
        faults.point("checkpoint_state")
        return self.trainer.checkpoint_state()

    def restore(self, state) -> None:
        self.trainer.load_checkpoint_state(state)


class InferenceWorker(_Where):
    """A frozen model's forward pass: reference logprobs."""

    def __init__(self, model_path: str, threads: int = 0, temperature: float = 1.0,
                 micro_batch: MicroBatch | int = 64, device: str = "cpu"):
        _threads(threads)
        dev = _on(device)
        model, _ = _load(model_path)
        self.trainer = Trainer(model.eval(), AlgoConfig(adv_estimator="grpo"),
                               OptimConfig(temperature=temperature, forward_batch=micro_batch), lm=True, device=dev,
                               bf16=dev is not None)

    def logprobs(self, batch: Batch):
        faults.point("logprobs")
        return _timed(self.trainer.logprobs, batch)


class RewardWorker(_Where):
    """A reward model (a sequence-classification head with one label) scoring whole sequences."""

    def __init__(self, model_path: str, threads: int = 0, micro_batch: MicroBatch | int = 64, device: str = "cpu"):
        from rpeg.runtime.models import load_reward

        _threads(threads)
        self.device = _on(device)
        self.model, self.tok = load_reward(model_path)
        if self.device:
            self.model = self.model.to(self.device)
        self.micro_batch = MicroBatch(rows=micro_batch) if isinstance(micro_batch, int) else micro_batch

    @torch.no_grad()
    def score(self, texts: list[str]):
        """One score per text (prompt and response as the policy decoded them, re-tokenized by the
        reward model's own tokenizer, as systems do when the two tokenizers differ)."""
        t = time.time()
        out = []
        # the plan's micro-batch: a token budget counts the texts as the reward model tokenizes them
        length = max((len(ids) for ids in self.tok(texts, add_special_tokens=False)["input_ids"]), default=1)
        rows = self.micro_batch.rows_for(length)
        for i in range(0, len(texts), rows):
            enc = self.tok(texts[i:i + rows], return_tensors="pt", padding=True, add_special_tokens=False)
            if self.device:
                enc = enc.to(self.device)
            with autocast(self.device, self.device is not None):
                out.append(self.model(**enc).logits[:, 0].float().cpu())
        return Timed(torch.cat(out), Span(t, time.time()))


class ColocatedWorker(_Where):
    """Rollout, actor training, reference and critic on the same device, in one process; on N
    devices (the hybrid engine), one such process per device: rank r of `world` holds its FSDP2
    shard of the actor (and of a critic), gathers the full weights into its engine in-process at
    each weight sync, and generates its share of the prompts."""

    def __init__(self, model_path: str, config: AlgoConfig, optim: OptimConfig, *, reference: bool, critic: bool,
                 shared_value: bool, ref_optim: OptimConfig | None = None, critic_optim: OptimConfig | None = None,
                 threads: int = 0, deterministic: bool = True, seed: int = 0,
                 engine: str = "hf", engine_memory: float = 0.4, engine_kv_cache_mib: int = 0, rank: int = 0,
                 world: int = 1, master: str = "", device: str = "cpu", max_seqs: int = 0, lora=None,
                 critic_lora=None, merged: bool = False):
        """`lora`, `critic_lora`: the actor (the critic) trains the job's adapters (runtime.adapters); the
        reference is then the actor with its adapters off, and an engine holding its own copy takes the
        adapters alone, or with `merged` the weights with the adapters folded in."""
        _threads(threads)
        _deterministic(deterministic)
        dev = _on(device)
        if world > 1:
            _join_group(rank, world, master, dev)
        torch.manual_seed(seed)
        model, tok = _load(model_path)
        sharded = world > 1
        on = {"device": dev, "bf16": dev is not None}
        self.actor = Trainer(model, config, optim, lm=True, value=shared_value, shard=sharded, lora=lora, seed=seed,
                             **on)
        self.merged = merged
        # hf on one device: the engine samples with the trainer's own model; a sharded trainer's model
        # cannot sample alone, so the engine holds a full copy; vllm always holds its own; both copies
        # are refreshed in-process from the (gathered) trainer weights
        own = self.actor.model
        if sharded:
            own = _load(model_path)[0]
            if lora is not None and not merged and engine == "hf":
                from rpeg.runtime.adapters import attach

                attach(own, lora, seed)
            if dev and engine == "hf":
                own = own.to(dev)
        # on a GPU a vllm engine sleeps while the trainer trains (its weights to host, its KV cache freed)
        # and wakes before it generates: vLLM's sleep mode, as verl and NeMo-RL colocate it
        self.sleeps = engine == "vllm" and dev is not None
        self.engine = _engine(engine, own, tok, model_path, seed=seed, threads=threads, memory=engine_memory,
                              kv_mib=engine_kv_cache_mib, device=dev, sleep=self.sleeps, max_seqs=max_seqs)
        self.tok, self.rank = tok, rank
        self.shares_model = isinstance(self.engine, HFEngine) and not sharded
        self.ref = (Trainer(_load(model_path)[0].eval(), config, ref_optim or optim, lm=True, **on)
                    if reference and lora is None else None)  # with LoRA: the actor, adapters off
        self.critic = Trainer(_load(model_path)[0], config, critic_optim or optim, lm=False, value=True, shard=sharded,
                              lora=critic_lora, seed=seed, **on) if critic else None

    def generate(self, prompts, params: SamplingParams, seed: int):
        faults.point("generate")
        if self.shares_model:
            self.engine.model.eval()
        if self.sleeps:
            self.engine.wake()
        out = _timed(self.engine.generate, prompts, params, seed)
        return Generated(*out.value, self.engine.version, out.span)

    def episodes(self, problems, spec: EnvSpec, params: SamplingParams, seed: int):
        faults.point("generate")
        if self.shares_model:
            self.engine.model.eval()
        if self.sleeps:
            self.engine.wake()
        return _episodes(self.engine, self.tok, problems, spec, params, seed)

    def load_weights(self, version: int):
        """In-process: an `hf` engine sharing the trainer's model already holds its weights; an own
        copy (vllm, or a sharded trainer's: every rank gathers the shards) gets them as tensors."""
        faults.point("load_weights")
        t = time.time()
        if self.shares_model:
            self.engine.version = version
        else:
            if self.sleeps:
                self.engine.wake()
            self.engine.load_weights(self.actor.engine_weights(self.merged), version)
        faults.after_load(self.engine, self.rank, version, hang_rank=0)
        return Span(t, time.time())

    def logprobs(self, batch: Batch):
        faults.point("logprobs")
        return _timed(self.actor.logprobs, batch)

    def ref_logprobs(self, batch: Batch):
        return _timed(self.ref.logprobs if self.ref is not None else self.actor.base_logprobs, batch)

    def values(self, batch: Batch):
        return _timed((self.critic or self.actor).values, batch)

    def logprobs_values(self, batch: Batch):
        return _timed(self.actor.logprobs_and_values, batch)

    def train(self, batch: Batch, epochs: int, mini_batches: int, seed: int):
        faults.point("train")
        if self.sleeps:
            self.engine.sleep()
        out = _timed(self.actor.train, batch, epochs, mini_batches, seed)
        if self.shares_model:
            self.engine.model.eval()
        return out

    def train_critic(self, batch: Batch, epochs: int, mini_batches: int, seed: int):
        return _timed(self.critic.train, batch, epochs, mini_batches, seed)

    def train_fused(self, batch: Batch, epochs: int, mini_batches: int, seed: int):
        """Actor and critic updates in one schedule (the plan fuses them): their optimizer steps
        alternate, mini-batch by mini-batch; each model's math is what its own update computes."""
        faults.point("train")
        from rpeg.runtime.trainer import mean_metrics

        def both():
            actor, critic = [], []
            for a, c in zip(self.actor.steps(batch, epochs, mini_batches, seed),
                            self.critic.steps(batch, epochs, mini_batches, seed), strict=True):
                actor.append(a)
                critic.append(c)
            return mean_metrics(actor), mean_metrics(critic)

        if self.sleeps:
            self.engine.sleep()
        out = _timed(both)
        if self.shares_model:
            self.engine.model.eval()
        return out

    def checkpoint_state(self):
        faults.point("checkpoint_state")
        return self.actor.checkpoint_state()

    def critic_checkpoint_state(self):
        return None if self.critic is None else self.critic.checkpoint_state()

    def restore(self, state) -> None:
        self.actor.load_checkpoint_state(state)

    def restore_critic(self, state) -> None:
        self.critic.load_checkpoint_state(state)
