"""The supervised warm-up: a step count, or a target on dev accuracy that ends it early."""

from __future__ import annotations

import pytest
import torch

from rpeg.errors import RpegError
from rpeg.runtime.config import RuntimeConfig
from rpeg.runtime.models import build_tiny, load
from rpeg.runtime.sft import supervised_warmup
from rpeg.tasks import get_task


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.set_num_threads(1)
    path = build_tiny(str(tmp_path_factory.mktemp("tiny")))
    return path, get_task("arithmetic", ops=["add"], level=1).problems("train", 40, seed=1)


def test_a_target_stops_at_the_first_check_that_reaches_it(tiny):
    path, problems = tiny
    model, tok = load(path)
    readings = iter([0.1, 0.2, 0.31, 0.9])
    seen = []
    result = supervised_warmup(model, tok, problems, steps=100, lr=1e-3, batch=4, seed=0, target=0.3,
                               check=lambda: next(readings), check_every=3,
                               on_step=lambda s, loss, acc: seen.append((s, acc)))
    assert result.reached and result.steps == 9 and len(result.losses) == 9
    assert result.checks == [(3, 0.1), (6, 0.2), (9, 0.31)]
    assert [s for s, _ in seen] == list(range(1, 10)) and seen[2] == (3, 0.1) and seen[3] == (4, None)
    assert result.as_dict()["dev_accuracy"] == 0.31
    assert not model.training


def test_a_target_not_reached_runs_to_the_bound(tiny):
    path, problems = tiny
    model, tok = load(path)
    result = supervised_warmup(model, tok, problems, steps=8, lr=1e-3, batch=4, seed=0, target=0.5,
                               check=lambda: 0.0, check_every=4)
    assert not result.reached and result.steps == 8 and result.checks == [(4, 0.0), (8, 0.0)]


def test_without_a_target_the_rate_decays_and_no_check_runs(tiny):
    path, problems = tiny
    model, tok = load(path)

    def never():
        raise AssertionError("checked without a target")

    result = supervised_warmup(model, tok, problems, steps=5, lr=1e-3, batch=4, seed=0, check=never, check_every=1)
    assert result.steps == 5 and result.checks == [] and not result.reached


def test_the_same_seed_gives_the_same_warmup(tiny):
    path, problems = tiny
    runs = []
    for _ in range(2):
        model, tok = load(path)
        runs.append(supervised_warmup(model, tok, problems, steps=4, lr=1e-3, batch=4, seed=3).losses)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("changes, needle", [
    ({"warmup_target": 1.0}, "warmup_target = 1.0 must be in [0, 1)"),
    ({"warmup_target": -0.1}, "must be in [0, 1)"),
    ({"warmup_target": 0.3, "warmup_sft_steps": 0}, "needs warmup_sft_steps > 0"),
    ({"warmup_check_every": 0}, "warmup_check_every = 0 must be positive"),
])
def test_bad_warmup_settings_are_refused(changes, needle):
    with pytest.raises(RpegError, match=needle.replace("[", r"\[").replace(")", r"\)")):
        RuntimeConfig(**({"warmup_sft_steps": 10} | changes))


def test_a_demonstration_trains_only_its_sampled_segments():
    from random import Random

    from rpeg.runtime.sft import _rows
    from rpeg.tasks import Problem
    from rpeg.tasks.calculator import calculator_env

    env = calculator_env(warmup_tool_share=1.0)
    segments = env.demonstration(Problem("347*58=", "20126"), Random(0))
    assert segments == [("calc(347*58)", True), (None, True), ("\n> 20126\n", False), ("20126", True), (None, True)]
    assert calculator_env().demonstration(Problem("347*58=", "20126"), Random(0)) == [("20126", True), (None, True)]
    ids, attn, labels = _rows([([1, 2], [5, 6, 7, 8], [True, False, False, True])], pad=0)
    assert ids.tolist() == [[1, 2, 5, 6, 7, 8]] and labels.tolist() == [[-100, -100, 5, -100, -100, 8]]
    with pytest.raises(RpegError, match="warmup_tool_share must be in"):
        calculator_env(warmup_tool_share=1.5)
