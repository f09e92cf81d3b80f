"""`rpeg import` / `rpeg export` and the plan file `rpeg plan` writes, end to end through the CLI."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from rpeg.cli import main
from rpeg.graph.serde import read_yaml_file

DATA = Path(__file__).parent.parent / "data" / "peers"
JOB = {"algorithm": "grpo", "model": "qwen2.5-7B", "cluster": "dgx-h100", "gpus": 16,
       "job": {"prompts": 64, "samples_per_prompt": 8, "prompt_len": 512,
               "response": {"kind": "lognormal", "mean": 1500, "max": 4096}, "mini_batches": 4}}


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_import_prints_both_plans_and_writes_three_files(capsys, tmp_path):
    rc, out, _ = run(capsys, "import", DATA / "verl" / "run_qwen2-7b_math.sh", "--from", "verl",
                     "--out", tmp_path / "o", "--steps", 3)
    assert rc == 0
    assert "read verl job" in out and "(synchronous trainer): grpo on qwen2.5-7B, 8 x h100-sxm" in out
    assert "verl (as configured)" in out and "\nrpeg " in out
    assert "not mapped (13 keys" in out and "actor_rollout_ref.actor.optim.lr = 1e-6" in out
    assert "assumed (the config does not say)" in out
    files = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert files == ["rpeg-plan-verl.sh", "rpeg-plan.yaml", "verl-job.yaml"]
    # the peer's plan as an RPEG job predicts what the table says
    rc, pout, _ = run(capsys, "predict", tmp_path / "o" / "verl-job.yaml", "--json")
    assert rc == 0
    rc, iout, _ = run(capsys, "import", DATA / "verl" / "run_qwen2-7b_math.sh", "--from", "verl",
                      "--out", tmp_path / "o2", "--steps", 3, "--json")
    data = json.loads(iout)
    assert math.isclose(json.loads(pout)["step_s"], data["plans"][0]["step_s"], rel_tol=1e-12)
    assert data["plans"][1]["plan"] == "rpeg" and data["plans"][1]["speedup"] > 0
    assert data["mode"] == "sync" and len(data["unmapped"]) == 13
    exported = (tmp_path / "o" / "rpeg-plan-verl.sh").read_text()
    assert exported.startswith("#!/usr/bin/env bash\n# written by rpeg export")
    assert "# predicted by RPEG on 8 x h100-sxm (dgx-h100): this config" in exported


def test_plan_writes_a_plan_file_that_predicts_the_same_step(capsys, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(JOB))
    rc, out, _ = run(capsys, "plan", job, "--out", tmp_path / "p", "--steps", 2, "--json")
    assert rc == 0
    chosen = json.loads(out)["chosen"]["predicted_step_s"]
    plan = tmp_path / "p" / "rpeg-plan.yaml"
    assert "passes" in read_yaml_file(str(plan))
    rc, out, _ = run(capsys, "predict", plan, "--json")
    assert rc == 0 and math.isclose(json.loads(out)["step_s"], chosen, rel_tol=1e-12)
    # and exports with the cost of what verl cannot express
    rc, out, _ = run(capsys, "export", plan, "--to", "verl", "--out", tmp_path / "plan.sh")
    assert rc == 0 and out.startswith(f"wrote {tmp_path / 'plan.sh'} (verl); predicted ")
    text = (tmp_path / "plan.sh").read_text()
    assert "python3 -m verl." in text
    if "verl cannot express" in text:
        assert "leaving it out costs" in text or "does not fit" in text


@pytest.mark.parametrize("argv, message", [
    (["import", "nope.sh", "--from", "verl"], "nope.sh: no such file"),
    (["import", "{data}", "--from", "verl"], "is a folder, not a file"),
    (["import", "{data}/verl/run_qwen2-7b_math.sh", "--from", "slime"], "invalid choice: 'slime'"),
    (["import", "{data}/verl/run_qwen2-7b_math.sh", "--from", "verl", "--response-mean", "5000"],
     "--response-mean 5000.0 exceeds the config's response cap of 1024 tokens"),
    (["import", "{data}/verl/run_qwen2-7b_math.sh", "--from", "verl", "--model", "gpt-9"], "gpt-9"),
    (["export", "nope.yaml", "--to", "verl"], "nope.yaml"),
    (["export", "{job}", "--to", "verl"], "this job has no plan to read"),
])
def test_bad_input_is_one_line(capsys, tmp_path, argv, message):
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(JOB))
    argv = [a.format(data=DATA, job=job) for a in argv]
    rc, out, err = run(capsys, *argv, *(["--out", tmp_path / "o"] if argv[0] == "import" else []))
    assert rc == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()  # nothing half written


def test_import_says_when_rpegs_plan_as_the_peers_config_does_not_fit(capsys, tmp_path):
    """Qwen2.5-32B on verl's 8 GPUs: verl's config as written does not fit; RPEG's plan fits by keeping
    the optimizer on the host (Megatron-Core's optimizer_cpu_offload), which verl's config can say, so
    the line states its time. (Before offload was a plan option it did not fit as verl's config, and the
    line formatted None: a TypeError after the tables, issue 23.)"""
    argv = ["import", DATA / "verl" / "run_qwen3-8b.sh", "--from", "verl", "--model", "qwen2.5-32B", "--steps", 1]
    rc, out, err = run(capsys, *argv, "--out", tmp_path / "o")
    assert rc == 0 and err == "", err
    assert "where the time goes (verl as configured)" in out and "RPEG's plan: rpeg:" in out
    assert "verl (as configured)  does not fit" in out
    line = next(x for x in out.splitlines() if x.startswith("  as verl config"))
    assert re.fullmatch(r"  as verl config \(rpeg-plan-verl.sh\), without what verl cannot express: [\d.]+ s a step",
                        line), line
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["rpeg-plan-verl.sh", "rpeg-plan.yaml",
                                                                  "verl-job.yaml"]
    assert "optimizer_cpu_offload=True" in (tmp_path / "o" / "rpeg-plan-verl.sh").read_text()
