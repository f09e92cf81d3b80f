"""Recovery inside the run (runtime.run): a worker killed (SIGKILL) or stopped (SIGSTOP) at a chosen point
(runtime.faults) is named in the log and the run goes on by itself. A synchronous plan ends with the weights
of an uninterrupted run, bit for bit; a bounded-asynchronous one within its staleness contract; and every
step is recorded once, in metrics.jsonl and in the timeline. A dead engine of a split plan costs its own
restart and a resync, not a step."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import torch

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.passes import bound_asynchrony, colocate, place
from rpeg.runtime import faults
from tests.runtime.test_runtime_e2e import TINY, colocated_plan, job, laid_out, lay, rt, split_async_plan, weights

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`

STEPS = 4


def split_sync_plan():
    """GRPO with generation on one device and everything else on another, on-policy (k = 0)."""
    g = build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.0)
    return laid_out(place(g, {"gen": 1, "train": 1}, {"generate": "gen"}, default="train"))


def colocated_async_plan():
    """GRPO with every role in one worker, one step ahead (k = 1)."""
    return laid_out(colocate(bound_asynchrony(build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.0), 1), 1))


def colocated_two_plan():
    """The hybrid engine on two devices: each process an FSDP2 rank (ZeRO-3) and an engine of its own."""
    g = colocate(build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.0), 2)
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            g = lay(g, s.name, dp=2, **({"zero": 3} if s.name in ("actor_update", "actor_logprobs") else {}))
    return g


def split_two_engines_plan():
    """Two engines on devices 0 and 1, the trainer on device 2, on-policy."""
    g = build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.0)
    g = place(g, {"gen": 2, "train": 1}, {"generate": "gen"}, default="train")
    for s in g.stages:
        if s.model and s.kind.value != "sync":
            g = lay(g, s.name, dp=2 if s.name == "generate" else 1)
    return g


PLANS = {"colocated": colocated_plan, "split": split_sync_plan, "split-k1": split_async_plan,
         "colocated-k1": colocated_async_plan, "colocated-2": colocated_two_plan, "split-2": split_two_engines_plan}


def _run(tmp_path, plan: str, monkeypatch, fault: str = "", **kw):
    from rpeg.runtime.run import run

    monkeypatch.setenv("RPEG_FAULTS", fault)
    monkeypatch.setenv("RPEG_FAULTS_DIR", str(tmp_path / "fired"))
    cfg = dict(steps=STEPS, checkpoint_every=2, wait_timeout_s=5.0, startup_timeout_s=120.0) | kw
    return run(PLANS[plan](), rt(tmp_path, **cfg), progress=False)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Each plan's uninterrupted run: its final weights."""
    out = {}
    mp = pytest.MonkeyPatch()
    try:
        for plan in ("colocated", "split"):
            path = tmp_path_factory.mktemp(f"clean-{plan}")
            _run(path, plan, mp)
            out[plan] = weights(str(path / "run"))
    finally:
        mp.undo()
    return out


def _recorded_once(result) -> None:
    """metrics.jsonl and the timeline hold each step once: steps 1..N in order, and no stage's part twice."""
    with open(os.path.join(result.out, "metrics.jsonl"), encoding="utf-8") as fh:
        steps = [json.loads(line)["step"] for line in fh]
    assert steps == list(range(1, STEPS + 1)) == [m["step"] for m in result.metrics]
    parts = Counter((r.unit, r.step, r.microbatch) for r in result.timeline.records if r.unit != "recovery")
    assert max(parts.values()) == 1, [k for k, v in parts.items() if v > 1]


