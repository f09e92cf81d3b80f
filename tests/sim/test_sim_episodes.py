"""The simulator's timeline of a multi-turn job: its critical episode's turns and tool calls inside each
generation task, as the model prices them."""

from __future__ import annotations

import pytest

from rpeg.sim import simulate
from rpeg.sim.export import chrome_trace
from rpeg.spec import load_spec


def timeline(latency: float):
    spec = load_spec("examples/grpo-qwen2.5-7b-agent.yaml")
    graph = spec.graph()
    graph = graph.replace(job=graph.job.replace(episode=graph.job.episode.replace(tool_latency_s=latency)))
    _, cluster, gpus = spec.cluster_and_gpus()
    from rpeg.search import search

    plan = search(graph, cluster, gpus, budget=40).best.graph
    return plan, simulate(plan, cluster, steps=4)


def test_each_generation_task_holds_six_turns_and_five_tool_calls_priced_as_the_model_does():
    plan, tl = timeline(5.0)
    gen = [r for r in tl.records if r.kind == "generate"]
    assert gen and tl.details
    for r in gen:
        inside = [d for d in tl.details if d.step == r.step and d.microbatch == r.microbatch]
        kinds = [d.kind for d in sorted(inside, key=lambda d: d.start)]
        assert kinds == ["turn", "tool"] * 5 + ["turn"]
        assert inside[0].start == pytest.approx(r.start) and max(d.end for d in inside) == pytest.approx(r.end)
    # the critical episode's five calls of 5 s a step, spread over the k + 1 steps it may span where the
    # engine never drains (perf/generation.py episode_parts)
    spread = plan.async_bound + 1 if plan.engines_never_drain else 1
    step = gen[-1].step
    assert sum(d.seconds for d in tl.details if d.kind == "tool" and d.step == step) == pytest.approx(25.0 / spread)
    lanes = {e["args"]["name"] for e in chrome_trace(tl)["traceEvents"] if e.get("name") == "thread_name"}
    assert any(name.endswith("· critical episode") for name in lanes)


def test_a_single_turn_job_has_no_details():
    spec = load_spec("examples/demo-grpo-tiny.yaml")
    _, cluster, gpus = spec.cluster_and_gpus(default="cpu-local")
    from rpeg.runtime.plan_check import runnable_plan

    assert simulate(runnable_plan(spec.graph(), cluster, gpus).graph, cluster, steps=3).details == ()
