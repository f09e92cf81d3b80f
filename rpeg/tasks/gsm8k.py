"""GSM8K-style math word problems from JSONL files, scored on the final answer.

Each line is `{"question": ..., "answer": "... #### 42"}` (GSM8K's own format; the gold answer is
what follows the last `####`, commas removed) or `{"prompt": ..., "answer": ...}`. Blank lines are
skipped; a repeated question keeps its first line. The default file is a small sample shipped
with the package (`data/gsm8k-sample.jsonl`, problems written for RPEG, not taken from GSM8K).

Splits: with one file, a question's hash decides its split (base.py); with `test_path`, that file
is the test split and `path` the train split, less any question that is also in the test file.

Scoring: the response (up to `<eos>`) gives its final answer as the content of its last
`\\boxed{...}`, else its last number (`#### 1,234` and `the answer is 1234.` both give `1234`).
That answer is correct when it equals the gold one as an exact decimal (`42.0` = `42`). When it
does not, and `use_math_verify` is on, math-verify compares the gold answer with the response's
tail (its own extraction: boxed, then the last LaTeX or plain expression), so free-form answers
such as gold `1/2` against `\\frac{1}{2}` or `\\boxed{0.5}` count. math-verify bounds its time
with SIGALRM, which works only on the main thread; elsewhere (a thread pool) it runs without
its timeout, on at most the response's last 2,000 characters.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import threading
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from rpeg.errors import RpegError
from rpeg.tasks.base import EOS, Problem, Task, cut

SAMPLE = str(importlib.resources.files("rpeg.tasks") / "data" / "gsm8k-sample.jsonl")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
DECIMAL = re.compile(r"-?\d+(?:\.\d+)?")
BOXED = "\\boxed{"
MATH_VERIFY_CHARS = 2000
MATH_VERIFY_TIMEOUT_S = 5


@dataclass(frozen=True, kw_only=True)
class FinalAnswerTask(Task):
    """Scoring by the final answer (GSM8K's): the last `\\boxed{...}` or else the last number, as an
    exact decimal, then math-verify when that fails and `use_math_verify` is on."""

    use_math_verify: bool = True

    def extract(self, response: str) -> str | None:
        return extract_answer(cut(response, (EOS,)))

    def is_correct(self, problem: Problem, response: str) -> bool:
        given = self.extract(response)
        if given is not None and same_number(given, problem.answer):
            return True
        return self.use_math_verify and math_verified(problem.answer, cut(response, (EOS,)))


@dataclass(frozen=True, kw_only=True)
class GSM8K(FinalAnswerTask):
    name = "gsm8k"
    path: str = SAMPLE  # JSONL; the train split, or both splits when there is no test_path
    test_path: str | None = None
    template: str = "{question}"  # the prompt; {question} is the problem's text
    _splits: dict[str, list[Problem]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if "{question}" not in self.template:
            raise RpegError(f"gsm8k: template must contain {{question}}, got {self.template!r}")
        object.__setattr__(self, "path", os.fspath(self.path))
        problems = load_jsonl(self.path, self.template)
        if self.test_path is None:
            train = [p for p in problems if self.split_of(p.get("question")) == "train"]
            test = [p for p in problems if self.split_of(p.get("question")) == "test"]
        else:
            test = load_jsonl(self.test_path, self.template)
            held_out = {p.get("question") for p in test}
            train = [p for p in problems if p.get("question") not in held_out]
        self._splits.update(train=train, test=test)

    def problems(self, split: str, n: int, seed: int = 0) -> list[Problem]:
        self._check_request(split, n)
        return self._take(self._splits[split], split, n, seed)

def load_jsonl(path: str, template: str = "{question}") -> list[Problem]:
    """Problems from a GSM8K-style JSONL file; every defect is an RpegError naming file and line."""
    if not os.path.isfile(path):
        raise RpegError(f"gsm8k: no such file: {path}")
    problems: dict[str, Problem] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise RpegError(f"{path}:{line_no}: malformed JSON: {e.msg} (column {e.colno})") from None
            if not isinstance(row, dict):
                raise RpegError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
            question = row.get("question", row.get("prompt"))
            answer = row.get("answer")
            if not isinstance(question, str) or not question.strip() or not isinstance(answer, (str, int, float)) \
                    or isinstance(answer, bool):
                raise RpegError(f"{path}:{line_no}: needs a text 'question' (or 'prompt') and an 'answer'; "
                                f"has keys {sorted(row)}")
            gold = gold_answer(str(answer))
            if not gold:
                raise RpegError(f"{path}:{line_no}: empty answer after '####': {answer!r}")
            problems.setdefault(question, Problem(template.replace("{question}", question), gold,
                                                  {"question": question, "line": line_no}))
    if not problems:
        raise RpegError(f"gsm8k: {path} holds no problems")
    return list(problems.values())


def extract_answer(text: str) -> str | None:
    """The answer `text` states: its last `\\boxed{...}`, else its last number (commas removed)."""
    boxed = last_boxed(text)
    if boxed:
        return boxed
    numbers = NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def gold_answer(answer: str) -> str:
    """The text after the last `####` (all of it when there is none), stripped, commas removed."""
    return answer.rsplit("####", 1)[-1].strip().replace(",", "")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` with balanced braces, stripped; None if there is none."""
    start = text.rfind(BOXED)
    while start >= 0:
        depth, i = 1, start + len(BOXED)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len(BOXED):i - 1].strip()
        start = text.rfind(BOXED, 0, start)  # unclosed: try an earlier one
    return None


def same_number(given: str, gold: str) -> bool:
    """Whether both are plain decimals (commas and a leading $ allowed) of the same value."""
    a, b = (s.strip().lstrip("$").replace(",", "") for s in (given, gold))
    if not (DECIMAL.fullmatch(a) and DECIMAL.fullmatch(b)):
        return False
    if max(len(a), len(b)) > 100:  # a 4,000-digit "answer" compares as text, not as a number
        return a == b
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return False


def math_verified(gold: str, response: str) -> bool:
    """math-verify's judgement of `response` against `gold`; False on any failure of its own."""
    try:
        from math_verify import parse, verify
    except ImportError:
        raise RpegError("gsm8k: math-verify is not installed (pip install math-verify), or pass "
                        "use_math_verify=False to score by exact numeric match only") from None
    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        gold_parsed = parse(f"${gold}$", parsing_timeout=timeout)
        given = parse(response[-MATH_VERIFY_CHARS:], parsing_timeout=timeout)
        return bool(gold_parsed and given and verify(gold_parsed, given, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - a reward never crashes a training step on odd text
        return False
