"""scripts/demo_figures.py: the README table from run summaries, and the CI learning check."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "demo_figures.py")
spec = importlib.util.spec_from_file_location("demo_figures", SCRIPT)
df = importlib.util.module_from_spec(spec)
spec.loader.exec_module(df)


def summary(tmp_path, name, before, after, **extra):
    run = tmp_path / name
    run.mkdir()
    data = {"accuracy_before": {"sampled": before, "greedy": 0.5}, "accuracy_after": {"sampled": after, "greedy": 0.6},
            "eval_size": 1000, "mean_step_s": 0.31, "steps": 400, "seed": 0, "threads": 2, "wall_s": 215.0,
            "warmup": {"steps": 440, "dev_accuracy": 0.328, "target": 0.25, "reached": True}} | extra
    (run / "summary.json").write_text(json.dumps(data))
    return str(run)


def test_gain_and_standard_error():
    g, se = df.gain({"accuracy_before": {"sampled": 0.3}, "accuracy_after": {"sampled": 0.6}, "eval_size": 1000})
    assert g == pytest.approx(0.3)
    assert se == pytest.approx(((0.3 * 0.7 + 0.6 * 0.4) / 1000) ** 0.5)


def test_table_rows_and_summary_line(tmp_path):
    runs = [summary(tmp_path, "a", 0.30, 0.62), summary(tmp_path, "b", 0.28, 0.55, seed=1, threads=1)]
    text = df.table([df.load(r) for r in runs])
    assert "| 0 | 2 | 440 | 0.328 | 0.300 -> 0.620 | +0.320 (" in text
    assert "| 1 | 1 | 440 |" in text and "3 min 35 s" in text
    se = (0.3 * 0.7 + 0.62 * 0.38 + 0.28 * 0.72 + 0.55 * 0.45) ** 0.5 / 1000 ** 0.5 / 2  # of the mean of two runs
    assert f"rose in 2 of 2 runs, by +0.270 to +0.320 (mean +0.295, {0.295 / se:.1f} standard errors of the mean " \
        f"({se:.3f}))" in text


def test_the_predicted_step_time_stands_beside_the_measured_one(tmp_path):
    runs = [summary(tmp_path, "a", 0.30, 0.62, predicted_step_s=0.25), summary(tmp_path, "b", 0.28, 0.55, seed=1,
                                                                               predicted_step_s=0.25)]
    text = df.table([df.load(r) for r in runs])
    assert "s per RL step (predicted) | wall |" in text and "| 0.31 (0.25) | 3 min 35 s |" in text
    assert "(predicted)" not in df.table([df.load(summary(tmp_path, "c", 0.3, 0.6))])


def test_write_replaces_only_the_block(tmp_path):
    doc = tmp_path / "README.md"
    start, end = df.markers("demo-figures")
    doc.write_text(f"intro\n{start}\nold figures\n{end}\nrest\n")
    assert df.main(["table", summary(tmp_path, "a", 0.3, 0.6), "--write", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith(f"intro\n{start}\n| seed |") and text.endswith(f"{end}\nrest\n")
    assert "old figures" not in text


def test_write_needs_one_block(tmp_path, capsys):
    doc = tmp_path / "README.md"
    doc.write_text("no block here\n")
    assert df.main(["table", summary(tmp_path, "a", 0.3, 0.6), "--write", str(doc)]) == 2
    assert "needs exactly one" in capsys.readouterr().err


def test_check_passes_a_clear_gain_and_fails_a_small_one(tmp_path, capsys):
    assert df.main(["check", summary(tmp_path, "a", 0.30, 0.60), "--min-gain", "0.15", "--min-z", "6"]) == 0
    assert df.main(["check", summary(tmp_path, "b", 0.30, 0.35), "--min-gain", "0.15", "--min-z", "6"]) == 1
    out = capsys.readouterr().out
    assert "rose by +0.050, less than 0.15" in out and "fewer than 6" in out


def test_a_folder_without_a_summary_is_one_line(tmp_path, capsys):
    assert df.main(["check", str(tmp_path), "--min-gain", "0.1"]) == 2
    assert "cannot read a run summary" in capsys.readouterr().err


def agent(tmp_path, name, calls_before, calls_after):
    run = summary(tmp_path, name, 0.06, 0.73)
    data = json.loads(open(os.path.join(run, "summary.json")).read())
    data["accuracy_before"]["sampled_tool_calls"] = calls_before
    data["accuracy_after"]["sampled_tool_calls"] = calls_after
    open(os.path.join(run, "summary.json"), "w").write(json.dumps(data))
    return run


def test_an_agent_run_gets_its_tool_calls_in_the_table_and_the_check(tmp_path, capsys):
    run = agent(tmp_path, "a", 0.136, 0.972)
    assert "| 0.136 -> 0.972 | 0.31 |" in df.table([df.load(run)])
    doc = tmp_path / "agents.md"
    start, end = df.markers("agent-figures")
    doc.write_text(f"{start}\n{end}\n")
    assert df.main(["table", run, "--block", "agent-figures", "--write", str(doc)]) == 0
    assert "tool calls per episode" in doc.read_text()
    assert df.main(["check", run, "--min-gain", "0.3", "--min-tool-gain", "0.5"]) == 0
    assert df.main(["check", agent(tmp_path, "b", 0.5, 0.6), "--min-gain", "0.3", "--min-tool-gain", "0.5"]) == 1
    assert df.main(["check", summary(tmp_path, "c", 0.1, 0.6), "--min-gain", "0.3", "--min-tool-gain", "0.5"]) == 1
    out = capsys.readouterr().out
    assert "rose by +0.100, less than 0.5" in out and "ran no environment" in out
