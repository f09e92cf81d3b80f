"""Countdown: every generated instance is solvable, and the verifier refuses anything but an
expression over the given numbers, without ever evaluating arbitrary code."""

from __future__ import annotations

import random
import re
from fractions import Fraction

import pytest

from rpeg.errors import RpegError
from rpeg.tasks import Countdown, Problem
from rpeg.tasks.countdown import evaluate, random_solution

PROMPT = re.compile(r"((?:\d+ )+)-> (\d+):")


def instance(numbers: tuple[int, ...], target: int) -> Problem:
    return Problem(f"{' '.join(map(str, numbers))} -> {target}:", "", {"numbers": numbers, "target": target})


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("split, n", [("train", 300), ("test", 100)])
def test_every_instance_is_solvable_by_its_own_solution(seed, split, n):
    task = Countdown()
    for p in task.problems(split, n, seed):
        numbers, target = p.get("numbers"), p.get("target")
        assert PROMPT.fullmatch(p.prompt).groups() == (" ".join(map(str, numbers)) + " ", str(target))
        assert len(numbers) in (3, 4) and all(1 <= x <= 10 for x in numbers)
        assert 1 <= target <= 100 and target not in numbers
        assert evaluate(p.answer, numbers) == target and task.reward(p, p.answer) == 1.0


def test_options_shape_the_instances():
    task = Countdown(sizes=(2,), max_number=50, max_target=500)
    for p in task.problems("train", 100, 0):
        assert len(p.get("numbers")) == 2 and max(p.get("numbers")) <= 50 and p.get("target") <= 500
        assert task.reward(p, p.answer) == 1.0


def test_random_solutions_need_their_parentheses():
    rng = random.Random(0)
    for _ in range(2000):
        numbers = tuple(rng.randint(1, 12) for _ in range(rng.choice((2, 3, 4, 5))))
        value, text = random_solution(numbers, rng)
        assert evaluate(text, numbers) == value > 0


def test_splits_key_on_the_number_multiset():
    task = Countdown()
    key = lambda p: (tuple(sorted(p.get("numbers"))), p.get("target"))  # noqa: E731
    train = {key(p) for p in task.problems("train", 400, 0)}
    test = {key(p) for p in task.problems("test", 100, 0)}
    assert not train & test  # "3 5 7 -> 22" in test keeps "7 3 5 -> 22" out of train


def test_an_impossible_configuration_is_refused():
    with pytest.raises(RpegError, match=r"no instance with a target in 1\.\.1 other than a given number"):
        Countdown(max_number=1, max_target=1).problems("train", 1)


P = instance((3, 5, 7), 22)
HALVES = instance((2, 3, 4), 6)
TWICE = instance((5, 5, 2), 23)


@pytest.mark.parametrize("problem, response", [
    (P, "3*5+7"),
    (P, " 3 * 5 + 7 "),
    (P, "3*5+7=22"),
    (P, "(3*5)+7\nand more text"),
    (P, "7+5*3<eos>junk"),
    (P, "((7+(5*3)))"),
    (instance((3, 5, 7, 9), 22), "3*5+7"),  # not every number has to be used
    (HALVES, "3/2*4"),  # rational intermediates are exact
    (TWICE, "5*5-2"),  # a number given twice may be used twice
])
def test_correct_expressions_score_one(problem, response):
    assert Countdown().reward(problem, response) == 1.0


@pytest.mark.parametrize("problem, response", [
    (P, "3*5+8"),  # 8 is not given (and the value is wrong)
    (P, "3+5+7"),  # wrong value
    (P, "7*3+7-5-1"),  # reuses 7, uses 1
    (P, "15+7"),  # 15 is not given
    (P, "22"),  # the target itself is not a given number
    (P, "35-13"),  # concatenating 3 and 5
    (P, "-3+5*5"),  # unary minus
    (P, "3*5+7.0"),
    (P, "0x3*5+7"),
    (P, "3_0"),
    (P, "(3)(5)"),
    (P, "3 5 7"),
    (P, "3*5+7; import os"),
    (P, "__import__('os').system('true')"),
    (P, "[3*5+7][0]"),
    (P, "lambda: 3*5+7"),
    (P, "True*22"),
    (P, "=3*5+7"),
    (P, "( 3*5+7"),
    (P, ""),
    (instance((5, 5, 7), 7), "7/(5-5)"),  # division by zero
    (instance((9, 9, 9), 9), "9**9**9"),
    (instance((9, 9, 9), 9), "9//9*9"),
    (instance((2, 3, 7), 9), "2^3+7"),
])
def test_wrong_malformed_and_adversarial_expressions_score_zero(problem, response):
    assert Countdown().reward(problem, response) == 0.0


@pytest.mark.parametrize("response", [
    "9**9**9",
    "9**9**9**9**9**9",
    "(" * 150 + "9" + ")" * 150,
    "(" * 1000 + "9" + ")" * 1000,
    "9*" * 99 + "9",
    "9" * 100_000,
    "1+" * 500_000 + "1",
])
def test_huge_and_deep_inputs_are_rejected_before_any_work(response, monkeypatch):
    # bounded work, not a wall-clock limit: the parser sees only short input and nothing is computed
    import rpeg.tasks.countdown as cd

    real_parse = cd.ast.parse
    parsed = []

    def short_parse(text, *args, **kwargs):
        parsed.append(len(text))
        return real_parse(text, *args, **kwargs)

    def no_value(node):
        raise AssertionError(f"evaluated {response[:20]!r}...")

    monkeypatch.setattr(cd.ast, "parse", short_parse)
    monkeypatch.setattr(cd, "_value", no_value)
    assert Countdown().reward(instance((9, 9, 9), 9), response) == 0.0
    assert all(n <= cd.MAX_CHARS for n in parsed)


def test_evaluate_is_exact_and_refuses_before_computing():
    assert evaluate("(2+3)/4", (2, 3, 4)) == Fraction(5, 4)
    assert evaluate("9**9**9", (9, 9, 9)) is None
    assert evaluate("2*2", (2,)) is None
    assert evaluate("1/(2-2)", (1, 2, 2)) is None


def test_format_bonus_for_a_wrong_expression_only():
    task = Countdown(format_bonus=0.1)
    assert task.reward(P, "3+5+7") == 0.1  # a well-formed expression, wrong
    assert task.reward(P, "7*3+7") == 0.1  # well-formed, reuses 7: still wrong
    assert task.reward(P, "the answer is 22") == 0.0
    assert task.reward(P, "3*5+7") == 1.0
