"""What the runtime can honour today, checked before anything starts; and the fastest plan it can."""

from __future__ import annotations

import dataclasses

from rpeg.errors import DoesNotFit, RpegError
from rpeg.graph import Graph, Kind
from rpeg.hardware.topology import Cluster
from rpeg.search import LayoutOptions, SpaceOptions, search
from rpeg.search.search import Candidate

SUPPORTED = ("ppo", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "dr_grpo", "remax", "dapo")


def check_plan(graph: Graph) -> None:
    """Raise RpegError with the reason if the runtime cannot run `graph` exactly as planned."""
    if graph.in_flight > 1 or graph.refill:
        what = (f"keeps {graph.in_flight} steps' prompts in flight" if graph.in_flight > 1
                else "admits the next step's prompts as this step's finish (refill)")
        raise RpegError(f"the plan {what} (NeMo-RL's async GRPO); the runtime generates one step's prompts at a "
                        "time: bound_asynchrony(k) with in_flight = 1 and refill false")
    if graph.algorithm not in SUPPORTED:
        raise RpegError(f"the runtime trains {', '.join(SUPPORTED)}, not {graph.algorithm}")
    if not graph.groups:
        raise RpegError("the plan places no stage on devices")
    lora = {m.name for m in graph.models if m.lora is not None}
    for s in graph.stages:
        lay = s.layout
        if s.model and s.kind is not Kind.SYNC and lay is None:
            raise RpegError(f"stage {s.name!r} has no parallel layout")
        if lay and (lay.cp > 1 or lay.ep > 1):
            raise RpegError(f"stage {s.name!r} asks for {lay.describe()}: the runtime runs data (FSDP2), tensor "
                            "(DTensor) and pipeline parallelism; context and expert parallelism are planned, not "
                            "executed")
        if lay and lay.pp > 1 and not (s.model == "actor" and s.kind in (Kind.TRAIN, Kind.INFER)):
            raise RpegError(f"stage {s.name!r} asks for {lay.describe()}: the runtime runs pipeline parallelism for "
                            "the policy's training and logprobs; pipelined generation, reference, critic and reward "
                            "models are not run")
        if lay and lay.pp > 1 and s.model in lora:
            raise RpegError(f"stage {s.name!r} asks for {lay.describe()}: the runtime trains LoRA adapters with data "
                            "(FSDP2) and tensor parallelism, not through a pipeline")
        if lay and lay.tp > 1 and s.kind is Kind.GENERATE and s.model in lora and \
                graph.model(s.model).lora.sync == "adapters":
            raise RpegError(f"stage {s.name!r} asks for {lay.describe()}: a tensor-parallel engine holding LoRA "
                            "adapters is not run; lora.sync: merged sends it the merged weights instead")
        if lay and lay.pp > 1 and lay.pp_interleave > 1:
            raise RpegError(f"stage {s.name!r} asks for {lay.describe()}: the runtime runs one pipeline stage per "
                            "rank (GPipe or 1F1B), not interleaved virtual stages")
        if lay and s.kind is Kind.TRAIN and lay.dp > 1 and lay.zero < 3:
            raise RpegError(f"stage {s.name!r} asks for {lay.describe()}: the runtime shards data-parallel training "
                            "with FSDP2, which is ZeRO-3 (zero = 3); plain or ZeRO-1/2 data parallelism is not run")
        if lay and (lay.offload_optimizer or lay.offload_params):
            raise RpegError(f"stage {s.name!r} asks for {lay.describe()}: the runtime keeps the optimizer state and "
                            "the parameters on the devices; offload to the host is planned, not executed")
        if lay and lay.recipe_options():
            raise RpegError(f"stage {s.name!r} asks for {lay.describe()}: the runtime runs none of Megatron-Core's "
                            "recipe options (recompute modules or layers, activation offload, bf16 gradients or "
                            "moments, embedding/loss pipeline slots); they are planned, not executed")
        if s.kind is Kind.REWARD and s.model is not None and lay is not None and lay.devices != lay.dp:
            raise RpegError(f"stage {s.name!r} asks for {lay.describe()}: the runtime runs a reward model data "
                            "parallel only (one scorer per device)")
    if graph.streams:
        _check_streams(graph)
    if graph.reference_on_host:
        raise RpegError("the plan keeps the reference's weights on the host and swaps them in (NeMo-RL's way); the "
                        "runtime holds the reference model on its devices")
    if graph.partial_rollout:
        _check_partial(graph)
    for group in graph.fusion:
        kinds = {graph.stage(n).kind for n in group}
        if set(group) != {"generate", "actor_logprobs"} and kinds != {Kind.TRAIN}:
            raise RpegError(f"the runtime fuses generation with the policy's logprobs, and the actor's and critic's "
                            f"updates, not ({', '.join(group)})")
    gen = graph.stage("generate")
    for s in graph.stages:
        if s.kind is Kind.GENERATE and s is not gen and (s.group != gen.group or s.layout != gen.layout):
            raise RpegError(f"stage {s.name!r} runs on the generation engines, so it must share generate's "
                            f"devices and layout ({gen.group}, {gen.layout.describe()})")
    train = graph.stage("actor_update")
    fused = any(set(f) == {"generate", "actor_logprobs"} for f in graph.fusion)
    logprobs = graph.stage("actor_logprobs").layout
    if not fused and (logprobs.dp, logprobs.tp, logprobs.pp) != (train.layout.dp, train.layout.tp, train.layout.pp):
        raise RpegError(f"actor_logprobs runs on the training workers, so its dp, tp and pp must match actor_update's "
                        f"(dp {train.layout.dp}, tp {train.layout.tp}, pp {train.layout.pp}); it asks for "
                        f"{logprobs.describe()}")
    _check_on_shards(graph, graph.stage("actor_logprobs"), train, fused)
    split = not graph.group(gen.group).overlaps(graph.group(train.group))
    ref = next((s for s in graph.stages if s.kind is Kind.INFER and s.model == "ref"), None)
    if ref is not None and "actor" in lora:  # the actor's workers with adapters off
        if ref.group != train.group or (ref.layout.dp, ref.layout.tp) != (train.layout.dp, train.layout.tp):
            raise RpegError(f"the LoRA reference runs on the actor's training workers, its adapters off: {ref.name} "
                            f"must share actor_update's devices and dp, tp ({train.group!r}, "
                            f"{train.layout.describe()}); it asks for {ref.layout.describe()} on {ref.group!r}")
        _check_on_shards(graph, ref, train, False)
    for s in graph.stages:
        if split and s.kind is Kind.INFER and s.model == "ref" and "actor" not in lora and \
                s.layout.devices != s.layout.dp:
            raise RpegError(f"stage {s.name!r} asks for {s.layout.describe()}: the runtime runs the reference data "
                            "parallel (a full copy per device, each on its share of the rows)")
    values = next((s for s in graph.stages if s.kind is Kind.INFER and s.model == "critic"), None)
    if values is not None and graph.has_model("critic"):
        update = next(s for s in graph.stages if s.kind is Kind.TRAIN and s.model == "critic")
        if (values.layout.dp, values.layout.tp) != (update.layout.dp, update.layout.tp):
            raise RpegError(f"{values.name} runs on the critic's training workers, so its dp and tp must match "
                            f"{update.name}'s (dp {update.layout.dp}, tp {update.layout.tp}); it asks for "
                            f"{values.layout.describe()}")
        _check_on_shards(graph, values, update, False)
    if train.layout.pp > 1 and "value" in graph.model("actor").heads:
        raise RpegError("the plan trains a value head on the actor with pipeline parallelism; the runtime pipelines "
                        "the policy's language-model head only")
    if graph.group(gen.group).overlaps(graph.group(train.group)):
        n = graph.group(train.group).count
        if graph.group(gen.group) != graph.group(train.group) or (gen.layout.dp, gen.layout.devices) != (n, n) \
                or train.layout.dp != n:
            raise RpegError(f"a colocated plan runs one process per device, each generating its share and training "
                            f"its FSDP2 shard: generation and training must share one group with data parallelism "
                            f"only (generate {gen.layout.describe()}, actor_update {train.layout.describe()} on "
                            f"{train.group!r}); give generation its own devices for tensor parallelism")
    if graph.refit_gather == "shard" and (train.layout.tp * train.layout.pp > 1 or gen.layout.tp > 1):
        raise RpegError(f"the plan's weight sync sends each engine slice only its shard (refit gather 'shard', with "
                        f"actor_update {train.layout.describe()} and generate {gen.layout.describe()}); the runtime "
                        "gathers every tensor in full and broadcasts it from the trainer's rank 0: plan it with "
                        "refit(gather='full')")


