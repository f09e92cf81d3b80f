"""Generation with a continuous-batching engine (vLLM-class): prefill, decode, KV-limited batching.

Each of the `dp` engine instances (tp x pp devices) gets its share of the sequences. Their
response lengths are the job's distribution at evenly spaced quantiles, in an interleaved
order (a batch is a random mix of short and long answers), so the tail is there: the instance
runs until its longest response is done, with a shrinking batch at the end. The instance costed
is the one the step waits for: it holds the longest response of the whole batch (an order
statistic of all the sequences, not of one engine's share; `critical_lengths`). With partial
rollout (responses carried across steps, `rpeg.passes.partial_rollout`) the engine never drains,
and a step costs the time one more step's sequences add to an engine that keeps running. The same
holds when the system keeps several steps' prompts in flight (`Graph.in_flight` > 1, NeMo-RL's
async GRPO: rpeg/passes/asynchrony.py), or admits the next step's prompts as this step's finish,
through weight updates (`Graph.refill`, NeMo-RL's in_flight_weight_updates): the engine's batch then
holds up to in_flight steps' sequences, as many as max_num_seqs and the KV cache admit, and a step
costs one step's sequences at that steady occupancy; the long tail is paid once, not every step.

The engine admits sequences while fewer than max_num_seqs run (`engine_max_seqs`: the caller's
setting, else vLLM's default for the engine's entry point and device) and their KV cache fits in what
the weights leave of `gpu_memory_utilization` x HBM; when growing sequences would overflow it,
the newest is preempted and later recomputed (vLLM's default preemption). Between two events
(a sequence finishing or being admitted) the batch is fixed, so the decode time of the interval
is the step time at its start and end, averaged, times its steps. A step reads the weights (the
experts a batch touches, for MoE) and the batch's KV cache, computes its GEMMs and attention
(roofline), all-reduces over tensor parallelism twice per layer, and pays the engine's per-step
CPU overhead. The engine then turns the step's sampled tokens into its outputs (each request's
new token and its logprob entry; detokenization and stop strings where a tokenizer is loaded), host
time per running sequence
(`OUTPUT_PER_SEQ_S`, fitted): where the engine core runs in the caller's process (the layout's
`inline_output`: vLLM's LLM with VLLM_ENABLE_V1_MULTIPROCESSING=0, NeMo-RL's synchronous engine) the
devices wait for it every step, its own line; with the engine core in its own process (vLLM V1's
default; its AsyncLLM always) it runs beside the next step and costs only what exceeds it. An MoE
layer's experts (vLLM's fused MoE) cost as the busiest expert-parallel rank's under the layout's
routing, and with expert parallelism the step dispatches and combines its tokens (perf/moe.py;
counted in the decode and prefill lines).
"""

from __future__ import annotations

import dataclasses
import heapq
import math

from rpeg.errors import RpegError
from rpeg.graph.layout import ParallelLayout
from rpeg.graph.model import ModelSpec
from rpeg.hardware.device import Device
from rpeg.hardware.topology import Cluster
from rpeg.perf import memory
from rpeg.perf.cost import StageCost
from rpeg.perf.efficiency import KV_MEMORY_UTILIZATION, KV_MEMORY_UTILIZATION_COLOCATED, Factor
from rpeg.perf.engine import OUTPUT_PER_SEQ_S as OUTPUT_PER_SEQ_S  # its home is the engine model; a name here too
from rpeg.perf.engine import SIM_SEQUENCES, GenWorkload, critical_lengths, response_lengths, sampled_response
from rpeg.perf.engine import StepModel as _StepModel
from rpeg.perf.engine import prefill_s as _prefill_s
from rpeg.perf.engine import scaled_lengths as scaled_lengths
from rpeg.perf.flops import expected_generation_flops
from rpeg.perf.static_engine import segment_tokens, simulate_segmented, simulate_static, static_episode_rounds

# vLLM's max_num_seqs when the caller sets none (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults and
# _set_default_max_num_seqs_and_batched_tokens_args, from v0.10 to v0.17 at least): the offline LLM class
# (UsageContext.LLM_CLASS) gets 1,024 on a GPU reporting 70 GiB or more whose name does not say A100, 256 on
# other GPUs, 256 x tp x pp on a CPU; AsyncLLM.from_engine_args passes UsageContext.ENGINE_CONTEXT, which is
# in neither table, so it falls through to SchedulerConfig.DEFAULT_MAX_NUM_SEQS, 128.
LLM_CLASS_MAX_SEQS_LARGE = Factor(1024, "vLLM's LLM class default max_num_seqs on a GPU of >= 70 GiB that is not "
                                        "an A100 (EngineArgs.get_batch_defaults: 'For GPUs like H100 and MI300x, "
                                        "use larger default values')")
