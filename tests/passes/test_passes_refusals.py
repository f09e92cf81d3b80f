"""A pass that declines a graph raises PassRefused, a kind of user error; the search skips exactly
those candidates, and any other exception from a pass (a bug) reaches the caller."""

from __future__ import annotations

import importlib

import pytest

from rpeg.algorithms import Models, build_graph
from rpeg.errors import PassRefused, RpegError
from rpeg.graph import Job, LengthDistribution, get_model
from rpeg.hardware import load_cluster
from rpeg.passes import parallelize, place
from rpeg.search import NoFeasiblePlan, search

SEARCH = importlib.import_module("rpeg.search.search")  # the module (rpeg.search.search is also the function)
G = build_graph("grpo", Job(prompts=8, samples_per_prompt=4, prompt_len=64, response=LengthDistribution.fixed(64)),
                Models(actor=get_model("qwen3-0.6B")))


@pytest.mark.parametrize("call, needle", [
    (lambda: place(G, {"all": "x"}, default="all"), "bad device group 'all'"),
    (lambda: place(G, {"all": [0, True]}, default="all"), "bad device group 'all'"),
    (lambda: place(G, "all", default="all"), "groups must be a non-empty mapping"),
    (lambda: place(G, {"all": 1}, assign="generate", default="all"), "assign must be a mapping"),
    (lambda: place(G, {"all": 1}, default=3), "default must be a group name"),
    (lambda: parallelize(place(G, {"all": 1}, default="all"), "generate", dp="1"), "expected whole numbers"),
    (lambda: parallelize(place(G, {"all": 1}, default="all"), "generate", recompute=None), "recompute = None"),
])
def test_bad_pass_arguments_are_refusals(call, needle):
    with pytest.raises(PassRefused, match=needle) as e:
        call()
    assert isinstance(e.value, RpegError) and "\n" not in str(e.value)


def test_a_bug_in_a_pass_is_not_swallowed_by_the_search(monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(SEARCH, "apply_execution", broken)
    with pytest.raises(KeyError, match="a bug"):
        search(G, load_cluster("dgx-h100", 8), 8, budget=20)


def test_refusals_are_skipped(monkeypatch):
    def refused(*args, **kwargs):
        raise PassRefused("fuse(...) refused: illegal here")

    monkeypatch.setattr(SEARCH, "apply_execution", refused)
    with pytest.raises(NoFeasiblePlan):
        search(G, load_cluster("dgx-h100", 8), 8, budget=20)
