"""`rpeg predict`, `rpeg hardware`, `rpeg calibrate`: output, JSON, and the OOM verdict."""

import json
import pathlib

import pytest

from rpeg.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_predict_default_plan(capsys):
    code, out, err = run(capsys, "predict", "grpo", "--model", "qwen3-8B", "--cluster", "dgx-h100", "--gpus", "8")
    assert code == 0, err
    assert "default plan" in out and "step time:" in out and "generate" in out and "GB/GPU" in out


def test_predict_json_matches_table(capsys):
    code, out, _ = run(capsys, "predict", "ppo", "--model", "qwen3-0.6B", "--gpus", "4", "--json")
    data = json.loads(out)
    assert code == 0 and data["fits"] is True and data["gpus"] == 4
    # a synchronous colocated plan: the step is every stage in turn
    assert data["step_s"] == pytest.approx(sum(s["seconds"] for s in data["stages"]), rel=1e-9)
    assert {s["stage"] for s in data["stages"]} >= {"generate", "critic_update", "actor_sync"}


def test_predict_out_of_memory_verdict(capsys):
    code, out, _ = run(capsys, "predict", str(ROOT / "tests" / "data" / "oom-llama70b-8gpu.yaml"))
    assert code == 3
    assert "OUT OF MEMORY: device group 'all' (GPUs 0-7) holds" in out and "GB per GPU of 85.5 GB" in out
    assert "while actor_update runs (actor trainer weights (actor_update)" in out  # each model and stage named
    assert "step time" not in out


def test_predict_errors(capsys):
    code, _, err = run(capsys, "predict", "grpo", "--model", "qwen3-8B", "--cluster", "nope")
    assert code == 2 and "nope" in err
    code, _, err = run(capsys, "predict", "grpo", "--model", "llama-3.1-405B", "--gpus", "1")
    # a valid job that fits no layout: exit 3, as for a plan that does not fit (README), not 2 (bad input)
    assert code == 3 and "no layout of llama-3.1-405B fits 1 x h100-sxm" in err


def test_hardware_lists_presets(capsys):
    code, out, _ = run(capsys, "hardware")
    assert code == 0
    for name in ("h100-sxm", "gb200-nvl72", "alps-gh200", "dgx-a100-80gb", "mi300x"):
        assert name in out


def test_calibrate_writes_a_readable_file(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("RPEG_CACHE_DIR", str(tmp_path))
    out_file = tmp_path / "cpu.yaml"
    code, out, _ = run(capsys, "calibrate", "--out", str(out_file))
    assert code == 0 and "GFLOP/s" in out
    assert "bf16" in out_file.read_text() or "tflop" in out_file.read_text()