LLM_CLASS_MAX_SEQS = Factor(256, "vLLM's LLM class default max_num_seqs on other GPUs, and per tp x pp rank on "
                                 "a CPU (EngineArgs.get_batch_defaults)")
ASYNC_ENGINE_MAX_SEQS = Factor(128, "vLLM's AsyncLLM default max_num_seqs: its UsageContext.ENGINE_CONTEXT is in "
                                    "neither default table, so SchedulerConfig.DEFAULT_MAX_NUM_SEQS applies")
LARGE_GPU_BYTES = 70 * 2**30  # the 70 GiB threshold of EngineArgs.get_batch_defaults


def engine_max_seqs(layout: ParallelLayout, device: Device) -> int:
    """The most sequences one decode step of an engine runs: the layout's max_seqs where the caller set
    it, else vLLM's LLM class default for the device (see LLM_CLASS_MAX_SEQS_LARGE)."""
    if layout.max_seqs:
        return layout.max_seqs
    if device.kind == "cpu":
        return int(LLM_CLASS_MAX_SEQS.value) * layout.tp * layout.pp
    large = device.hbm_capacity_bytes >= LARGE_GPU_BYTES and "a100" not in device.name.lower()
    return int((LLM_CLASS_MAX_SEQS_LARGE if large else LLM_CLASS_MAX_SEQS).value)


# the seconds of a simulated engine, by part (what `simulate_instance` returns besides its counts)
TIME_PARTS = ("prefill", "decode", "tensor-parallel comm", "engine step overhead", "output processing")
# An engine that never drains is priced over steps through which its batch turns over this many
# times, so that the last, partial wave of sequences that started together (similar lengths finish
# together) weighs at most 1/8 of a step (`steady_state`).
STEADY_WAVES = 8


def episode_parts(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, work: GenWorkload,
                  n: float, spread: int = 1, capacity: float = math.inf) -> dict[str, float]:
    """What a multi-turn step adds to an engine's `n` episodes, beyond decoding their sampled tokens:

    - observation prefill: each tool turn's observation tokens are prefilled before the next reply
      (with the prefix cache, only they; without it, the whole context so far, every turn: the hf
      engine's case, and vLLM's with enable_prefix_caching off);
    - tool waits: the episode that finishes last waits for each of its tool calls with nothing left to
      hide them behind, so its `turns - 1` calls' latency is on the step's critical path (the depth term
      of the work-depth view: turns x tokens per turn plus tool latency). Other episodes' waits overlap
      decoding: vLLM frees a request's batch slot when its turn ends, and the hf engine batches the turns
      that are ready (runtime/agent_engine.py). An engine that never drains (partial rollout, several
      steps in flight, refill) carries an episode across steps: it may span the k + 1 steps the
      staleness bound allows, so its waits are spread over them, 1 / (k + 1) a step (`spread`); a wait
      longer than that stretches the steps (or, in the peers, drops the episode as too stale);
    - prefix cache evictions: a waiting episode's context is not reserved. vLLM frees a finished turn's
      blocks to its prefix cache, where they stay only while the KV cache (`capacity` tokens) has room
      for them; under pressure the least recently used are evicted, and that episode's next turn
      prefills its whole context again. The share that survives is taken as capacity over what the
      engine's `n` episodes hold at mid-episode (prompt + half their turns), at most 1: the prefix
      cache's hit rate when every episode's context competes for the same blocks. The extra prefill of
      the rest is this line; without the cache every turn pays it already."""
    ep = work.episode
    k = ep.tool_turns
    if k <= 0:
        return {}
    per_turn = sampled_response(work).mean / ep.turns + ep.observation_tokens
    full = k * work.prompt_len + per_turn * k * (k + 1) / 2  # turn j (1..k) prefills the prompt and j turns again
    if ep.prefix_cache:
        tokens = k * ep.observation_tokens
        context = work.prompt_len + ep.turns * per_turn / 2
    else:
        tokens = full
        context = tokens / k
    prefill = _prefill_s(spec, layout, cluster, n * tokens, context, work.dtype, n * k) if tokens > 0 else 0.0
    waits = k * ep.tool_latency_s / spread
    out = {"observation prefill": prefill, "tool waits (critical path)": waits}
    held = n * (work.prompt_len + ep.turns * per_turn / 2)
    evicted = max(0.0, 1.0 - capacity / held) if ep.prefix_cache and held > 0 else 0.0
    if evicted > 0:  # a line only where the cache overflows
        extra = evicted * n * (full - tokens)
        out["prefix cache evictions"] = _prefill_s(spec, layout, cluster, extra, full / k, work.dtype, evicted * n * k)
    return out


