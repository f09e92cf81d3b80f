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
from dataclasses import dataclass

from rpeg.errors import RpegError
from rpeg.graph.episode import Episode
from rpeg.graph.job import LengthDistribution
from rpeg.graph.layout import ParallelLayout
from rpeg.graph.model import ModelSpec
from rpeg.hardware.device import Device
from rpeg.hardware.topology import Cluster
from rpeg.perf import memory
from rpeg.perf.collectives import Group, all_reduce_s
from rpeg.perf.compute import BF16, eager_host_s, head_forward, layer_forward
from rpeg.perf.cost import StageCost
from rpeg.perf.efficiency import (DECODE_OVERHEAD_PER_SEQ_S, DECODE_STEP_OVERHEAD_S, KV_MEMORY_UTILIZATION,
                                  KV_MEMORY_UTILIZATION_COLOCATED, Factor, host_time)
from rpeg.perf.fitted import declare
from rpeg.perf.flops import expected_generation_flops
from rpeg.perf.moe import busiest_rank_load, dispatch_s

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


OUTPUT_PER_SEQ_S = declare(
    "generation.output_per_seq_s", unit="s per running sequence per decode step (x86 host)", bounds=(1e-6, 3e-4),
    rows=("nemo-rl-v0.3-stages:rl:generation",), group="generation-output",
    mechanism="host time an engine spends per running sequence after each decode step turning its sampled token "
              "into output, on an x86 host (scaled by HOST_TIME): each request's EngineCoreOutput and vLLM V1's "
              "OutputProcessor.process_outputs (the request's state, its new token ids and, with logprobs=0 as "
              "NeMo-RL's SamplingParams ask at v0.3-v0.6, the sampled token's Logprob entry; incremental "
              "detokenization and stop strings only where a tokenizer is loaded: NeMo-RL skips it when no stop "
              "strings are set). NeMo-RL's synchronous engine runs it between steps (VLLM_ENABLE_V1_MULTIPROCESSING=0 "
              "in its vLLM worker: vllm.LLM's engine core in the worker's process, InprocClient)")
# the seconds of a simulated engine, by part (what `simulate_instance` returns besides its counts)
TIME_PARTS = ("prefill", "decode", "tensor-parallel comm", "engine step overhead", "output processing")
_GOLDEN = (math.sqrt(5) - 1) / 2
# An engine's sequences are simulated one by one up to this many; a larger share runs as more of
# the same waves of at most max_num_seqs (128 to 1,024) sequences, which 4,096 (4 to 32 waves) show in steady
# state, so the simulated times are scaled by n / SIM_SEQUENCES. This keeps the cost of a stage
# bounded whatever the batch (`rpeg plan` at 131,072 sequences on 8 GPUs took 70 s before).
SIM_SEQUENCES = 4_096
# An engine that never drains is priced over steps through which its batch turns over this many
# times, so that the last, partial wave of sequences that started together (similar lengths finish
# together) weighs at most 1/8 of a step (`steady_state`).
STEADY_WAVES = 8


@dataclass(frozen=True, kw_only=True, slots=True)
class GenWorkload:
    sequences: float  # per step, all instances
    prompt_len: float
    response: LengthDistribution
    dtype: str = "bf16"
    partial: bool = False  # partial rollout: the engine never drains between steps (passes/rollout.py)
    in_flight: int = 1  # steps whose sequences the engine may hold at once (Graph.in_flight); > 1: never drains
    refill: bool = False  # the next step's prompts enter as this step's finish (Graph.refill): never drains
    episode: Episode | None = None  # multi-turn: `response` is sampled plus observation tokens (graph/episode.py)
    async_bound: int = 0  # k: steps a sample may lag (an episode carried across steps spans up to k + 1)


def sampled_response(work: GenWorkload) -> LengthDistribution:
    """The tokens the engine samples per episode: the response less its observation tokens, every length
    scaled by the same share (a multi-turn job's lengths are given for the whole response)."""
    ep = work.episode
    if ep is None or ep.observed() <= 0:
        return work.response
    return scaled_lengths(work.response, ep.sampled_share(work.response.mean), work.response.mean - ep.observed())


def scaled_lengths(d: LengthDistribution, share: float, mean: float | None = None) -> LengthDistribution:
    """`d` with every length times `share` (at least one token); `mean`: the new mean where the caller has
    it exactly."""
    if share == 1.0:
        return d
    mean = d.mean * share if mean is None else mean
    cap = max(1, round(d.max * share))
    if d.kind == "fixed":
        return LengthDistribution.fixed(max(1.0, mean))
    if d.kind == "uniform":
        return dataclasses.replace(d, min=max(1, round(d.min * share)), max=max(cap, round(d.min * share), 1))
    if d.kind == "empirical":
        return dataclasses.replace(d, points=tuple(max(1, round(x * share)) for x in d.points), max=0)
    return dataclasses.replace(d, mean=mean, max=cap)


