"""Synthetic addition and multiplication for tiny character-level models.

Prompts are `12+7=` / `12*7=` and the answer is the decimal result (`19`); the characters are
digits, `+`, `*` and `=` only. Level L uses two L-digit operands (level 1: 0-9, level 2: 10-99,
..., level 5: 10000-99999), for both operations.

Scoring: the response is cut at the first newline or `<eos>`, its spaces are removed, and the
first integer in what is left must equal the answer exactly (`019` does not match `19`; exact
string match also means a 10,000-digit response is never converted to an int).

Levels 1-2 are small enough to enumerate (100 / 8,100 operand pairs per operation), so asking
for more problems than a split holds fails with the exact count; higher levels are sampled.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from rpeg.errors import RpegError
from rpeg.tasks.base import EOS, Problem, Task, cut

OPS = {"add": ("+", lambda a, b: a + b), "mul": ("*", lambda a, b: a * b)}
LEVELS = range(1, 6)
ENUMERATE_BELOW = 20_000  # operand pairs: enumerate the space up to this size, else sample
INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True, kw_only=True)
class Arithmetic(Task):
    name = "arithmetic"
    ops: tuple[str, ...] = ("add", "mul")
    level: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        ops = (self.ops,) if isinstance(self.ops, str) else tuple(self.ops)
        unknown = [op for op in ops if op not in OPS]
        if not ops or unknown:
            raise RpegError(f"arithmetic: ops must be a non-empty subset of {', '.join(OPS)}; got {self.ops!r}")
        object.__setattr__(self, "ops", tuple(dict.fromkeys(ops)))
        if type(self.level) is not int or self.level not in LEVELS:
            raise RpegError(f"arithmetic: level must be 1..{LEVELS[-1]}, got {self.level!r}")

    def operand_range(self) -> range:
        return range(0 if self.level == 1 else 10 ** (self.level - 1), 10**self.level)

    def key(self, op: str, a: int, b: int) -> str:
        """The split key of `a op b`: operand order does not matter, so 3+5 and 5+3 share a split."""
        return f"{op}:{min(a, b)}:{max(a, b)}"

    def make(self, op: str, a: int, b: int) -> Problem:
        symbol, fn = OPS[op]
        return Problem(f"{a}{symbol}{b}=", str(fn(a, b)), {"op": op, "a": a, "b": b, "level": self.level})

    def problems(self, split: str, n: int, seed: int = 0) -> list[Problem]:
        self._check_request(split, n)
        r = self.operand_range()
        if len(r) ** 2 * len(self.ops) <= ENUMERATE_BELOW:
            space = [(op, a, b) for op in self.ops for a in r for b in r if self.split_of(self.key(op, a, b)) == split]
            return [self.make(*triple) for triple in self._take(space, split, n, seed)]

        def draw(rng: random.Random) -> tuple[str, Problem]:
            triple = rng.choice(self.ops), rng.choice(r), rng.choice(r)
            return self.key(*triple), self.make(*triple)

        return self._draw(draw, split, n, seed)

    def extract(self, response: str) -> str | None:
        match = INTEGER.search(cut(response, ("\n", EOS)).replace(" ", ""))
        return match.group() if match else None

    def is_correct(self, problem: Problem, response: str) -> bool:
        return self.extract(response) == problem.answer
