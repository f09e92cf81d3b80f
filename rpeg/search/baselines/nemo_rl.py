"""NeMo-RL: colocated Megatron training and vLLM generation, synchronous; and async GRPO on
dedicated generation GPUs.

Sources: the NeMo-RL repository (NVIDIA-NeMo/RL) docs and example configs:
`policy.megatron_cfg` (`tensor_model_parallel_size`, `pipeline_model_parallel_size`,
`context_parallel_size`, `expert_model_parallel_size`, `sequence_parallel`,
`activation_checkpointing`, the distributed optimizer), `policy.generation.vllm_cfg`
(`tensor_parallel_size`), `policy.generation.colocated.enabled` (true by default; false with
`colocated.resources` gives generation its own GPUs), and async GRPO
(`grpo.async_grpo.max_trajectory_age_steps`, default 1). NeMo-RL has no paper; its predecessor is
NeMo-Aligner (arXiv 2405.01481).

`nemo-rl` models: k = 0; every stage on all GPUs (generation, logprobs, reference, training take
turns; the refit from Megatron to vLLM is the colocated `actor_sync`, the offload/onload the
context switch; the refit gathers every tensor in full on every GPU, `gather_params` in
nemo_rl/models/megatron/refit_utils.py: tensor-parallel all-gather, full-tensor broadcast over
the pipeline group, expert all-gather; `refit(gather="full")`); the reference's weights wait on the host and are swapped
in for its pass (`use_reference_model`, `reference_on_host()`). Training and forward passes: any
tp inside a node, pp, cp (1-8), EP for MoE, and ZeRO-1 (Megatron's distributed optimizer shards
optimizer state only). Generation: vLLM tensor parallelism inside a node.

`nemo-rl-one-step-off` models: k = 1 (max_trajectory_age_steps = 1); generation on its own half
of the GPUs (whole nodes where each side can have one, else GPUs; one GPU: colocated), everything
else on the other half (the reference swapped in on the training half); the refit crosses the halves.

Left out: the DTensor (FSDP2 + TP) policy backend; in-flight weight updates during generation;
vLLM pipeline parallelism and expert parallelism in the engine separate from training's;
virtual pipeline stages; optimizer CPU offload; sequence packing beyond the perf model's default.
"""

from __future__ import annotations

from rpeg.graph import Graph
from rpeg.hardware.topology import Cluster
from rpeg.passes import bound_asynchrony, colocate, keep_reference_on_host, refit
from rpeg.search.baselines.common import check_input, finish, node_divisors, split_generation
from rpeg.search.layouts import LayoutCache, LayoutOptions

GENERATION_SHARE = 0.5  # nemo-rl-one-step-off
MAX_TRAJECTORY_AGE_STEPS = 1


REFIT_GATHER = "full"  # see the module docstring: every tensor gathered in full on every device


def options(cluster: Cluster) -> LayoutOptions:
    return LayoutOptions(train_tp=node_divisors(cluster), train_pp=None, train_cp=(1, 2, 4, 8), zero=(1,),
                         recompute=("none", "selective", "full"), gen_tp=node_divisors(cluster), gen_pp=(1,),
                         expert_parallel=True, sequence_parallel=True,
                         logits="distributed-logprob",  # DistributedLogprob on Megatron's fp32-upcast output
                         bins="ffd")  # shard_by_batch_size: first-fit-decreasing bins dealt round-robin


def build(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    check_input(graph, cluster, gpus, "nemo-rl")
    g = bound_asynchrony(graph, 0)
    g = colocate(g, gpus)  # policy.generation.colocated.enabled = true
    g = keep_reference_on_host(refit(g, REFIT_GATHER))
    return finish(g, cluster, options(cluster), cache, "nemo-rl")


def build_one_step_off(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    check_input(graph, cluster, gpus, "nemo-rl-one-step-off")
    g = bound_asynchrony(graph, MAX_TRAJECTORY_AGE_STEPS)
    g = split_generation(g, cluster, gpus, GENERATION_SHARE, "generation")
    g = keep_reference_on_host(refit(g, REFIT_GATHER))
    return finish(g, cluster, options(cluster), cache, "nemo-rl-one-step-off")