def episode_parts(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, work: GenWorkload,
                  n: float, spread: int = 1) -> dict[str, float]:
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
      longer than that stretches the steps (or, in the peers, drops the episode as too stale)."""
    ep = work.episode
    k = ep.tool_turns
    if k <= 0:
        return {}
    per_turn = sampled_response(work).mean / ep.turns + ep.observation_tokens
    if ep.prefix_cache:
        tokens = k * ep.observation_tokens
        context = work.prompt_len + ep.turns * per_turn / 2
    else:  # turn j (1..k) prefills the prompt and j turns of reply and observation again
        tokens = k * work.prompt_len + per_turn * k * (k + 1) / 2
        context = tokens / k
    prefill = _prefill_s(spec, layout, cluster, n * tokens, context, work.dtype, n * k) if tokens > 0 else 0.0
    waits = k * ep.tool_latency_s / spread
    return {"observation prefill": prefill, "tool waits (critical path)": waits}


def response_lengths(dist: LengthDistribution, n: int) -> list[float]:
    """n lengths at quantiles (i + 0.5) / n, in a low-discrepancy (interleaved) order."""
    qs = sorted(((i * _GOLDEN) % 1.0, i) for i in range(n))
    return [max(1.0, round(dist.quantile((i + 0.5) / n))) for _, i in qs]


def critical_lengths(dist: LengthDistribution, n: int, total: float) -> list[float]:
    """The response lengths of the engine the step waits for: of `total` responses spread over the
    engines, `n` each, the step ends when the engine holding the longest of all of them is done. Its
    other responses are typical (quantiles of its own n); its longest is the batch's longest: the
    median of the maximum of `total` independent lengths, quantile 0.5 ** (1 / total), not the
    longest of a typical n."""
    lengths = response_lengths(dist, n)
    if total > n:
        top = max(range(n), key=lengths.__getitem__)
        lengths[top] = max(lengths[top], max(1.0, round(dist.quantile(0.5 ** (1 / total)))))
    return lengths


class _StepModel:
    """Decode-step time for a batch of `batch` sequences holding `context` KV tokens in total."""

    def __init__(self, spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, dtype: str):
        self.spec, self.layout, self.cluster, self.dtype = spec, layout, cluster, dtype
        self.host = host_time(cluster.device)

    def overhead(self, batch: float) -> float:
        """The engine's host time per decode step, on the CPU that drives the device (HOST_TIME)."""
        return (DECODE_STEP_OVERHEAD_S.value + DECODE_OVERHEAD_PER_SEQ_S.value * batch) * self.host

    def output(self, batch: float) -> float:
        """The engine's host time per decode step turning `batch` sequences' tokens into outputs."""
        return OUTPUT_PER_SEQ_S.value * batch * self.host

    def __call__(self, batch: float, context: float) -> tuple[float, float]:
        """(seconds, of which TP communication)."""
        spec, lay = self.spec, self.layout
        pp = lay.pp
        mb = max(batch / pp, 1e-9)  # pp groups of the batch in flight, each through every stage
        ctx = context / pp
        dense = spec.layers if not spec.is_moe else spec.dense_layers
        moe = 0 if not spec.is_moe else spec.moe_layers
        stage = 0.0
        kw = dict(tokens=mb, context=ctx / max(mb, 1e-9), tp=lay.tp, ep=lay.ep, kv_read_tokens=ctx, dtype=self.dtype)
        if dense:
            stage += layer_forward(spec, self.cluster.device, moe_layer=False, **kw).seconds * dense / pp
        if moe:  # the busiest expert-parallel rank's experts, and the EP exchange (perf/moe.py)
            load = busiest_rank_load(spec, lay.ep, lay.routing, lay.capacity_factor)
            stage += layer_forward(spec, self.cluster.device, moe_layer=True, moe_load=load, **kw).seconds * moe / pp
            stage += 2 * dispatch_s(self.cluster, spec, mb, lay.ep, lay.dispatcher, load) * moe / pp
        stage += head_forward(spec, self.cluster.device, tokens=mb, tp=lay.tp, dtype=self.dtype, decode=True).seconds / pp
        comm = 2 * spec.layers / pp * all_reduce_s(self.cluster, mb * spec.hidden * BF16, Group(lay.tp, 1))
        # an eager engine's host time per forward call, where measured (cpu-local)
        stage += eager_host_s(self.cluster.device, spec.layers / pp)
        return pp * (stage + comm) + self.overhead(batch), pp * comm


