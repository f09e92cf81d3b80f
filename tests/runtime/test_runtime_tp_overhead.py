"""benchmarks/tp_overhead.py runs: both trainers time the demo's batch and the ratios are theirs."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.long  # end-to-end runs: the second tier (`make test-long`), not `make test`

ROOT = pathlib.Path(__file__).parents[2]


def test_the_benchmark_times_both_trainers_on_the_demo_batch():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tp_overhead.py"), "--repeats", "1", "--job",
                           str(ROOT / "examples" / "demo-grpo-tiny.yaml")], capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": str(ROOT)}, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["batch"]["rows"] == 256 and out["batch"]["mini_batches"] == 2
    for tp in ("tp1", "tp2"):
        assert out[tp]["logprobs_s"] > 0 and out[tp]["train_s"] > out[tp]["logprobs_s"]
    assert out["tp2_over_tp1"]["train_s"] == out["tp2"]["train_s"] / out["tp1"]["train_s"]
