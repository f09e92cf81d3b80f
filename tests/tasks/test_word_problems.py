"""Word problems: every story's gold answer is what an independent reading of its text gives,
stated numbers stay within max_number, splits keep a story's structure on one side, and scoring
is GSM8K's final-answer match."""

from __future__ import annotations

import re

import pytest

from rpeg.errors import RpegError
from rpeg.tasks import get_task

# One pattern per sentence the generator writes; the groups are the numbers the story states.
START_GROUPS = re.compile(r"(?P<name>[A-Z]\w+) has (?P<a>\d+) (?P<group>\w+) with (?P<b>\d+) (?P<thing>\w+) in each")
START_PLAIN = re.compile(r"(?P<name>[A-Z]\w+) has (?P<a>\d+) (?P<thing>\w+)")
ADD = re.compile(r"(?:She|He) (?:buys|finds|gets) (?P<b>\d+) more (?P<thing>\w+)")
SUB = re.compile(r"(?:She|He) gives (?P<b>\d+) (?P<thing>\w+) to (?:a friend|a neighbor|(?:her|his) "
                 r"(?:brother|sister|teacher))")
DIV = re.compile(r"(?:She|He) shares them equally among (?P<k>\d+) friends")
ASK_ALL = re.compile(r"How many (?P<thing>\w+) does (?P<name>[A-Z]\w+) have now\?")
ASK_EACH = re.compile(r"How many (?P<thing>\w+) does each friend get\?")


def solve(question: str) -> tuple[int, tuple, list[int], list[int]]:
    """(answer, structure, stated numbers, every amount along the way) read from the story's text.
    The structure is the story without its names: ("mul", a, b) or ("n", a), then (op, number)s."""
    *sentences, ask = re.split(r"(?<=\.) ", question)
    first, *steps = [s.removesuffix(".") for s in sentences]
    if m := START_GROUPS.fullmatch(first):
        a, b = int(m["a"]), int(m["b"])
        amount, structure, stated = a * b, [("mul", a, b)], [a, b]
    else:
        m = START_PLAIN.fullmatch(first)
        assert m, f"unreadable first sentence {first!r} in {question!r}"
        amount, structure, stated = int(m["a"]), [("n", int(m["a"]))], [int(m["a"])]
    name, thing, amounts = m["name"], m["thing"], [amount]
    assert steps, f"no step after the first sentence: {question!r}"
    for i, step in enumerate(steps):
        if m := ADD.fullmatch(step):
            b = int(m["b"])
            amount, op = amount + b, "add"
        elif m := SUB.fullmatch(step):
            b = int(m["b"])
            assert b < amount, f"gives away {b} of {amount}: {question!r}"
            amount, op = amount - b, "sub"
        else:
            m = DIV.fullmatch(step)
            assert m, f"unreadable step {step!r} in {question!r}"
            b = int(m["k"])
            assert i == len(steps) - 1, f"a share before the last step: {question!r}"
            assert amount % b == 0, f"{amount} does not share equally among {b}: {question!r}"
            amount, op = amount // b, "div"
        assert "thing" not in m.groupdict() or m["thing"] == thing, question
        structure.append((op, b))
        stated.append(b)
        amounts.append(amount)
    if structure[-1][0] == "div":
        m = ASK_EACH.fullmatch(ask)
        assert m and m["thing"] == thing, question
    else:
        m = ASK_ALL.fullmatch(ask)
        assert m and (m["thing"], m["name"]) == (thing, name), question
    return amount, tuple(structure), stated, amounts


def test_the_solver_reads_the_docstring_example():
    story = ("Maya has 7 boxes with 6 pencils in each. She gives 12 pencils to her brother. "
             "How many pencils does Maya have now?")
    assert solve(story) == (30, (("mul", 7, 6), ("sub", 12)), [7, 6, 12], [42, 30])


@pytest.mark.parametrize("max_number", [20, 100])
@pytest.mark.parametrize("max_steps", [1, 2, 3, 4])
def test_every_gold_answer_is_the_story_result(max_steps, max_number):
    task = get_task("word_problems", max_steps=max_steps, max_number=max_number)
    steps_seen = set()
    for p in task.problems("train", 300, seed=max_steps):
        assert p.prompt == p.get("question")
        answer, structure, stated, amounts = solve(p.get("question"))
        assert p.answer.isdigit() and p.answer == str(answer)
        assert 1 <= len(structure) - 1 <= max_steps
        assert max(stated) <= max_number  # a product (boxes of n) may exceed it; a stated number not
        assert all(0 <= x <= 10 * max_number for x in amounts)  # the docstring's bound on every amount
        steps_seen.add(len(structure) - 1)
    assert steps_seen == set(range(1, max_steps + 1))


