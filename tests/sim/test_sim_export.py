"""Timelines as Chrome/Perfetto trace JSON and as a Gantt PNG: GRPO on Qwen3-0.6B, generation
split from training with k = 1 and 4-way streaming, and colocated (with its context switches)."""

import json
from dataclasses import replace

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.graph import Job, Kind, get_model
from rpeg.graph import LengthDistribution as Dist
from rpeg.hardware import load_cluster
from rpeg.passes import bound_asynchrony, colocate, parallelize, place, stream
from rpeg.sim import simulate
from rpeg.sim.export import chrome_trace, write_gantt, write_trace

PNG = b"\x89PNG\r\n\x1a\n"
JOB = Job(prompts=16, samples_per_prompt=4, prompt_len=256, response=Dist.fixed(512))


def data_parallel(graph):
    for s in graph.stages:
        if s.model and s.kind is not Kind.SYNC:
            graph = parallelize(graph, s.name, dp=graph.group(s.group).count)
    return graph


@pytest.fixture(scope="module", params=["split", "colocated"])
def timeline(request):
    g = build_graph("grpo", JOB, Models(actor=get_model("qwen3-0.6B")))
    if request.param == "split":
        g = place(g, {"gen": 4, "train": 4}, assign={"generate": "gen"}, default="train")
        g = stream(bound_asynchrony(data_parallel(g), 1), 4)
    else:
        g = data_parallel(colocate(g, 4))
    return simulate(g, load_cluster("dgx-h100"), 4)


def test_every_record_is_a_complete_event_in_microseconds(timeline):
    trace = chrome_trace(timeline, "a title")
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(timeline.records)
    for e, r in zip(complete, timeline.records):
        assert e["ts"] == pytest.approx(r.start * 1e6, rel=1e-12, abs=1e-6)
        assert e["dur"] == pytest.approx(r.seconds * 1e6, rel=1e-12, abs=1e-6) and e["dur"] >= 0
        assert e["name"] == f"{r.unit} s{r.step}" and e["cat"] == r.kind
        assert e["args"]["step"] == r.step and e["args"]["microbatch"] == r.microbatch
        assert e["args"]["devices"] == f"{r.devices[0]}+{r.devices[1]}"
        assert e["args"].get("weight_version", -1) == r.weight_version
    assert any("weight_version" in e["args"] for e in complete)  # generation says which weights it used


def test_processes_and_threads_are_named(timeline):
    events = chrome_trace(timeline)["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    groups = {r.group for r in timeline.records}
    assert sorted(procs.values()) == sorted(f"{g} (simulated)" for g in groups)
    assert len(set(procs)) == len(groups)
    complete = [e for e in events if e["ph"] == "X"]
    tids = {}
    for e, r in zip(complete, timeline.records):
        assert procs[e["pid"]] == f"{r.group} (simulated)"  # the device group's process
        assert threads[(e["pid"], e["tid"])] == r.unit  # the unit's thread
        tids.setdefault(r.unit, set()).add(e["tid"])
    assert all(len(t) == 1 for t in tids.values())  # one thread id per unit
    assert len(threads) == len({(r.group, r.unit) for r in timeline.records})


def test_the_trace_is_json_and_carries_the_step_time(timeline, tmp_path):
    trace = chrome_trace(timeline, "rpeg test")
    assert json.loads(json.dumps(trace)) == trace
    assert trace["otherData"] == {"title": "rpeg test", "step_s": timeline.step_s, "steps": 4, "source": "simulated"}
    path = write_trace(timeline, str(tmp_path / "trace.json"), "rpeg test")
    assert json.loads((tmp_path / "trace.json").read_text()) == trace
    assert path == str(tmp_path / "trace.json")


def test_gantt_is_a_png(timeline, tmp_path):
    path = write_gantt(timeline, str(tmp_path / "gantt.png"), "test")
    data = (tmp_path / "gantt.png").read_bytes()
    assert path == str(tmp_path / "gantt.png")
    assert data[:8] == PNG and len(data) > 1000


def test_a_measured_peak_memory_shows_in_the_trace_and_an_unknown_one_does_not():
    from rpeg.sim.timeline import Record, Timeline

    common = dict(step=0, microbatch=0, group="all", devices=(0, 1))
    recs = (Record(unit="actor_update", kind="train", start=0.0, end=1.0, peak_memory_bytes=3.5e9, **common),
            Record(unit="generate", kind="generate", start=1.0, end=2.0, **common))
    trace = chrome_trace(Timeline(records=recs, steps=1, step_s=2.0, step_ends=(2.0,), tokens_per_step=0.0,
                                  sequences_per_step=1, max_staleness=0, source="measured"))
    args = {e["name"]: e["args"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert args["actor_update s0"]["peak_memory_gb"] == 3.5 and "peak_memory_gb" not in args["generate s0"]


def test_episode_details_get_their_own_lanes_after_their_stage(tmp_path):
    from rpeg.sim.export import write_episodes
    from rpeg.sim.timeline import Record, Timeline

    common = dict(step=0, microbatch=0, group="gen", devices=(0, 1))
    recs = (Record(unit="generate", kind="generate", start=0.0, end=2.0, **common),)
    details = tuple(Record(unit=f"generate · episode {i}", kind=k, start=s, end=e, label=f"{k} s0", **common)
                    for i in (10, 2) for k, s, e in (("turn", 0.0, 0.5), ("tool", 0.5, 1.5), ("turn", 1.5, 2.0)))
    details += (Record(unit="generate · engine 0", kind="engine", start=0.1, end=0.5, label="2 turns s0", **common),)
    tl = Timeline(records=recs, steps=1, step_s=2.0, step_ends=(2.0,), tokens_per_step=0.0, sequences_per_step=2,
                  source="measured", details=details)
    trace = chrome_trace(tl)
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert [names[t] for t in sorted(names)] == ["generate", "generate · engine 0", "generate · episode 2",
                                                 "generate · episode 10"]
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 8 and sum(e["cat"] == "tool" for e in spans) == 2
    assert {e["name"] for e in spans if e["cat"] == "engine"} == {"2 turns s0"}
    assert write_episodes(tl, str(tmp_path / "episodes.png")) and (tmp_path / "episodes.png").read_bytes()[:8] == PNG
    assert write_episodes(replace(tl, details=()), str(tmp_path / "none.png")) is None
