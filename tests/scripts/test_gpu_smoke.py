"""benchmarks/gpu_smoke.py runs its GRPO step end to end on the CPU (the GPU path's script, ready for
a GPU session) and prints the measured and predicted figures side by side."""

from __future__ import annotations

import importlib.util
import pathlib

SCRIPT = pathlib.Path(__file__).parents[2] / "benchmarks" / "gpu_smoke.py"


def test_the_smoke_step_runs_on_the_cpu_and_sets_measured_beside_predicted(capsys):
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.main(["--device", "cpu", "--prompts", "4", "--samples", "2", "--max-new-tokens", "4"])
    assert out["device"] == "cpu" and out["sequences"] == 8 and out["cluster"] == "cpu-local"
    for key in ("generate_s", "logprobs_s", "train_s"):
        assert out["measured"][key] > 0 and out["predicted"][key] > 0
        assert out["predicted_over_measured"][key] == out["predicted"][key] / out["measured"][key]
    assert out["measured"]["generate_tokens_per_s"] > 0 and out["predicted"]["fits"]
    assert '"predicted_over_measured"' in capsys.readouterr().out