def _check_on_shards(graph: Graph, forward, update, fused: bool) -> None:
    """A forward pass that runs on data-parallel training workers runs on their FSDP2 shards, gathering
    each layer's weights as it goes: the plan must say so (zero 3), or its prediction counts whole
    weights that the run does not hold."""
    if not fused and update.layout.dp > 1 and forward.layout.zero != 3:
        raise RpegError(f"{forward.name} runs on {update.name}'s data-parallel workers, which hold FSDP2 shards and "
                        f"gather each layer's weights for a forward pass: its layout must say zero = 3 (it asks for "
                        f"{forward.layout.describe()})")


def _check_streams(graph: Graph) -> None:
    """Streaming as the runtime runs it: the step's prompt groups in M parts from generation on."""
    from rpeg.runtime.roles import step_stages

    names = step_stages(graph)
    counts = sorted({s.microbatches for s in graph.streams})
    if len(counts) > 1:
        raise RpegError(f"the plan streams in {counts} micro-batches on different edges; the runtime cuts a step "
                        "into one number of parts, from generation on")
    if not any(s.producer == names.generate for s in graph.streams):
        raise RpegError("the plan streams between stages after generation only; the runtime's streams start at "
                        "generation (its parts are prompt groups as the engines finish them)")
    if names.greedy or names.group_filter:
        raise RpegError("the plan streams with ReMax's greedy baseline or DAPO's group filter, which need the "
                        "whole step's samples; the runtime streams neither")
    if counts[0] > graph.job.prompts:
        raise RpegError(f"the plan streams {counts[0]} micro-batches of whole prompt groups; the job has only "
                        f"{graph.job.prompts} prompts")
    into_training = {s.consumer for s in graph.streams} & {names.actor_update, names.critic_update}
    if into_training and graph.job.ppo_epochs > 1:
        raise RpegError(f"the plan streams into {', '.join(sorted(into_training))} with {graph.job.ppo_epochs} PPO "
                        "epochs; the epochs after the first need the whole batch, and the runtime streams one epoch")