def simulate_instance(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, *, n: int, prompt: float,
                      lengths: list[float], capacity_tokens: float, dtype: str = "bf16",
                      max_seqs: int | None = None) -> dict[str, float]:
    """Run one engine instance over `n` sequences, at most `max_seqs` (default: engine_max_seqs of the
    layout and device) running at once; returns seconds by part and counts."""
    step = _StepModel(spec, layout, cluster, dtype)
    queue = list(range(n))[::-1]  # pop() takes the next sequence in order
    done_tokens = [0.0] * n  # generated so far (kept across preemption for the recompute prefill)
    running: list[tuple[float, int]] = []  # heap of (finish at absolute decode step, seq)
    held = 0.0  # KV tokens held by running sequences, at `now`
    now = 0.0  # decode steps taken
    decode_s = prefill_s = comm_s = overhead_s = output_s = 0.0
    preemptions = 0
    max_seqs = engine_max_seqs(layout, cluster.device) if max_seqs is None else max(1, int(max_seqs))
    start_step: dict[int, float] = {}
    longest = max(lengths[:n], default=0.0)
    if prompt + longest > capacity_tokens:  # admission lets a lone sequence in, so check here
        raise RpegError(f"one sequence of {prompt:.0f} + {longest:.0f} tokens does not fit the KV cache "
                        f"({capacity_tokens:.0f} tokens per engine)")

    # A sequence admitted with d tokens already generated (d > 0 after a preemption) is prefilled over
    # prompt + d tokens, which samples token d + 1; each decode step feeds the last token in (its KV
    # is written) and samples one more, so a response of L tokens takes L - d - 1 decode steps and
    # holds prompt + L - 1 tokens of KV cache at the end (the last sampled token is never fed in).
    while queue or running:
        # admit
        admitted_tokens = admitted = 0.0
        while queue and len(running) < max_seqs:
            i = queue[-1]
            need = prompt + done_tokens[i] + 1
            if running and held + need > capacity_tokens:
                break
            queue.pop()
            start_step[i] = now
            heapq.heappush(running, (now + lengths[i] - done_tokens[i] - 1, i))
            held += need - 1
            admitted_tokens += prompt + done_tokens[i]
            admitted += 1
        prefill_s += _prefill_s(spec, layout, cluster, admitted_tokens, prompt, dtype, admitted)
        b = len(running)
        # advance to the next finish, or until the KV cache is full
        next_finish = running[0][0]
        room = (capacity_tokens - held) / b
        room = room if math.isinf(room) else math.floor(room)  # inf: no KV limit
        if next_finish <= now + 1e-9:  # responses of one token: done at their prefill
            delta = 0.0
        else:
            delta = max(1.0, min(next_finish - now, room)) if room >= 1 else 1.0
        ctx0 = held
        ctx1 = held + b * delta
        t0, c0 = step(b, ctx0)
        t1, c1 = step(b, ctx1)
        decode_s += delta * (t0 + t1) / 2
        comm_s += delta * (c0 + c1) / 2
        overhead_s += delta * step.overhead(b)
        # in the step loop the devices wait for it; beside it (an engine-core process) only its excess shows
        out = step.output(b)
        output_s += delta * (out if layout.inline_output else max(0.0, out - (t0 + t1) / 2))
        now += delta
        held = ctx1
        # finish
        while running and running[0][0] <= now + 1e-9:
            _, i = heapq.heappop(running)
            held -= prompt + lengths[i] - 1
            done_tokens[i] = lengths[i]
        held = max(held, 0.0)
        # preempt the newest while over capacity (vLLM recompute preemption)
        while running and held > capacity_tokens and len(running) > 1:
            newest = max(running, key=lambda x: start_step[x[1]])
            running.remove(newest)
            heapq.heapify(running)
            i = newest[1]
            done_tokens[i] += 1 + now - start_step[i]  # the token its prefill sampled, then one per step
            held -= prompt + done_tokens[i] - 1
            queue.append(i)
            preemptions += 1
    return {"decode": decode_s - comm_s - overhead_s, "prefill": prefill_s, "tensor-parallel comm": comm_s,
            "engine step overhead": overhead_s, "output processing": output_s, "decode_steps": now,
            "preemptions": preemptions}


