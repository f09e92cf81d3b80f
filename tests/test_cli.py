"""The `rpeg` command: output, files written, and one-line errors with exit code 2."""

import json
import pathlib
import subprocess
import sys

import pytest

from rpeg.cli import main

DEMO = str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "demo-grpo-tiny.yaml")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_prints_stages_fields_and_writes_dot_and_png(capsys, tmp_path):
    code, out, err = run(capsys, "show", "grpo", "--model", "qwen3-32B", "--out", str(tmp_path))
    assert code == 0, err
    for word in ("generate", "actor_update", "ref_logprobs", "response_ids", "per step", "32.76B"):
        assert word in out
    dot = (tmp_path / "grpo.dot").read_text()
    assert dot.startswith('digraph "grpo"') and '"generate" -> "reward"' in dot
    assert (tmp_path / "grpo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_analyze_prints_work_depth_table(capsys):
    code, out, _ = run(capsys, "analyze", "ppo", "--model", "llama-3.1-8B")
    assert code == 0
    assert "depth D" in out and "critic_update" in out and "critical path" in out
    assert "asynchrony" in out


def test_analyze_json_is_machine_readable(capsys):
    code, out, _ = run(capsys, "analyze", "grpo", "--model", "tiny-qwen2", "--json", "--steps", "4")
    data = json.loads(out)
    assert code == 0
    assert {s["stage"] for s in data["stages"]} >= {"generate", "actor_update"}
    assert data["total"]["flops"] == pytest.approx(sum(s["flops"] for s in data["stages"]))
    assert [r["k"] for r in data["async"]] == [0, 1, 2, 4]


def test_job_file_and_passes(capsys, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("algorithm: ppo\nmodel: qwen2.5-7B\njob: {prompts: 16, samples_per_prompt: 2, mini_batches: 2}\n"
                   "passes:\n  - share_actor_critic\n  - bound_asynchrony: {k: 2}\n")
    code, out, err = run(capsys, "show", str(job), "--out", str(tmp_path))
    assert code == 0, err
    assert "share_actor_critic()" in out and "async bound k = 2" in out and "v(t-2)" in out
    assert "critic_values" not in out


@pytest.mark.parametrize("argv, needle", [
    (["show", "nope", "--model", "qwen3-8B"], "unknown algorithm 'nope'"),
    (["show", "grpo", "--model", "qwen9"], "unknown model 'qwen9'"),
    (["show", "grpo", "--model", "qwen3-8B", "-n", "1"], "samples_per_prompt >= 2"),
    (["show", "grpo", "--model", "qwen3-8B", "--prompts", "x"], "invalid int value"),
    (["analyze", "grpo"], "--model is required"),
    (["show", "grpo", "--model", "qwen3-8B", "--share"], "has no critic"),
    (["show", "ppo", "--model", "qwen3-8B", "--async", "-1"], "k must be"),
    (["show", "reinforce_pp", "--model", "qwen3-8B", "--stream", "1"], "microbatches must be"),
    (["frobnicate"], "invalid choice"),
    (["train", DEMO, "--steps", "0"], "steps = 0 must be positive"),
    (["train", DEMO, "--threads", "-1"], "threads = -1 must be >= 0"),
    (["model", "convert", "nope.gguf", "--out", "x"], "no such GGUF file: nope.gguf"),
    (["model", "convert", "smollm2"], "--out"),
    (["model"], "model_command"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_job_files(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: grpo\nmodel: [1,\n")
    code, _, err = run(capsys, "show", str(bad))
    assert code == 2 and "malformed YAML" in err and "bad.yaml:3" in err
    bad.write_text("algorithm: grpo\nmodel: qwen3-8B\njob: {prompts: lots}\n")
    code, _, err = run(capsys, "show", str(bad))
    assert code == 2 and "job.prompts: expected an integer" in err
    bad.write_text("algorithm: grpo\nmodel: qwen3-8B\npasses: [{parallelize: {stage: generate, tp: 3}}]\n")
    code, _, err = run(capsys, "show", str(bad))
    assert code == 2 and "tp = 3 does not divide the 32 attention heads" in err
    code, _, err = run(capsys, "show", str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read" in err
    bad.write_text("algorithm: grpo\nmodel: tiny-qwen2\nruntime: {steps: 0}\n")
    code, _, err = run(capsys, "train", str(bad))
    assert code == 2 and err == "rpeg: error: runtime: steps = 0 must be positive\n"  # the place named once


def test_listings(capsys):
    assert run(capsys, "models")[1].count("deepseek-v3") == 1
    out = run(capsys, "algorithms")[1]
    assert all(a in out for a in ("ppo", "grpo", "rloo", "reinforce_pp", "remax", "dapo", "dr_grpo"))
    assert "parallelize" in run(capsys, "passes")[1]


def test_console_entry_point_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "rpeg", "show", "grpo", "--model", "nope"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("rpeg: error: unknown model")


def test_loss_options_in_a_job_file_are_shown_and_bad_ones_refused(capsys, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("algorithm: grpo\nmodel: tiny-qwen2\n"
                   "config: {off_policy: mask-token, is_low: 0.4, policy_loss: gspo, dual_clip: 0}\n")
    code, out, err = run(capsys, "show", str(job), "--out", str(tmp_path))
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("config:"))
    assert line.endswith("gspo ratio, no dual-clip, off-policy mask-token [0.4, 2]"), line
    job.write_text("algorithm: grpo\nmodel: tiny-qwen2\nconfig: {off_policy: tis3}\n")
    code, _, err = run(capsys, "show", str(job), "--out", str(tmp_path))
    assert code == 2 and "off_policy: 'tis3' is not one of 'none', 'tis'" in err and len(err.strip().splitlines()) == 1


def test_algorithms_lists_every_config_option(capsys):
    from dataclasses import fields

    from rpeg.graph.config import AlgoConfig

    code, out, _ = run(capsys, "algorithms")
    assert code == 0
    for f in fields(AlgoConfig):
        assert any(line.startswith(f.name + " ") for line in out.splitlines()), f.name
    assert "none, tis, tis-seq, mask-token, mask-seq, decoupled" in out


# ---- issue 23, item 4: names and numbers a job file or a flag gets wrong ------------------------
JOB = "algorithm: ppo\nmodel: tiny-qwen2\njob: {prompts: 8, samples_per_prompt: 2}\n"
TINY = "{layers: 2, hidden: 64, heads: 4, kv_heads: 4, ffn: 128, vocab: 100"


@pytest.mark.parametrize("text, needle", [
    # a preset that is not a string: an AttributeError traceback before
    *[(f"algorithm: ppo\njob: {{prompts: 8, samples_per_prompt: 2}}\nmodel: {{preset: {v}}}\n",
       f"model.preset: expected a model: a preset, a catalogue id, a config.json or a model folder (see `rpeg models "
       f"--all`), a string, got {shown}")
      for v, shown in (("3", "3"), ("null", "None"), ("[a]", "['a']"), ("{a: 1}", "{'a': 1}"), ("true", "True"))],
    *[(JOB + f"{role}: {{preset: 3}}\n", f"{role}.preset: expected a model: a preset") for role in
      ("critic", "reference", "reward")],
    (JOB + "critic: {preset: ''}\n", "critic.preset: an empty name"),
    # an empty name silently meant the default before
    (JOB + "cluster: ''\n", "cluster: an empty name; expected a cluster preset"),
    (JOB + "cluster: '  '\n", "cluster: an empty name"),
    (JOB + "critic: ''\n", "critic: an empty name; expected a model: a preset"),
    (JOB + "reference: ''\n", "reference: an empty name"),
    (JOB.replace("algorithm: ppo", "algorithm: ''"), "algorithm: an empty name"),
    (JOB.replace("algorithm: ppo", "algorithm: [ppo]"), "algorithm: expected an algorithm"),
    (JOB.replace("model: tiny-qwen2", f"model: {TINY}, name: ''}}"), "model: name = '': a model needs a name"),
    (JOB + "passes: [{place: {groups: {'': 1}, default: ''}}]\n", "device group '': a group needs a name"),
    (JOB + "config: {3: 1}\n", "config: option 3 is not a name"),
    # numbers out of range, accepted before
    (JOB.replace("job: {", "job: {response: {kind: lognormal, mean: 1.0e-300, max: 100}, "),
     "lognormal mean = 1e-300 must be at least 1 token"),
    (JOB.replace("job: {", "job: {response: {kind: fixed, mean: 0.5}, "), "fixed mean = 0.5 must be at least 1 token"),
    (JOB.replace("job: {", "job: {response: {kind: lognormal, mean: 100, max: 1000, sigma: 99}, "),
     "sigma = 99 exceeds 10.0"),  # an OverflowError traceback before
    (JOB.replace("job: {", "job: {response: {kind: lognormal, mean: 100, max: 1000, sigma: 1.0e-300}, "),
     "sigma = 1e-300 must be at least 0.01"),
    (JOB.replace("model: tiny-qwen2", f"model: {TINY}, position_embeddings: -5}}"), "position_embeddings = -5 must be >= 0"),
    (JOB.replace("model: tiny-qwen2", f"model: {TINY}, position_embeddings: 1000000000000}}"),
     "position_embeddings = 1,000,000,000,000 exceeds 16,777,216"),
    (JOB.replace("prompts: 8, samples_per_prompt: 2", "prompts: 10000000, samples_per_prompt: 100, mini_batches: 4")
     + "passes: [{stream: {microbatches: 1000000000}}]\n", "microbatches = 1,000,000,000 exceeds 65,536"),
    (JOB.replace("prompts: 8, samples_per_prompt: 2", "prompts: 1000000, samples_per_prompt: 1000, "
                 "mini_batches: 1000000000"), "mini_batches = 1,000,000,000 exceeds 1,048,576"),
    (JOB + "passes: [{bound_asynchrony: {k: 1000000000}}]\n", "k = 1,000,000,000 exceeds 64"),
    (JOB + "passes: [{place: {groups: {g: [1000000000000, 1]}, default: g}}]\n", "go past 1,000,000"),
])
def test_bad_job_files_are_one_line_and_exit_2(capsys, tmp_path, text, needle):
    job = tmp_path / "job.yaml"
    job.write_text(text)
    code, _, err = run(capsys, "predict", str(job))
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("rpeg: error: ") and needle in err, err


@pytest.mark.parametrize("argv, needle", [
    (["predict", "grpo", "--model", "tiny-qwen2", "--cluster", ""], "argument --cluster: an empty name"),
    (["plan", "grpo", "--model", "tiny-qwen2", "--cluster", " "], "argument --cluster: an empty name"),
    (["show", "grpo", "--model", ""], "argument --model: an empty name"),
    (["show", "ppo", "--model", "tiny-qwen2", "--critic", ""], "argument --critic: an empty name"),
    (["show", "ppo", "--model", "tiny-qwen2", "--reference", ""], "argument --reference: an empty name"),
    (["show", "ppo", "--model", "tiny-qwen2", "--reward", ""], "argument --reward: an empty name"),
    (["show", "grpo", "--model", "tiny-qwen2", "--out", ""], "argument --out: an empty name"),
    (["import", "x.sh", "--from", "verl", "--cluster", ""], "argument --cluster: an empty name"),
    (["import", "x.sh", "--from", "verl", "--model", ""], "argument --model: an empty name"),
    (["export", "x.yaml", "--to", "verl", "--cluster", ""], "argument --cluster: an empty name"),
    (["export", "x.yaml", "--to", "verl", "--out", ""], "argument --out: an empty name"),
    (["calibrate", "--out", ""], "argument --out: an empty name"),
    (["train", DEMO, "--out", ""], "argument --out: an empty name"),
    (["train", DEMO, "--address", ""], "argument --address: an empty name"),
    (["model", "convert", "", "--out", "x"], "argument GGUF: an empty name"),
    (["model", "convert", "smollm2", "--out", ""], "argument --out: an empty name"),
    (["show", "grpo", "--model", "tiny-qwen2", "--stream", "1000000000"], "microbatches = 1,000,000,000 exceeds 65,536"),
    (["predict", "grpo", "--model", "tiny-qwen2", "--response-len", "1e-300"], "--response-len: 1e-300 must be in [1,"),
])
def test_empty_names_and_absurd_counts_on_the_command_line(capsys, argv, needle):
    code, _, err = run(capsys, *argv)
    assert code == 2, err
    assert err.count("\n") == 1 and needle in err, err


@pytest.mark.parametrize("runtime, needle", [
    ("lr: .nan", "runtime: lr = nan must be a finite number"),
    ("lr: 1.0e-300", "lr = 1e-300 must be >= 1e-12"),
    ("lr: 10", "lr = 10 exceeds 1.0"),
    ("temperature: 0", "temperature = 0 must be >= 0.01"),
    ("temperature: 1.0e+300", "temperature = 1e+300 exceeds 100.0"),
    ("grad_clip: -1", "grad_clip = -1 must be >= 1e-06"),
    ("engine_memory: 1.0e-300", "engine_memory = 1e-300 must be >= 0.01"),
    ("steps: 1000000000000", "steps = 1,000,000,000,000 exceeds 1,000,000"),
    ("max_new_tokens: 1000000000000", "max_new_tokens = 1,000,000,000,000 exceeds 16,777,216"),
    ("micro_batch: 1000000000000", "micro_batch = 1,000,000,000,000 exceeds 65,536"),
    ("keep_checkpoints: -1", "keep_checkpoints = -1 must be >= 0"),
    ("seed: -5", "seed = -5 must be >= 0"),
    ("threads: 1000000000000", "threads = 1,000,000,000,000 exceeds 4,096"),
    ("out: ''", "runtime: out = '': an empty name"),
    ("model_path: ''", "runtime: model_path = '': an empty name"),
    ("task: {name: [a]}", "unknown task ['a']"),  # a TypeError traceback before
])
def test_bad_runtime_sections_are_one_line_before_any_work(capsys, tmp_path, runtime, needle):
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("ppo", "grpo") + f"runtime: {{{runtime}}}\n")
    code, _, err = run(capsys, "train", str(job))
    assert code == 2, err
    assert err.count("\n") == 1 and needle in err, err
