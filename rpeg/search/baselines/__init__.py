"""Plans built the way each peer system builds them, to stand beside the planner's plan.

Each baseline takes the algorithm's graph (no execution passes yet), a cluster, a GPU count and
the search's LayoutCache, and applies in order the system's structure (bound_asynchrony), its
placement (place / colocate), streaming where the system streams, and the fastest layouts among
those the system supports (`LayoutOptions`). It returns the verified plan, or None when some
stage fits in no supported layout. One module per system; its docstring cites the sources and
says what it models and what it leaves out.

    from rpeg.search.baselines import build_baselines
    plans = build_baselines(graph, load_cluster("dgx-h100", 64), 64, LayoutCache())
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rpeg.graph import Graph
from rpeg.hardware.topology import Cluster
from rpeg.search.baselines import areal, deepspeed_chat, nemo_rl, openrlhf, real, verl
from rpeg.search.layouts import LayoutCache


@dataclass(frozen=True)
class Baseline:
    name: str
    system: str
    summary: str  # placement, asynchrony, training / generation engines
    build: Callable[[Graph, Cluster, int, LayoutCache], Graph | None]


BASELINES: dict[str, Baseline] = {b.name: b for b in (
    Baseline("verl", "verl", "all roles colocated on one pool, synchronous; FSDP (ZeRO-3) training, vLLM/SGLang TP "
             "rollout, 3D-HybridEngine resharding", verl.build),
    Baseline("verl-megatron", "verl", "as verl, with the Megatron backend: 3D-parallel training (tp/pp, ZeRO-1) and "
             "the 3D-HybridEngine's zero-redundancy resharding (HybridFlow's evaluated setup)", verl.build_megatron),
    Baseline("verl-one-step-off", "verl", "rollout pool of 1/4 (whole nodes), training roles on the rest, k = 1; "
             "FSDP training, vLLM/SGLang TP rollout", verl.build_one_step_off),
    Baseline("verl-fully-async", "verl", "rollout pool of half the GPUs, k = 1 with partial rollout (the engines "
             "never drain); FSDP training, vLLM/SGLang TP rollout", verl.build_fully_async),
    Baseline("real", "ReaL", "generation on all GPUs, concurrent inference and training calls on disjoint meshes, "
             "synchronous; 3D parallel (tp/pp, ZeRO-1) training and generation", real.build),
    Baseline("openrlhf", "OpenRLHF", "a group per model plus vLLM engines, disaggregated, synchronous; DeepSpeed "
             "ZeRO-3 training, vLLM TP", openrlhf.build),
    Baseline("openrlhf-v0.2", "OpenRLHF", "as openrlhf, as it ran in early 2024 (v0.2.3): each actor "
             "rank's micro-batch of prompts a separate generate call, an engine serving one call at a time",
             openrlhf.build_v02),
    Baseline("openrlhf-async", "OpenRLHF", "a group per model plus vLLM engines, disaggregated, async queue of 1 "
             "(k = 1); DeepSpeed ZeRO-3 training, vLLM TP", openrlhf.build_async),
    Baseline("areal", "AReaL", "generation 3/4, training 1/4 (whole nodes), fully async k = 4, streamed per "
             "trajectory; FSDP training, SGLang TP", areal.build),
    Baseline("nemo-rl", "NeMo-RL", "all stages colocated, synchronous; Megatron (tp/pp/cp/ep, distributed optimizer) "
             "training, vLLM TP", nemo_rl.build),
    Baseline("nemo-rl-one-step-off", "NeMo-RL", "dedicated generation GPUs (half, whole nodes), async GRPO k = 1; "
             "Megatron training, vLLM TP", nemo_rl.build_one_step_off),
    Baseline("deepspeed-chat", "DeepSpeed-Chat", "all four models colocated, synchronous; Hybrid Engine: ZeRO-3 "
             "training, TP inference for generation", deepspeed_chat.build),
)}


def build_baselines(graph: Graph, cluster: Cluster, gpus: int, cache: LayoutCache) -> dict[str, Graph | None]:
    """Every baseline's plan for this job, by name (None where no supported layout fits)."""
    return {name: b.build(graph, cluster, gpus, cache) for name, b in BASELINES.items()}


__all__ = ["BASELINES", "Baseline", "build_baselines"]