def test_a_share_count_stays_within_a_small_max_number():
    task = get_task("word_problems", max_steps=4, max_number=5)
    assert all(max(solve(p.get("question"))[2]) <= 5 for p in task.problems("train", 300))


def test_the_first_product_stays_within_ten_times_max_number():
    task = get_task("word_problems", max_steps=1, max_number=12)
    assert all(max(solve(p.get("question"))[3]) <= 120 for p in task.problems("train", 300))


def test_problems_are_deterministic_by_seed_and_distinct():
    task = get_task("word_problems")
    first = task.problems("train", 200, seed=5)
    assert first == get_task("word_problems").problems("train", 200, seed=5)
    assert first != task.problems("train", 200, seed=6)
    assert len({p.prompt for p in first}) == 200


def test_splits_never_share_a_story_structure():
    # the split key leaves out names, people and things: two stories of one structure are one problem
    task = get_task("word_problems", max_steps=2, max_number=20)
    train = [p.prompt for seed in range(2) for p in task.problems("train", 400, seed)]
    test = [p.prompt for seed in range(2) for p in task.problems("test", 200, seed)]
    assert not set(train) & set(test)
    train_keys = {solve(q)[1] for q in train}
    test_keys = {solve(q)[1] for q in test}
    assert train_keys and test_keys and not train_keys & test_keys


def test_the_template_wraps_the_raw_question():
    task = get_task("word_problems", template="Q: {question}\nA:")
    for p in task.problems("test", 20, seed=1):
        assert p.prompt == f"Q: {p.get('question')}\nA:"
        assert "{question}" not in p.prompt and solve(p.get("question"))[0] == int(p.answer)


@pytest.fixture(scope="module")
def problem():
    return get_task("word_problems").problems("test", 1, seed=0)[0]


@pytest.mark.parametrize("use_math_verify", [True, False])
def test_rewards_score_the_final_answer(problem, use_math_verify):
    task = get_task("word_problems", use_math_verify=use_math_verify)
    n, wrong = problem.answer, str(int(problem.answer) + 1)
    assert task.reward(problem, f"Working it out step by step, the answer is {n}") == 1.0
    assert task.reward(problem, f"She ends with \\boxed{{{n}}}.") == 1.0
    assert task.reward(problem, f"\\boxed{{{n}}} and then {wrong} more words") == 1.0  # a box beats a number
    assert task.reward(problem, f"{n}<eos>and then {wrong}") == 1.0  # the response ends at <eos>
    assert task.reward(problem, f"The answer is {wrong}") == 0.0
    assert task.reward(problem, f"\\boxed{{{wrong}}}") == 0.0
    assert task.reward(problem, "") == 0.0


def test_exact_match_alone_never_calls_math_verify(problem, monkeypatch):
    import rpeg.tasks.gsm8k as scoring  # word_problems scores as gsm8k does

    def refuse(*args):
        raise AssertionError("math-verify called with use_math_verify=False")

    monkeypatch.setattr(scoring, "math_verified", refuse)
    task = get_task("word_problems", use_math_verify=False)
    assert task.reward(problem, problem.answer) == 1.0
    assert task.reward(problem, str(int(problem.answer) + 1)) == 0.0


def test_format_bonus_pays_a_stated_wrong_number_only(problem):
    task = get_task("word_problems", format_bonus=0.1)
    assert task.reward(problem, str(int(problem.answer) + 1)) == 0.1
    assert task.reward(problem, "no idea") == 0.0
    assert task.reward(problem, problem.answer) == 1.0


@pytest.mark.parametrize("options, message", [
    ({"max_steps": 0}, r"word_problems: max_steps must be in 1\.\.4, got 0"),
    ({"max_steps": 5}, r"word_problems: max_steps must be in 1\.\.4, got 5"),
    ({"max_number": 3}, r"word_problems: max_number must be in 5\.\.1000, got 3"),
    ({"max_number": 1001}, r"word_problems: max_number must be in 5\.\.1000, got 1001"),
    ({"template": "Solve: "}, r"word_problems: template must contain \{question\}, got 'Solve: '"),
    ({"test_fraction": 1.0}, r"word_problems: test_fraction must be in \(0, 1\), got 1\.0"),
    ({"steps": 2}, r"task 'word_problems' has no option 'steps' \(known: .*max_steps"),
])
def test_bad_options_are_refused_with_the_value(options, message):
    with pytest.raises(RpegError, match=message):
        get_task("word_problems", **options)
