"""bound_asynchrony(k, in_flight, refill): generation at step t may use actor weights of any step >= t - k.

k = 0 is on-policy (generation waits for the previous step's update); k = 1 is one-step-off
(verl `one_step_off`, NeMo-RL async GRPO, OpenRLHF's queue of 1); larger k bounds the
staleness of AReaL-style fully asynchronous training. Only weight-version edges change: every
generation stage now reads its model at lag k, so the weight edge into it spans 1 + k steps.

`in_flight` (1 to k) is how many steps' prompts the system lets generation hold at once. With 1
(the default) each step's batch is generated to its end before the next one's starts: the engine
drains, and a step pays its longest response (verl's one-step-off trainer generates each batch in
one call). NeMo-RL's async GRPO keeps up to num_prompts_per_step x max_trajectory_age_steps prompts
in flight (AsyncTrajectoryCollector's in-flight semaphore, nemo_rl/algorithms/async_utils.py at
v0.6.0), targets each batch at one of the next k weight versions, and with
`in_flight_weight_updates` lets running generations continue through a weight update: in_flight =
k. Then an engine's continuous batch holds up to in_flight steps' sequences (as many as
max_num_seqs and its KV cache admit) and never drains; rpeg/perf/generation.py prices a step as
that engine's steady-state time for one step's sequences.

`refill` says the engine never drains even with in_flight = 1: the next step's prompts enter as this
step's sequences finish, and the running ones continue through the weight update. NeMo-RL's async
GRPO with in_flight_weight_updates does that at any k (its semaphore releases a prompt group's slot
when the group finishes, and the collector targets the next weight version as soon as the current
one's groups are all dispatched), so with k = 1 its engine holds one step's sequences and is priced
at that steady occupancy. Without it (NeMo-RL's default, verl's one-step-off trainer) each step's
batch is generated to its end: the engine drains every step.
"""

from __future__ import annotations

from rpeg.graph import Graph, Kind
from rpeg.graph.bounds import MAX_STALENESS
from rpeg.passes.base import call_text, finish, refuse


def bound_asynchrony(graph: Graph, k: int, in_flight: int = 1, refill: bool = False) -> Graph:
    call = call_text("bound_asynchrony", k=k, **({"in_flight": in_flight} if in_flight != 1 else {}),
                     **({"refill": refill} if refill else {}))
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise refuse(call, f"k must be a whole number of steps >= 0, got {k!r}")
    if k > MAX_STALENESS:
        raise refuse(call, f"k = {k:,} exceeds {MAX_STALENESS} (published systems use 1-8)")
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) or not 1 <= in_flight <= max(1, k):
        raise refuse(call, f"in_flight must be a whole number of steps from 1 to k = {k} (generation runs at most "
                           f"k steps ahead), got {in_flight!r}")
    if not isinstance(refill, bool):
        raise refuse(call, f"refill must be true or false, got {refill!r:.80}")
    if refill and k < 1:
        raise refuse(call, "refill admits the next step's prompts while this step's still run, through the weight "
                           "update between them: it needs k >= 1 (on-policy generation waits for the update)")
    for group in graph.fusion:
        kinds = {graph.stage(s).kind for s in group}
        if k > 0 and Kind.GENERATE in kinds and len({graph.stage(s).model for s in group} - {None}) == 1 \
                and any(graph.stage(s).kind is not Kind.GENERATE and graph.stage(s).model for s in group):
            raise refuse(call, f"fusion group ({', '.join(group)}) runs generation and another pass of the "
                         "same model in one engine; with k > 0 they would read different weight versions")
    stages = [s.replace(lag=k) for s in graph.stages if s.kind is Kind.GENERATE]
    return finish(graph, graph.with_stages(stages).replace(async_bound=k, in_flight=in_flight, refill=refill), call)
