"""Numbers out of range are refused in one line naming the field and its range; NaN and infinity
never pass; valid extreme values are accepted."""

from __future__ import annotations

import math
import re

import pytest

from rpeg.cli import main
from rpeg.errors import RpegError
from rpeg.graph import Job, LengthDistribution
from rpeg.graph.bounds import (MAX_GPUS, MAX_MICROBATCHES, MAX_MINI_BATCHES, MAX_POINTS, MAX_PROMPTS, MAX_SIGMA,
                               MAX_STALENESS, MAX_TOKENS, MIN_SIGMA, problem)
from rpeg.graph.config import AlgoConfig


def test_problem_messages():
    assert problem("x", 3, positive=True, maximum=5) is None
    assert problem("x", 0, positive=True) == "x = 0 must be positive"
    assert problem("x", -1.5, minimum=0) == "x = -1.5 must be >= 0"
    assert problem("x", 10**12, maximum=10) == "x = 1,000,000,000,000 exceeds 10"
    assert problem("x", 1e308, maximum=10) == "x = 1e+308 exceeds 10"
    assert problem("x", math.nan, minimum=0) == "x = nan must be a finite number"
    assert problem("x", "3") == "x = '3' must be a number"
    assert problem("x", True) == "x = True must be a number"


@pytest.mark.parametrize("field, value, needle", [
    ("prompts", MAX_PROMPTS + 1, "prompts = 10,000,001 exceeds 10,000,000"),
    ("prompt_len", MAX_TOKENS + 1, "prompt_len = 16,777,217 exceeds"),
    ("samples_per_prompt", 0, "samples_per_prompt = 0 must be positive"),
])
def test_job_bounds(field, value, needle):
    with pytest.raises(RpegError, match=needle):
        Job(**{field: value})


def test_valid_extremes_are_accepted():
    job = Job(prompts=MAX_PROMPTS, samples_per_prompt=2, prompt_len=MAX_TOKENS,
              response=LengthDistribution(kind="lognormal", mean=MAX_TOKENS / 2, max=MAX_TOKENS))
    assert job.sequences == 2 * MAX_PROMPTS


@pytest.mark.parametrize("kw, needle", [
    ({"kind": "fixed", "mean": math.nan}, "mean = nan must be a finite number"),
    ({"kind": "fixed", "mean": math.inf}, "mean = inf must be a finite number"),
    ({"kind": "lognormal", "mean": 10, "max": 100, "sigma": math.nan}, "sigma = nan"),
    ({"kind": "empirical", "points": tuple(range(1, MAX_POINTS + 2))}, "more than 100,000"),
    ({"kind": "empirical", "points": (5, MAX_TOKENS + 1)}, "point = 16,777,217 exceeds"),
])
def test_length_bounds(kw, needle):
    with pytest.raises(RpegError, match=needle):
        LengthDistribution(**kw)


