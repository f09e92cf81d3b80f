"""stage_cost: the cost of one stage of a planned graph (placed, with a parallel layout)."""

from __future__ import annotations

import dataclasses

from rpeg.errors import RpegError
from rpeg.graph import Graph, Kind, Stage
from rpeg.hardware.topology import Cluster
from rpeg.perf import batchdata, memory, packing
from rpeg.perf.calls import with_serial_calls
from rpeg.perf.compute import BF16
from rpeg.perf.cost import StageCost
from rpeg.perf.efficiency import Factor, host_link_bytes_per_s
from rpeg.perf.generation import GenWorkload, generation_cost
from rpeg.perf.training import PassWorkload, pass_cost
from rpeg.perf.weightsync import (RECEIVE_BUFFER, SLEEPING_ENGINE, receive_buffer_bytes, sleeping_engine_bytes,
                                  weight_sync_cost)

SWAPS = 3  # reference_on_host: the actor's weights out, the reference's in, the actor's back in (passes/reference.py)
PACKED_TOKENS = Factor(1.0, "sequence packing fills a training or logprob micro-batch up to its token budget "
                            "(micro_batch x the longest sequence: NeMo-RL's train_mb_tokens / logprob_mb_tokens, "
                            "verl's ppo_max_token_len_per_gpu)")


def attention_context(graph: Graph) -> float:
    """Mean keys per query of causal attention over the job's sequences: E[s^2] / (2 E[s])."""
    p = graph.job.prompt_len
    resp = graph.job.response
    e_r, e_r2 = resp.moments()
    e_s = p + e_r
    e_s2 = p * p + 2 * p * e_r + e_r2
    return e_s2 / (2 * e_s)


def padded_length(graph: Graph) -> float:
    """The longest sequence of the step's batch, to which an unpacked batch pads every sequence:
    the prompt plus the median of the longest of the step's responses (quantile 0.5 ** (1 / N))."""
    job = graph.job
    return job.prompt_len + job.response.quantile(0.5 ** (1 / max(1, job.sequences)))


def _pass_workload(graph: Graph, stage: Stage, *, train: bool, even: bool = False) -> PassWorkload:
    """The pass's workload; a packed layout with bins = "ffd" gets its busiest rank's tokens and bins
    (rpeg/perf/packing.py) unless `even`."""
    job = graph.job
    seqs = graph.stage_sequences(stage)
    layout = stage.layout
    mb = layout.micro_batch if layout is not None else 1
    steps = job.ppo_epochs * job.mini_batches if train else 1
    per_step = seqs / job.mini_batches if train else seqs
    if layout is None or layout.packing:  # micro-batches packed up to their token budget
        seq_len, context = job.mean_seq_len, attention_context(graph)
        budget = PACKED_TOKENS.value * mb * job.max_seq_len
        micro = max(1.0, budget / seq_len)
        if layout is not None and layout.bins == "ffd" and not even:  # the busiest rank's bins, padding included
            load = packing.busiest_rank(job.response, job.prompt_len, max(1, round(per_step)), round(budget),
                                        layout.dp, layout.pp > 1, _pad_multiple(layout))
            per_rank = per_step / layout.dp
            seq_len = load.tokens / per_rank
            micro = per_rank / load.bins * (1 + 1e-9)  # pass_cost's ceil(per_rank / micro) = the bins
    else:  # mb sequences per micro-batch, each padded to the batch's longest; attention over the padding too
        seq_len = padded_length(graph)
        context, micro = (seq_len + 1) / 2, float(mb)
    # a critic's value head or a reward model's score head: hidden x 1, not the vocabulary
    value_head = "lm" not in graph.model(stage.model).heads
    return PassWorkload(sequences=per_step, seq_len=seq_len, attention_context=context,
                        micro_batch=micro, optimizer_steps=steps, forward_only=not train, value_head=value_head,
                        lora=graph.model(stage.model).lora)


def _pad_multiple(layout) -> int:
    """NeMo-RL pads each packed sequence to a multiple of tp, of 2 x cp x tp under context parallelism
    (lm_policy.py's sequence_length_pad_multiple)."""
    return 2 * layout.cp * layout.tp if layout.cp > 1 else layout.tp


def _with_bins(cost: StageCost, even: StageCost) -> StageCost:
    """`cost` (the busiest rank's bins) with `even`'s breakdown (the mean share) and the difference as
    a line of its own."""
    return dataclasses.replace(cost, parts=even.parts + ((packing.LABEL, cost.seconds - even.seconds),))


