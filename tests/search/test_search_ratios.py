"""`ratios:` in validation files: published step-time ratios between two systems against the
peers' plans; bad fields are one-line errors."""

from __future__ import annotations

import json

import pytest

from rpeg.cli import main
from rpeg.hardware import load_cluster
from rpeg.perf.step import predict_step
from rpeg.perf.validation import bundled
from rpeg.search.baselines import BASELINES
from rpeg.search.layouts import LayoutCache
from rpeg.search.ratios import predict_ratio, ratios_file, within
from rpeg.spec import spec_from_data

DATA = bundled()["peer-ratios"]
ENTRY = """ratios:
  - id: small
    job: {algorithm: grpo, model: qwen3-0.6B, job: {prompts: 16, samples_per_prompt: 4, prompt_len: 256,
          response: {kind: fixed, mean: 512}}}
    system: dgx-h100
    gpus: 8
    faster: verl
    slower: openrlhf
    ratio: 2.0
"""


def test_the_predicted_ratio_is_the_two_plans_step_ratio(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text(ENTRY)
    (r,) = ratios_file(str(f))
    job = {"algorithm": "grpo", "model": "qwen3-0.6B", "job": {"prompts": 16, "samples_per_prompt": 4,
                                                              "prompt_len": 256, "response": {"kind": "fixed",
                                                                                              "mean": 512}}}
    graph, cluster, cache = spec_from_data(job).graph(), load_cluster("dgx-h100", 8), LayoutCache()
    steps = {s: predict_step(BASELINES[s].build(graph, cluster, 8, cache), cluster).step_s for s in ("verl", "openrlhf")}
    assert r.predicted == pytest.approx(steps["openrlhf"] / steps["verl"], rel=1e-12)
    assert r.off_by == pytest.approx(r.predicted / 2.0) and r.published == 2.0


def test_an_average_over_models_is_the_mean_of_their_ratios():
    entry = {"id": "avg", "job": {"algorithm": "ppo", "model": "qwen3-0.6B", "critic": "qwen3-0.6B",
                                  "job": {"prompts": 16, "samples_per_prompt": 1, "prompt_len": 256,
                                          "response": {"kind": "fixed", "mean": 256}}},
             "models": ["qwen3-0.6B", "qwen3-1.7B"], "system": "dgx-h100", "gpus": 8, "faster": "verl",
             "slower": "deepspeed-chat", "ratio": 1.5}
    r = predict_ratio(entry, "t")
    assert [m for m, *_ in r.per_model] == ["qwen3-0.6B", "qwen3-1.7B"]
    assert r.predicted == pytest.approx(sum(q for *_, q in r.per_model) / 2)
    one = predict_ratio({**entry, "models": ["qwen3-1.7B"]}, "t")
    assert one.per_model[0] == r.per_model[1]  # every role takes the size: the critic too


def test_the_repository_ratios_run_and_print(capsys):
    results = ratios_file(str(DATA))
    assert len(results) == 6 and all(r.predicted is not None and r.predicted > 0 for r in results)
    assert within(results, 0.0, float("inf")) == results
    assert main(["validate", str(DATA)]) == 0
    out = capsys.readouterr().out
    assert "step-time ratios between systems" in out and "hybridflow-verl-vs-deepspeed-chat" in out
    assert main(["validate", str(DATA), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in data["ratios"]] == [r.id for r in results]


@pytest.mark.parametrize("edit, needle", [
    (("ratio: 2.0", "ratio: 0"), "ratios[0] (small).ratio: ratio = 0 must be positive"),
    (("ratio: 2.0", "ratio: .nan"), "ratio = nan must be a finite number"),
    (("    ratio: 2.0\n", ""), "ratios[0] (small): missing 'ratio'"),
    (("faster: verl", "faster: nope"), ".faster: unknown system 'nope' (known: verl,"),
    (("slower: openrlhf", "slower: verl"), "faster and slower are the same system (verl)"),
    (("gpus: 8", "gpus: 0"), ".gpus: gpus = 0 must be positive"),
    (("gpus: 8", "gpus: 8.5"), ".gpus: expected a whole number, got 8.5"),
    (("system: dgx-h100", "system: nope"), "unknown cluster 'nope'"),
    (("    gpus: 8\n", "    gpus: 8\n    speed: 3\n"), "(small): unknown key 'speed'"),
    (("model: qwen3-0.6B", "model: nope"), "unknown model 'nope'"),
])
def test_bad_ratio_entries_are_one_line(tmp_path, capsys, edit, needle):
    assert edit[0] in ENTRY
    f = tmp_path / "bad.yaml"
    f.write_text(ENTRY.replace(*edit, 1))
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err, err