def steady_state(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, *, n: int, lengths: list[float],
                 ahead: int, max_seqs: int, steps: int = 1, **kw) -> dict[str, float]:
    """What one more step's `n` sequences cost an engine that never drains: (T((ahead + steps) n) -
    T(ahead n)) / steps, the engine admitting at most `max_seqs` at once. Once `ahead` steps'
    sequences fill the batch, the next steps' run through it at that occupancy; both runs end with
    the same tail, so the difference holds none of it (the tail is paid once, not every step).
    Sequences of similar lengths admitted together finish together, in waves of the batch: over
    `steps` steps a last partial wave weighs 1 / steps as much."""
    one = simulate_instance(spec, layout, cluster, n=ahead * n, lengths=lengths * ahead, max_seqs=max_seqs, **kw)
    two = simulate_instance(spec, layout, cluster, n=(ahead + steps) * n, lengths=lengths * (ahead + steps),
                            max_seqs=max_seqs, **kw)
    return {k: max(0.0, two[k] - one[k]) / steps for k in one}


def carried_recompute_s(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, work: GenWorkload,
                        capacity: float, n: float) -> float:
    """Partial rollout: the responses in flight at the weight update carry into the next step with
    their KV cache recomputed (AReaL's interruptible generation; a colocated engine drops its KV cache
    when it sleeps anyway). An engine holds as many as its batch allows: max_num_seqs, what its KV
    cache admits, and no more than the two steps' sequences (`n` a step) its steady state runs
    (T(2n) - T(n)). A response caught in flight is a length-biased one (the inspection paradox): its
    context so far averages prompt + E[r^2] / (2 E[r]). Their recompute is one prefill of those tokens
    per step."""
    mean, mean2 = work.response.moments()
    context = work.prompt_len + (mean2 / (2 * mean) if mean > 0 else 0.0)
    most = min(engine_max_seqs(layout, cluster.device), 2 * n)
    in_flight = min(most, capacity / context if math.isfinite(capacity) else most)
    return _prefill_s(spec, layout, cluster, in_flight * context, context, work.dtype, in_flight)


def engine_layout(spec: ModelSpec, layout: ParallelLayout) -> ParallelLayout:
    """The layout as the memory model should see an engine: without expert parallelism, vLLM splits
    every expert over the tensor-parallel ranks, which holds as much per device as ep = tp."""
    if spec.is_moe and layout.ep == 1 and layout.tp > 1:
        return layout.replace(ep=layout.tp)
    return layout


