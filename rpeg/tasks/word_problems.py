"""GSM8K-style word problems made from templates: a story of one to `max_steps` arithmetic steps.

GSM8K itself cannot be fetched here (nothing downloads at run time and no PyPI package ships it),
so this task writes problems of its shape: a person, a kind of thing, a starting amount, then steps
that buy, give away, pack into groups or share out, and a question about the end amount. Every
intermediate amount is a whole number in [0, 10 * max_number] and a share divides exactly, as in
GSM8K, so the gold answer is a non-negative integer:

    Maya has 7 boxes with 6 pencils in each box. She gives 12 pencils to her brother.
    How many pencils does Maya have now?                                         (answer 30)

The first sentence is either a plain amount or a product (boxes of n). A step's verb sets its
operation: `buys`/`finds`/`gets` add, `gives` subtracts, `shares equally among k` divides (last step
only, since the question then asks for one share).

Scoring is GSM8K's (rpeg.tasks.gsm8k): the response's last `\\boxed{...}` or else its last number,
compared as an exact decimal with the gold answer, then math-verify when that fails. The split key
is the problem's structure and numbers (not its names): two stories that differ only in who buys
what are the same problem and land in the same split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rpeg.errors import RpegError
from rpeg.tasks.base import Problem
from rpeg.tasks.gsm8k import FinalAnswerTask

PEOPLE = (("Maya", "she", "her"), ("Liam", "he", "his"), ("Ava", "she", "her"), ("Noah", "he", "his"),
          ("Zoe", "she", "her"), ("Omar", "he", "his"), ("Lena", "she", "her"), ("Ravi", "he", "his"))
THINGS = (("apples", "baskets"), ("pencils", "boxes"), ("stickers", "sheets"), ("marbles", "bags"),
          ("cookies", "trays"), ("stamps", "albums"), ("coins", "jars"), ("books", "shelves"))
OTHERS = ("a friend", "{pos} brother", "{pos} sister", "a neighbor", "{pos} teacher")


@dataclass(frozen=True, kw_only=True)
class WordProblems(FinalAnswerTask):
    name = "word_problems"
    max_steps: int = 2  # operations after the first sentence: each problem has 1..max_steps of them
    max_number: int = 20  # the largest number a sentence states
    template: str = "{question}"  # the prompt; {question} is the problem's text

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("max_steps", "max_number"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int):
                raise RpegError(f"word_problems: {name} must be an integer, got {getattr(self, name)!r}")
        if not 1 <= self.max_steps <= 4:
            raise RpegError(f"word_problems: max_steps must be in 1..4, got {self.max_steps!r}")
        if not 5 <= self.max_number <= 1000:
            raise RpegError(f"word_problems: max_number must be in 5..1000, got {self.max_number!r}")
        if "{question}" not in self.template:
            raise RpegError(f"word_problems: template must contain {{question}}, got {self.template!r}")

    def problems(self, split: str, n: int, seed: int = 0) -> list[Problem]:
        return self._draw(self._one, split, n, seed)

    def _one(self, rng: random.Random) -> tuple[str, Problem]:
        name, subj, pos = rng.choice(PEOPLE)
        thing, group = rng.choice(THINGS)
        top, cap = self.max_number, 10 * self.max_number
        if rng.random() < 0.5:
            a = rng.randint(2, min(top, 12))
            b = rng.randint(2, min(top, 12, cap // a))
            amount, key = a * b, [f"mul:{a}:{b}"]
            text = [f"{name} has {a} {group} with {b} {thing} in each."]
        else:
            amount = rng.randint(2, top)
            key, text = [f"n:{amount}"], [f"{name} has {amount} {thing}."]
        steps = rng.randint(1, self.max_steps)
        ask = f"How many {thing} does {name} have now?"
        for i in range(steps):
            last = i == steps - 1
            shares = [k for k in range(2, min(10, top) + 1) if amount % k == 0]
            ops = ["add"] * (amount + top <= cap) + ["sub"] * (amount >= 3) + ["div"] * (last and bool(shares))
            op = rng.choice(ops or ["add"])
            if op == "add":
                b = rng.randint(2, top)
                amount += b
                text.append(f"{subj.capitalize()} {rng.choice(('buys', 'finds', 'gets'))} {b} more {thing}.")
            elif op == "sub":
                b = rng.randint(2, min(top, amount - 1))
                amount -= b
                other = rng.choice(OTHERS).format(pos=pos)
                text.append(f"{subj.capitalize()} gives {b} {thing} to {other}.")
            else:
                k = rng.choice(shares)
                amount //= k
                b = k
                text.append(f"{subj.capitalize()} shares them equally among {k} friends.")
                ask = f"How many {thing} does each friend get?"
            key.append(f"{op}:{b}")
        question = " ".join(text + [ask])
        prompt = self.template.replace("{question}", question)
        return "|".join(key), Problem(prompt, str(amount), {"question": question})
