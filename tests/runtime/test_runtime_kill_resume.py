"""A run killed with SIGKILL between checkpoints and resumed records every step once (metrics and
the measured timeline), and ends with the weights of an uninterrupted run, bit for bit (`rpeg train`
as a user runs it, in a subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`

JOB = """\
algorithm: grpo
model: tiny-qwen2
cluster: cpu-local
gpus: 1
job: {prompts: 8, samples_per_prompt: 4, prompt_len: 6, response: {kind: fixed, mean: 3}, mini_batches: 2}
config: {kl_coef: 0.0}
runtime:
  model_path: tiny
  task: {name: arithmetic, ops: [add], level: 1}
  steps: 14
  lr: 1.0e-3
  max_new_tokens: 3
  eval_every: 0
  eval_size: 20
  checkpoint_every: 5
  threads: 1
"""


def _train(job: str, out: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rpeg", "train", job, "--out", out, "--no-progress", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _lines(out: str) -> list[dict]:
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.endswith("\n")]


def _checkpoint_step(out: str) -> int:
    with open(os.path.join(out, "checkpoints", "latest"), encoding="utf-8") as fh:
        return int(fh.read().strip().split("-")[1])


def _weights(out: str) -> dict:
    folder = os.path.join(out, "checkpoints")
    with open(os.path.join(folder, "latest"), encoding="utf-8") as fh:
        state = torch.load(os.path.join(folder, fh.read().strip(), "state.pt"), weights_only=False)
    return state["actor"]["model"]


def test_sigkill_between_checkpoints_then_resume(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    whole = _train(str(job), full)
    proc = _train(str(job), cut)
    deadline = time.time() + 240
    while len(_lines(cut)) < 7 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray cluster it started
    proc.wait()
    logged, saved = len(_lines(cut)), _checkpoint_step(cut)
    assert 14 > logged > saved, f"the kill did not land between checkpoints ({logged} steps logged, {saved} saved)"
    resumed = _train(str(job), cut, "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stdout.read().decode()
    assert whole.wait(timeout=300) == 0, whole.stdout.read().decode()
    assert [m["step"] for m in _lines(cut)] == list(range(1, 15))
    assert [m["reward"] for m in _lines(cut)] == [m["reward"] for m in _lines(full)]
    a, b = _weights(full), _weights(cut)
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed run's weights differ from the uninterrupted run's"
    trace = json.load(open(os.path.join(cut, "timeline.json"), encoding="utf-8"))
    updates = [e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "train"]
    assert sorted(updates) == list(range(14)), "the timeline lost or repeated steps across the resume"