def stage_cost(graph: Graph, stage: Stage, cluster: Cluster) -> StageCost:
    if stage.kind in (Kind.COMPUTE,) or (stage.kind is Kind.REWARD and stage.model is None):
        return StageCost(stage=stage.name, seconds=0.0, parts=(("host-side, negligible", 0.0),))
    if stage.kind is Kind.SYNC:
        return _sync_cost(graph, stage, cluster)
    if stage.layout is None:
        raise RpegError(f"stage {stage.name!r} has no parallel layout: apply parallelize(stage={stage.name!r}, ...)")
    spec = graph.model(stage.model).spec
    if stage.kind is Kind.GENERATE:
        work = GenWorkload(sequences=graph.stage_sequences(stage), prompt_len=graph.job.prompt_len,
                           response=graph.job.response, partial=graph.partial_rollout,
                           in_flight=graph.in_flight, refill=graph.refill, episode=graph.job.episode,
                           async_bound=graph.async_bound)
        colocated = _shares_with_training(graph, stage)
        # the engine alone; what the trainers keep beside it is summed per device (rpeg/perf/residency.py)
        cost = generation_cost(stage.name, spec, stage.layout, cluster, work, colocated=colocated)
        if graph.call_sequences:  # the engine reached in serial calls of a few sequences (passes/calls.py)
            cost = with_serial_calls(cost, spec, stage.layout, cluster, work, graph.call_sequences, colocated)
        if any(s.kind is Kind.SYNC and s.model == stage.model for s in graph.stages):  # it receives new weights
            cost = _with_memory(cost, ((RECEIVE_BUFFER, receive_buffer_bytes(spec, stage.layout, graph.refit_gather,
                                                                             graph.model(stage.model).lora)),))
        return cost
    train = stage.kind is Kind.TRAIN
    cost = pass_cost(stage.name, spec, stage.layout, cluster, _pass_workload(graph, stage, train=train))
    if stage.layout.packing and stage.layout.bins != "even":
        even = pass_cost(stage.name, spec, stage.layout, cluster, _pass_workload(graph, stage, train=train, even=True))
        cost = _with_bins(cost, even)
    cost = _with_batch_transfer(graph, stage, cost, train=train)
    if graph.reference_on_host and stage.model == "ref" and stage.kind is Kind.INFER:
        cost = _with_reference_swap(graph, stage, cost, cluster)
    # a pass on devices where a generation engine sleeps keeps beside it what the sleep does not release
    return _with_memory(cost, sleeping_engine_parts(graph, stage))


def _with_memory(cost: StageCost, parts: tuple[tuple[str, float], ...]) -> StageCost:
    """`parts` (name, bytes per device) join the stage's peak memory and its breakdown."""
    parts = tuple((name, b) for name, b in parts if b > 0)
    if not parts:
        return cost
    return dataclasses.replace(cost, peak_memory_bytes=cost.peak_memory_bytes + sum(b for _, b in parts),
                               memory_parts=cost.memory_parts + parts)


def sleeping_engine_parts(graph: Graph, stage: Stage) -> tuple[tuple[str, float], ...]:
    """What the generation engines on the stage's devices keep there while they sleep: their NCCL
    communicators' buffers (rpeg/perf/weightsync.py), one line per engine whose layout is set."""
    if stage.group is None:
        return ()
    mine = graph.group(stage.group)
    engines = [s for s in graph.stages if s.kind is Kind.GENERATE and s.layout is not None and s.group
               and graph.group(s.group).overlaps(mine)]
    return tuple((f"{SLEEPING_ENGINE} ({s.name})", sleeping_engine_bytes(s.layout)) for s in engines)


def _with_batch_transfer(graph: Graph, stage: Stage, cost: StageCost, *, train: bool) -> StageCost:
    """The pass's batch, padded to the step's longest sequence, shipped by the driver to every worker
    (rpeg/perf/batchdata.py): one call per pass, its own line of the breakdown."""
    s = batchdata.batch_transfer_s(stage.layout, graph.stage_sequences(stage), padded_length(graph), train=train)
    return dataclasses.replace(cost, seconds=cost.seconds + s, comm_s=cost.comm_s + s,
                               parts=cost.parts + ((batchdata.LABEL, s),))


def _with_reference_swap(graph: Graph, stage: Stage, cost: StageCost, cluster: Cluster) -> StageCost:
    """The reference pass borrows the actor's model: the actor's per-device weights go to the host,
    the reference's come in, and the actor's go back (passes/reference.py): SWAPS copies of the
    per-device bf16 weights over the host link, before and after the pass."""
    train = next(s for s in graph.stages if s.kind is Kind.TRAIN and s.model == "actor")
    layout = train.layout or stage.layout
    bytes_ = SWAPS * BF16 * memory.params_per_device(graph.model("actor").spec, layout)
    swap = bytes_ / host_link_bytes_per_s(cluster.device)
    return dataclasses.replace(cost, seconds=cost.seconds + swap, memory_s=cost.memory_s + swap,
                               parts=cost.parts + (("reference weights swapped through the host", swap),))


def _shares_with_training(graph: Graph, stage: Stage) -> bool:
    """Whether the stage's devices also host a training stage (a colocated engine)."""
    if stage.group is None:
        return False
    mine = graph.group(stage.group)
    return any(s.kind is Kind.TRAIN and s.group and graph.group(s.group).overlaps(mine) for s in graph.stages)


def _sync_cost(graph: Graph, stage: Stage, cluster: Cluster) -> StageCost:
    train = next(s for s in graph.stages if s.kind is Kind.TRAIN and s.model == stage.model)
    gens = [s for s in graph.stages if s.kind is Kind.GENERATE and s.model == stage.model]
    if not gens:
        return StageCost(stage=stage.name, seconds=0.0)
    gen = gens[0]
    if train.layout is None or gen.layout is None:
        raise RpegError(f"stage {stage.name!r} needs the layouts of {train.name!r} and {gen.name!r}")
    tg, gg = graph.group(train.group), graph.group(gen.group)
    colocated = tg.overlaps(gg)
    return weight_sync_cost(stage.name, graph.model(stage.model).spec, train.layout, gen.layout, cluster,
                            colocated=colocated, separation=0 if colocated else abs(gg.first - tg.first),
                            gather=graph.refit_gather, lora=graph.model(stage.model).lora)