def _check_partial(graph: Graph) -> None:
    """Partial rollout runs on engines of their own: in-flight responses take each new version of the
    weights at their next segment, so the engines' weights must change only by a weight sync."""
    gen, train = graph.stage("generate"), graph.stage("actor_update")
    if graph.group(gen.group).overlaps(graph.group(train.group)):
        raise RpegError("the plan uses partial rollout with generation on the training devices; the runtime runs "
                        "it with the engines on devices of their own (a colocated engine samples with the trainer's "
                        "weights, which change mid-step), as AReaL and verl's fully_async do")
    if gen.layout.tp > 1:
        raise RpegError(f"the plan uses partial rollout with {gen.layout.describe()} generation; the runtime runs "
                        "it on engines of one device each (a tensor-parallel engine's ranks would have to take a "
                        "weight update at the same segment)")


def runnable_plan(graph: Graph, cluster: Cluster, gpus: int, micro_batch: int = 64, engine: str = "hf",
                  partial: bool = False) -> Candidate:
    """The fastest plan the runtime can honour: data parallelism only, whole batches, no streaming;
    every training and forward pass in micro-batches of `micro_batch` padded rows (`runtime.micro_batch`),
    stated in the plan's layouts so that the prediction counts the micro-batches the runtime runs (the
    runtime takes them from the layouts). Where no plan fits at `micro_batch` rows (the full-vocabulary
    fp32 logits of 64 padded rows of long sequences overflow any GPU: rpeg/perf/logits.py), the
    micro-batch is halved until one fits; the plan's name says so. With `engine` "hf" the generation
    layouts say the engine batches statically (ParallelLayout.static_batch), as RPEG's hf engine does.
    `partial`: the fastest such plan with partial rollout (engines of their own, k = 1), for measuring it."""
    rows = micro_batch
    while True:
        try:
            cand = _runnable_plan(graph, cluster, gpus, rows, engine == "hf", partial)
        except DoesNotFit:
            if rows == 1:
                raise
            rows = max(1, rows // 2)
            continue
        if rows == micro_batch:
            return cand
        return dataclasses.replace(cand, name=f"{cand.name}, micro-batches of {rows} rows (runtime.micro_batch "
                                              f"{micro_batch} does not fit)")


def _runnable_plan(graph: Graph, cluster: Cluster, gpus: int, micro_batch: int, static: bool,
                   partial: bool = False) -> Candidate:
    options = LayoutOptions(train_tp=(1,), train_pp=(1,), train_cp=(1,), zero=(3,), infer_zero=(0, 3), gen_tp=(1,),
                            expert_parallel=False, sequence_parallel=False, micro_batch=micro_batch, packing=False,
                            offload=False, gen_static_batch=static)
    space = SpaceOptions(share=False, fuse=True, stream=False, placements=("colocated", "split"),
                         partial_rollout=partial)
    result = search(graph, cluster, gpus, max_staleness=1, options=options, space=space, budget=200)
    for cand in result.ranked:
        if partial and not cand.graph.partial_rollout:
            continue
        try:
            check_plan(cand.graph)
            return cand
        except RpegError:
            continue
    raise RpegError("no plan the runtime can run was found for this job on this machine" + (
        " with partial rollout (it needs engines on devices of their own: gpus >= 2)" if partial else ""))
