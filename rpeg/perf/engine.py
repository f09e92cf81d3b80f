"""What every model of a generation engine builds on: the workload, the response lengths it is simulated
over, the time of one decode step (`StepModel`) and of a prefill (`prefill_s`).

rpeg/perf/generation.py prices continuous-batching engines (vLLM-class) with them and
rpeg/perf/static_engine.py RPEG's own hf engine, which batches statically.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from rpeg.graph.episode import Episode
from rpeg.graph.job import LengthDistribution
from rpeg.graph.layout import ParallelLayout
from rpeg.graph.model import ModelSpec
from rpeg.hardware.topology import Cluster
from rpeg.perf.collectives import Group, all_reduce_s
from rpeg.perf.compute import BF16, eager_host_s, head_forward, layer_forward
from rpeg.perf.efficiency import DECODE_OVERHEAD_PER_SEQ_S, DECODE_STEP_OVERHEAD_S, host_time
from rpeg.perf.fitted import declare
from rpeg.perf.moe import busiest_rank_load, dispatch_s

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
_GOLDEN = (math.sqrt(5) - 1) / 2
# An engine's sequences are simulated one by one up to this many; a larger share runs as more of
# the same waves of at most max_num_seqs (128 to 1,024) sequences, which 4,096 (4 to 32 waves) show in steady
# state, so the simulated times are scaled by n / SIM_SEQUENCES. This keeps the cost of a stage
# bounded whatever the batch (`rpeg plan` at 131,072 sequences on 8 GPUs took 70 s before).
SIM_SEQUENCES = 4_096


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


class StepModel:
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
        stage += head_forward(spec, self.cluster.device, tokens=mb, tp=lay.tp, dtype=self.dtype,
                              decode=True).seconds / pp
        comm = 2 * spec.layers / pp * all_reduce_s(self.cluster, mb * spec.hidden * BF16, Group(lay.tp, 1))
        # an eager engine's host time per forward call, where measured (cpu-local)
        stage += eager_host_s(self.cluster.device, spec.layers / pp)
        return pp * (stage + comm) + self.overhead(batch), pp * comm


def prefill_s(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, tokens: float, prompt: float,
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
