"""`--model` and job files take a preset, a catalogue id, a config.json or a model folder: every planning
command, `rpeg import` of a peer script naming a local folder, and `rpeg models --all`."""

import json
import pathlib

import pytest

from rpeg.cli import main
from rpeg.graph.catalogue import catalogue
from rpeg.graph.serde import read_yaml_file

PEERS = pathlib.Path(__file__).resolve().parent / "data" / "peers"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def folder(tmp_path):
    """A model folder holding Qwen3-4B's config.json (no weights: planning needs none)."""
    path = tmp_path / "models" / "my-qwen3"
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(catalogue()["Qwen/Qwen3-4B"].config))
    return path


def test_models_lists_presets_and_points_at_the_catalogue(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0 and "qwen3-8B" in out and "rpeg models --all" in out and "openai/gpt-oss-20b" not in out
    code, out, _ = run(capsys, "models", "--all")
    assert code == 0 and "openai/gpt-oss-20b" in out and "20.91B" in out and "Qwen/Qwen1.5-MoE-A2.7B" in out


@pytest.mark.parametrize("how", ["folder", "file"])
def test_show_and_analyze_take_a_config_or_a_folder(capsys, tmp_path, folder, how):
    ref = folder if how == "folder" else folder / "config.json"
    code, out, err = run(capsys, "show", "grpo", "--model", ref, "--out", tmp_path / "o")
    assert code == 0, err
    assert f"grpo on {folder} (4.02B params)" in out
    code, out, err = run(capsys, "analyze", "ppo", "--model", ref, "--critic", "Qwen/Qwen2.5-3B-Instruct")
    assert code == 0 and "critical path" in out, err


def test_predict_and_plan_take_a_folder_and_the_plan_loads_back_from_anywhere(capsys, tmp_path, folder,
                                                                                  monkeypatch):
    code, out, err = run(capsys, "predict", "grpo", "--model", folder, "--gpus", 8)
    assert code == 0 and "step time" in out, err
    code, out, err = run(capsys, "plan", "grpo", "--model", folder, "--gpus", 8, "--out", tmp_path / "p")
    assert code == 0, err
    plan = tmp_path / "p" / "rpeg-plan.yaml"
    assert read_yaml_file(str(plan))["model"] == str(folder)
    monkeypatch.chdir("/")
    code, out, err = run(capsys, "predict", plan, "--json")
    assert code == 0, err


def test_a_job_file_names_a_folder_relative_to_itself(capsys, tmp_path, folder):
    job = tmp_path / "models" / "job.yaml"
    job.write_text("algorithm: grpo\nmodel: my-qwen3\ngpus: 8\n")
    code, out, err = run(capsys, "show", job, "--out", tmp_path / "o")
    assert code == 0 and f"grpo on {folder}" in out, err


def test_import_reads_a_peer_script_naming_a_local_folder_or_a_catalogue_id(capsys, tmp_path, folder):
    text = (PEERS / "verl" / "run_qwen2-7b_math.sh").read_text()
    assert "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct" in text
    local = tmp_path / "local.sh"
    local.write_text(text.replace("model.path=Qwen/Qwen2-7B-Instruct", f"model.path={folder}"))
    code, out, err = run(capsys, "import", local, "--from", "verl", "--out", tmp_path / "o", "--steps", 2)
    assert code == 0 and f"grpo on {folder}" in out, err
    assert read_yaml_file(str(tmp_path / "o" / "verl-job.yaml"))["model"] == str(folder)
    assert str(folder) in (tmp_path / "o" / "rpeg-plan-verl.sh").read_text()  # the export names the folder
    hub = tmp_path / "hub.sh"
    hub.write_text(text.replace("model.path=Qwen/Qwen2-7B-Instruct", "model.path=Qwen/Qwen2.5-3B-Instruct"))
    code, out, err = run(capsys, "import", hub, "--from", "verl", "--out", tmp_path / "o2", "--steps", 2)
    assert code == 0 and "grpo on Qwen/Qwen2.5-3B-Instruct" in out, err


def test_an_unknown_model_is_one_line(capsys):
    code, _, err = run(capsys, "show", "grpo", "--model", "no-such-model-3B")
    assert code == 2 and "unknown model 'no-such-model-3B'" in err and err.count("\n") == 1


def test_train_defaults_model_path_to_a_job_model_folder(tmp_path, monkeypatch):
    """The resolution only (no run): `rpeg train` reads runtime.model_path from `model:` when it is a folder."""
    seen = {}

    def fake_run(graph, rt, **kw):
        seen["model_path"] = rt.model_path
        raise SystemExit(0)

    monkeypatch.setattr("rpeg.runtime.run.run", fake_run)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(catalogue()["Qwen/Qwen2.5-0.5B-Instruct"].config))
    job = tmp_path / "job.yaml"
    job.write_text(f"algorithm: grpo\nmodel: {folder}\ngpus: 1\ncluster: dgx-h100\nruntime: {{steps: 1, out: "
                   f"{tmp_path / 'out'}}}\n")
    with pytest.raises(SystemExit):
        main(["train", str(job), "--no-progress"])
    assert seen["model_path"] == str(folder)
    job.write_text(job.read_text().replace("steps: 1", "steps: 1, model_path: tiny"))
    with pytest.raises(SystemExit):
        main(["train", str(job), "--no-progress"])
    assert seen["model_path"] == "tiny"  # an explicit runtime.model_path wins
