"""RPEG's hf engine, which batches statically (ParallelLayout.static_batch; rpeg/runtime/rollout.py): a call
prefills its prompts together and decodes until its longest sequence ends, every row kept in the batch.

`simulate_static` prices a step's calls, `static_episode_rounds` a multi-turn step's rounds of turns, and
`simulate_segmented` partial rollout's segment calls over the sequences of every step in flight.
"""

from __future__ import annotations

import math
from collections import deque

from rpeg.graph.layout import ParallelLayout
from rpeg.graph.model import ModelSpec
from rpeg.hardware.topology import Cluster
from rpeg.perf.engine import (SIM_SEQUENCES, GenWorkload, StepModel, critical_lengths, prefill_s, sampled_response,
                              scaled_lengths)


def simulate_static(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, *, n: float, prompt: float,
                    lengths: list[float], dtype: str = "bf16", max_seqs: int = 256) -> dict[str, float]:
    """An engine that batches statically (ParallelLayout.static_batch: RPEG's hf engine) over `n` sequences
    of which `lengths` are a sample: waves of up to `max_seqs`, each prefilled together and decoded until
    its longest response ends with every row kept in the batch (a finished row decodes padding), the next
    wave only then. Seconds by part, as simulate_instance gives them."""
    step = StepModel(spec, layout, cluster, dtype)
    out = {"decode": 0.0, "prefill": 0.0, "tensor-parallel comm": 0.0, "engine step overhead": 0.0,
           "output processing": 0.0, "decode_steps": 0.0, "preemptions": 0}
    waves = max(1, math.ceil(n / max_seqs))
    per = len(lengths) / waves  # the sample's sequences each wave stands for
    for w in range(waves):
        part = lengths[round(w * per):round((w + 1) * per)] or lengths
        b = n / waves
        steps = max(part) - 1  # the prefill samples the first token; then one decode step per token
        out["prefill"] += prefill_s(spec, layout, cluster, b * prompt, prompt, dtype, b)
        if steps <= 0:
            continue
        _decode(out, step, layout, b, steps, b * prompt, b * (prompt + steps))
    return out


def static_episode_rounds(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, work: GenWorkload,
                          n: float, max_seqs: int) -> dict[str, float]:
    """A static-batch engine's multi-turn episodes: each round of turns is one call (runtime/agent_engine.py
    gathers the turns that are ready), which prefills every context in it again (the hf engine keeps no
    cache between calls) and decodes until the call's longest reply ends. Rounds: the episodes' mean turns
    rounded up (the calls a step makes when every episode's tool returns within the call's gathering
    window); round r holds the episodes that reach it, min(1, turns - r) of them. A reply is an episode's
    sampled tokens over its turns; the call's longest is that of the step's longest reply
    (critical_lengths). Seconds by part, the later rounds' prefills as "observation prefill"."""
    ep = work.episode
    reply = scaled_lengths(sampled_response(work), 1.0 / ep.turns)
    total: dict[str, float] = {}
    for r in range(ep.rounds):
        share = min(1.0, ep.turns - r)  # of the episodes, those that reach round r
        alive = n * share
        context = work.prompt_len + r * (reply.mean + ep.observation_tokens)
        sim_n = max(1, min(math.ceil(alive), SIM_SEQUENCES))
        lengths = critical_lengths(reply, sim_n, work.sequences * share)
        part = simulate_static(spec, layout, cluster, n=alive, prompt=context, lengths=lengths, dtype=work.dtype,
                               max_seqs=max_seqs)
        if r:
            part["observation prefill"] = part.pop("prefill")
        for k, v in part.items():
            total[k] = total.get(k, 0.0) + v
    return total


def _decode(out: dict[str, float], step: StepModel, layout: ParallelLayout, b: float, steps: float, context: float,
            context_end: float) -> None:
    """`steps` decode steps of a batch of `b` rows holding `context` KV tokens at the first and `context_end`
    at the last (each step's time averaged between them), into `out`'s parts."""
    t0, c0 = step(b, context)
    t1, c1 = step(b, context_end)
    over = step.overhead(b)
    out["decode"] += steps * ((t0 + t1) / 2 - (c0 + c1) / 2 - over)
    out["tensor-parallel comm"] += steps * (c0 + c1) / 2
    out["engine step overhead"] += steps * over
    o = step.output(b)  # as simulate_instance counts it: beside the step loop only its excess shows
    out["output processing"] += steps * (o if layout.inline_output else max(0.0, o - (t0 + t1) / 2))
    out["decode_steps"] += steps