def _prefill_s(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, tokens: float, prompt: float,
               dtype: str, sequences: float) -> float:
    """A prefill of `tokens` tokens of `sequences` sequences: the decoder layers over every token, the
    vocabulary head over each sequence's last position only (vLLM computes logits only where it
    samples: the first response token)."""
    if tokens <= 0:
        return 0.0
    kw = dict(tokens=tokens / layout.pp, context=prompt / 2, tp=layout.tp, ep=layout.ep, dtype=dtype)
    dense = spec.layers if not spec.is_moe else spec.dense_layers
    t = layer_forward(spec, cluster.device, moe_layer=False, **kw).seconds * dense
    if spec.is_moe:  # the busiest expert-parallel rank's experts, and the EP exchange (perf/moe.py)
        load = busiest_rank_load(spec, layout.ep, layout.routing, layout.capacity_factor)
        t += layer_forward(spec, cluster.device, moe_layer=True, moe_load=load, **kw).seconds * spec.moe_layers
        t += 2 * dispatch_s(cluster, spec, tokens / layout.pp, layout.ep, layout.dispatcher, load) * spec.moe_layers
    t += head_forward(spec, cluster.device, tokens=sequences, tp=layout.tp, dtype=dtype).seconds
    t += eager_host_s(cluster.device, spec.layers)  # an eager engine's host time per call, where measured
    comm = 2 * spec.layers * all_reduce_s(cluster, tokens / layout.pp * spec.hidden * BF16, Group(layout.tp, 1))
    return t + comm


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


def simulate_static(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, *, n: float, prompt: float,
                    lengths: list[float], dtype: str = "bf16", max_seqs: int = 256) -> dict[str, float]:
    """An engine that batches statically (ParallelLayout.static_batch: RPEG's hf engine) over `n` sequences
    of which `lengths` are a sample: waves of up to `max_seqs`, each prefilled together and decoded until
    its longest response ends with every row kept in the batch (a finished row decodes padding), the next
    wave only then. Seconds by part, as simulate_instance gives them."""
    step = _StepModel(spec, layout, cluster, dtype)
    out = {"decode": 0.0, "prefill": 0.0, "tensor-parallel comm": 0.0, "engine step overhead": 0.0,
           "output processing": 0.0, "decode_steps": 0.0, "preemptions": 0}
    waves = max(1, math.ceil(n / max_seqs))
    per = len(lengths) / waves  # the sample's sequences each wave stands for
    for w in range(waves):
        part = lengths[round(w * per):round((w + 1) * per)] or lengths
        b = n / waves
        steps = max(part) - 1  # the prefill samples the first token; then one decode step per token
        out["prefill"] += _prefill_s(spec, layout, cluster, b * prompt, prompt, dtype, b)
        if steps <= 0:
            continue
        t0, c0 = step(b, b * prompt)
        t1, c1 = step(b, b * (prompt + steps))
        over = step.overhead(b)
        out["decode"] += steps * ((t0 + t1) / 2 - (c0 + c1) / 2 - over)
        out["tensor-parallel comm"] += steps * (c0 + c1) / 2
        out["engine step overhead"] += steps * over
        o = step.output(b)  # as simulate_instance counts it: beside the step loop only its excess shows
        out["output processing"] += steps * (o if layout.inline_output else max(0.0, o - (t0 + t1) / 2))
        out["decode_steps"] += steps
    return out


def static_episode_rounds(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, work: GenWorkload,
                          n: float, max_seqs: int) -> dict[str, float]:
    """A static-batch engine's multi-turn episodes: each round of turns is one call (runtime/agent_engine.py
    gathers the turns that are ready), which prefills every context in it again (the hf engine keeps no
    cache between calls) and decodes until the call's longest reply ends. Rounds: the episodes' mean turns
    rounded up (the calls a step makes when every episode's tool returns within the call's gathering
    window); round r holds the episodes that reach it, min(1, turns - r) of them. A reply is an episode's
    sampled tokens over its turns; the call's longest is that of the step's longest reply
    (critical_lengths). Seconds by part, the later rounds' prefills as "observation prefill"."""
    ep = work.episode
    reply = scaled_lengths(sampled_response(work), 1.0 / ep.turns)
    total: dict[str, float] = {}
    for r in range(ep.rounds):
        share = min(1.0, ep.turns - r)  # of the episodes, those that reach round r
        alive = n * share
        context = work.prompt_len + r * (reply.mean + ep.observation_tokens)
        sim_n = max(1, min(math.ceil(alive), SIM_SEQUENCES))
        lengths = critical_lengths(reply, sim_n, work.sequences * share)
        part = simulate_static(spec, layout, cluster, n=alive, prompt=context, lengths=lengths, dtype=work.dtype,
                               max_seqs=max_seqs)
        if r:
            part["observation prefill"] = part.pop("prefill")
        for k, v in part.items():
            total[k] = total.get(k, 0.0) + v
    return total


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
    if work.partial:
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
    if work.partial:  # once per step, whatever the number of simulated waves
        sim["recompute carried KV cache"] = carried_recompute_s(spec, layout, cluster, work, capacity, n)
    spread = work.async_bound + 1 if work.partial or work.in_flight > 1 or work.refill else 1
    turns = episode_parts(spec, layout, cluster, full, n, spread) if full.episode is not None else {}
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
