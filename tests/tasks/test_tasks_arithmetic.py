"""Arithmetic: prompts per level and operation, exact splits, first-integer scoring."""

from __future__ import annotations

import re
import sys

import pytest

from rpeg.errors import RpegError
from rpeg.tasks import Arithmetic, Problem

PROMPT = re.compile(r"(\d+)([+*])(\d+)=")


@pytest.mark.parametrize("level", range(1, 6))
@pytest.mark.parametrize("ops", [("add",), ("mul",), ("add", "mul")])
def test_prompts_answers_and_operand_sizes(level, ops):
    task = Arithmetic(ops=ops, level=level)
    problems = task.problems("train", 30, seed=1)
    assert len(problems) == 30
    for p in problems:
        a, symbol, b = PROMPT.fullmatch(p.prompt).groups()
        assert {"+": "add", "*": "mul"}[symbol] in ops and p.get("op") in ops
        assert p.answer == str(int(a) + int(b) if symbol == "+" else int(a) * int(b))
        assert all(len(x) == level for x in (a, b)) and (p.get("a"), p.get("b")) == (int(a), int(b))


def test_level_one_is_the_whole_small_table_split_exactly():
    task = Arithmetic(ops=("add",), level=1)
    train = {p.prompt for p in _all(task, "train")}
    test = {p.prompt for p in _all(task, "test")}
    assert len(train) + len(test) == 100  # 0-9 + 0-9, every ordered pair once
    # a reordering of a test problem is a test problem too: 3+5 in test means 5+3 in test
    swapped = {f"{b}+{a}=" for a, b in (PROMPT.fullmatch(p).group(1, 3) for p in test)}
    assert swapped == test and not swapped & train


def _all(task: Arithmetic, split: str) -> list[Problem]:
    """Every problem of `split`: as many as the ordered pairs whose key falls in it."""
    n = sum(task.split_of(task.key("add", a, b)) == split for a in range(10) for b in range(10))
    return task.problems(split, n)


def test_asking_for_more_than_a_split_holds_names_the_count():
    with pytest.raises(RpegError, match=r"level=1\) has \d+ test problems, asked for 1000"):
        Arithmetic(level=1).problems("test", 1000)


def test_sampled_levels_are_deterministic_and_disjoint():
    task = Arithmetic(level=4)
    train, test = task.problems("train", 500, seed=0), task.problems("test", 200, seed=0)
    assert train == Arithmetic(level=4).problems("train", 500, seed=0)
    assert not {p.prompt for p in train} & {p.prompt for p in test}
    assert {task.split_of(task.key(p.get("op"), p.get("a"), p.get("b"))) for p in test} == {"test"}


P = Problem("12+7=", "19", {"op": "add", "a": 12, "b": 7, "level": 2})


@pytest.mark.parametrize("response, given, reward", [
    ("19", "19", 1.0),
    (" 19", "19", 1.0),
    ("1 9", "19", 1.0),  # spaces are stripped before reading the integer
    ("19\n20", "19", 1.0),  # the response ends at a newline
    ("19<eos>", "19", 1.0),
    ("19<eos>garbage 7", "19", 1.0),
    ("=19", "19", 1.0),
    ("19+0=19", "19", 1.0),
    ("20", "20", 0.0),
    ("019", "019", 0.0),  # exact: a leading zero is a different answer
    ("-19", "-19", 0.0),
    ("119", "119", 0.0),
    ("12+7=19", "12", 0.0),  # the first integer stated is 12
    ("\n19", None, 0.0),
    ("<eos>19", None, 0.0),
    ("abc", None, 0.0),
    ("", None, 0.0),
])
def test_first_integer_exact_match(response, given, reward):
    task = Arithmetic()
    assert task.extract(response) == given
    assert task.reward(P, response) == reward


def test_a_huge_integer_is_wrong_and_never_converted():
    # Python refuses int() of a string over its digit limit (quadratic work): with the limit set, a
    # scorer that converted the response would raise here instead of comparing strings
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(4300)
    try:
        assert Arithmetic().reward(P, "9" * 200_000) == 0.0
    finally:
        sys.set_int_max_str_digits(limit)
