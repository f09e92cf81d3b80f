"""The performance model against published measurements (rpeg/data/validation/published.yaml),
with the issue's tolerances, acceptance of every field of that file's schema, and the shipped
validation files themselves: each has its sources, `rpeg validate NAME` finds it, and nothing in
the repository reaches outside it for data."""

import json
import math
import pathlib

import pytest

from rpeg.cli import main
from rpeg.errors import RpegError
from rpeg.perf.validation import BUNDLED_DIR, bundled, summary, validate_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
PUBLISHED = bundled()["published"]
EXTRA = bundled()["nemo-rl-v0.5-extra"]


@pytest.fixture(scope="module")
def published():
    return validate_file(str(PUBLISHED))


def test_training_entries_within_tolerance(published):
    training = [r for r in published if r.kind == "training"]
    assert len(training) == 8
    assert summary(training)["training"] <= 0.10, [(r.id, round(r.error, 3)) for r in training]
    assert max(abs(r.error) for r in training) <= 0.20


def test_rl_entries_within_tolerance(published):
    rl = [r for r in published if r.kind == "rl"]
    assert len(rl) == 3
    assert summary(rl)["rl"] <= 0.20, [(r.id, round(r.error, 3)) for r in rl]
    assert max(abs(r.error) for r in rl) <= 0.30


def test_breakdowns_add_up(published):
    for r in published:
        assert r.parts and all(v >= 0 for _, v in r.parts)
        if r.kind == "training":
            assert sum(v for _, v in r.parts) == pytest.approx(r.predicted, rel=1e-6)


