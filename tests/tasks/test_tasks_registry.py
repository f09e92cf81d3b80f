"""The task registry, Problem, and what every task promises: determinism by seed, disjoint
splits, a gold answer that scores 1.0, rewards in {0, format_bonus, 1} that never raise."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpeg.errors import RpegError
from rpeg.runtime.models import CHARS  # the tiny character-level tokenizer's alphabet
from rpeg.tasks import TASKS, Problem, Task, get_task

NAMES = sorted(TASKS)
SIZES = {"arithmetic": 40, "countdown": 40, "gsm8k": 1, "word_problems": 40}  # the gsm8k sample holds 7 train, 1 test


def sample(task: Task, split: str, seed: int = 0) -> list[Problem]:
    return task.problems(split, SIZES[task.name], seed)


def test_registry_names_every_task():
    assert NAMES == ["arithmetic", "countdown", "gsm8k", "word_problems"]
    for name in NAMES:
        task = get_task(name)
        assert isinstance(task, TASKS[name]) and task.name == name


def test_unknown_task_names_it_and_the_known_ones():
    with pytest.raises(RpegError, match=r"unknown task 'gsm9k' \(known: arithmetic, countdown, gsm8k, word_problems\)"):
        get_task("gsm9k")


def test_unknown_option_names_it_and_the_known_ones():
    with pytest.raises(RpegError, match=r"task 'arithmetic' has no option 'digits' \(known: .*level"):
        get_task("arithmetic", digits=3)


@pytest.mark.parametrize("name, options, message", [
    ("arithmetic", {"level": 6}, r"level must be 1\.\.5, got 6"),
    ("arithmetic", {"level": True}, r"level must be"),
    ("arithmetic", {"ops": ("add", "sub")}, r"ops must be a non-empty subset of add, mul; got \('add', 'sub'\)"),
    ("arithmetic", {"ops": ()}, r"ops must be"),
    ("countdown", {"sizes": (1, 3)}, r"sizes must be counts of numbers in 2\.\.6"),
    ("countdown", {"max_number": 0}, r"max_number must be an integer in 1\.\.1000, got 0"),
    ("gsm8k", {"template": "Q:"}, r"template must contain \{question\}"),
    ("countdown", {"test_fraction": 1.0}, r"countdown: test_fraction must be in \(0, 1\), got 1\.0"),
    ("gsm8k", {"format_bonus": 1.0}, r"gsm8k: format_bonus must be in \[0, 1\), got 1\.0"),
])
def test_bad_options_say_which_and_why(name, options, message):
    with pytest.raises(RpegError, match=message):
        get_task(name, **options)


def test_problem_meta_is_sorted_hashable_and_readable():
    p = Problem("1+2=", "3", {"op": "add", "a": 1})
    assert p.meta == (("a", 1), ("op", "add")) and p.get("op") == "add" and p.get("b", 0) == 0
    assert hash(p) == hash(Problem("1+2=", "3", (("op", "add"), ("a", 1))))
    with pytest.raises(RpegError, match="hashable"):
        Problem("q", "a", {"numbers": [1, 2]})


@pytest.mark.parametrize("name", NAMES)
def test_problems_are_deterministic_by_seed(name):
    task = get_task(name)
    assert sample(task, "train", seed=3) == sample(get_task(name), "train", seed=3)
    if name != "gsm8k":  # one sample test problem: every seed gives it
        assert sample(task, "train", seed=3) != sample(task, "train", seed=4)


@pytest.mark.parametrize("name", NAMES)
def test_splits_are_disjoint_and_prompts_distinct(name):
    task = get_task(name)
    train = {p.prompt for seed in range(3) for p in sample(task, "train", seed)}
    test = {p.prompt for seed in range(3) for p in sample(task, "test", seed)}
    assert train and test and not train & test
    problems = sample(task, "train")
    assert len({p.prompt for p in problems}) == len(problems)


@pytest.mark.parametrize("name", NAMES)
def test_bad_requests_are_refused(name):
    task = get_task(name)
    with pytest.raises(RpegError, match=r"unknown split 'val' \(known: train, test\)"):
        task.problems("val", 1, 0)
    with pytest.raises(RpegError, match="n must be a non-negative integer, got -1"):
        task.problems("train", -1, 0)
    assert task.problems("test", 0, 0) == []


@pytest.mark.parametrize("name", NAMES)
def test_the_gold_answer_scores_one(name):
    task = get_task(name)
    for p in sample(task, "train") + sample(task, "test"):
        assert task.reward(p, p.answer) == 1.0
        assert task.reward(p, "") == 0.0


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_tiny_task_text_fits_the_character_tokenizer(name):
    task = get_task(name, level=5) if name == "arithmetic" else get_task(name)
    text = "".join(p.prompt + p.answer for p in sample(task, "train"))
    assert set(text) <= set(CHARS)


@pytest.mark.parametrize("name, wrong", [("arithmetic", None), ("countdown", "1+1+1+1+1"), ("gsm8k", "#### 7")])
def test_format_bonus_pays_a_stated_wrong_answer_only(name, wrong):
    task = get_task(name, format_bonus=0.1)
    p = sample(task, "test")[0]
    wrong = wrong or str(int(p.answer) + 1)
    assert task.reward(p, p.answer) == 1.0
    assert task.reward(p, wrong) == 0.1
    assert task.reward(p, "no idea") == 0.0
    assert get_task(name).reward(p, wrong) == 0.0


PIECES = list(CHARS) + ["<eos>", "\\boxed{", "\\frac{", "**", "####", "é", "\x00", "9" * 50]
ADVERSARIAL = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=120, deadline=None)
@given(response=ADVERSARIAL)
def test_reward_never_raises_and_is_one_of_three_values(name, response):
    task = get_task(name, format_bonus=0.25)
    p = task.problems("test", 1, 0)[0]
    assert task.reward(p, response) in (0.0, 0.25, 1.0)


def test_tasks_import_without_torch_or_ray():
    root = pathlib.Path(__file__).resolve().parents[2] / "rpeg" / "tasks"
    pattern = re.compile(r"^\s*(import|from)\s+(torch|ray|transformers)\b", re.M)
    assert [p.name for p in root.rglob("*.py") if pattern.search(p.read_text())] == []
    script = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'ray', 'transformers'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
from rpeg.tasks import get_task
t = get_task('countdown')
p = t.problems('train', 5, 0)[0]
print(t.reward(p, p.answer))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1.0"
