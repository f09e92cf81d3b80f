"""The catalogue of published models, and naming a model every way `get_model` takes: preset, catalogue
id (with or without the organisation, any case), the last part of a path, a config.json, a model folder."""

from __future__ import annotations

import json
import os

import pytest

from rpeg.errors import RpegError
from rpeg.graph import get_model
from rpeg.graph.catalogue import catalogue, resolve_model
from rpeg.graph.presets import _PRESETS

ENTRIES = list(catalogue().values())


def test_the_catalogue_is_large_enough_and_every_entry_is_sourced():
    ids = {i.lower() for e in ENTRIES for i in (e.id, *e.aliases)}
    assert len(ENTRIES) >= 50 and len(ids) >= 60
    assert len(ids) == sum(1 + len(e.aliases) for e in ENTRIES), "an id is listed twice"
    for e in ENTRIES:
        assert e.config_source.startswith("https://") and e.config_source.endswith("config.json"), e.id
        assert e.params_source.strip(), e.id


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_every_entry_counts_within_one_percent_of_its_published_figure(entry):
    total = entry.spec().params_total()
    assert total == pytest.approx(entry.params, rel=0.01), f"{entry.id}: {total / 1e9:.3f}B vs {entry.params_source}"


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.preset], ids=[e.id for e in ENTRIES if e.preset])
def test_an_entry_with_a_preset_reads_to_that_preset(entry):
    preset = _PRESETS[entry.preset.lower()]()
    assert entry.spec().replace(name=preset.name) == preset
    assert get_model(entry.id) == preset


def test_a_catalogue_model_resolves_with_or_without_its_organisation_in_any_case():
    a = get_model("Qwen/Qwen2.5-3B-Instruct")
    assert a.name == "Qwen/Qwen2.5-3B-Instruct" and round(a.params_total() / 1e9, 2) == 3.09
    assert get_model("qwen2.5-3b-instruct") == a
    assert get_model("/ckpt/Qwen2.5-3B-Instruct") == a  # a path on a peer's cluster: its last part
    assert get_model("~/models/Qwen2.5-3B-Instruct/") == a
    base = get_model("Qwen/Qwen2.5-3B")  # an alias keeps its own spelling, so it names itself again
    assert base.name == "Qwen/Qwen2.5-3B" and base.replace(name=a.name) == a
    assert get_model(base.name) == base


@pytest.mark.parametrize("ref, name", [
    ("deepseek-ai/deepseek-llm-7b-chat", "deepseek-ai/deepseek-llm-7b-chat"),
    ("Qwen/Qwen1.5-MoE-A2.7B", "Qwen/Qwen1.5-MoE-A2.7B"),
    ("openai/gpt-oss-20b", "openai/gpt-oss-20b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "qwen2.5-7B"),
    ("/data/DeepSeek-R1", "deepseek-v3"),
    ("Qwen2.5-Math-7B", "qwen2.5-7B"),
    ("sfairXC/FsfairX-LLaMA3-RM-v0.1", "llama-3.1-8B"),  # a naming variant: a reward model on Llama-3-8B
    ("QWEN3-8b", "qwen3-8B"),
])
def test_names_peers_write_resolve(ref, name):
    assert get_model(ref).name == name


def _write(folder, config):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "config.json")
    with open(path, "w") as fh:
        json.dump(config, fh)
    return path


def test_a_config_file_and_its_folder_name_the_same_model_by_absolute_path(tmp_path, monkeypatch):
    cfg = dict(catalogue()["Qwen/Qwen3-8B"].config)
    path = _write(tmp_path / "my-finetune", cfg)
    folder = get_model(str(tmp_path / "my-finetune"))
    assert folder.name == str(tmp_path / "my-finetune")
    assert folder.replace(name="qwen3-8B") == get_model("qwen3-8B")
    assert get_model(path) == folder
    monkeypatch.chdir(tmp_path)
    assert get_model("my-finetune") == folder  # relative to the working directory
    monkeypatch.chdir("/")
    assert get_model(folder.name) == folder  # the name it writes loads from anywhere


def test_a_local_folder_wins_over_the_catalogue_entry_its_name_matches(tmp_path):
    cfg = {**catalogue()["Qwen/Qwen2.5-3B-Instruct"].config, "num_hidden_layers": 6}
    _write(tmp_path / "Qwen2.5-3B-Instruct", cfg)
    assert get_model(str(tmp_path / "Qwen2.5-3B-Instruct")).layers == 6


def test_unknown_names_and_folders_without_a_config_are_one_line_errors(tmp_path):
    with pytest.raises(RpegError, match="unknown model 'no-such-model-9B'.*rpeg models --all"):
        get_model("no-such-model-9B")
    with pytest.raises(RpegError, match="no config.json there"):
        get_model(str(tmp_path))
    with pytest.raises(RpegError, match="nope.json': no such file"):
        get_model(str(tmp_path / "nope.json"))
    assert resolve_model("qwen3-8B").kind == "preset"


@pytest.mark.parametrize("ref, name", [
    ("~/models/gpt-oss-20b-bf16", "openai/gpt-oss-20b"),
    ("~/verl/models/DeepSeek-V3-config-verl", "deepseek-v3"),
    ("/ckpt/Qwen3-8B-sft-step200", "qwen3-8B"),
    ("/ckpt/Qwen2.5-72B-Instruct-AWQ", "qwen2.5-72B"),  # the longest id that begins the name
])
def test_a_name_that_starts_with_a_catalogue_id_reads_as_it_and_says_so(ref, name):
    r = resolve_model(ref)
    assert r.spec.name == name
    assert len(r.notes) == 1 and "the name starts with that id" in r.notes[0]


def test_a_prefix_must_end_at_a_separator():
    """`Qwen2.5-7B` does not begin `Qwen2.5-72B-Foo`; a name that only shares letters is not read."""
    assert resolve_model("/x/Qwen2.5-72B-Foo").spec.name == "qwen2.5-72B"
    with pytest.raises(RpegError):
        resolve_model("/x/Qwen2.5-7Bx")
