"""verl (HybridFlow): every role colocated on one pool, synchronous; and its one-step-off recipe.

Sources: Sheng et al., "HybridFlow: A Flexible and Efficient RLHF Framework" (arXiv 2409.19256),
§4 (hybrid programming model, `ActorRolloutRefWorker`), §5 (3D-HybridEngine); the verl repository
docs: `ResourcePoolManager` maps roles to resource pools (the default `global_pool` holds every
role), the FSDP workers (`actor_rollout_ref.actor.fsdp_config`, `ulysses_sequence_parallel_size`,
`enable_gradient_checkpointing`), the rollout's `tensor_model_parallel_size` (vLLM / SGLang), and
`recipe/one_step_off_policy` (rollout on its own pool, generation one step ahead; PEERS.md: 4 of
16 H20 GPUs for rollout).

What `verl` models: k = 0; one device group of all GPUs holding actor, rollout, reference,
critic and reward model, which take turns and pay the train <-> generation context switch (vLLM
sleep mode, offloading the FSDP state); the 3D-HybridEngine's resharding is the colocated
`actor_sync`, at the cost of verl's FSDP rollout sync: every GPU gathers each parameter in full
(`full_tensor()` in verl/workers/sharding_manager/fsdp_vllm.py's per-tensor generator) and vLLM
loads its slice (`refit(gather="full")`; the zero-redundancy 3D-HybridEngine of §5 is verl's
Megatron backend, left out below). Training and every forward pass use FSDP (ZeRO-3, tp 1, pp 1, any recomputation),
with Ulysses context parallelism of 1 or 2; the rollout uses tensor parallelism inside a node, each
engine at verl's rollout.max_num_seqs (VERL_MAX_NUM_SEQS), which verl passes to vLLM in every mode.

`verl-one-step-off` models: k = 1; a rollout pool of a quarter of the GPUs (whole nodes, at least
one; inside one node, a quarter of its GPUs) that runs generation only, and a training pool of
the rest that runs every other role; the weight sync crosses the pools. With one GPU there is
nothing to split: everything is colocated (k stays 1). Its weight sync gathers each parameter in
full and broadcasts it from one trainer rank to the rollout pool over NCCL (PEERS.md: the recipe's
NCCL sync of a 7B model takes under 300 ms on H20).

`verl-megatron` models verl with its Megatron backend (`actor_rollout_ref.actor.strategy=megatron`),
the configuration HybridFlow's evaluation ran (section 8): colocated and synchronous as `verl`, with
Megatron 3D-parallel training (tp inside a node, pp, the distributed optimizer, ZeRO-1) and the
3D-HybridEngine's zero-redundancy resharding (section 5: each GPU gathers only its rollout shard,
`refit(gather="shard")`).

`verl-fully-async` models `fully_async_policy` as its documented run (docs/advance/fully_async.md:
64 rollout + 64 training GPUs of 128, staleness_threshold 0.5, partial rollout): a rollout pool of
half the GPUs, k = 1 (a fractional staleness of at most one version), and partial rollout (the
rollout engines never drain between steps).

Left out: the Megatron backend's context and expert parallelism; fully_async's fractional
staleness below one whole step; dynamic batch sizes and parameter/optimizer CPU offload; the
reference and critic running as FSDP-sharded forward passes (our inference layouts keep a full
replica per device at tp 1, so a model that only fits sharded makes the plan None); running
actor and critic updates in parallel, which verl does only on separate pools.
"""

from __future__ import annotations

from rpeg.graph import Graph
from rpeg.hardware.topology import Cluster
from rpeg.passes import bound_asynchrony, colocate, partial_rollout, refit
from rpeg.search.baselines.common import check_input, finish, node_divisors, split_generation
from rpeg.search.layouts import LayoutCache, LayoutOptions

ROLLOUT_SHARE = 0.25  # verl-one-step-off: the rollout pool's share of the GPUs
FULLY_ASYNC_ROLLOUT_SHARE = 0.5  # verl-fully-async: docs/advance/fully_async.md's run, 64 rollout + 64 train GPUs


REFIT_GATHER = "full"  # see the module docstring: every tensor gathered in full on every device
# verl passes its rollout's max_num_seqs to every vLLM engine it starts (verl/workers/rollout/vllm_rollout/
# vllm_async_server.py); verl/trainer/config/rollout/rollout.yaml sets 256 at v0.9 (1,024 from v0.1 to v0.8)
VERL_MAX_NUM_SEQS = 256


def options(cluster: Cluster) -> LayoutOptions:
    return LayoutOptions(train_tp=(1,), train_pp=(1,), train_cp=(1, 2), zero=(3,),
                         recompute=("none", "selective", "full"), gen_tp=node_divisors(cluster), gen_pp=(1,),
                         expert_parallel=False, sequence_parallel=False, gen_max_seqs=VERL_MAX_NUM_SEQS,
                         logits="bf16-ce")  # dp_actor: bf16 logits, flash-attn's in-place cross-entropy


def build(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    check_input(graph, cluster, gpus, "verl")
    g = bound_asynchrony(graph, 0)  # synchronous PPO / GRPO trainer
    g = colocate(g, gpus)  # one global resource pool for every role
    g = refit(g, REFIT_GATHER)
    return finish(g, cluster, options(cluster), cache, "verl")


def megatron_options(cluster: Cluster) -> LayoutOptions:
    return LayoutOptions(train_tp=node_divisors(cluster), train_pp=None, train_cp=(1,), zero=(1,),
                         recompute=("none", "selective", "full"), gen_tp=node_divisors(cluster), gen_pp=(1,),
                         expert_parallel=False, sequence_parallel=True, gen_max_seqs=VERL_MAX_NUM_SEQS,
                         logits="fused-ce")  # megatron_actor: Megatron's vocab-parallel cross-entropy


def build_megatron(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    check_input(graph, cluster, gpus, "verl-megatron")
    g = bound_asynchrony(graph, 0)
    g = colocate(g, gpus)
    g = refit(g, "shard")  # the 3D-HybridEngine: each GPU gathers its rollout shard only
    return finish(g, cluster, megatron_options(cluster), cache, "verl-megatron")


def build_one_step_off(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    check_input(graph, cluster, gpus, "verl-one-step-off")
    g = bound_asynchrony(graph, 1)  # generation of step t + 1 overlaps training of step t
    g = split_generation(g, cluster, gpus, ROLLOUT_SHARE, "rollout")
    g = refit(g, REFIT_GATHER)
    return finish(g, cluster, options(cluster), cache, "verl-one-step-off")


def build_fully_async(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    check_input(graph, cluster, gpus, "verl-fully-async")
    g = bound_asynchrony(graph, 1)  # staleness_threshold 0.5: at most one version behind
    g = partial_rollout(g)
    g = split_generation(g, cluster, gpus, FULLY_ASYNC_ROLLOUT_SHARE, "rollout")
    g = refit(g, REFIT_GATHER)
    return finish(g, cluster, options(cluster), cache, "verl-fully-async")
