"""The staleness contract: every sample a step trains on was generated with weights at most the plan's
k versions old, checked as the batch is built. Async with k = 0 is the synchronous run bit for bit;
k = 2 reaches its bound and never passes it, also across a SIGKILL and `--resume` (k = 1: in
test_runtime_e2e.py::test_async_disaggregated_records_staleness); a driver
that launches generation further ahead than the plan allows is stopped with a one-line error."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from rpeg.algorithms import Models, build_graph
from rpeg.errors import RpegError
from rpeg.passes import bound_asynchrony, place
from rpeg.runtime import run as run_module
from rpeg.runtime.run import run
from rpeg.runtime.step import check_staleness
from tests.runtime.test_runtime_e2e import TINY, job, laid_out, rt, weights
from tests.runtime.test_runtime_kill_resume import _checkpoint_step, _lines, _train

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`


def split_plan(k: int | None):
    """GRPO, generation on one device and training on another; k None: no bound_asynchrony pass at all."""
    g = build_graph("grpo", job(), Models(actor=TINY), kl_coef=0.0)
    if k is not None:
        g = bound_asynchrony(g, k)
    return laid_out(place(g, {"gen": 1, "train": 1}, {"generate": "gen"}, default="train"))


TIMING = ("step_s",)  # measured wall time: the only fields two identical runs may differ in


def test_check_staleness_names_the_step_and_the_sample():
    check_staleness(5, 0, [5, 4, 3], 2)  # lags 0, 1, 2 with k = 2: fine
    with pytest.raises(RpegError, match=r"step 6, sample 10: .*version 2, 3 update\(s\) behind .*k = 2"):
        check_staleness(5, 8, [5, 4, 2], 2)
    with pytest.raises(RpegError, match=r"step 6, sample 1: .*version 6, -1 update"):  # weights from the future
        check_staleness(5, 0, [5, 6], 2)
    with pytest.raises(RpegError, match=r"step 4, sample 1, token 2: .*version 0, 3 update"):  # per-token versions
        check_staleness(3, 0, [[3, 3], [1, 2, 0]], 2)
    assert "\n" not in _error(lambda: check_staleness(5, 0, [1], 2))


def _error(fn) -> str:
    try:
        fn()
    except RpegError as e:
        return str(e)
    raise AssertionError("no error")


def test_async_with_k0_reproduces_the_synchronous_run_bit_for_bit(tmp_path):
    sync = run(split_plan(None), rt(tmp_path / "sync", steps=2, checkpoint_every=2), progress=False)
    k0 = run(split_plan(0), rt(tmp_path / "k0", steps=2, checkpoint_every=2), progress=False)
    strip = [{k: v for k, v in m.items() if k not in TIMING} for m in sync.metrics]
    assert strip == [{k: v for k, v in m.items() if k not in TIMING} for m in k0.metrics]
    assert all(m["staleness_max"] == 0 for m in k0.metrics)
    a, b = weights(sync.out), weights(k0.out)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("k", [2])  # k = 1: test_runtime_e2e.py::test_async_disaggregated_records_staleness
def test_lags_reach_k_and_never_exceed_it(tmp_path, k):
    result = run(split_plan(k), rt(tmp_path, steps=4, checkpoint_every=0), progress=False)
    lags = [m["staleness_max"] for m in result.metrics]
    # step s trains samples launched at step max(0, s - k) on that step's weights
    assert lags == [min(s, k) for s in range(4)]


def test_a_driver_running_ahead_of_the_bound_is_stopped(tmp_path, monkeypatch):
    """The contract is checked where the batch is built, not assumed from the launch loop: a loop that
    launches one step further ahead than the plan's k = 1 trains step 3 on weights 2 versions old."""
    loop = run_module._Runner.loop

    def ahead(self, *args):
        self.k += 1
        return loop(self, *args)

    monkeypatch.setattr(run_module._Runner, "loop", ahead)
    with pytest.raises(RpegError, match=r"staleness bound broken at step 3, sample 0: .*2 update\(s\) behind .*k = 1"):
        run(split_plan(1), rt(tmp_path, steps=4, checkpoint_every=1), progress=False)
    assert os.path.exists(os.path.join(tmp_path, "run", "checkpoints", "latest"))  # steps 1 and 2 stand


JOB = """\
algorithm: grpo
model: tiny-qwen2
cluster: cpu-local
gpus: 2
job: {prompts: 8, samples_per_prompt: 4, prompt_len: 6, response: {kind: fixed, mean: 3}, mini_batches: 2}
config: {kl_coef: 0.0}
passes:
  - bound_asynchrony: {k: 2}
  - place: {groups: {gen: 1, train: 1}, assign: {generate: gen}, default: train}
  - parallelize: {stage: generate, dp: 1, micro_batch: 64, packing: false}
  - parallelize: {stage: actor_logprobs, dp: 1, micro_batch: 64, packing: false}
  - parallelize: {stage: actor_update, dp: 1, micro_batch: 64, packing: false}
runtime:
  model_path: tiny
  task: {name: arithmetic, ops: [add], level: 1}
  steps: 7
  lr: 1.0e-3
  max_new_tokens: 3
  eval_every: 0
  eval_size: 20
  checkpoint_every: 3
  threads: 1
"""


def test_lags_stay_within_k_after_a_sigkill_and_resume(tmp_path):
    """AReaL #1388's failure: after recovery the staleness grew without bound. Here the generations in
    flight at the checkpoint are restored with their versions, and the resumed run's lags follow the
    uninterrupted pattern (0, 1, 2, 2, ...) step for step."""
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB)
    out = str(tmp_path / "cut")
    proc = _train(str(job_file), out)
    deadline = time.time() + 240
    while len(_lines(out)) < 4 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    logged, saved = len(_lines(out)), _checkpoint_step(out)
    assert 7 > logged > saved > 0, f"the kill did not land between checkpoints ({logged} logged, {saved} saved)"
    resumed = _train(str(job_file), out, "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stdout.read().decode()
    rows = _lines(out)
    assert [m["step"] for m in rows] == list(range(1, 8))
    assert [m["staleness_max"] for m in rows] == [min(s, 2) for s in range(7)]
