"""Validation files: zero, negative, NaN and wrongly typed fields are refused with the entry and
the field named (they used to divide by zero or raise TypeError deep in the model)."""

from __future__ import annotations

import pytest

from rpeg.cli import main
from tests.test_validation import SCHEMA


@pytest.mark.parametrize("edit, needle", [
    (("micro_batch: 2,", "micro_batch: 0,"), "(t-a100).micro_batch: micro_batch = 0 must be positive"),
    (("measured_iteration_s: 1.0}", "measured_iteration_s: -1.0}"), "measured_iteration_s = -1 must be positive"),
    (("measured_iteration_s: 1.0}", "measured_iteration_s: .nan}"), "must be a finite number"),
    (("train_global_batch: 32,", "train_global_batch: 0,"), "(r-gb200).train_global_batch: train_global_batch = 0"),
    (("generation: {tp: 2, pp: 1, ep: 2}", "generation: {tp: 0, pp: 1, ep: 2}"), "(r-gb200).generation.tp"),
    (("generation: {tp: 2, pp: 1, ep: 2}", "generation: [2]"), "(r-gb200).generation: expected a mapping"),
    (("training: {tp: 2, cp: 2,", "training: {tp: two, cp: 2,"), "(r-alps).training.tp: expected an integer"),
    (("measured: {step_s: 10,", "measured: {step_s: 0,"), "(r-gb200).measured.step_s: step_s = 0 must be positive"),
    (("mean_seq_len: 900,", "mean_seq_len: 9000,"), "mean_seq_len = 9000 exceeds max_seq_len = 2048"),
    (("async_bound: 1,", "async_bound: -1,"), "(r-alps).async_bound: expected an integer in [0, 64]"),
    (("prompts: 8,", "prompts: 8.5,"), "(r-gb200).prompts: expected an integer, got 8.5"),
    (("training: {tp: 2, cp: 2,", "training: {tp: 2, packing: yes please, cp: 2,"),
     "(r-alps).training.packing: expected true or false"),
    (("training: {tp: 2, cp: 2,", "training: {tp: 2, logprob_batch: 0, cp: 2,"),
     "(r-alps).training.logprob_batch: logprob_batch = 0 must be positive"),
    (("training: {tp: 2, cp: 2,", "training: {tp: 2, micro_bach: 2, cp: 2,"),
     "(r-alps).training: unknown key 'micro_bach'"),
    (("generation: {tp: 2, pp: 1, ep: 2}", "generation: {tp: 2, pp: 1, ep: 2, cp: 2}"),
     "(r-gb200).generation: unknown key 'cp'"),
])
def test_bad_fields_are_one_line_naming_entry_and_field(tmp_path, capsys, edit, needle):
    assert edit[0] in SCHEMA
    f = tmp_path / "bad.yaml"
    f.write_text(SCHEMA.replace(*edit, 1))
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err, err


OOM = """rl:
  - {id: fits, system: dgx-h100, model: llama-3.1-8B, gpus: 8, prompts: 64, samples_per_prompt: 8,
     max_seq_len: 2048, mean_seq_len: 900, generation: {tp: 1}, training: {tp: 2}, measured: {step_s: 60}}
  - {id: too-big, system: dgx-h100, model: llama-3.1-405B, gpus: 1, prompts: 64, samples_per_prompt: 8,
     max_seq_len: 2048, mean_seq_len: 900, measured: {step_s: 60}}
"""


def test_an_entry_predicted_not_to_fit_is_named_and_left_out_of_the_mean(tmp_path, capsys):
    import json
    import math

    f = tmp_path / "oom.yaml"
    f.write_text(OOM)
    assert main(["validate", str(f)]) == 3  # a plan that does not fit, as predict and plan say it
    out = capsys.readouterr().out
    assert "inf" not in out.lower() and "does not fit" in out and "DOES NOT FIT" in out and "too-big" in out
    assert "over the 1 that fit" in out
    assert main(["validate", str(f), "--json"]) == 3

    def refuse(name):
        raise AssertionError(f"{name} in --json output")

    data = json.loads(capsys.readouterr().out, parse_constant=refuse)  # strict JSON: no Infinity, no NaN
    fits, big = data["entries"]
    assert fits["fits"] and math.isfinite(fits["error"]) and data["mape"] == abs(fits["error"])
    assert (big["fits"], big["predicted"], big["error"]) == (False, None, None)
    assert data["not_fitting"] == ["too-big"]


STAGES = "measured: {step_s: 10, stages_s: {generation: 5, logprobs: 2, training: 2, refit: 0.5, other: 0.5}}"


@pytest.mark.parametrize("stages, needle", [
    ("stages_s: {generation: -5}", "(r-gb200).measured.stages_s.generation: generation = -5 must be >= 0"),
    ("stages_s: {generation: .nan}", "stages_s.generation: generation = nan must be a finite number"),
    ("stages_s: {generation: fast}", "stages_s.generation: expected a number of seconds, got 'fast'"),
    ("stages_s: {gen: 5}", "stages_s: unknown stage 'gen' (known: generation, logprobs, training, refit, other)"),
    ("stages_s: 5", "stages_s: expected a mapping of generation, logprobs"),
    ("stages_s: {}", "stages_s: expected a mapping"),
    ("stage_s: {generation: 5}", "(r-gb200).measured: unknown key 'stage_s'"),
])
def test_bad_stage_times_are_one_line(tmp_path, capsys, stages, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(SCHEMA.replace("measured: {step_s: 10,", "measured: {step_s: 10, " + stages + ",", 1))
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_stage_times_are_predicted_and_scored(tmp_path, capsys):
    import json

    from rpeg.perf.validation import STAGES_S, stage_mapes, validate_file

    f = tmp_path / "stages.yaml"
    f.write_text(SCHEMA.replace("measured: {step_s: 10, tokens_per_s_per_gpu: 100}", STAGES, 1))
    results = validate_file(str(f))
    r = next(r for r in results if r.id == "r-gb200")
    assert [s.stage for s in r.stages] == list(STAGES_S)
    split = {s.stage: s.predicted for s in r.stages}
    assert all(v >= 0 for v in split.values()) and split["generation"] > 0 and split["training"] > 0
    assert sum(split.values()) == pytest.approx(r.predicted, rel=1e-9)  # synchronous, colocated: the stages add up
    mapes = stage_mapes(results)
    assert mapes["generation"] == pytest.approx(abs(split["generation"] - 5) / 5)
    assert mapes["all"] == pytest.approx(sum(abs(split[k] - m) / m for k, m in
                                             (("generation", 5), ("logprobs", 2), ("training", 2), ("refit", 0.5))) / 4)
    assert main(["validate", str(f)]) == 0
    out = capsys.readouterr().out
    assert "per stage, predicted / measured seconds" in out and "stages (generation, logprobs, training, refit)" in out
    assert main(["validate", str(f), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    entry = next(e for e in data["entries"] if e["id"] == "r-gb200")
    assert entry["stages"]["refit"]["measured"] == 0.5 and data["mape_by_stage"]["all"] == pytest.approx(mapes["all"])
