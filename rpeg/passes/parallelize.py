"""parallelize(stage, dp, tp, pp, cp, ep, zero, recompute, ...): the parallel layout of one stage.

Checked in the manner of torchtitan's ParallelDims, with every factor in the message: the
product dp*tp*pp*cp equals the devices of the stage's group; tp divides the attention heads
(and divides or is a multiple of the kv heads); pp divides the layers; ep divides the experts
and dp*cp*tp; ZeRO, recomputation and offload (offload_optimizer, offload_params, resident, pageable:
see ParallelLayout) apply to training only; an MoE stage's dispatcher, ep_overlap, permute_fusion, cuda_graphs,
routing, capacity_factor and rank_capacity_factor say how its experts run (ParallelLayout; rpeg/perf/moe.py
prices them).
logits names how a training or log-prob pass computes its log-probs (rpeg/perf/logits.py); the
Megatron-Core recipe options (recompute_modules, recompute_layers, offload_activation_layers,
grad_dtype, optimizer_moments, pp_embedding_loss_slots) are ParallelLayout's too
(rpeg/perf/recipe_options.py), inline_output says where a generation engine processes its outputs and
max_seqs how many sequences it runs at once and static_batch whether it batches statically
(ParallelLayout; rpeg/perf/generation.py), so every layout field can be passed back through this pass.
"""

from __future__ import annotations

from rpeg.errors import RpegError
from rpeg.graph import Graph, ParallelLayout
from rpeg.graph.layout import DEFAULT_LOGITS
from rpeg.graph.verify import layout_problems
from rpeg.passes.base import call_text, finish, refuse


def parallelize(graph: Graph, stage: str, *, dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
                zero: int = 0, recompute: str = "none", sequence_parallel: bool = False,
                pp_interleave: int = 1, pp_uneven: bool = False, micro_batch: int = 1,
                packing: bool = True, offload_optimizer: float | bool = 0.0, offload_params: bool = False,
                resident: list[str] | tuple[str, ...] = (),
                pageable: list[str] | tuple[str, ...] = (), dispatcher: str = "alltoall",
                ep_overlap: bool = False, permute_fusion: bool = True,
                cuda_graphs: str | list[str] | tuple[str, ...] = "none",
                routing: str = "balanced",
                capacity_factor: float = 0.0, rank_capacity_factor: float = 0.0, logits: str = DEFAULT_LOGITS,
                grad_dtype: str = "fp32",
                recompute_modules: list[str] | tuple[str, ...] = (), recompute_layers: int = 0,
                offload_activation_layers: int = 0, optimizer_moments: str = "fp32",
                pp_embedding_loss_slots: bool = False, bins: str = "even", inline_output: bool = False,
                max_seqs: int = 0, static_batch: bool = False) -> Graph:
    call = call_text("parallelize", stage=stage, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero,
                     recompute=recompute)
    if stage not in graph.stage_names:
        raise refuse(call, f"no stage {stage!r} (stages: {', '.join(graph.stage_names)})")
    degrees = dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, pp_interleave=pp_interleave, micro_batch=micro_batch,
                   max_seqs=max_seqs)
    wrong = [f"{k} = {v!r}" for k, v in degrees.items() if isinstance(v, bool) or not isinstance(v, int)]
    wrong += [f"{k} = {v!r}" for k, v in (("sequence_parallel", sequence_parallel), ("pp_uneven", pp_uneven),
                                          ("packing", packing), ("ep_overlap", ep_overlap),
                                          ("permute_fusion", permute_fusion),
                                          ("inline_output", inline_output), ("static_batch", static_batch))
              if not isinstance(v, bool)]
    for name, value in (("recompute", recompute), ("dispatcher", dispatcher), ("routing", routing)):
        if not isinstance(value, str):
            wrong.append(f"{name} = {value!r}")
    if not isinstance(cuda_graphs, str) and not (isinstance(cuda_graphs, (list, tuple))
                                                 and all(isinstance(v, str) for v in cuda_graphs)):
        wrong.append(f"cuda_graphs = {cuda_graphs!r}")
    if not isinstance(logits, str):
        wrong.append(f"logits = {logits!r}")
    if not isinstance(bins, str):
        wrong.append(f"bins = {bins!r}")
    for name, value in (("grad_dtype", grad_dtype), ("optimizer_moments", optimizer_moments)):
        if not isinstance(value, str):
            wrong.append(f"{name} = {value!r}")
    if not isinstance(offload_params, bool):
        wrong.append(f"offload_params = {offload_params!r}")
    if not isinstance(offload_optimizer, (bool, int, float)):
        wrong.append(f"offload_optimizer = {offload_optimizer!r}")
    for name, value in (("capacity_factor", capacity_factor), ("rank_capacity_factor", rank_capacity_factor)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            wrong.append(f"{name} = {value!r}")
    for name, value in (("resident", resident), ("pageable", pageable)):
        if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
            wrong.append(f"{name} = {value!r}")
    if wrong:
        raise refuse(call, "expected whole numbers, true/false, recompute / dispatcher / cuda_graphs / routing names, "
                           "a logits path, an offload fraction and lists of state parts or host copies: "
                           + ", ".join(wrong))
    try:
        layout = ParallelLayout(**degrees, recompute=recompute, sequence_parallel=sequence_parallel,
                                pp_uneven=pp_uneven, packing=packing, offload_optimizer=offload_optimizer,
                                offload_params=offload_params, resident=tuple(resident),
                                pageable=tuple(pageable), dispatcher=dispatcher, ep_overlap=ep_overlap,
                                permute_fusion=permute_fusion,
                                cuda_graphs=cuda_graphs, routing=routing, capacity_factor=capacity_factor,
                                rank_capacity_factor=rank_capacity_factor,
                                logits=logits, grad_dtype=grad_dtype, recompute_modules=tuple(recompute_modules),
                                recompute_layers=recompute_layers, offload_activation_layers=offload_activation_layers,
                                optimizer_moments=optimizer_moments, pp_embedding_loss_slots=pp_embedding_loss_slots,
                                bins=bins, inline_output=inline_output, static_batch=static_batch)
    except RpegError as e:
        raise refuse(call, str(e)) from None
    new = graph.stage(stage).replace(layout=layout)
    problems = layout_problems(graph, new)
    if problems:
        raise refuse(call, "; ".join(problems))
    return finish(graph, graph.with_stages([new]), call)
