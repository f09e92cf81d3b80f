"""GSM8K: the JSONL loader and its errors, the shipped sample, final-answer extraction, exact
numeric match and the math-verify fallback."""

from __future__ import annotations

import json
import threading

import pytest

from rpeg.errors import RpegError
from rpeg.tasks import GSM8K, Problem
from rpeg.tasks.gsm8k import SAMPLE, load_jsonl


def write(tmp_path, name: str, lines: list) -> str:
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


def test_the_sample_loads_with_normalized_answers():
    problems = load_jsonl(SAMPLE)
    assert 5 <= len(problems) <= 10
    assert "1200" in [p.answer for p in problems]  # "#### 1,200"
    assert all(p.answer.isdigit() and p.prompt == p.get("question") for p in problems)
    task = GSM8K()
    train, test = task.problems("train", 7), task.problems("test", 1)
    assert len(train) + len(test) == len(problems) and not {p.prompt for p in train} & {p.prompt for p in test}
    assert all(task.reward(p, f"So the answer is {p.answer}.") == 1.0 for p in problems)


def test_prompt_keys_numeric_answers_blank_lines_duplicates_and_template(tmp_path):
    path = write(tmp_path, "mixed.jsonl", [
        {"prompt": "What is 6 times 7?", "answer": 42},
        "",
        {"question": "How many legs do 3 cats have?", "answer": "3 * 4 = 12\n#### 12"},
        {"question": "How many legs do 3 cats have?", "answer": "#### 13"},  # repeat: the first wins
        {"question": "Half of 3?", "answer": "1.5"},
    ])
    problems = load_jsonl(path, "Q: {question}\nA:")
    assert [(p.prompt, p.answer, p.get("line")) for p in problems] == [
        ("Q: What is 6 times 7?\nA:", "42", 1),
        ("Q: How many legs do 3 cats have?\nA:", "12", 3),
        ("Q: Half of 3?\nA:", "1.5", 5),
    ]


@pytest.mark.parametrize("lines, message", [
    ([{"question": "q", "answer": "#### 1"}, '{"question": "q2", "answer": '], r"bad\.jsonl:2: malformed JSON"),
    ([{"question": "q", "answer": "#### 1"}, {"question": "q2"}],
     r"bad\.jsonl:2: needs a text 'question' \(or 'prompt'\) and an 'answer'; has keys \['question'\]"),
    ([{"text": "q", "answer": "1"}], r"bad\.jsonl:1: needs .* has keys \['answer', 'text'\]"),
    ([{"question": "q", "answer": None}], r"bad\.jsonl:1: needs"),
    ([[1, 2]], r"bad\.jsonl:1: expected a JSON object, got list"),
    ([{"question": "q", "answer": "work #### "}], r"bad\.jsonl:1: empty answer after '####'"),
    ([""], r"bad\.jsonl holds no problems"),
])
def test_bad_files_name_the_file_and_line(tmp_path, lines, message):
    path = write(tmp_path, "bad.jsonl", lines)
    with pytest.raises(RpegError, match=message):
        GSM8K(path=path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(RpegError, match=r"gsm8k: no such file: .*nope\.jsonl"):
        GSM8K(path=str(tmp_path / "nope.jsonl"))


def test_a_test_file_is_the_test_split_and_leaves_train(tmp_path):
    rows = [{"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"} for i in range(10)]
    train_path = write(tmp_path, "train.jsonl", rows)
    test_path = write(tmp_path, "test.jsonl", rows[7:])
    task = GSM8K(path=train_path, test_path=test_path)
    assert sorted(p.answer for p in task.problems("test", 3)) == ["14", "16", "18"]
    assert len(task.problems("train", 7)) == 7
    with pytest.raises(RpegError, match=r"has 7 train problems, asked for 8"):
        task.problems("train", 8)
    assert task.problems("train", 7, seed=1) == task.problems("train", 7, seed=1) != task.problems("train", 7, seed=2)


@pytest.mark.parametrize("response, given", [
    ("6 * 7 = 42\n#### 42", "42"),
    ("#### 1,234", "1234"),
    ("The answer is 1234.", "1234"),
    ("She pays $12.50 in all.", "12.50"),
    ("It is -3 degrees", "-3"),
    ("\\boxed{42} and then step 5", "42"),  # a boxed answer beats a later number
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{1} then \\boxed{ 2 }", "2"),
    ("\\boxed{3 then 4", "4"),  # unclosed: the last number
    ("7<eos>#### 8", "7"),
    ("no idea", None),
    ("", None),
])
def test_extract_the_final_answer(response, given):
    assert GSM8K().extract(response) == given


GOLD42 = Problem("q", "42")


@pytest.mark.parametrize("response, reward", [
    ("#### 42", 1.0),
    ("so 42.", 1.0),
    ("42.0", 1.0),
    ("$42", 1.0),
    ("\\boxed{42}", 1.0),
    ("Step 1: 40 + 2 = 42", 1.0),
    ("42<eos>#### 41", 1.0),
    ("#### 43", 0.0),
    ("42 apples, minus 2, leaves 40", 0.0),
    ("\\boxed{42} wait no \\boxed{41}", 0.0),
    ("4" * 5000, 0.0),
    ("", 0.0),
])
def test_exact_numeric_match_on_the_final_answer(response, reward):
    assert GSM8K().reward(GOLD42, response) == reward


GOLD_HALF = Problem("q", "1/2")


@pytest.mark.parametrize("gold, response, reward", [
    ("1/2", "\\boxed{0.5}", 1.0),
    ("1/2", "\\frac{1}{2}", 1.0),
    ("1/2", "The answer is $\\frac{1}{2}$.", 1.0),
    ("1/2", "\\boxed{\\dfrac{2}{4}}", 1.0),
    ("0.5", "\\boxed{\\frac{1}{2}}", 1.0),
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\frac{\\sqrt 3}{2}}", 1.0),
    ("1/2", "\\boxed{0.25}", 0.0),
    ("1/2", "\\boxed{2}", 0.0),
    ("1/2", "\\boxed{" * 300, 0.0),
])
def test_math_verify_judges_free_form_answers(gold, response, reward):
    assert GSM8K().reward(Problem("q", gold), response) == reward


def test_math_verify_can_be_turned_off():
    assert GSM8K(use_math_verify=False).reward(GOLD_HALF, "\\frac{1}{2}") == 0.0
    assert GSM8K(use_math_verify=False).reward(GOLD42, "#### 42") == 1.0


def test_math_verify_works_off_the_main_thread():
    # math-verify's SIGALRM timeout refuses to run off the main thread; the task drops it there
    out = []
    thread = threading.Thread(target=lambda: out.append(GSM8K().reward(GOLD_HALF, "\\boxed{0.5}")))
    thread.start()
    thread.join()
    assert out == [1.0]
