"""Fuzzing the command line and every reader: random mutations of the example job files and of the
validation schema, and random command lines. The property: `rpeg` returns 0, or 2/3 with one line
on stderr; nothing else escapes (no traceback, no other exit). Bounded: a fixed number of examples
each, on inputs whose size the readers bound (no wall-clock limit: the machine is shared).
`derandomize` makes every run try the same cases; set RPEG_FUZZ_EXAMPLES to try more."""

from __future__ import annotations

import copy
import math
import os
import pathlib

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rpeg.cli import main
from rpeg.errors import RpegError
from rpeg.graph.serde import from_data

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# RPEG_FUZZ_EXAMPLES=500 for a longer hunt; make test runs 25 a test, the same ones every run
SETTINGS = settings(max_examples=int(os.environ.get("RPEG_FUZZ_EXAMPLES", "25")), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# values a careless or hostile file holds
ODD = st.one_of(
    st.sampled_from([0, -1, 1, 2, 3, 7, 10**6, 10**12, 10**400, 2**63, -(2**63)]),
    st.sampled_from([0.0, -0.5, 1e-300, 1e308, math.nan, math.inf, -math.inf, 0.5]),
    st.sampled_from(["", " ", "x", "grpo", "qwen3-8B", "fixed", "lognormal", "nan", "1e9", "\x00", "é" * 50]),
    st.sampled_from([None, True, False, [], {}, [1, 2], {"a": 1}, [[[[]]]]]),
)


def _paths(data, prefix=()):
    """Every path to a value in nested dicts and lists."""
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, prefix + (i,))


def _mutate(data, draw):
    data = copy.deepcopy(data)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
        if action == "set":
            parent[path[-1]] = copy.deepcopy(draw(ODD))  # never the strategy's own list or dict
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(["zzz", "max", "k", "tp", "mean"]))] = copy.deepcopy(draw(ODD))
        else:
            parent.append(copy.deepcopy(draw(ODD)))
    return data


def _dump(data) -> str:
    try:
        return yaml.safe_dump(data, allow_unicode=True)
    except (yaml.YAMLError, OverflowError):
        return "{}"


def _check(capsys, argv) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code in (0, 2, 3), (argv, code, err)
    if code:
        assert err.count("\n") == 1 and err.startswith("rpeg: error: "), (argv, err)
        assert len(err) < 2000, (argv, err[:200])
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["show", "analyze", "predict"])
@SETTINGS
@given(data=st.data())
def test_mutated_job_files(tmp_path_factory, capsys, command, data):
    source = data.draw(st.sampled_from(EXAMPLES), label="example")
    doc = yaml.safe_load(source.read_text())
    doc.pop("runtime", None)  # `rpeg train` is fuzzed through its reader below
    mutated = _mutate(doc, data.draw)
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "job.yaml"
    path.write_text(_dump(mutated), encoding="utf-8")
    extra = ["--out", str(folder / "out")] if command == "show" else []
    _check(capsys, [command, str(path), *extra])


@SETTINGS
@given(data=st.data())
def test_mutated_runtime_sections(data):
    from rpeg.runtime.config import RuntimeConfig

    doc = yaml.safe_load((ROOT / "examples" / "demo-grpo-tiny.yaml").read_text())["runtime"]
    section = _mutate(doc, data.draw)
    try:
        from_data(RuntimeConfig, section, "runtime")
    except RpegError as e:
        assert "\n" not in str(e)


@SETTINGS
@given(data=st.data())
def test_mutated_validation_files(tmp_path_factory, capsys, data):
    from tests.test_validation import SCHEMA

    mutated = _mutate(yaml.safe_load(SCHEMA), data.draw)
    path = tmp_path_factory.mktemp("fuzz") / "v.yaml"
    path.write_text(_dump(mutated), encoding="utf-8")
    _check(capsys, ["validate", str(path)])


FLAGS = {
    "--prompts": "n", "--samples": "n", "--prompt-len": "n", "--response-len": "x", "--response-max": "n",
    "--epochs": "n", "--mini-batches": "n", "--kl-coef": "x", "--async": "n", "--stream": "n",
    "--response-dist": "dist", "--model": "model", "--critic": "model",
}
VALUES = {
    "n": st.sampled_from(["0", "-1", "1", "2", "8", "64", "1000000000000", "1.5", "x", "", "1e3"]),
    "x": st.sampled_from(["0", "-1", "0.5", "1", "512", "nan", "inf", "-inf", "1e308", "x", ""]),
    "dist": st.sampled_from(["fixed", "uniform", "lognormal", "bogus"]),
    "model": st.sampled_from(["qwen3-8B", "llama-3.1-8B", "tiny-qwen2", "qwen9", ""]),
}


@SETTINGS
@given(data=st.data())
def test_random_command_lines(tmp_path_factory, capsys, data):
    command = data.draw(st.sampled_from(["show", "analyze", "predict"]))
    algorithm = data.draw(st.sampled_from(["grpo", "ppo", "rloo", "dapo", "remax", "nope"]))
    argv = [command, algorithm, "--model", "qwen3-8B"]
    for flag in data.draw(st.lists(st.sampled_from(sorted(FLAGS)), max_size=4, unique=True)):
        argv += [flag, data.draw(VALUES[FLAGS[flag]])]
    if command == "show":
        argv += ["--out", str(tmp_path_factory.mktemp("fuzz"))]
    if command == "analyze":
        argv += ["--steps", data.draw(VALUES["n"])]
    if command == "predict":
        argv += ["--gpus", data.draw(VALUES["n"])]
    _check(capsys, argv)


@SETTINGS
@given(data=st.data())
def test_mutated_stage_times_and_ratios(tmp_path_factory, capsys, data):
    """The sections issue 10 added to validation files: measured.stages_s and ratios:."""
    from tests.search.test_search_ratios import ENTRY
    from tests.test_validation import SCHEMA

    doc = yaml.safe_load(SCHEMA)
    rl = doc["rl"][0]
    rl["measured"]["stages_s"] = {"generation": 5, "logprobs": 2, "training": 2, "refit": 0.5, "other": 0.5}
    doc = {"models": doc.get("models"), "rl": [rl], "ratios": yaml.safe_load(ENTRY)["ratios"]}
    mutated = _mutate(doc, data.draw)
    path = tmp_path_factory.mktemp("fuzz") / "v.yaml"
    path.write_text(_dump(mutated), encoding="utf-8")
    _check(capsys, ["validate", str(path)])


TRAIN_EXAMPLES = ["demo-grpo-tiny.yaml", "agent-calculator-tiny.yaml", "partial-rollout-tiny.yaml"]


@SETTINGS
@given(data=st.data())
def test_mutated_train_jobs_dry_run(tmp_path_factory, capsys, data):
    """`rpeg train JOB --dry-run` on a mutated job file, runtime section included: 0 or one line, and no
    output that looks like a run (metrics, checkpoints) is left behind."""
    source = ROOT / "examples" / data.draw(st.sampled_from(TRAIN_EXAMPLES), label="example")
    mutated = _mutate(yaml.safe_load(source.read_text()), data.draw)
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "job.yaml"
    path.write_text(_dump(mutated), encoding="utf-8")
    _check(capsys, ["train", str(path), "--dry-run", "--out", str(folder / "out")])
    left = {p.name for p in (folder / "out").rglob("*")} if (folder / "out").exists() else set()
    assert not left & {"metrics.jsonl", "checkpoints", "summary.json"}, left
