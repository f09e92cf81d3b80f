"""The trainer role: a policy (optionally with a value head) or a critic, its optimizer and LR
schedule; logprobs, values, and PPO-style updates. Parallelism is applied to the unmodified
Hugging Face model: tensor parallelism with DTensor (`parallelize_module`: column-parallel
q/k/v and gate/up projections, row-parallel output and down projections, as Megatron splits a
layer) over the mesh's `tp` dimension, then data parallelism with FSDP2 (`fully_shard` on every
decoder layer and the root) over its `dp` dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from rpeg.graph.config import AlgoConfig
from rpeg.runtime import algos
from rpeg.runtime.batch import Batch
from rpeg.runtime.models import autocast


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """What one forward (or forward and backward) call takes, as the stage's layout says: `rows`
    sequences padded to the batch's longest; with `tokens` > 0 (a packed layout's token budget,
    micro_batch x the job's longest sequence) as many padded rows as fit in `tokens`, at least one.
    The runtime pads instead of concatenating sequences, so where lengths vary a packed micro-batch
    holds fewer sequences than packing would fit (docs/runtime.md)."""

    rows: int = 64
    tokens: int = 0

    def rows_for(self, length: int) -> int:
        """Rows per micro-batch for sequences padded to `length` tokens."""
        if self.tokens > 0:
            return max(1, self.tokens // max(1, length))
        return max(1, self.rows)

    @classmethod
    def of(cls, layout, longest: int) -> MicroBatch:
        """A stage's micro-batch from its parallel layout (`micro_batch`, `packing`) and the job's
        longest sequence in tokens."""
        return cls(rows=layout.micro_batch, tokens=layout.micro_batch * longest if layout.packing else 0)


@dataclass(frozen=True, slots=True)
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    grad_clip: float = 1.0
    micro_batch: MicroBatch | int = MicroBatch()  # per forward and backward of an update (an int: that many rows)
    temperature: float = 1.0
    vf_coef: float = 0.5  # value loss weight when the critic is a head on the actor
    forward_batch: MicroBatch | int | None = None  # per forward-only pass (logprobs, values); None: micro_batch

    def __post_init__(self) -> None:
        rows = lambda m: MicroBatch(rows=m) if isinstance(m, int) else m  # noqa: E731
        object.__setattr__(self, "micro_batch", rows(self.micro_batch))
        object.__setattr__(self, "forward_batch", rows(self.forward_batch) if self.forward_batch is not None
                           else self.micro_batch)


class ValueHead(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.proj.weight)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h.float()).squeeze(-1)


def tensor_parallel(model, mesh, lora=None) -> None:
    """Megatron's split of every decoder layer, applied with DTensor to the unmodified model (with
    `lora`, its adapters split to match: runtime.adapters.tensor_parallel_plan)."""
    from torch.distributed.tensor.parallel import parallelize_module

    from rpeg.runtime.adapters import tensor_parallel_plan

    for layer in _decoder_layers(model):
        parallelize_module(layer, mesh, tensor_parallel_plan(lora))


def _decoder_layers(model) -> list[torch.nn.Module]:
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", [])
    return list(layers.values()) if isinstance(layers, torch.nn.ModuleDict) else list(layers)  # a pipeline stage's


class Trainer:
    """One rank of a training group. `lm`: the model has a language-model head it trains with the
    policy loss; `value`: it trains a value head (the critic, or a value head on the actor)."""

    def __init__(self, model, config: AlgoConfig, optim: OptimConfig, *, lm: bool = True, value: bool = False,
                 shard: bool = False, tp: int = 1, pp: int = 1, pp_schedule: str = "1f1b", device: str | None = None,
                 bf16: bool = False, lora=None, seed: int = 0):
        """`device`: where the model computes (None: where it is, the CPU path); `bf16`: forward and
        backward in bf16 under autocast while the parameters, gradients and optimizer stay fp32 (the
        master weights), as FSDP2's bf16 mixed precision does per shard. `pp` > 1: this rank holds one
        pipeline stage of the policy (`runtime.pipeline`), run with the `pp_schedule` schedule. `lora`
        (rpeg.graph.lora.LoRA): peft's adapters are injected (drawn from `seed`) and trained, the model's
        own weights frozen (runtime.adapters); a value head is trained in full."""
        self.config, self.optim, self.lm, self.value = config, optim, lm, value
        self.lora = lora
        self.device, self.bf16 = device, bf16
        self.pipe = None
        if pp > 1 and (value or not lm):
            from rpeg.errors import RpegError

            raise RpegError("pipeline parallelism runs a policy's language-model head; a value head or critic with "
                            "pp > 1 is not run")
        model = model if device is None else model.to(device)
        if lora is not None:
            from rpeg.runtime.adapters import attach

            attach(model, lora, seed)
        self.head = ValueHead(model.config.hidden_size) if value else None
        if self.head is not None and device is not None:
            self.head = self.head.to(device)
        if shard or tp > 1 or pp > 1:
            from torch.distributed.device_mesh import init_device_mesh

            world = dist.get_world_size()
            dp = world // (tp * pp)
            kind = torch.device(device).type if device else "cpu"
            mesh = init_device_mesh(kind, (dp, pp, tp) if pp > 1 else (dp, tp),
                                    mesh_dim_names=("dp", "pp", "tp") if pp > 1 else ("dp", "tp"))
            if pp > 1:
                from rpeg.runtime.pipeline import Pipeline, Stage, cut, tie_groups

                index = mesh["pp"].get_local_rank()
                lo, hi = cut(model.config.num_hidden_layers, pp, index)
                ties = tie_groups(mesh, 1) if getattr(model.config, "tie_word_embeddings", False) else {}
                model = Stage(model, lo, hi, first=index == 0, last=index == pp - 1)
            if tp > 1:
                tensor_parallel(model, mesh["tp"], lora)
            if dp > 1:
                from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

                # bf16: FSDP2 gathers bf16 copies of the fp32 shards for compute and reduces gradients in
                # fp32 into the fp32 shards the optimizer steps (master weights)
                kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} \
                    if bf16 else {}
                for layer in _decoder_layers(model):
                    fully_shard(layer, mesh=mesh["dp"], **kw)
                fully_shard(model, mesh=mesh["dp"], **kw)
                if self.head is not None:
                    fully_shard(self.head, mesh=mesh["dp"], **kw)
            if pp > 1:
                self.pipe = Pipeline(model, index, pp, mesh["pp"].get_group(), pp_schedule,
                                     ties.get(dist.get_rank()))
        self.model = model
        params = [p for p in model.parameters() if p.requires_grad] + \
            (list(self.head.parameters()) if self.head is not None else [])  # with LoRA: the adapters (and head)
        self.opt = torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay)
        warm = max(optim.warmup_steps, 0)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / (warm + 1)) if warm else 1.0)
        self.updates = 0

    # ---- forward passes -------------------------------------------------------------------------
    def _on_device(self, b: Batch) -> Batch:
        return b if self.device is None else b.to(self.device)

    def _rows(self, b: Batch, forward: bool) -> int:
        """Rows per micro-batch of `b`: the plan's micro-batch of the pass (forward-only or update)."""
        return (self.optim.forward_batch if forward else self.optim.micro_batch).rows_for(b.input_ids.shape[1])

    def _forward(self, b: Batch, need_values: bool):
        """Logprobs and values of a micro-batch already on the trainer's device."""
        with autocast(self.device, self.bf16):
            out = self.model(input_ids=b.input_ids, attention_mask=b.attention_mask, position_ids=b.position_ids(),
                             output_hidden_states=need_values)
        logp = self._next_logprobs(out.logits, b.input_ids[:, 1:]) if self.lm else None
        values = self.head(out.hidden_states[-1][:, :-1]) if need_values else None
        return logp, values

    def _next_logprobs(self, logits: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        logits = logits[:, :-1].float() / self.optim.temperature
        return torch.log_softmax(logits, -1).gather(-1, next_ids[..., None]).squeeze(-1)

    @torch.no_grad()
    def _per_token(self, b: Batch, values: bool) -> torch.Tensor:
        """Logprobs (values=False) or values of every next token, micro-batch by micro-batch."""
        if self.pipe is not None:  # the pipeline's forward schedule; the last stage's logprobs on every stage
            b = self._on_device(b)
            logits = self.pipe.run(b.input_ids, b.attention_mask,
                                   self.pipe.micro_batches(b.size, self._rows(b, forward=True), train=False))
            logp = None if logits is None else (self._next_logprobs(logits, b.input_ids[:, 1:]) * b.mask).cpu()
            return self.pipe.from_last(logp)
        return self._both(b, values)[1 if values else 0]

    @torch.no_grad()
    def _both(self, b: Batch, values: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Logprobs (an LM head's) and, with `values`, values, from one forward pass per micro-batch."""
        logps, vals = [], []
        for idx in _chunks(b.size, self._rows(b, forward=True)):
            mb = self._on_device(b.select(idx))
            logp, v = self._forward(mb, values)
            if logp is not None:
                logps.append((logp * mb.mask).cpu())
            if v is not None:
                vals.append((v * mb.mask).cpu())
        return (torch.cat(logps) if logps else None), (torch.cat(vals) if vals else None)

    def logprobs(self, b: Batch) -> torch.Tensor:
        """(B, L-1) log-probabilities of each next token (zero outside the response mask)."""
        return self._per_token(b, values=False)

    def base_logprobs(self, b: Batch) -> torch.Tensor:
        """Logprobs of the base model: with LoRA, the adapters off (the reference, on the trainer's own
        frozen weights); without, the model's own."""
        if self.lora is None:
            return self.logprobs(b)
        from rpeg.runtime.adapters import disabled

        with disabled(self.model):
            return self.logprobs(b)

    def values(self, b: Batch) -> torch.Tensor:
        """(B, L-1) value estimates (zero outside the response mask)."""
        return self._per_token(b, values=True)

    def logprobs_and_values(self, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Both from the same forward passes: a policy with a value head, whose plan computes its old
        logprobs and values in one stage (share_actor_critic)."""
        if self.pipe is not None or not (self.lm and self.value):
            raise RuntimeError("logprobs_and_values needs an unpipelined policy with a value head")
        return self._both(b, True)

    # ---- updates ----------------------------------------------------------------------------------
    def train(self, b: Batch, epochs: int, mini_batches: int, seed: int) -> dict[str, float]:
        """PPO epochs over `mini_batches` optimizer steps each; returns mean metrics."""
        return mean_metrics(self.steps(b, epochs, mini_batches, seed))

    def steps(self, b: Batch, epochs: int, mini_batches: int, seed: int):
        """The optimizer steps of `train`, one at a time (each yields its metrics): two trainers'
        steps can then alternate in one schedule (actor and critic fused on the same devices)."""
        gen = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            order = torch.randperm(b.size, generator=gen)
            for chunk in torch.tensor_split(order, mini_batches):
                if len(chunk) == 0:
                    continue
                yield self._step(b.select(chunk))

    def _step(self, mini: Batch) -> dict[str, float]:
        if self.pipe is not None:
            return self._pipeline_step(mini)
        self.opt.zero_grad(set_to_none=True)
        kept = self._kept(mini)
        metrics: dict[str, float] = {}
        for idx in _chunks(mini.size, self._rows(mini, forward=False)):
            mb = self._on_device(mini.select(idx))
            share = self._share(kept, idx)
            logp, values = self._forward(mb, self.value)
            loss = torch.zeros((), device=self.device)
            if self.lm:
                pl, m = algos.policy_loss(logp, mb.extras["old_logprobs"], mb.extras["advantages"], mb.mask,
                                          self.config, ref_logprobs=mb.extras.get("ref_logprobs"),
                                          behaviour_logprobs=mb.rollout_logprobs)
                loss = loss + pl
                _accumulate(metrics, m, share)
            if self.value:
                vl, m = algos.value_loss(values, mb.extras["values"], mb.extras["returns"], mb.mask, self.config)
                loss = loss + (self.optim.vf_coef if self.lm else 1.0) * vl
                _accumulate(metrics, m, share)
            (loss * share).backward()
        return self._optimizer_step(metrics)

    def _kept(self, mini: Batch) -> torch.Tensor:
        """(B, T) bool: the mini-batch's tokens the policy loss keeps (all of its response tokens,
        unless an off-policy mask drops some); a critic keeps every response token."""
        if not self.lm:
            return mini.mask.bool()
        return algos.correction(mini.extras["old_logprobs"], mini.rollout_logprobs, mini.mask, self.config).keep

    def _share(self, kept: torch.Tensor, idx: torch.Tensor) -> float:
        """A micro-batch's share of its mini-batch's loss: the losses aggregate over the mini-batch, so
        each micro-batch (its rows `idx`) is weighted by its kept tokens (token-mean) or its sequences
        with a kept token (the sequence means) out of the mini-batch's."""
        if self.config.loss_agg == "token-mean":
            return float(kept[idx].sum()) / float(kept.sum().clamp(min=1))
        seqs = kept.any(dim=1)
        return float(seqs[idx].sum()) / float(seqs.sum().clamp(min=1))

    def _optimizer_step(self, metrics: dict[str, float]) -> dict[str, float]:
        """Clip the gradients' global norm (over every pipeline stage too), step, and add the norm and LR."""
        params = [p for g in self.opt.param_groups for p in g["params"]]
        if self.pipe is None:
            norm = _clip_grad_norm(params, self.optim.grad_clip)
        else:
            norm = _clip_grad_norm(params, self.optim.grad_clip, counted=self.pipe.counted(params),
                                   reduce=self.pipe.total)
        self.opt.step()
        self.sched.step()
        self.updates += 1
        metrics["grad_norm"] = norm
        metrics["lr"] = self.sched.get_last_lr()[0]
        return metrics

    def _pipeline_step(self, mini: Batch) -> dict[str, float]:
        """One optimizer step through the pipeline: the schedule runs forward and backward over equal
        micro-batches; the last stage computes each micro-batch's policy loss (weighted by its share of
        the mini-batch, as `_step` does) from the per-token fields packed into the schedule's target."""
        self.opt.zero_grad(set_to_none=True)
        mini = self._on_device(mini)
        kept = self._kept(mini)
        tokens, seqs = float(kept.sum().clamp(min=1)), float(kept.any(dim=1).sum().clamp(min=1))
        ref = mini.extras.get("ref_logprobs")
        fields = [mini.input_ids[:, 1:].float(), mini.extras["old_logprobs"], mini.extras["advantages"], mini.mask,
                  mini.rollout_logprobs, kept.float()]
        target = torch.stack(fields + ([ref] if ref is not None else []), -1)  # token ids < 2**24: exact as floats
        metrics: dict[str, float] = {}

        def loss_fn(logits: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            mask, keep = t[..., 3], t[..., 5].bool()  # the micro-batch's share of the mini-batch, as `_share`
            share = float(keep.sum()) / tokens if self.config.loss_agg == "token-mean" else float(
                keep.any(dim=1).sum()) / seqs
            logp = self._next_logprobs(logits, t[..., 0].long())
            pl, m = algos.policy_loss(logp, t[..., 1], t[..., 2], mask, self.config,
                                      ref_logprobs=t[..., 6] if ref is not None else None,
                                      behaviour_logprobs=t[..., 4])
            calls.append((m, share))
            return pl * share

        calls: list[tuple[dict, float]] = []
        n = self.pipe.micro_batches(mini.size, self._rows(mini, forward=False), train=True)
        with autocast(self.device, self.bf16):
            self.pipe.run(mini.input_ids, mini.attention_mask, n, loss_fn, target)
        # the schedule's set-up first calls the loss once on placeholder outputs (to learn the gradients'
        # shapes); the micro-batches' own calls are the last n
        for m, share in calls[-n:]:
            _accumulate(metrics, m, share)
        self.pipe.tie_gradients()
        return self._optimizer_step(self.pipe.from_last(metrics))

    # ---- state -------------------------------------------------------------------------------------
    def full_state_dict(self, keep_device: bool = False) -> dict[str, torch.Tensor]:
        """The model's full weights (gathered from the shards), for weight sync and checkpoints: host
        copies, or with `keep_device` the gathered tensors where they are (not to be modified: the
        weights themselves where unsharded), for a broadcast that reads them once."""
        sd = self.model.state_dict()
        full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach() for k, v in sd.items()}
        if self.pipe is not None or not keep_device:
            full = {k: v.cpu().clone() for k, v in full.items()}
        if self.pipe is not None:  # every stage's part: the stages keep the full model's names
            return {k: v for part in self.pipe.gathered(full) for k, v in part.items()}
        return full

    def engine_weights(self, merged: bool, keep_device: bool = False) -> dict[str, torch.Tensor]:
        """What a weight sync sends an engine: the full weights; with LoRA, the adapters alone, or with
        `merged` the weights with the adapters folded in, named as the model without them (an engine that
        holds no adapters). Every rank gathers."""
        full = self.full_state_dict(keep_device=keep_device and not merged)
        if self.lora is None:
            return full
        from rpeg.runtime.adapters import adapter_state, merged_state

        return merged_state(full, self.lora) if merged else adapter_state(full)

    def checkpoint_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # cpu_offload keeps the gathered state on global rank 0 only; a pipeline's other stages need their own
        opts = StateDictOptions(full_state_dict=True, cpu_offload=self.pipe is None)
        modules = [self.model] + ([self.head] if self.head is not None else [])
        model = get_model_state_dict(self.model, options=opts)
        if self.lora is not None:  # the frozen base is the model folder's: the adapters are what changed
            from rpeg.runtime.adapters import adapter_state

            model = adapter_state(model)
        optimizer = get_optimizer_state_dict(_Joint(modules), self.opt, options=opts)
        if self.pipe is not None:  # the full weights, and each stage's optimizer state (restored by the same layout)
            from torch.utils._pytree import tree_map

            def cpu(tree):
                return tree_map(lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, tree)
            model = {k: v for part in self.pipe.gathered(cpu(model)) for k, v in part.items()}
            optimizer = {"stages": self.pipe.gathered(cpu(optimizer))}
        return {"model": model, "head": None if self.head is None else get_model_state_dict(self.head, options=opts),
                "optimizer": optimizer, "scheduler": self.sched.state_dict(), "updates": self.updates}

    def load_checkpoint_state(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)

        opts = StateDictOptions(full_state_dict=True, strict=self.lora is None)  # LoRA: the adapters alone
        model, optimizer = state["model"], state["optimizer"]
        if self.pipe is not None:
            from rpeg.errors import RpegError

            own = set(self.model.state_dict())
            stages = optimizer.get("stages") if isinstance(optimizer, dict) else None
            if stages is None or len(stages) != self.pipe.stages:
                raise RpegError(f"the checkpoint was written by another pipeline layout than this one's "
                                f"{self.pipe.stages} stages: resume with the plan that wrote it")
            model, optimizer = {k: v for k, v in model.items() if k in own}, stages[self.pipe.index]
        if self.lora is not None:
            from rpeg.errors import RpegError
            from rpeg.runtime.adapters import is_adapter

            own = {k for k in self.model.state_dict() if is_adapter(k)}
            if set(model) != own:
                raise RpegError("the checkpoint's model is not this job's LoRA adapters (their rank or targets "
                                f"differ, or it trained the full model): {sorted(set(model) ^ own)[:2]}")
        set_model_state_dict(self.model, model, options=opts)
        if self.head is not None and state.get("head") is not None:
            set_model_state_dict(self.head, state["head"], options=opts)
        modules = [self.model] + ([self.head] if self.head is not None else [])
        set_optimizer_state_dict(_Joint(modules), self.opt, optimizer, options=opts)
        self.sched.load_state_dict(state["scheduler"])
        self.updates = state["updates"]


class _Joint(torch.nn.Module):
    """Model and value head as one module, so the optimizer's state maps to one state dict."""

    def __init__(self, modules: list[torch.nn.Module]):
        super().__init__()
        self.parts = torch.nn.ModuleList(modules)


def mean_metrics(steps) -> dict[str, float]:
    """The mean of each metric over optimizer steps (an iterable of metric dicts)."""
    totals: dict[str, float] = {}
    count = 0
    for metrics in steps:
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0.0) + v
        count += 1
    return {k: v / max(count, 1) for k, v in totals.items()}


def _clip_grad_norm(params: list[torch.Tensor], max_norm: float, *, counted: list[torch.Tensor] | None = None,
                    reduce=None) -> float:
    """Clip the global gradient norm. torch's clip_grad_norm_ refuses a mix of DTensor (tensor-
    parallel layers) and plain tensors (replicated embeddings and norms): gather then. A pipeline
    stage counts only `counted` (a tied weight once) and sums the squares over the stages (`reduce`)."""
    grads = [p.grad for p in params if p.grad is not None]
    kinds = {hasattr(g, "full_tensor") for g in grads}
    if len(kinds) < 2 and reduce is None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    norm_grads = grads if counted is None else [p.grad for p in counted if p.grad is not None]
    sq = sum(((g.full_tensor() if hasattr(g, "full_tensor") else g).float().pow(2).sum() for g in norm_grads),
             torch.zeros(()))
    total = (reduce(sq) if reduce is not None else sq).sqrt()
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return float(total)


def _chunks(n: int, size: int) -> list[torch.Tensor]:
    size = max(1, size)
    return [torch.arange(i, min(n, i + size)) for i in range(0, n, size)]


def _accumulate(metrics: dict[str, float], new: dict, share: float) -> None:
    for k, v in new.items():
        metrics[k] = metrics.get(k, 0.0) + float(v) * share


__all__ = ["MicroBatch", "OptimConfig", "Trainer", "ValueHead"]
