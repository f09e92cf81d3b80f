"""Execution annotations: device groups and per-stage parallel layouts.

Checks follow torchtitan's ParallelDims: a failing check prints every factor, e.g.
`dp*tp*pp*cp = 2*4*2*1 = 16 != 32 devices of group 'train'`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from rpeg.errors import RpegError
from rpeg.graph.bounds import MAX_GPUS

Recompute = Literal["none", "selective", "full"]
# how a pass gets its log-probs from the logits (ParallelLayout.logits); rpeg/perf/logits.py holds each
# path's bytes and the system whose code it counts. RPEG's own runtime's path first: the default
LOGITS_PATHS = ("fp32-logsoftmax", "distributed-logprob", "softmax-inplace", "fused-ce", "fp32-ce", "bf16-ce",
                "bf16-ce-entropy", "chunked-logsoftmax", "fused-linear")
DEFAULT_LOGITS = LOGITS_PATHS[0]
# the parts of a trainer's state on each device (rpeg.perf.memory.MemoryBreakdown's names)
STATE_PARTS = ("weights", "gradients", "optimizer")
# the host copies a trainer makes, by part and direction (out: device to host, in: host to device);
# ParallelLayout.pageable names those made through pageable host memory (rpeg/perf/offload.py)
HOST_COPIES = ("weights-out", "weights-in", "gradients-out", "optimizer-out", "optimizer-in")
# Megatron-Core's selective recompute modules (TransformerConfig.recompute_modules; its default is
# ["core_attn"], what recompute = "selective" means alone): rpeg/perf/memory_recipes.py says what each
# one stops storing
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
STATE_DTYPES = ("fp32", "bf16")
# how a packed pass's bins reach the data-parallel ranks (ParallelLayout.bins; rpeg/perf/packing.py)
BINS = ("even", "ffd")
# how an MoE stage runs (rpeg/perf/moe.py prices each): the token dispatcher, the CUDA-graph scope and the routing
DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")
CUDA_GRAPHS = ("none", "partial", "full")
# Megatron-Core's cuda_graph_scope (TransformerConfig.cuda_graph_modules: attn, mlp, moe, moe_router, moe_preprocess,
# mamba) and its full-iteration graph (cuda_graph_impl "full_iteration", which Megatron-LM recipes also write as
# the scope full_iteration); training.layer_launches and moe.moe_launches say what each takes off the host
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration")
ROUTINGS = ("balanced", "natural")


def graph_scopes(cuda_graphs: str | tuple[str, ...]) -> frozenset[str]:
    """The scopes a cuda_graphs value captures: `partial` is the attention and dense parts of every layer
    (attn, mlp, and the "partial" mark for an MoE layer's own dense kernels; the MoE part eager), `full`
    the whole iteration."""
    named = {"none": (), "partial": ("attn", "mlp", "partial"), "full": ("full_iteration",)}
    return frozenset(named[cuda_graphs] if isinstance(cuda_graphs, str) else cuda_graphs)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceGroup:
    """A contiguous range of global device ids [first, first + count). Groups may overlap:
    stages on overlapping groups are colocated and take turns on the devices."""

    name: str
    first: int
    count: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise RpegError(f"device group {self.name!r}: a group needs a name (stages are assigned to it by name)")
        if self.first < 0 or self.count <= 0:
            raise RpegError(f"device group {self.name!r}: first = {self.first} must be >= 0 and "
                            f"count = {self.count} must be > 0")
        if self.first + self.count > MAX_GPUS:
            raise RpegError(f"device group {self.name!r}: devices {self.first:,} to {self.first + self.count - 1:,} "
                            f"go past {MAX_GPUS:,} (above the largest clusters built)")

    @property
    def devices(self) -> range:
        return range(self.first, self.first + self.count)

    def overlaps(self, other: DeviceGroup) -> bool:
        return self.first < other.first + other.count and other.first < self.first + self.count


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelLayout:
    """How one stage's model is split over its devices.

    dp, tp, pp, cp: data, tensor, pipeline, context parallel degrees (their product is the
    device count); ep: expert parallel degree, carved out of dp*cp*tp (MoE parallel folding);
    zero: ZeRO stage 0-3 (3 = FSDP); recompute: activation recomputation;
    sequence_parallel: Megatron SP along tp; pp_interleave: virtual stages per pipeline rank;
    pp_uneven: allow pipeline stages with unequal layer counts (Megatron's first/last-stage layer
    options), for models whose layers pp does not divide (DeepSeek-V3's 61).
    micro_batch, packing: what one micro-batch of a training or forward pass holds. With sequence
    packing (the default) sequences are packed into micro-batches of micro_batch x the job's
    longest sequence in tokens (NeMo-RL's train_mb_tokens / logprob_mb_tokens, verl's
    ppo_max_token_len_per_gpu); without it, micro_batch sequences, each padded to the batch's
    longest (Hugging Face-style padded batches). bins: how a packed pass's bins reach the
    data-parallel ranks (rpeg/perf/packing.py): "even" (every rank the mean share of tokens) or "ffd"
    (NeMo-RL: first-fit-decreasing bins dealt round-robin, padded to the rank's longest bin under
    pipeline parallelism; the busiest rank sets the time).

    Offload (training stages; rpeg/perf/offload.py says what each system's flag does):
    offload_optimizer: the fraction of the optimizer state (fp32 master weights and Adam moments)
    that lives in host memory while the stage computes, its Adam step run by the host CPU (DeepSpeed
    ZeRO-Offload and OpenRLHF's --adam_offload: 1; Megatron-Core's --optimizer-cpu-offload with
    --optimizer-offload-fraction f: f); with zero >= 2 the same fraction of the gradient partition
    goes to the host too. offload_params: the weight and gradient shards live in host memory and
    each layer's are fetched when it runs (ZeRO-3 offload_param, FSDP2's CPUOffloadPolicy); needs
    zero = 3 and offload_optimizer = 1. resident: the parts of the state ("weights", "gradients",
    "optimizer") that stay on the devices while a colocated generation engine runs; the others are
    moved to the host and back around it (gradients: freed) - verl's param_offload /
    optimizer_offload / grad_offload false keep a part resident. pageable: the host copies (of
    HOST_COPIES, a part alone naming both its directions) that go through pageable host memory,
    at the pageable rates (efficiency.PAGEABLE_*); the others are pinned. verl's FSDP2 moves its
    weights with module.cpu() / module.to(device): ["weights"]; its Megatron backend copies them out
    with .cpu().pin_memory(): ["weights-out"]; DeepSpeed with pin_memory false and Megatron-Core's
    --no-pin-cpu-grads / --no-pin-cpu-params: ["gradients-out", "weights-in"] (rpeg/perf/offload.py).

    Megatron-Core recipe options (rpeg/perf/memory_recipes.py; the defaults change nothing):
    recompute_modules: with recompute = "selective", the submodules recomputed (RECOMPUTE_MODULES;
    empty: core_attn alone). recompute_layers: with recompute = "full", the layers of each model chunk
    recomputed (recompute_method block, recompute_num_layers); 0: all of them. offload_activation_layers:
    the layers whose stored activations go to host memory in the forward and come back for the backward
    (cpu_offloading_num_layers; Megatron-Core allows it without pipeline parallelism only). grad_dtype:
    the gradient buffer's dtype, fp32 (Megatron's default, accumulate and reduce in fp32) or bf16
    (grad_reduce_in_fp32 false, as Megatron-Bridge's performance recipes set it). optimizer_moments:
    Adam's exp_avg / exp_avg_sq dtype, bf16 with the precision-aware optimizer
    (use_precision_aware_optimizer, exp_avg_dtype = exp_avg_sq_dtype = bfloat16).
    pp_embedding_loss_slots: the embedding and the loss each take a decoder layer's place in the pipeline
    split (account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split): the first and
    the last stage hold one decoder layer fewer.

    MoE execution (rpeg/perf/moe.py): dispatcher: the token dispatcher of the expert-parallel
    exchange (Megatron's --moe-token-dispatcher-type alltoall / allgather, its flex dispatcher with the
    DeepEP or HybridEP backend; vLLM's all2all backend); ep_overlap: the all-to-all of one micro-batch
    overlapped with another's compute (Megatron's --overlap-moe-expert-parallel-comm); permute_fusion:
    Transformer Engine's fused token permutation (Megatron's --moe-permute-fusion, which Megatron-Bridge's
    and Megatron-LM's MoE recipes set; false: PyTorch ops, per-chunk splits and concatenations, as
    NeMo-RL's default megatron_cfg runs; priced by moe.unfused_permute_host_s); cuda_graphs: none,
    partial (the attention and dense parts captured), full (the whole iteration), or a list of
    Megatron-Core's --cuda-graph-scope values (CUDA_GRAPH_SCOPES; priced by training.layer_launches and
    moe.moe_launches); routing: balanced (forced, as benchmarks run: --moe-router-force-load-balancing) or
    natural (the learned router: the busiest expert-parallel rank sets the time); capacity_factor:
    0 for dropless routing (Megatron's default), else each expert's input padded to that many times
    its mean share and the rest dropped (--moe-expert-capacity-factor with
    --moe-pad-expert-input-to-capacity; Megatron-Bridge's apply_moe_token_drop: 1.0), which fixes the
    shapes: no device-to-host sync, and no rank above the capacity. rank_capacity_factor: 0, or a
    static receive buffer per expert-parallel rank of that many times its mean (token, expert) pairs
    (Megatron's --moe-expert-rank-capacity-factor, which the full-iteration CUDA-graph recipes set with
    HybridEP and the paged stash): shapes fixed, so no device-to-host sync, and the expert part of each
    MoE layer runs over the whole buffer; the exchange still sends only the routed tokens. The defaults
    are what the model assumed before these knobs: per-(token, expert) all-to-all, not overlapped, no graphs, balanced,
    dropless.

    logits: how a training or log-prob pass turns the last stage's hidden states into log-probs, which
    sets the bytes its full-vocabulary logits hold (rpeg/perf/logits.py counts each path tensor by
    tensor from the system's code; LOGITS_PATHS lists them). The default, "fp32-logsoftmax", is what
    RPEG's own runtime does (rpeg/runtime/trainer.py: log_softmax over an fp32 copy of the logits);
    the importers set the peers' ("bf16-ce": verl's FSDP actor; "fused-linear": verl's
    use_fused_kernels; "fused-ce": Megatron's vocab-parallel cross-entropy; "fp32-ce": OpenRLHF;
    "distributed-logprob": NeMo-RL; "chunked-logsoftmax": AReaL; "softmax-inplace": slime).

    inline_output (generation stages; rpeg/perf/generation.py): the engine turns each step's sampled
    tokens into its outputs (each request's new token and its logprob entry, detokenization where a
    tokenizer is loaded) in the loop that runs its steps, so the devices wait for it every step: vLLM's offline
    LLM with VLLM_ENABLE_V1_MULTIPROCESSING=0 (its engine core in the caller's process, InprocClient),
    as NeMo-RL's synchronous engine runs. False (the default): a separate engine-core process steps the
    model while the front end processes the last step's outputs (vLLM V1's default; its AsyncLLM always).

    max_seqs (generation stages; rpeg/perf/generation.py `engine_max_seqs`): the engine's max_num_seqs,
    the most sequences one decode step runs. 0 (the default): what vLLM's offline LLM class takes when
    the caller sets none, which depends on the device (1,024 on a GPU of 70 GiB or more that is not an
    A100, else 256). A caller that sets it (verl's rollout.max_num_seqs), or an engine built another way
    (AsyncLLM, whose default is 128: generation.ASYNC_ENGINE_MAX_SEQS), says so here.

    static_batch (generation stages; rpeg/perf/generation.py `simulate_static`): the engine decodes each
    call's batch until its longest sequence ends, every row kept in the batch, and takes the next call's
    sequences only then: RPEG's own `hf` engine (rpeg/runtime/rollout.py HFEngine), which
    runtime.plan_check.runnable_plan sets for a run on it. False (the default): continuous batching, as
    vLLM does. With multi-turn episodes each round of turns is a call of its own, with its own tail.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    recompute: Recompute = "none"
    sequence_parallel: bool = False
    pp_interleave: int = 1
    pp_uneven: bool = False
    micro_batch: int = 1
    packing: bool = True
    bins: str = "even"
    offload_optimizer: float = 0.0
    offload_params: bool = False
    resident: tuple[str, ...] = ()
    pageable: tuple[str, ...] = ()
    recompute_modules: tuple[str, ...] = ()
    recompute_layers: int = 0
    offload_activation_layers: int = 0
    grad_dtype: str = "fp32"
    optimizer_moments: str = "fp32"
    pp_embedding_loss_slots: bool = False
    dispatcher: str = "alltoall"
    ep_overlap: bool = False
    permute_fusion: bool = True
    cuda_graphs: str | tuple[str, ...] = "none"
    routing: str = "balanced"
    capacity_factor: float = 0.0
    rank_capacity_factor: float = 0.0
    logits: str = DEFAULT_LOGITS
    inline_output: bool = False
    max_seqs: int = 0
    static_batch: bool = False

    def __post_init__(self) -> None:
        bad = [f"{f} = {getattr(self, f)}" for f in ("dp", "tp", "pp", "cp", "ep", "pp_interleave", "micro_batch")
               if getattr(self, f) < 1]
        if bad:
            raise RpegError(f"parallel layout: {', '.join(bad)} must be >= 1")
        if self.logits not in LOGITS_PATHS:
            raise RpegError(f"parallel layout: logits = {self.logits!r} is not a logits path; the paths are "
                            f"{', '.join(LOGITS_PATHS)} (rpeg/perf/logits.py says what each holds)")
        if self.bins not in BINS:
            raise RpegError(f"parallel layout: bins = {self.bins!r} must be one of {', '.join(BINS)} "
                            "(rpeg/perf/packing.py says what each does)")
        if self.zero not in (0, 1, 2, 3):
            raise RpegError(f"parallel layout: zero = {self.zero} must be 0, 1, 2 or 3")
        if not isinstance(self.inline_output, bool):
            raise RpegError(f"parallel layout: inline_output = {self.inline_output!r:.80} must be true or false")
        if not isinstance(self.static_batch, bool):
            raise RpegError(f"parallel layout: static_batch = {self.static_batch!r:.80} must be true or false")
        if isinstance(self.max_seqs, bool) or not isinstance(self.max_seqs, int) or self.max_seqs < 0:
            raise RpegError(f"parallel layout: max_seqs = {self.max_seqs!r:.80} must be a whole number >= 0 (the "
                            "engine's max_num_seqs; 0: vLLM's default for the device)")
        if self.recompute not in ("none", "selective", "full"):
            raise RpegError(f"parallel layout: recompute = {self.recompute!r} must be none, selective or full")
        if self.sequence_parallel and self.tp == 1:
            raise RpegError("parallel layout: sequence_parallel needs tp > 1")
        if self.pp_interleave > 1 and self.pp == 1:
            raise RpegError(f"parallel layout: pp_interleave = {self.pp_interleave} needs pp > 1")
        if isinstance(self.offload_optimizer, bool):  # true/false as a job file may say it: all or nothing
            object.__setattr__(self, "offload_optimizer", float(self.offload_optimizer))
        if not isinstance(self.offload_optimizer, (int, float)) or not 0.0 <= self.offload_optimizer <= 1.0:
            raise RpegError(f"parallel layout: offload_optimizer = {self.offload_optimizer!r} must be a fraction "
                            "from 0 to 1 (or true/false)")
        object.__setattr__(self, "offload_optimizer", float(self.offload_optimizer))
        if self.offload_params and (self.zero != 3 or self.offload_optimizer != 1.0):
            raise RpegError(f"parallel layout: offload_params needs zero = 3 and offload_optimizer = 1 (zero = "
                            f"{self.zero}, offload_optimizer = {self.offload_optimizer:g}): ZeRO-3's offload_param and "
                            "FSDP2's CPUOffloadPolicy keep the shards and the optimizer step on the host")
        if isinstance(self.resident, str) or not all(p in STATE_PARTS for p in self.resident):
            raise RpegError(f"parallel layout: resident = {self.resident!r} must list some of "
                            f"{', '.join(STATE_PARTS)}")
        object.__setattr__(self, "resident", tuple(p for p in STATE_PARTS if p in self.resident))
        if isinstance(self.pageable, str) or not all(isinstance(c, str) for c in self.pageable):
            raise RpegError(f"parallel layout: pageable = {self.pageable!r} must be a list of host copies "
                            f"({', '.join(HOST_COPIES)}; a part alone names both its directions)")
        wanted = {c for x in self.pageable for c in HOST_COPIES if c == x or c.startswith(x + "-")}
        unknown = [x for x in self.pageable if not any(c == x or c.startswith(x + "-") for c in HOST_COPIES)]
        if unknown:
            raise RpegError(f"parallel layout: pageable = {list(self.pageable)!r}: {', '.join(map(repr, unknown))} is "
                            f"not a host copy; the copies are {', '.join(HOST_COPIES)} (a part alone names both "
                            "its directions)")
        object.__setattr__(self, "pageable", tuple(c for c in HOST_COPIES if c in wanted))
        self._check_recipe_options()
        self._check_moe_options()

    def _check_recipe_options(self) -> None:
        """The Megatron-Core recipe options: each in one line with its way out."""
        modules = self.recompute_modules
        if isinstance(modules, str) or not all(isinstance(m, str) and m in RECOMPUTE_MODULES for m in modules):
            raise RpegError(f"parallel layout: recompute_modules = {modules!r:.80} must list some of "
                            f"{', '.join(RECOMPUTE_MODULES)}")
        if modules and self.recompute != "selective":
            raise RpegError(f"parallel layout: recompute_modules = {list(modules)} needs recompute = selective, "
                            f"not {self.recompute!r} (Megatron's recompute_granularity)")
        object.__setattr__(self, "recompute_modules", tuple(m for m in RECOMPUTE_MODULES if m in modules))
        for name in ("recompute_layers", "offload_activation_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise RpegError(f"parallel layout: {name} = {value!r:.80} must be a whole number >= 0 (0: none)")
        if self.recompute_layers and self.recompute != "full":
            raise RpegError(f"parallel layout: recompute_layers = {self.recompute_layers} needs recompute = full, "
                            f"not {self.recompute!r} (Megatron's recompute_method block)")
        if self.offload_activation_layers and self.pp > 1:
            raise RpegError(f"parallel layout: offload_activation_layers = {self.offload_activation_layers} needs "
                            f"pp = 1, not {self.pp} (Megatron-Core's cpu_offloading has no pipeline support)")
        if self.pp_embedding_loss_slots and self.pp == 1:
            raise RpegError("parallel layout: pp_embedding_loss_slots needs pp > 1 (it moves layers between "
                            "pipeline stages)")
        for name in ("grad_dtype", "optimizer_moments"):
            if getattr(self, name) not in STATE_DTYPES:
                raise RpegError(f"parallel layout: {name} = {getattr(self, name)!r:.80} must be fp32 or bf16")

    def _check_moe_options(self) -> None:
        """The MoE execution options: each in one line with its way out."""
        for name, allowed in (("dispatcher", DISPATCHERS), ("routing", ROUTINGS)):
            value = getattr(self, name)
            if value not in allowed:
                raise RpegError(f"parallel layout: {name} = {value!r} must be one of {', '.join(allowed)}")
        self._check_cuda_graphs()
        if not isinstance(self.ep_overlap, bool):
            raise RpegError(f"parallel layout: ep_overlap = {self.ep_overlap!r} must be true or false")
        if not isinstance(self.permute_fusion, bool):
            raise RpegError(f"parallel layout: permute_fusion = {self.permute_fusion!r} must be true or false")
        if isinstance(self.capacity_factor, bool) or not isinstance(self.capacity_factor, (int, float)) or not (
                0.0 <= self.capacity_factor <= 64.0):
            raise RpegError(f"parallel layout: capacity_factor = {self.capacity_factor!r} must be 0 (dropless) or an "
                            "expert capacity factor up to 64")
        object.__setattr__(self, "capacity_factor", float(self.capacity_factor))
        rank = self.rank_capacity_factor
        if isinstance(rank, bool) or not isinstance(rank, (int, float)) or not (rank == 0 or 1.0 <= rank <= 64.0):
            raise RpegError(f"parallel layout: rank_capacity_factor = {rank!r:.80} must be 0 (buffers sized by a sync) "
                            "or a per-rank capacity factor from 1 to 64 (Megatron's moe_expert_rank_capacity_factor)")
        object.__setattr__(self, "rank_capacity_factor", float(rank))
        if self.capacity_factor and self.dispatcher not in ("alltoall", "allgather"):
            raise RpegError(f"parallel layout: capacity_factor = {self.capacity_factor:g} needs the alltoall or "
                            f"allgather dispatcher, not {self.dispatcher} (Megatron pads experts to capacity in those "
                            "only)")
        if self.ep_overlap and self.ep == 1:
            raise RpegError("parallel layout: ep_overlap needs ep > 1 (there is no expert-parallel all-to-all to "
                            "overlap)")

    def _check_cuda_graphs(self) -> None:
        """cuda_graphs: none, partial, full, or a list of Megatron-Core scopes, checked as Megatron-Core's
        TransformerConfig.__post_init__ checks cuda_graph_modules."""
        value = self.cuda_graphs
        if isinstance(value, str):
            if value not in CUDA_GRAPHS:
                raise RpegError(f"parallel layout: cuda_graphs = {value!r} must be one of {', '.join(CUDA_GRAPHS)} "
                                f"or a list of scopes ({', '.join(CUDA_GRAPH_SCOPES)})")
            return
        if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value):
            raise RpegError(f"parallel layout: cuda_graphs = {value!r:.80} must be none, partial, full or a non-empty "
                            f"list of scopes ({', '.join(CUDA_GRAPH_SCOPES)})")
        bad = [v for v in value if v not in CUDA_GRAPH_SCOPES]
        if bad:
            raise RpegError(f"parallel layout: cuda_graphs scope {bad[0]!r} is not one of "
                            f"{', '.join(CUDA_GRAPH_SCOPES)}")
        scopes = tuple(v for v in CUDA_GRAPH_SCOPES if v in value)
        if "full_iteration" in scopes and len(scopes) > 1:
            raise RpegError(f"parallel layout: cuda_graphs {list(value)} combines full_iteration with per-layer "
                            "scopes; a full-iteration graph takes no scope list (Megatron-Core: cuda_graph_modules "
                            "must be empty)")
        if "moe_preprocess" in scopes and "moe_router" not in scopes:
            raise RpegError("parallel layout: cuda_graphs scope moe_preprocess needs moe_router too (Megatron-Core: "
                            "'moe_preprocess cuda graph is only supported with moe_router cuda graph')")
        if "moe" in scopes and "moe_router" in scopes:
            raise RpegError("parallel layout: cuda_graphs has both moe and moe_router; keep one (Megatron-Core: "
                            "'cuda_graph_modules must not contain both moe and moe_router')")
        if "moe" in scopes and not self.capacity_factor:
            raise RpegError("parallel layout: cuda_graphs scope moe needs capacity_factor > 0 (Megatron-Core: 'moe "
                            "cuda graph is only supported with drop-padding MoE'); capture moe_router instead")
        object.__setattr__(self, "cuda_graphs", scopes)

    @property
    def graph_scopes(self) -> frozenset[str]:
        return graph_scopes(self.cuda_graphs)

    def replace(self, **changes) -> ParallelLayout:
        return dataclasses.replace(self, **changes)

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def layers_per_stage(self, layers: int) -> int:
        """Layers on the busiest pipeline stage."""
        return -(-layers // (self.pp * self.pp_interleave)) * self.pp_interleave

    def product_terms(self) -> str:
        return f"dp*tp*pp*cp = {self.dp}*{self.tp}*{self.pp}*{self.cp} = {self.devices}"

    def describe(self) -> str:
        parts = [f"{k}{getattr(self, k)}" for k in ("dp", "tp", "pp", "cp", "ep") if getattr(self, k) > 1]
        if self.zero:
            parts.append(f"zero{self.zero}")
        if self.recompute != "none":
            parts.append(f"recompute={self.recompute}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.pp_interleave > 1:
            parts.append(f"vpp{self.pp_interleave}")
        if self.pp_uneven:
            parts.append("uneven-pp")
        if self.micro_batch != 1:
            parts.append(f"mb{self.micro_batch}")
        if not self.packing:
            parts.append("unpacked")
        elif self.bins != "even":
            parts.append(f"bins={self.bins}")
        if self.offload_optimizer:
            parts.append("optimizer-on-host" + (f"={self.offload_optimizer:g}" if self.offload_optimizer < 1 else ""))
        if self.offload_params:
            parts.append("params-on-host")
        if self.resident:
            parts.append("resident=" + "+".join(self.resident))
        if self.pageable:
            parts.append("pageable=" + "+".join(self.pageable))
        parts += self.recipe_options()
        if self.logits != DEFAULT_LOGITS:
            parts.append(f"logits={self.logits}")
        if self.max_seqs:
            parts.append(f"max-seqs={self.max_seqs}")
        if self.static_batch:
            parts.append("static-batch")
        return " ".join(parts) or "single device"

    def recipe_options(self) -> list[str]:
        """The Megatron-Core recipe options this layout sets, as describe() shows them ([] for none)."""
        parts = []
        if self.recompute_modules:
            parts.append("recompute-modules=" + "+".join(self.recompute_modules))
        if self.recompute_layers:
            parts.append(f"recompute-layers={self.recompute_layers}")
        if self.offload_activation_layers:
            parts.append(f"activations-on-host={self.offload_activation_layers}")
        if self.grad_dtype != "fp32":
            parts.append(f"grads-{self.grad_dtype}")
        if self.optimizer_moments != "fp32":
            parts.append(f"moments-{self.optimizer_moments}")
        if self.pp_embedding_loss_slots:
            parts.append("pp-embedding-loss-slots")
        if not self.permute_fusion:
            parts.append("unfused-permute")
        return parts
