"""AReaL: fully asynchronous, disaggregated generation and training, streamed per trajectory.

Sources: Fu et al., "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
Language Reasoning" (arXiv 2505.24298), §4 (asynchronous system: rollout workers, trainer
workers, staleness-bounded rollout controller, interruptible generation), §5 (decoupled PPO);
the AReaL docs: "Allocation Mode" (`sglang:d4t2+fsdp:d8`: inference and training on separate GPU
pools) and "Asynchronous RL" (`rollout.max_head_offpolicyness: 4` in its example, "typical range
2-8"; the CLI default 0 means synchronous).

What it models: k = 4 (max_head_offpolicyness); generation on the first 3/4 of the GPUs and
every other model stage (recomputed logprobs for the decoupled loss, reference, reward model if
any, training) on the last 1/4, both in whole nodes where each can have one (else in GPUs;
one GPU: everything colocated); every producer -> consumer edge that can stream does so with 16
micro-batches (trajectories flow to the trainer as they finish, which `rpeg.passes.stream`
allows up to the edges into a whole-batch optimizer step). Training is FSDP (ZeRO-3, tp 1,
pp 1, cp 1 or 2, gradient checkpointing or none); SGLang / vLLM generation uses tensor
parallelism inside a node.

Interruptible generation (§4: a trajectory that spans a weight update continues with the new
weights, its KV cache recomputed) is `partial_rollout`: the rollout engines never drain between
steps. Left out: AReaL's Megatron training backend; dynamic batching by token budget; the staleness manager's admission
control beyond the bound k; ZeRO-3-sharded forward passes of frozen models (full replicas here).
"""

from __future__ import annotations

from rpeg.errors import PassRefused
from rpeg.graph import Graph
from rpeg.hardware.topology import Cluster
from rpeg.passes import bound_asynchrony, partial_rollout, stream
from rpeg.search.baselines.common import check_input, finish, node_divisors, split_generation
from rpeg.search.layouts import LayoutCache, LayoutOptions

MAX_HEAD_OFFPOLICYNESS = 4
GENERATION_SHARE = 0.75
STREAM_MICROBATCHES = 16


def options(cluster: Cluster) -> LayoutOptions:
    return LayoutOptions(train_tp=(1,), train_pp=(1,), train_cp=(1, 2), zero=(3,), recompute=("none", "full"),
                         gen_tp=node_divisors(cluster), gen_pp=(1,), expert_parallel=False, sequence_parallel=False,
                         logits="chunked-logsoftmax")  # gather_logprobs: bf16 logits, fp32 slices of 1,024 tokens


def build(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    check_input(graph, cluster, gpus, "areal")
    g = bound_asynchrony(graph, MAX_HEAD_OFFPOLICYNESS)
    g = partial_rollout(g)  # interruptible generation: running trajectories continue across weight updates
    g = split_generation(g, cluster, gpus, GENERATION_SHARE, "rollout")
    try:
        g = stream(g, STREAM_MICROBATCHES)  # every edge that can stream
    except PassRefused:
        pass  # none can (a batch of fewer than 16 sequences): the plan runs batch by batch
    return finish(g, cluster, options(cluster), cache, "areal")