@pytest.mark.parametrize("field", ["kl_coef", "clip_low", "clip_high", "entropy_coef", "value_clip", "oversample"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_config_refuses_non_finite(field, value):
    with pytest.raises(RpegError, match=f"{field} = -?(nan|inf) must be a finite number"):
        AlgoConfig(adv_estimator="grpo", **{field: value})


def test_config_refuses_a_negative_value_clip():
    with pytest.raises(RpegError, match="value_clip = -1 must be >= 0"):
        AlgoConfig(adv_estimator="gae", value_clip=-1)


@pytest.mark.parametrize("argv, needle", [
    (["show", "grpo", "--model", "qwen3-8B", "--response-len", "nan"], "--response-len: nan must be a finite"),
    (["show", "grpo", "--model", "qwen3-8B", "--response-len", "1e308"], "must be in [1, 16,777,216]"),
    (["show", "grpo", "--model", "qwen3-8B", "--kl-coef", "inf"], "--kl-coef: inf must be a finite number"),
    (["show", "grpo", "--model", "qwen3-8B", "--response-max", "5"], "--response-max 5 is below --response-len"),
    (["show", "grpo", "--model", "qwen3-8B", "--async", "1000"], "--async 1000 exceeds 64"),
    (["analyze", "grpo", "--model", "qwen3-8B", "--steps", "0"], "--steps: 0 must be in [1, 10,000]"),
    (["analyze", "grpo", "--model", "qwen3-8B", "--steps", "1000000"], "must be in [1, 10,000]"),
    (["predict", "grpo", "--model", "qwen3-8B", "--gpus", "0"], "--gpus: 0 must be in [1, 1,000,000]"),
    (["predict", "grpo", "--model", "qwen3-8B", "--prompts", "1000000000000"], "prompts = 1,000,000,000,000 exceeds"),
    (["plan", "grpo", "--model", "qwen3-8B", "--gpus", "0"], "--gpus: 0 must be in"),
    (["plan", "grpo", "--model", "qwen3-8B", "--max-staleness", "1000000"], "--max-staleness must be <= 64"),
    (["predict", "grpo", "--model", "qwen3-8B", "--cluster", "/dev/zero"], "not a regular file"),
])
def test_cli_numbers_are_one_line_and_exit_2(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


MODEL = "{name: m, layers: 4, hidden: 64, heads: 4, kv_heads: 4, ffn: 128, vocab: 100}"


@pytest.mark.parametrize("body, needle", [
    ("algorithm: grpo\nmodel: qwen3-8B\njob: []\n", "job: expected a mapping for Job, got []"),
    ("algorithm: grpo\nmodel: qwen3-8B\nconfig: []\n", "config must be a mapping"),
    ("algorithm: ppo\nmodel: qwen3-8B\nconfig: {adv_estimator: bogus}\n", "adv_estimator = 'bogus' is not one of"),
    ("algorithm: ppo\nmodel: qwen3-8B\nconfig: {value_clip: -1}\n", "value_clip = -1 must be >= 0"),
    (f"algorithm: grpo\nmodel: {MODEL.replace('layers: 4', 'layers: 1000000000')}\n",
     "layers = 1,000,000,000 exceeds 2,048"),
    (f"algorithm: grpo\nmodel: {MODEL.replace('ffn: 128', 'ffn: 128, head_dim: -128')}\n",
     "head_dim = -128 must be >= 0"),
])
def test_job_file_values_are_refused(tmp_path, capsys, body, needle):
    path = tmp_path / "job.yaml"
    path.write_text(body)
    assert main(["show", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_the_config_estimators_are_the_runtimes():
    pytest.importorskip("torch")
    from rpeg.graph.config import ADV_ESTIMATORS
    from rpeg.runtime.advantages import ADVANTAGES

    assert sorted(ADV_ESTIMATORS) == sorted(ADVANTAGES)


def test_huge_integers_are_shown_without_overflow():
    assert problem("prompts", 10**400, maximum=10) == "prompts = 1.00e+400 exceeds 10"
    with pytest.raises(RpegError, match=r"prompts = 1.00e\+400 exceeds"):
        Job(prompts=10**400)


# ---- issue 23, item 4: tiny positives, and counts that had no upper bound -----------------------
@pytest.mark.parametrize("kw, needle", [
    ({"kind": "lognormal", "mean": 1e-300, "max": 100}, "lognormal mean = 1e-300 must be at least 1 token"),
    ({"kind": "fixed", "mean": 5e-324}, "fixed mean = 4.94066e-324 must be at least 1 token"),
    ({"kind": "lognormal", "mean": 100, "max": 1000, "sigma": 1e-300}, "sigma = 1e-300 must be at least 0.01"),
    ({"kind": "lognormal", "mean": 100, "max": 1000, "sigma": 30.0}, "sigma = 30 exceeds 10.0"),
])
def test_length_ranges(kw, needle):
    with pytest.raises(RpegError, match="response length") as err:
        LengthDistribution(**kw)
    assert needle in str(err.value)


def test_length_range_edges_are_accepted_and_stay_finite():
    for sigma in (MIN_SIGMA, MAX_SIGMA):
        for mean, cap in ((1, 2), (1, MAX_TOKENS), (MAX_TOKENS, MAX_TOKENS)):
            d = LengthDistribution(kind="lognormal", mean=mean, max=cap, sigma=sigma)
            assert all(math.isfinite(x) for x in (*d.moments(), d.expected_max(10**6), d.quantile(0.5)))
    assert LengthDistribution(kind="fixed", mean=1).max == 1


def test_counts_have_upper_bounds():
    from rpeg.graph import DeviceGroup
    from rpeg.graph import get_model
    from rpeg.passes import bound_asynchrony, stream

    with pytest.raises(RpegError, match="mini_batches = 1,048,577 exceeds 1,048,576"):
        Job(prompts=MAX_PROMPTS, samples_per_prompt=2, mini_batches=MAX_MINI_BATCHES + 1)
    assert Job(prompts=MAX_PROMPTS, samples_per_prompt=2, mini_batches=MAX_MINI_BATCHES).mini_batches == MAX_MINI_BATCHES
    with pytest.raises(RpegError, match="position_embeddings = 16,777,217 exceeds 16,777,216"):
        get_model("tiny-qwen2").replace(position_embeddings=MAX_TOKENS + 1)
    with pytest.raises(RpegError, match="devices 999,999 to 1,000,000 go past 1,000,000"):
        DeviceGroup(name="g", first=MAX_GPUS - 1, count=2)
    assert DeviceGroup(name="g", first=MAX_GPUS - 1, count=1).count == 1
    from rpeg.algorithms import Models, build_graph

    big = Job(prompts=MAX_PROMPTS, samples_per_prompt=100, mini_batches=4)
    g = build_graph("ppo", big, Models(actor=get_model("tiny-qwen2")))
    assert any(s.microbatches == MAX_MICROBATCHES for s in stream(g, MAX_MICROBATCHES).streams)
    with pytest.raises(RpegError, match="microbatches = 65,537 exceeds 65,536"):
        stream(g, MAX_MICROBATCHES + 1)
    assert bound_asynchrony(g, MAX_STALENESS).async_bound == MAX_STALENESS
    with pytest.raises(RpegError, match="k = 65 exceeds 64"):
        bound_asynchrony(g, MAX_STALENESS + 1)


def test_names_that_are_not_strings_or_are_empty():
    from rpeg.graph import get_model

    for bad, needle in ((3, "got 3"), (None, "got None"), (["a"], "got ['a']"), ("", "got an empty name")):
        with pytest.raises(RpegError, match=re.escape(f"a model is a preset, a catalogue id, a config.json or a model folder (see `rpeg models`), {needle}")):
            get_model(bad)
    with pytest.raises(RpegError, match="name = '': a model needs a name"):
        get_model("tiny-qwen2").replace(name="")