def _recoveries(result) -> list[dict]:
    with open(os.path.join(result.out, "recoveries.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


# (plan, fault, what the log names, the recovery: engines alone or the whole run from a checkpoint)
CASES = [
    # colocated: the one process holds every role; any fault restarts it from the last checkpoint
    ("colocated", "die:train:3", "colocated worker 0", "run"),  # mid update, step 3 (after step 2's checkpoint)
    ("colocated", "stop:generate:5", "gave no answer within 5 s", "run"),  # stopped mid generation, step 3
    ("colocated", "die:checkpoint_state:1", "colocated worker 0", "run"),  # mid checkpoint: from the start
    # split, on-policy: a dead engine alone is restarted, resynced and its calls made again
    ("split", "die:generate:4", "engine 0 (plan device 0) died", "engines"),  # mid generation, step 2
    ("split", "die:receive_weights:2", "engine", "engines"),  # mid weight sync: every engine, new weights
    ("split", "die:train:3", "actor rank 0 (plan device 1) died", "run"),  # the trainer, mid update
    ("split", "die:send_weights:3", "actor rank 0", "run"),  # the trainer, mid weight sync
    ("split", "stop:generate:4", "gave no answer within 5 s", "run"),  # a stopped engine: a timeout
]


@pytest.mark.parametrize("plan,fault,named,how", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_synchronous_run_survives_a_fault_with_the_weights_of_an_uninterrupted_one(
        tmp_path, monkeypatch, clean, plan, fault, named, how):
    result = _run(tmp_path, plan, monkeypatch, fault)
    assert faults.fired() == 1  # the fault did fire, once
    rows = _recoveries(result)
    assert len(rows) == 1 and named in rows[0]["fault"], rows
    assert ("engines" in rows[0]) == (how == "engines"), rows
    if how == "engines":
        assert rows[0]["steps_lost"] == 0
    _recorded_once(result)
    assert any(r.unit == "recovery" for r in result.timeline.records)
    got, want = weights(result.out), clean[plan]
    assert all(torch.equal(got[k], want[k]) for k in want), [k for k in want if not torch.equal(got[k], want[k])]


ASYNC = [("split-k1", "die:train:3"), ("split-k1", "die:generate:5"), ("split-k1", "stop:generate:5"),
         ("colocated-k1", "die:train:3"), ("colocated-k1", "stop:generate:6")]


@pytest.mark.parametrize("plan,fault", ASYNC, ids=[f"{p}-{f}" for p, f in ASYNC])
def test_a_bounded_asynchronous_run_survives_a_fault_within_its_staleness_contract(tmp_path, monkeypatch, plan,
                                                                                      fault):
    """k = 1: an engine that dies while it generates the next step is seen at the weight sync (every engine
    is restarted with the new weights, the next step's calls made again); a trainer's death restarts the
    run from its checkpoint with the generations it held in flight. Every sample stays 0 or 1 behind."""
    result = _run(tmp_path, plan, monkeypatch, fault)
    assert faults.fired() == 1
    assert len(_recoveries(result)) == 1
    _recorded_once(result)
    assert all(0 <= m["staleness_max"] <= 1 for m in result.metrics)
    assert all(torch.isfinite(v).all() for v in weights(result.out).values() if v.is_floating_point())


def test_past_max_restarts_the_run_stops_with_one_line_and_its_checkpoint(tmp_path, monkeypatch):
    """Without RPEG_FAULTS_DIR the fault fires in every restarted worker too (each process's second update):
    step 2 dies, the run restarts from step 1's checkpoint, step 3 dies, and the bound of 1 ends it."""
    from rpeg.runtime.run import run

    monkeypatch.setenv("RPEG_FAULTS", "die:train:2")
    monkeypatch.delenv("RPEG_FAULTS_DIR", raising=False)
    with pytest.raises(RpegError, match=r"step 3: colocated worker 0 .* died .*; the run restarted its workers 1 "
                                        r"time\(s\), runtime.max_restarts: the run stops here, and its last "
                                        r"checkpoint \(step 2\) stands for --resume"):
        run(colocated_plan(), rt(tmp_path, steps=STEPS, checkpoint_every=1, max_restarts=1), progress=False)
    assert len(_recoveries_at(tmp_path / "run")) == 1


def _recoveries_at(out) -> list[dict]:
    with open(os.path.join(out, "recoveries.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.slow
def test_a_soak_of_twenty_random_faults_ends_complete_and_consistent(tmp_path, monkeypatch):
    """runtime.faults' soak: at every fault point of every worker, a one-in-four chance to be killed or
    stopped, until 20 faults have fired, over a 12-step on-policy split run: it ends with every step once
    and the weights of the uninterrupted run, bit for bit."""
    steps = 12
    cfg = dict(steps=steps, checkpoint_every=2, max_restarts=40, startup_timeout_s=30.0)
    result = _run(tmp_path / "soak", "split", monkeypatch, "soak:20:0.25", **cfg)
    assert faults.fired() == 20
    rows = _recoveries(result)
    assert 1 <= len(rows) <= 20 and len(result.metrics) == steps
    with open(os.path.join(result.out, "metrics.jsonl"), encoding="utf-8") as fh:
        assert [json.loads(line)["step"] for line in fh] == list(range(1, steps + 1))
    clean = _run(tmp_path / "clean", "split", monkeypatch, **cfg)
    got, want = weights(result.out), weights(clean.out)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_tracker_keeps_each_step_once_when_steps_run_again(tmp_path, monkeypatch):
    """Step 4's update dies after step 3 was logged: the run goes on from step 2's checkpoint, runs step 3
    again (metrics.jsonl keeps the new line) and TensorBoard keeps its first record of it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = _run(tmp_path, "colocated", monkeypatch, "die:train:4", loggers=("tensorboard",))
    assert [r["steps_lost"] for r in _recoveries(result)] == [1]
    _recorded_once(result)
    acc = EventAccumulator(os.path.join(result.out, "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/reward")] == list(range(1, STEPS + 1))


def test_rpeg_train_names_the_fault_and_says_what_the_recovery_cost(tmp_path):
    """`rpeg train` as a user runs it: the fault's line on stderr, and the recovery in its last lines."""
    import subprocess
    import sys

    from tests.runtime.test_runtime_kill_resume import JOB

    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("steps: 14", "steps: 4").replace("checkpoint_every: 5", "checkpoint_every: 2"))
    env = os.environ | {"RPEG_FAULTS": "die:train:3", "RPEG_FAULTS_DIR": str(tmp_path / "fired")}
    done = subprocess.run([sys.executable, "-m", "rpeg", "train", str(job), "--out", str(tmp_path / "run"),
                           "--no-progress"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rpeg: step 3: colocated worker 0" in done.stderr and "from the checkpoint of step 2" in done.stderr
    assert "recovered from 1 worker fault(s) by itself" in done.stdout and "0 step(s) run again" in done.stdout


WIDE = [("colocated-2", "die:train:3", "colocated worker"),  # one FSDP rank dies; the other blocks in its gather
        ("split-2", "die:generate:4", "engine")]  # one of two engines: it alone is restarted


@pytest.mark.parametrize("plan,fault,named", WIDE, ids=[f"{c[0]}-{c[1]}" for c in WIDE])
def test_a_plan_on_more_devices_survives_a_fault_bit_for_bit(tmp_path, monkeypatch, plan, fault, named):
    """A rank of a 2-rank FSDP group dies mid update: the wait ends at once (the other rank would block in
    its all-gather) and the group forms again on new ports. One of two engines dies: the other keeps its
    calls. Both end with the weights of the uninterrupted run."""
    result = _run(tmp_path / "fault", plan, monkeypatch, fault)
    rows = _recoveries(result)
    assert faults.fired() == 1 and len(rows) == 1 and named in rows[0]["fault"], rows
    if plan == "split-2":
        assert len(rows[0]["engines"]) == 1 and rows[0]["calls_again"] == 1, rows
    _recorded_once(result)
    clean = _run(tmp_path / "clean", plan, monkeypatch)
    got, want = weights(result.out), weights(clean.out)
    assert all(torch.equal(got[k], want[k]) for k in want)