def segment_tokens(work: GenWorkload) -> int:
    """The tokens of one partial-rollout segment on the hf engine: a quarter of the longest response (the
    runtime's default, a quarter of max_new_tokens: rpeg/runtime/step.py partial_segment)."""
    return max(1, math.ceil(work.response.max / 4))


def simulate_segmented(spec: ModelSpec, layout: ParallelLayout, cluster: Cluster, *, n: float, prompt: float,
                       lengths: list[float], segment: int, ahead: int, dtype: str = "bf16", max_seqs: int = 256,
                       periods: int = 2) -> dict[str, float]:
    """Partial rollout on RPEG's hf engine (runtime/rollout.py SegmentPool), generation the bottleneck.

    The engine's worker takes one turn at a time from its queue, and each step in flight has one turn
    queued. A turn's call takes every running sequence of the steps whose turns have begun, prefills its
    context so far again (the hf engine keeps no KV cache between calls: "recompute carried KV cache" for
    what earlier calls generated, "prefill" for the prompts) and decodes until the longest of their
    budgets ends (at most `segment` tokens; a sequence that ends sooner keeps its row); more than
    `max_seqs` rows run as waves. A step whose turn finds it finished returns without a call, and the
    step that finishes in its own turn returns there; otherwise its next turn queues behind the others.
    The driver launches step j, its first turn queued last, as soon as step j - ahead - 1 returns (the
    staleness bound k = `ahead`; training takes no engine time). A step costs the time between two
    returns in that steady state: averaged over `periods` x (ahead + 1) steps after the first ahead + 1.
    `lengths`: a sample of a step's response lengths standing for its `n` sequences. Seconds per step,
    by part."""
    model = StepModel(spec, layout, cluster, dtype)
    scale = n / len(lengths)
    keys = ("prefill", "decode", "tensor-parallel comm", "engine step overhead", "output processing",
            "recompute carried KV cache", "decode_steps")
    out = dict.fromkeys(keys, 0.0)
    steps = periods * (ahead + 1)
    total = ahead + 1 + steps
    queue = deque(range(min(total, ahead + 1)))  # the steps' queued turns, launched but not returned
    flight: dict[int, list[float]] = {}  # the pool: per step whose turn began, the tokens of each sequence
    returned = 0

    def finished(j: int) -> bool:
        return all(x >= length for x, length in zip(flight[j], lengths))

    def back(j: int) -> None:  # step j returns: the driver launches the one the bound now admits
        nonlocal returned
        del flight[j]
        returned += 1
        if j + ahead + 1 < total:
            queue.append(j + ahead + 1)

    while queue:
        j = queue.popleft()
        flight.setdefault(j, [0.0] * len(lengths))
        if finished(j):  # another step's call finished it
            back(j)
            continue
        rows = [(s, i) for s, toks in flight.items() for i, length in enumerate(lengths) if toks[i] < length]
        budgets = [min(segment, lengths[i] - flight[s][i]) for s, i in rows]
        call = dict.fromkeys(keys, 0.0)
        b = len(rows) * scale
        fresh = sum(prompt for s, i in rows if flight[s][i] == 0) * scale
        carried = sum(prompt + flight[s][i] for s, i in rows if flight[s][i] > 0) * scale
        waves = max(1, math.ceil(b / max_seqs))
        bw, held = b / waves, (fresh + carried) / waves  # a wave's rows and context
        t = waves * prefill_s(spec, layout, cluster, held, (fresh + carried) / b, dtype, bw)
        call["prefill"] = t * fresh / (fresh + carried)
        call["recompute carried KV cache"] = t * carried / (fresh + carried)
        decode_steps = max(budgets) - 1  # the prefill samples the first token
        if decode_steps > 0:
            wave = dict.fromkeys(keys, 0.0)
            _decode(wave, model, layout, bw, decode_steps, held, held + bw * decode_steps)
            call = {k: call[k] + waves * wave[k] for k in keys}
        for (s, i), got in zip(rows, budgets):
            flight[s][i] += got
        if returned >= ahead + 1:  # steady state: the calls after the (ahead + 1)-th return, to the last
            out = {k: out[k] + call[k] for k in keys}
        if finished(j):
            back(j)
        else:
            queue.append(j)
    return {k: v / steps for k, v in out.items()}