def test_validate_json_format(capsys):
    code = main(["validate", str(EXTRA), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(data) >= {"entries", "mape"}
    for e in data["entries"]:
        assert {"id", "predicted", "measured", "error"} <= set(e)
        assert e["error"] == pytest.approx((e["predicted"] - e["measured"]) / e["measured"])
    assert data["mape"] == pytest.approx(sum(abs(e["error"]) for e in data["entries"]) / len(data["entries"]))


def test_held_out_rows_all_predict():
    """MoE, MLA, GB200 and 1-step-off rows that were not used to choose any factor: every one
    predicts a finite positive time (their errors are reported in docs/perf.md, not asserted)."""
    results = validate_file(str(EXTRA))
    assert len(results) == 10
    assert all(math.isfinite(r.predicted) and r.predicted > 0 for r in results)


SCHEMA = """
models:
  moe-mla:  {layers: 8, hidden: 1024, heads: 16, kv_heads: 16, head_dim: 64, ffn: 2816, vocab: 32000, ffn_act: swiglu,
             experts: 16, experts_per_token: 2, moe_ffn: 512, shared_experts: 1, dense_layers: 1,
             attention: mla, kv_lora_rank: 128, q_lora_rank: 256, rope_head_dim: 32}
  gpt-small: {layers: 8, hidden: 1024, heads: 16, kv_heads: 16, ffn: 4096, vocab: 51200, ffn_act: gelu}
training:
  - {id: t-a100, system: dgx-a100-80gb, model: gpt-small, gpus: 16, tp: 2, pp: 2, dp: 4, global_batch: 64,
     micro_batch: 2, seq: 2048, recompute: selective, pp_interleave: 2, measured_iteration_s: 1.0}
  - {id: t-h200-moe, system: dgx-h200, model: moe-mla, gpus: 16, tp: 1, pp: 2, dp: 4, cp: 2, ep: 4,
     global_batch: 32, micro_batch: 1, seq: 4096, recompute: full, pp_interleave: 1, measured_iteration_s: 1.0}
rl:
  - {id: r-gb200, system: gb200-nvl72, model: moe-mla, gpus: 8, gpus_per_node: 4, prompts: 8, samples_per_prompt: 8,
     train_global_batch: 32, max_seq_len: 2048, mean_seq_len: 900, async_bound: 0, colocated: true,
     generation: {tp: 2, pp: 1, ep: 2}, training: {tp: 2, cp: 1, pp: 1, ep: 2, sequence_parallel: true, recompute: full},
     measured: {step_s: 10, tokens_per_s_per_gpu: 100}}
  - {id: r-alps, system: alps-gh200, model: llama-3.1-8B, gpus: 16, gpus_per_node: 4, gen_gpus: 8, prompts: 16,
     samples_per_prompt: 8, train_global_batch: 64, max_seq_len: 4096, mean_seq_len: 1500, async_bound: 1,
     colocated: false, generation: {tp: 1, pp: 1}, training: {tp: 2, cp: 2, pp: 1, recompute: selective},
     measured: {step_s: 30, tokens_per_s_per_gpu: 100}}
  - {id: r-h20, system: h20, model: qwen3-8B, gpus: 8, gpus_per_node: 8, prompts: 16, samples_per_prompt: 8,
     train_global_batch: 128, max_seq_len: 4096, mean_seq_len: 2000, async_bound: 0, colocated: true,
     generation: {tp: 1, pp: 1, async_engine: true}, training: {tp: 1, cp: 1, pp: 2, recompute: full},
     measured: {step_s: 30, tokens_per_s_per_gpu: 100}}
"""


def test_every_schema_field_and_system_is_accepted(tmp_path):
    f = tmp_path / "schema.yaml"
    f.write_text(SCHEMA)
    results = validate_file(str(f))
    assert [r.id for r in results] == ["t-a100", "t-h200-moe", "r-gb200", "r-alps", "r-h20"]
    assert all(math.isfinite(r.predicted) and r.predicted > 0 for r in results)


@pytest.mark.parametrize("edit, needle", [
    (("tp: 2, pp: 2, dp: 4", "tp: 2, pp: 2, dp: 3"), "tp*pp*dp*cp = 2*2*3*1 = 12 != gpus = 16"),
    (("system: dgx-a100-80gb", "system: dgx-z9000"), "dgx-z9000"),
    (("model: gpt-small", "model: gpt-huge"), "unknown model 'gpt-huge'"),
    (("seq: 2048,", "seq: long,"), "t-a100"),
    (("ffn_act: gelu}", "ffn_act: relu}"), "models.gpt-small"),
    (("async_engine: true}", "async_engine: maybe}"), "(r-h20).generation.async_engine: expected true or false"),
    (("async_engine: true}", "async_engine: true, max_num_seqs: -4}"),
     "(r-h20).generation.max_num_seqs: expected a whole number >= 1"),
    (("async_bound: 1,", "async_bound: 1, in_flight_weight_updates: 2,"),
     "(r-alps).in_flight_weight_updates: expected true or false"),
    (("async_bound: 0, colocated: true,\n     generation: {tp: 1, pp: 1, async_engine",
      "async_bound: 0, in_flight_weight_updates: true, colocated: true,\n     generation: {tp: 1, pp: 1, async_engine"),
     "(r-h20).in_flight_weight_updates: true needs async_bound >= 1"),
])
def test_bad_entries_name_the_entry_and_problem(tmp_path, edit, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(SCHEMA.replace(*edit))
    with pytest.raises(RpegError, match=None) as info:
        validate_file(str(f))
    assert needle in str(info.value)


def test_the_engine_processes_its_outputs_in_line_unless_it_is_async():
    """NeMo-RL's vllm_cfg.async_engine: false (grpo_math_1B.yaml) runs vllm.LLM's engine core in the worker's
    process, its outputs processed between steps; true (every async recipe, and the DeepSeek-V3 and
    Qwen3-235B on-policy ones) runs AsyncLLM, whose engine core has a process of its own."""
    import yaml

    from rpeg.perf.validation import rl_graph

    entries = {e["id"]: e for e in yaml.safe_load(SCHEMA)["rl"]}

    def inline(entry):
        g, _ = rl_graph(entry, {}, entry["id"])
        return next(s for s in g.stages if s.kind.value == "generate").layout.inline_output

    assert not inline(entries["r-alps"])  # async_bound 1: AsyncLLM, as every NeMo-RL async recipe sets
    assert not inline(entries["r-h20"])  # on-policy, async_engine: true
    assert inline(dict(entries["r-h20"], generation={"tp": 1, "pp": 1}))  # on-policy, the default


def test_an_async_engine_runs_asyncllms_128_and_in_flight_updates_refill_it():
    """AsyncLLM's max_num_seqs default (128) for an async engine, the LLM class's (0: by device) for the
    synchronous one, a recipe's own where the entry gives it; an async entry's in-flight weight updates
    (on by default, as every NeMo-RL async performance recipe sets them) keep its engines from draining."""
    import yaml

    from rpeg.perf.validation import rl_graph

    entries = {e["id"]: e for e in yaml.safe_load(SCHEMA)["rl"]}

    def plan(entry):
        g, _ = rl_graph(entry, {}, entry["id"])
        return g, next(s for s in g.stages if s.kind.value == "generate").layout

    g, lay = plan(entries["r-alps"])
    assert (lay.max_seqs, g.in_flight, g.refill) == (128, 1, True)
    g, lay = plan(dict(entries["r-alps"], in_flight_weight_updates=False))
    assert (g.in_flight, g.refill) == (1, False)
    assert plan(dict(entries["r-h20"], generation={"tp": 1, "pp": 1}))[1].max_seqs == 0
    assert plan(dict(entries["r-h20"], generation={"tp": 1, "pp": 1, "max_num_seqs": 32}))[1].max_seqs == 32


def test_validate_cli_errors_are_one_line(capsys, tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("training: [1, 2\n")
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert "malformed YAML" in err and err.count("\n") == 1


def test_the_shipped_files_are_the_seven_with_a_sources_section_each():
    assert sorted(bundled()) == ["megatron-bridge", "megatron-lm-moe-recipes", "nemo-rl-v0.3-stages",
                                 "nemo-rl-v0.5-extra", "nemo-rl-v0.6", "peer-ratios", "published"]
    sources = (BUNDLED_DIR / "SOURCES.md").read_text(encoding="utf-8")
    for path in bundled().values():
        assert f"## {path.name}\n" in sources, path.name
        assert "SOURCES.md" in path.read_text(encoding="utf-8"), f"{path.name} does not point to its sources"


def test_the_shipped_files_are_package_data():
    """A pip-installed rpeg has them: pyproject's package-data names the folder's files."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"data/validation/*.yaml"' in text and '"data/validation/*.md"' in text


@pytest.mark.parametrize("name", ["published", "published.yaml"])
def test_validate_takes_a_shipped_name(capsys, monkeypatch, tmp_path, name):
    monkeypatch.chdir(tmp_path)  # no file of that name here: the shipped one is read
    assert main(["validate", name, "--json"]) == 0
    ids = [e["id"] for e in json.loads(capsys.readouterr().out)["entries"]]
    assert ids == [r.id for r in validate_file(str(PUBLISHED))]


def test_a_users_file_wins_over_a_shipped_name(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "published").write_text(SCHEMA)
    assert main(["validate", "published", "--json"]) == 0
    assert [e["id"] for e in json.loads(capsys.readouterr().out)["entries"]][0] == "t-a100"


def test_validate_all_runs_every_shipped_file(capsys):
    code = main(["validate", "--all", "--json"])
    files = json.loads(capsys.readouterr().out)["files"]
    # every measured run is predicted to fit (the recipes' memory options: tests/test_validation_bridge.py)
    assert code == 0 and not [k for k, f in files.items() if f["not_fitting"]]
    assert sorted(files) == sorted(bundled())
    assert len(files["published"]["entries"]) == 11 and len(files["nemo-rl-v0.5-extra"]["entries"]) == 10
    assert [e["kind"] for e in files["nemo-rl-v0.6"]["entries"]] == ["rl"] * 17 + ["refit"] * 12
    assert files["peer-ratios"]["ratios"] and not files["peer-ratios"]["entries"]


def test_validate_all_prints_a_heading_per_file(capsys):
    assert main(["validate", "--all"]) == 0  # as above
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("== ")] == [
        f"== {name} ({path.name}) ==" for name, path in bundled().items()]


@pytest.mark.parametrize("argv, needle", [
    (["validate"], "not neither"),
    (["validate", "published", "--all"], "not both"),
    (["validate", "nonesuch"], "ships no validation file of that name (megatron-bridge, megatron-lm-moe-recipes, "),
    (["validate", "no/such.yaml"], "cannot read no/such.yaml"),
])
def test_validate_names_are_checked(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_nothing_in_the_repository_reads_outside_it():
    """A user's clone has no sibling folders: no file of the project may name our own notes folder.
    It walks the tree rather than asking git, as CI's bare copy of the tracked files has no .git."""
    import os

    skip = {".git", "__pycache__", ".pytest_cache", ".hypothesis", "rpeg-out", "build", "dist", "models"}
    needle = "../" + "shared"  # written in two parts so that this file does not match itself
    hits, seen = [], 0
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith(".venv") and not d.endswith(".egg-info")]
        for name in files:
            path = pathlib.Path(folder, name)
            text = path.read_bytes().decode("utf-8", "replace")
            seen += 1
            hits += [f"{path.relative_to(ROOT)}:{i}" for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert seen > 100
    assert not hits, hits


def test_validate_loo_prints_the_stored_fit_beside_a_fresh_prediction(capsys):
    """--loo: the fitted constants' rows of the file, in-sample and leave-one-out as the fit script
    stored them, none stale; a file no constant is fitted on says so."""
    assert main(["validate", "nemo-rl-v0.6", "--loo", "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)["fitted"]
    assert fitted["constants"] and fitted["rows"]
    assert all(r["id"].startswith("nemo-rl-v0.6:") and not r["stale"] for r in fitted["rows"])
    assert any(r["loo"] != r["in_sample"] for r in fitted["rows"])
    assert main(["validate", "published", "--loo"]) == 0
    assert "no fitted constant is fitted on rows of this file" in capsys.readouterr().out
