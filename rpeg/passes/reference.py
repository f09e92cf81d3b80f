"""reference_on_host(): the reference model's weights live in host memory and are swapped in for
its logprob pass.

NeMo-RL's Megatron policy keeps the reference weights on the CPU and runs the reference pass on
the policy's own model (`use_reference_model` in nemo_rl/models/policy/megatron_policy_worker.py,
tags v0.3.0 and v0.5.0): it copies every policy tensor to the host (`.to("cpu", copy=True)`),
loads the reference state dict onto the devices, runs the pass, and loads the policy back. Each
step moves the policy's per-device weights across the host link three times (one device-to-host,
two host-to-device: `SWAPS` in rpeg/perf/stages.py, costed at the host link's rate); in return the
reference takes no device memory between its passes.

The reference pass must run on the devices that train the actor (it borrows its model).
"""

from __future__ import annotations

from rpeg.graph import Graph
from rpeg.graph.verify import reference_host_problem
from rpeg.passes.base import call_text, finish, refuse


def reference_on_host(graph: Graph) -> Graph:
    call = call_text("reference_on_host")
    why = reference_host_problem(graph)
    if why:
        raise refuse(call, why)
    return finish(graph, graph.replace(reference_on_host=True), call)


def keep_reference_on_host(graph: Graph) -> Graph:
    """NeMo-RL's way for any graph: `reference_on_host()` when it runs a reference, else unchanged."""
    return reference_on_host(graph) if any(s.model == "ref" for s in graph.stages) else graph
