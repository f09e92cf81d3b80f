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
    # RPEG's plan shards the reference (FSDP), which verl's Megatron backend (ZeRO-1 training) cannot:
    # as verl's config it keeps whole reference weights beside the trainer and may say it does not fit
    head = exported.splitlines()[:3]
    assert head[0] == "#!/usr/bin/env bash" and any(x.startswith("# written by rpeg export") for x in head[1:])
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
    the optimizer on the host, which verl's config can say (FSDP2's offload_policy, or Megatron-Core's
    optimizer_cpu_offload: which backend RPEG's plan takes follows the logits path's bytes, 12 per entry
    in training on RPEG's own), so the line states its time. (Before offload was a plan option it did
    not fit as verl's config, and the line formatted None: a TypeError after the tables, issue 23.)"""
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
    written = (tmp_path / "o" / "rpeg-plan-verl.sh").read_text()
    assert "fsdp_config.offload_policy=True" in written or "optimizer_cpu_offload=True" in written


def test_export_of_a_plan_that_does_not_fit_says_so_first(capsys, tmp_path):
    """A config RPEG predicts runs out of memory says so on its first line (after the shebang), in the file
    and in what `rpeg export` prints (issue 24). verl's own plan of run_qwen3-8b with Qwen2.5-32B does not
    fit its 8 GPUs; exported back to verl it still does not."""
    argv = ["import", DATA / "verl" / "run_qwen3-8b.sh", "--from", "verl", "--model", "qwen2.5-32B", "--steps", 1]
    assert run(capsys, *argv, "--out", tmp_path / "o")[0] == 0
    peer = tmp_path / "o" / "verl-job.yaml"
    rc, out, _ = run(capsys, "export", peer, "--to", "verl")
    lines = out.splitlines()
    assert rc == 0 and lines[0].startswith("#!") and lines[1].startswith(
        "# DOES NOT FIT: RPEG predicts this config runs out of memory on 8 x h100-sxm ("), out[:300]
    rc, out, _ = run(capsys, "export", peer, "--to", "verl", "--out", tmp_path / "x.sh")
    assert rc == 0 and out.startswith(f"DOES NOT FIT: wrote {tmp_path / 'x.sh'} (verl)"), out
    assert (tmp_path / "x.sh").read_text().splitlines()[1] == lines[1]
    # a config that fits has no such line
    rc, out, _ = run(capsys, "export", tmp_path / "o" / "rpeg-plan.yaml", "--to", "verl")
    assert rc == 0 and "DOES NOT FIT" not in out and "this config " in out


def _table_after(out: str, heading: str, skip: int = 3) -> list[list[str]]:
    """The rows of the table whose first line starts with `heading` (its title, or its header with
    skip = 2), cells split on 2+ spaces."""
    lines = out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith(heading))
    rows = []
    for x in lines[at + skip:]:
        if not x.strip():
            break
        rows.append(re.split(r"\s{2,}", x.strip()))
    return rows


def test_ppo_import_keeps_the_critic_unless_sharing_is_allowed(capsys, tmp_path):
    """verl's PPO example with a reward model: RPEG's plan used to share the critic's trunk with the actor
    (a different value model) and report 1.98x as if the job were the same. Now the critic stays, the
    breakdown shows what sharing would add, and --allow-share takes it (issue 24, item 4)."""
    src = DATA / "verl" / "run_qwen2-7b_rm.sh"
    rc, out, _ = run(capsys, "import", src, "--from", "verl", "--steps", 2, "--out", tmp_path / "a", "--json")
    data = json.loads(out)
    assert rc == 0 and "critic shared" not in data["rpeg_plan"]
    plan = read_yaml_file(str(tmp_path / "a" / "rpeg-plan.yaml"))
    assert not any("share_actor_critic" in p for p in plan["passes"]) and plan["critic"]
    rungs = {r["key"]: r for r in data["structure"]}
    assert list(rungs) == ["none", "async", "partial", "share"]
    assert [r["allowed"] for r in data["structure"]] == [True, True, True, False]
    steps = [r["step_s"] for r in data["structure"]]
    assert all(a >= b - 1e-9 for a, b in zip(steps, steps[1:])), steps  # each rung's space holds the one above
    # the plan taken is the best of the allowed rungs
    assert math.isclose(data["plans"][1]["step_s"], steps[2], rel_tol=1e-9)
    peer = data["plans"][0]["step_s"]
    for r in data["structure"]:
        assert math.isclose(r["speedup"], peer / r["step_s"], rel_tol=1e-9)
    assert rungs["share"]["this_change"] > 1.2  # what sharing adds here: the critic's passes go
    # the table says the same as the JSON
    rc, text, _ = run(capsys, "import", src, "--from", "verl", "--steps", 2, "--out", tmp_path / "b")
    assert "--allow-share" in text
    shown = _table_after(text, "what the speedup needs")
    assert [row[0] for row in shown] == [r["change"] for r in data["structure"]]
    assert [row[2] for row in shown] == [f"{r['step_s']:.1f}" for r in data["structure"]]
    assert [row[3] for row in shown] == [f"{r['speedup']:.2f}x" for r in data["structure"]]
    summary = _table_after(text, "plan ", skip=2)
    assert [row[1] for row in summary] == [f"{r['step_s']:.1f}" for r in data["plans"]]
    assert summary[1][-1] == f"{data['plans'][1]['speedup']:.2f}x"
    # allowed: the plan shares, and it is the last rung's
    rc, out, _ = run(capsys, "import", src, "--from", "verl", "--steps", 2, "--out", tmp_path / "c", "--json",
                     "--allow-share")
    shared = json.loads(out)
    assert "critic shared with the actor" in shared["rpeg_plan"]
    assert math.isclose(shared["plans"][1]["step_s"], steps[3], rel_tol=1e-9)


def test_import_without_partial_rollout_takes_the_async_rung(capsys, tmp_path):
    src = DATA / "verl" / "run_qwen2-7b_rm.sh"
    rc, out, _ = run(capsys, "import", src, "--from", "verl", "--steps", 2, "--out", tmp_path / "a", "--json",
                     "--no-partial-rollout", "--allow-share")
    data = json.loads(out)
    assert rc == 0 and "partial rollout" not in data["rpeg_plan"]
    assert [r["allowed"] for r in data["structure"]] == [True, True, False, True]
    # sharing without partial rollout is a search of its own: never slower than the async rung
    assert data["plans"][1]["step_s"] <= data["structure"][1]["step_s"] + 1e-9


def test_plan_keeps_the_critic_unless_sharing_is_allowed(capsys, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({**JOB, "algorithm": "ppo", "model": "qwen2.5-1.5B", "gpus": 8}))
    rc, out, _ = run(capsys, "plan", job, "--out", tmp_path / "p", "--steps", 1, "--json")
    assert rc == 0 and "critic shared" not in json.loads(out)["chosen"]["structure"]
    rc, out, _ = run(capsys, "plan", job, "--out", tmp_path / "q", "--steps", 1, "--json", "--allow-share")
    assert rc == 0 and "critic shared" in json.loads(out)["chosen"]["structure"]
