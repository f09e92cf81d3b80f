"""OpenRLHF: one Ray group per model plus vLLM engines, disaggregated; synchronous or async (queue of 1).

Sources: Hu et al., "OpenRLHF: An Easy-to-use, Scalable and High-performance RLHF Framework"
(arXiv 2405.11143), §3 (Ray placement of actor, critic, reference, reward and vLLM engines);
the OpenRLHF repository: `openrlhf/cli/train_ppo_ray.py` (`--actor_num_nodes`,
`--critic_num_gpus_per_node`, `--ref_num_nodes`, `--reward_num_nodes`, `--vllm_num_engines`,
`--vllm_tensor_parallel_size`, `--zero_stage 3`, `--gradient_checkpointing`, `--ring_attn_size`,
`--colocate_actor_ref`, `--colocate_critic_reward`, `--colocate_all_models`) and its
performance-tuning docs (vLLM : actor : critic nodes 1 : 1 : 1); async training with a queue of
one batch (PEERS.md: `async_enable`, queue size 1 bounds the lag).

What it models: disjoint device groups, laid end to end in this order, sized in whole nodes
where every group can have one (else in GPUs):
  with a critic:  vLLM 1/4, actor 1/4, critic 1/4, reference 1/8, reward model 1/8;
  critic-free:    vLLM 1/2, reference 1/8, reward model 1/8, actor the rest (3/8 with one of them);
a missing reference or reward model gives its share to the actor. Each model's passes run on its
group (actor_logprobs with the actor, critic_values with the critic); rule rewards and advantage
math run on the driver (placed with the actor; they hold no devices). Training is DeepSpeed
ZeRO-3 (tp 1, pp 1) with optional ring attention (cp 1 or 2) and gradient checkpointing; vLLM
uses tensor parallelism inside a node. The weight sync gathers each parameter in full
(`deepspeed.zero.GatheredParameters`) and rank 0 broadcasts it to every vLLM engine over NCCL
(its issue #533: that broadcast took 40% of a step): `refit(gather="full")`, one sender.
`openrlhf` is synchronous (k = 0); `openrlhf-async` is the same placement with k = 1.

`openrlhf-v0.2` is `openrlhf` as it ran in the first half of 2024 (v0.2.3, April 2024, the version
ReaL's paper compared against): each actor rank generated its share of the rollout batch in calls
of `--micro_rollout_batch_size` prompts to engine `rank % vllm_num_engines`, waiting for each, and
an engine served one call at a time (`serial_calls`, rpeg/passes/calls.py, with the sources). The
micro-batch is the example scripts' for the model's size: 16 (train_ppo_llama_ray.sh, 7B), 2
(train_ppo_llama_ray_70b.sh, 70B; taken above SCRIPT_70B_FROM_PARAMS). Later versions hand every
prompt of the rollout batch to the engines at once (`openrlhf`).

Fewer GPUs than groups: the first of these that fits, as OpenRLHF's own flags allow:
  1. `--colocate_actor_ref --colocate_critic_reward`: the reference joins the actor's group, the
     reward model the critic's (the actor's when there is no critic);
  2. `--colocate_all_models`: vLLM on half, every model on the other half;
  3. one GPU: everything colocated (`--colocate_all_models` with vLLM sleep mode).

Left out: DeepSpeed AutoTP and vLLM pipeline parallelism, partial rollout, sample packing and
dynamic batching, Adam offload; ZeRO-3 sharding of the reference and reward model's forward
passes (our inference layouts keep a full replica per device); the hybrid-engine mode
(`--colocate_all_models` with vLLM in the same group) except as the one-GPU fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpeg.graph import Graph, Kind
from rpeg.hardware.topology import Cluster
from rpeg.passes import bound_asynchrony, colocate, place, refit, serial_calls
from rpeg.search.baselines.common import check_input, finish, node_divisors, split
from rpeg.search.layouts import LayoutCache, LayoutOptions


MICRO_ROLLOUT_BATCH_7B = 16  # v0.2.3 examples/scripts/train_ppo_llama_ray.sh: --micro_rollout_batch_size 16
MICRO_ROLLOUT_BATCH_70B = 2  # v0.2.3 examples/scripts/train_ppo_llama_ray_70b.sh: --micro_rollout_batch_size 2
SCRIPT_70B_FROM_PARAMS = 30e9  # the 70B script's settings for actors above this (its only other script is the 7B one)


@dataclass(frozen=True, slots=True)
class _Role:
    name: str
    weight: float  # eighths of the GPUs
    stages: tuple[str, ...]


def options(cluster: Cluster) -> LayoutOptions:
    return LayoutOptions(train_tp=(1,), train_pp=(1,), train_cp=(1, 2), zero=(3,), recompute=("none", "full"),
                         gen_tp=node_divisors(cluster), gen_pp=(1,), expert_parallel=False, sequence_parallel=False,
                         logits="fp32-ce")  # Actor.forward: an fp32 copy, flash-attn's cross-entropy


def roles(graph: Graph) -> list[_Role]:
    """The groups of the full split, with their shares in eighths of the GPUs."""
    own = {"critic": [], "ref": [], "reward": []}  # models with a Ray group of their own
    vllm, actor = [], []
    for s in graph.stages:
        if s.kind is Kind.GENERATE:
            vllm.append(s.name)
        elif s.kind is not Kind.SYNC:  # the sync spans the actor's and vLLM's groups
            (own[s.model] if s.model in own else actor).append(s.name)  # driver-side stages go with the actor
    critic, ref, rm = (bool(own[m]) for m in ("critic", "ref", "reward"))
    out = [_Role("vllm", 2 if critic else 4, tuple(vllm)), _Role("actor", 4 - ref - rm, tuple(actor))]
    out += [_Role(m, 2 if m == "critic" else 1, tuple(own[m])) for m in ("critic", "ref", "reward") if own[m]]
    return out


def _merge(rs: list[_Role], src: str, dst: str) -> list[_Role]:
    if src not in {r.name for r in rs}:
        return rs
    gone = next(r for r in rs if r.name == src)
    return [_Role(r.name, r.weight + gone.weight, r.stages + gone.stages) if r.name == dst else r
            for r in rs if r.name != src]


def fallbacks(graph: Graph) -> list[list[_Role]]:
    """Placements from the full split to the most colocated, in the order they are tried."""
    full = roles(graph)
    names = {r.name for r in full}
    paired = _merge(_merge(full, "ref", "actor"), "reward", "critic" if "critic" in names else "actor")
    models = [r for r in paired if r.name != "vllm"]
    all_models = [paired[0], _Role("models", sum(r.weight for r in models), sum((r.stages for r in models), ()))]
    return [full, paired, all_models]


def _build(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache, k: int, name: str) -> Graph | None:
    check_input(graph, cluster, gpus, name)
    g = bound_asynchrony(graph, k)
    for rs in fallbacks(g):
        counts = split(gpus, cluster.gpus_per_node, [r.weight for r in rs])
        if counts is not None:
            assign = {s: r.name for r in rs for s in r.stages}
            g = place(g, {r.name: c for r, c in zip(rs, counts)}, assign=assign)
            break
    else:
        g = colocate(g, gpus)
    g = refit(g, "full")  # ZeRO-3 GatheredParameters per tensor, broadcast from rank 0 to the vLLM engines
    return finish(g, cluster, options(cluster), cache, name)


def build(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    return _build(graph, cluster, gpus, cache, 0, "openrlhf")


def micro_rollout_batch(graph: Graph) -> int:
    """v0.2.3's example scripts' --micro_rollout_batch_size for the actor's size."""
    big = graph.model("actor").spec.params_total() > SCRIPT_70B_FROM_PARAMS
    return MICRO_ROLLOUT_BATCH_70B if big else MICRO_ROLLOUT_BATCH_7B


def build_v02(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    check_input(graph, cluster, gpus, "openrlhf-v0.2")
    return _build(serial_calls(graph, micro_rollout_batch(graph)), cluster, gpus, cache, 0, "openrlhf-v0.2")


def build_async(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    return _build(graph, cluster, gpus, cache, 1, "openrlhf-async")