def generation_cost(name: str, spec: ModelSpec, layout: ParallelLayout, cluster: Cluster,
                    work: GenWorkload, colocated: bool = False) -> StageCost:
    instances = layout.dp
    n = max(1, math.ceil(work.sequences / instances))
    dev = cluster.device
    util = (KV_MEMORY_UTILIZATION_COLOCATED if colocated else KV_MEMORY_UTILIZATION).value
    longest = work.prompt_len + work.response.max
    # sliding-window layers keep at most their window of a sequence: per token, that depends on its length
    typical = work.prompt_len + work.response.moments()[0]
    capacity = memory.kv_capacity_tokens(spec, engine_layout(spec, layout), dev.hbm_capacity_bytes,
                                         memory_utilization=util, context=typical)
    if capacity < longest:  # not even one sequence fits beside the weights: no time, an OOM verdict
        weights = memory.weight_bytes_per_device(spec, engine_layout(spec, layout))
        need = weights + longest * memory.kv_cache_bytes_per_token(spec, layout.tp, context=longest)
        return StageCost(stage=name, seconds=math.inf, peak_memory_bytes=need,
                         capacity_bytes=dev.hbm_capacity_bytes,
                         memory_parts=(("weights", weights), ("kv_cache", need - weights)), devices=layout.devices,
                         parts=(("does not fit", math.inf),))
    kw = dict(prompt=work.prompt_len, capacity_tokens=capacity, dtype=work.dtype)
    max_seqs = engine_max_seqs(layout, dev)
    full = work
    if work.episode is not None:  # decode the sampled tokens only; observations are prefilled (episode_parts)
        work = dataclasses.replace(work, response=sampled_response(work))
    segmented = work.partial and layout.static_batch and full.episode is None
    if segmented:  # RPEG's hf engine under partial rollout: segment calls over every step in flight
        sim_n = min(n, SIM_SEQUENCES // (work.async_bound + 1))
        sim = simulate_segmented(spec, layout, cluster, n=n, prompt=work.prompt_len, dtype=work.dtype,
                                 lengths=response_lengths(work.response, sim_n), segment=segment_tokens(work),
                                 ahead=work.async_bound, max_seqs=max_seqs)
        sim_n = n  # simulated at the step's n rows (the sample stands for them)
    elif work.partial:
        # Never draining: a step costs what one more step's sequences add to an engine that keeps
        # running, T(2n) - T(n), its batch kept full (responses carried across steps); the tail of
        # the longest response is paid once, not every step.
        sim_n = min(n, SIM_SEQUENCES)
        sim = steady_state(spec, layout, cluster, n=sim_n, lengths=response_lengths(work.response, sim_n), ahead=1,
                           max_seqs=max_seqs, **kw)
    elif work.in_flight > 1 or work.refill:
        # Several steps' prompts in flight, or the next step's admitted as this one's finish
        # (rpeg/passes/asynchrony.py): the batch holds up to in_flight steps' sequences, of which
        # max_num_seqs and the KV cache admit what they can; a step costs one
        # step's sequences at that occupancy, averaged over enough steps that STEADY_WAVES batches
        # turn over (a step's share simulated up to SIM_SEQUENCES / (s + 1), like the drained case).
        s = work.in_flight
        batch = min(max_seqs, s * n)
        sim_n = min(n, max(1, SIM_SEQUENCES // (s + 1)))
        sim = steady_state(spec, layout, cluster, n=sim_n, lengths=response_lengths(work.response, sim_n), ahead=s,
                           max_seqs=batch, steps=max(1, math.ceil(STEADY_WAVES * batch / sim_n)), **kw)
    elif layout.static_batch:  # RPEG's hf engine: a call decodes until its longest sequence ends
        if full.episode is not None and full.episode.tool_turns > 0:
            sim = static_episode_rounds(spec, layout, cluster, full, n, max_seqs)
        else:
            sim_n = min(n, SIM_SEQUENCES)
            sim = simulate_static(spec, layout, cluster, n=n, prompt=work.prompt_len, dtype=work.dtype,
                                  lengths=critical_lengths(work.response, sim_n, work.sequences), max_seqs=max_seqs)
        sim_n = n
    else:
        sim_n = min(n, SIM_SEQUENCES)
        lengths = critical_lengths(work.response, sim_n, work.sequences)
        sim = simulate_instance(spec, layout, cluster, n=sim_n, lengths=lengths, max_seqs=max_seqs, **kw)
    scale = n / sim_n
    sim = {k: v * scale for k, v in sim.items()}
    if work.partial and not segmented:  # once per step, whatever the number of simulated waves
        sim["recompute carried KV cache"] = carried_recompute_s(spec, layout, cluster, work, capacity, n)
    spread = work.async_bound + 1 if work.partial or work.in_flight > 1 or work.refill else 1
    turns = episode_parts(spec, layout, cluster, full, n, spread, capacity) if full.episode is not None else {}
    if "observation prefill" in sim:  # the static rounds prefilled each call's contexts themselves
        turns["observation prefill"] = sim.pop("observation prefill")
    sim |= turns
    keys = ("prefill", "decode", "tensor-parallel comm", "engine step overhead") + (
        ("output processing",) if layout.inline_output or sim["output processing"] > 0 else ()) + (
        ("recompute carried KV cache",) if work.partial else ()) + tuple(turns)
    parts = tuple((k, sim[k]) for k in keys)
    seconds = sum(v for _, v in parts)
    flops = work.sequences * expected_generation_flops(spec, work.prompt_len, work.response)
    weights = memory.weight_bytes_per_device(spec, engine_layout(spec, layout))
    kv_bytes = util * dev.hbm_capacity_bytes - weights
    return StageCost(stage=name, seconds=seconds, compute_s=sim["prefill"], memory_s=sim["decode"],
                     comm_s=sim["tensor-parallel comm"],
                     overhead_s=sim["engine step overhead"] + sim["output processing"], flops=flops,
                     peak_memory_bytes=weights + kv_bytes, capacity_bytes=dev.hbm_capacity_bytes,
                     memory_parts=(("weights", weights), ("kv_cache", kv_bytes)), devices=layout.devices,
                     microbatches=n * instances, parts=parts)
