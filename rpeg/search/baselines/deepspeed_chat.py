"""DeepSpeed-Chat: all four models colocated on all GPUs, synchronous, with the Hybrid Engine.

Sources: Yao et al., "DeepSpeed-Chat: Easy, Fast and Affordable RLHF Training of ChatGPT-like
Models at All Scales" (arXiv 2308.01320), §4 (Hybrid Engine: the actor switches between ZeRO
training and tensor-parallel inference for generation); the DeepSpeedExamples repository,
`applications/DeepSpeed-Chat` step 3 (`--enable_hybrid_engine`, `--inference_tp_size`,
`--actor_zero_stage 3`, `--critic_zero_stage 3`, `--actor_gradient_checkpointing`).

What it models: k = 0; every stage on one group of all GPUs, in turn, with the context switch
between training and generation (the Hybrid Engine's switch; its resharding of the actor is the
colocated `actor_sync`, whose ZeRO-3 `GatheredParameters` gathers every parameter in full on every
GPU: `refit(gather="full")`). Training is ZeRO-3 (tp 1, pp 1, no context parallelism, gradient
checkpointing or none); generation uses tensor parallelism inside a node; the other forward
passes run data parallel.

Left out: the reference and reward models' ZeRO-3 sharded inference (our inference layouts keep
a full replica per device, so a model that fits only sharded makes the plan None); LoRA, EMA,
the unsupervised (ptx) loss, CPU offload. DeepSpeed-Chat implements PPO with a critic only; for
other algorithms this is the same placement applied to their graph.
"""

from __future__ import annotations

from rpeg.graph import Graph
from rpeg.hardware.topology import Cluster
from rpeg.passes import bound_asynchrony, colocate, refit
from rpeg.search.baselines.common import check_input, finish, node_divisors
from rpeg.search.layouts import LayoutCache, LayoutOptions


REFIT_GATHER = "full"  # see the module docstring: every tensor gathered in full on every device


def options(cluster: Cluster) -> LayoutOptions:
    return LayoutOptions(train_tp=(1,), train_pp=(1,), train_cp=(1,), zero=(3,), recompute=("none", "full"),
                         gen_tp=node_divisors(cluster), gen_pp=(1,), expert_parallel=False, sequence_parallel=False)


def build(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    check_input(graph, cluster, gpus, "deepspeed-chat")
    g = bound_asynchrony(graph, 0)
    g = colocate(g, gpus)
    g = refit(g, REFIT_GATHER)
    return finish(g, cluster, options(cluster), cache, "deepspeed-chat")
