"""`rpeg plan`: the table of RPEG's plan beside the peers', the chosen plan, the files written,
JSON output, and what it says when nothing fits. GRPO on Qwen3-0.6B, one DGX H100 node."""

import contextlib
import io
import json

import pytest

from rpeg.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
JOB = ("algorithm: grpo\nmodel: {model}\n"
       "job: {{prompts: 16, samples_per_prompt: 4, prompt_len: 256, response: {{kind: fixed, mean: 512}}}}\n")


def job_file(tmp_path, model="qwen3-0.6B"):
    path = tmp_path / f"job-{model}.yaml"
    path.write_text(JOB.format(model=model))
    return str(path)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def table_run(tmp_path_factory):
    """One `rpeg plan` run with a table, shared by the tests that read it."""
    tmp = tmp_path_factory.mktemp("plan")
    out_dir = tmp / "out"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", job_file(tmp), "--cluster", "dgx-h100", "--gpus", "8", "--out", str(out_dir)])
    return code, out.getvalue(), err.getvalue(), out_dir


def test_plan_prints_the_table_of_plans(table_run):
    code, out, err, _ = table_run
    assert code == 0, err
    assert "plan grpo on qwen3-0.6B: dgx-h100, 8 x h100-sxm, objective time, max staleness 1" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in
            ("rpeg", "verl", "real", "areal", "openrlhf", "nemo-rl", "deepspeed-chat")}
    assert {"rpeg", "verl", "real"} <= set(rows)
    assert rows["rpeg"].rstrip().endswith("1.00x")
    for name in ("verl", "real"):  # the peers run no faster: their speedup column is RPEG's gain, >= 1
        speedup = float(rows[name].split()[-1].rstrip("x"))
        assert speedup >= 1.0
    assert "searched" in out and "candidates" in out


def test_plan_describes_the_chosen_plan(table_run):
    _, out, _, _ = table_run
    assert "\nthe chosen plan\n" in out
    chosen = out.split("the chosen plan", 1)[1]
    for key in ("structure:", "placement:", "layouts:", "generate:", "actor_update:", "async_bound:",
                "predicted_step_s:", "bottleneck:"):
        assert key in chosen


def test_plan_writes_the_trace_and_gantt_charts(table_run):
    _, out, _, out_dir = table_run
    trace = json.loads((out_dir / "plan-trace.json").read_text())
    assert trace["otherData"]["title"] == "rpeg plan" and trace["otherData"]["step_s"] > 0
    assert any(e["ph"] == "X" for e in trace["traceEvents"])
    for png in ("plan-gantt.png", "verl-gantt.png", "real-gantt.png"):
        assert (out_dir / png).read_bytes()[:8] == PNG
        assert str(out_dir / png) in out  # the "wrote ..." line names it


def test_plan_json_has_plans_chosen_and_search(capsys, tmp_path):
    code, out, err = run(capsys, "plan", job_file(tmp_path), "--cluster", "dgx-h100", "--gpus", "8",
                         "--out", str(tmp_path / "out"), "--json", "--steps", "4")
    assert code == 0, err
    data = json.loads(out)
    assert {"plans", "chosen", "search"} <= set(data)
    assert data["gpus"] == 8 and data["cluster"] == "dgx-h100" and data["objective"] == "time"
    plans = {p["plan"]: p for p in data["plans"]}
    assert data["plans"][0]["plan"] == "rpeg" and {"verl", "real"} <= set(plans)
    rpeg = plans["rpeg"]
    assert rpeg["step_s"] == pytest.approx(data["chosen"]["predicted_step_s"])
    assert 0 < rpeg["utilization"] <= 1 and 0 < rpeg["mfu"] <= 1
    assert rpeg["tokens_per_s"] == pytest.approx(16 * 4 * (256 + 512) / rpeg["step_s"])
    for p in data["plans"]:
        if p.get("step_s") is not None:
            assert p["step_s"] >= rpeg["step_s"] * (1 - 1e-9), p["plan"]
    assert data["search"]["candidates"] > 0 and data["search"]["layouts_costed"] > 0
    assert set(data["chosen"]) >= {"structure", "placement", "layouts", "fusion", "streams", "async_bound"}
    assert all(f.startswith(str(tmp_path / "out")) for f in data["files"])


def test_an_infeasible_job_exits_3(capsys, tmp_path):
    code, out, err = run(capsys, "plan", job_file(tmp_path, "llama-3.1-405B"), "--cluster", "dgx-h100",
                         "--gpus", "1", "--out", str(tmp_path / "out"))
    assert code == 3, err
    assert out.startswith("NO FEASIBLE PLAN: no plan of grpo with llama-3.1-405B fits 1 x h100-sxm")
    assert "nothing nearby fits either" in out
    assert not (tmp_path / "out").exists()


def test_an_infeasible_job_names_the_nearest_feasible_one(capsys, tmp_path):
    """Qwen3-32B does not fit one H100 but fits one node: the preset cluster has room for it."""
    code, out, err = run(capsys, "plan", job_file(tmp_path, "qwen3-32B"), "--cluster", "dgx-h100",
                         "--gpus", "1", "--out", str(tmp_path / "out"))
    assert code == 3, err
    assert "NO FEASIBLE PLAN" in out
    assert "nearest feasible: 8 GPUs instead of 1: rpeg:" in out


def test_a_negative_max_staleness_is_one_line_and_exit_2(capsys, tmp_path):
    code, out, err = run(capsys, "plan", job_file(tmp_path), "--max-staleness", "-1", "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--max-staleness must be >= 0, got -1" in err and "Traceback" not in err
