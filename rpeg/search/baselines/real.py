"""ReaL (ReaLHF): a device mesh per model function call, parameters reallocated between them.

Sources: Mei et al., "ReaLHF: Optimized RLHF Training for Large Language Models through
Parameter Reallocation" (arXiv 2406.14088), §3-§5; the ReaLHF repository
(openpsi-project/ReaLHF): a device mesh is 1, 2, 4 or 8 GPUs of one node or a run of whole nodes
(`DeviceMesh`, `find_sub_device_meshes`), model parallel sizes 1/2/4/8 and pipeline sizes up to
16 (`find_parallel_strategies`), `ParallelismConfig` (data / model / pipeline parallel sizes,
`use_sequence_parallel`), ZeRO-1 through its Megatron-style distributed optimizer, and
`gradient_checkpointing`.

What it models: k = 0. Generation runs on all GPUs. The inference calls (actor_logprobs,
ref_logprobs, critic_values, a reward model's calls) run at the same time on disjoint meshes that
split all GPUs in equal shares: whole nodes when each call can have one (remainders to the earlier
calls), else power-of-two meshes inside nodes as ReaL's mesh rule requires (8 GPUs over 3 calls:
4, 2, 2). The order is the actor's calls, then the frozen models', then the critic's, so the actor's
and the critic's inference meshes lie inside their training meshes. The training calls run at the
same time on disjoint meshes: actor on the first half, critic on the second (same rule); a
critic-free algorithm trains the actor on all GPUs. Too few GPUs for disjoint meshes: those calls
share all GPUs and take turns. Layouts: any tp inside a node, any pp up to 16, for training and
generation; no context parallelism; ZeRO-1.

Parameter reallocation: the actor's move from its training mesh to the generation layout is the
colocated `actor_sync`, and the context switch is paid where generation and actor training
overlap. Left out: the actor's reallocation to its inference mesh, the critic's between its
training and inference meshes, and moving the frozen reference and reward models on and off
the devices generation uses (their weights are assumed resident, their memory not counted
against the other calls'); ReaL's MCMC search over allocations (this is a fixed rule, neither
ReaL's searched plan nor its paper's "heuristic"); per-call micro-batch counts (`n_mbs`); MoE
expert parallelism (ReaL splits experts over its tensor-parallel group, which LayoutOptions cannot
express, so no EP is allowed).
"""

from __future__ import annotations

from rpeg.graph import Graph, Kind, Stage
from rpeg.hardware.topology import Cluster
from rpeg.passes import bound_asynchrony, place
from rpeg.search.baselines.common import check_input, finish, lay_out, node_divisors, split
from rpeg.search.layouts import LayoutCache, LayoutOptions

MAX_PP = 16  # find_parallel_strategies: num_pp <= 16


def options(cluster: Cluster) -> LayoutOptions:
    return LayoutOptions(train_tp=node_divisors(cluster), train_pp=None, train_cp=(1,), zero=(1,),
                         recompute=("none", "full"), gen_tp=node_divisors(cluster), gen_pp=(1, 2, 4, 8, 16),
                         expert_parallel=False, sequence_parallel=True, max_pp=MAX_PP)


def meshes(gpus: int, gpus_per_node: int, calls: int) -> tuple[int, ...] | None:
    """Equal disjoint meshes for `calls` concurrent calls, per ReaL's mesh rule; None if impossible."""
    if calls == 0:
        return ()
    if gpus % gpus_per_node == 0 and gpus // gpus_per_node >= calls:
        return split(gpus, gpus_per_node, [1] * calls)
    if gpus < calls:
        return None
    size = 1
    while size * 2 <= min(gpus // calls, gpus_per_node):
        size *= 2
    sizes = [size] * calls
    grown = True
    while grown:  # double meshes in turn, earliest first, while the GPUs and the node allow
        grown = False
        for i in range(calls):
            if sizes[i] * 2 <= gpus_per_node and sum(sizes) + sizes[i] <= gpus:
                sizes[i] *= 2
                grown = True
    return tuple(sizes)  # non-increasing, so meshes laid end to end stay aligned inside nodes


def _call_order(graph: Graph, s: Stage) -> tuple[int, int]:
    rank = 0 if s.model == "actor" else 2 if s.model == "critic" else 1
    return rank, graph.stage_names.index(s.name)


def build(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> Graph | None:
    check_input(graph, cluster, gpus, "real")
    g = bound_asynchrony(graph, 0)
    node = cluster.gpus_per_node
    groups: dict[str, tuple[int, int]] = {"all": (0, gpus)}
    assign: dict[str, str] = {}
    infer = sorted((s for s in g.stages if s.model and s.kind in (Kind.INFER, Kind.REWARD)),
                   key=lambda s: _call_order(g, s))
    sizes = meshes(gpus, node, len(infer))
    if sizes:
        names = [f"mesh_{s.name}" for s in infer]
        groups.update(lay_out(names, sizes))
        assign.update({s.name: n for s, n in zip(infer, names)})
    train = sorted((s for s in g.stages if s.kind is Kind.TRAIN), key=lambda s: _call_order(g, s))
    sizes = meshes(gpus, node, len(train)) if len(train) > 1 else None
    if sizes:
        names = [f"mesh_{s.name}" for s in train]
        groups.update(lay_out(names, sizes))
        assign.update({s.name: n for s, n in zip(train, names)})
    g = place(g, groups, assign=assign, default="all")
    return finish(g, cluster, options(cluster), cache, "real")
