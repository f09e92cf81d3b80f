"""Problems, the Task interface, and the train/test split every task shares.

A task makes `Problem`s (prompt, gold answer, metadata) deterministically from a seed and scores a
response with a verifiable reward:

    reward = 1.0           the response's answer is correct          (is_correct)
           = format_bonus  it states an answer (extract() is not None) but a wrong one
           = 0.0           it states none

`format_bonus` is 0.0 by default: pure outcome reward, as in DeepSeek-R1. TinyZero's countdown
gives 0.1 for a well-formed wrong answer; set `format_bonus=0.1` for that shaping. It must stay
below 1.0 so a wrong answer never pays as much as a right one.

Splits: a problem belongs to "test" when a stable hash (blake2b, not Python's salted `hash`) of
its canonical key falls below `test_fraction`, else to "train". The key names the problem up to
symmetry (`add:3:5` for both 3+5 and 5+3), so a train set never holds a reordering of a test
problem, whatever the seeds. Within one `problems()` call every prompt is distinct.
"""

from __future__ import annotations

import hashlib
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from rpeg.errors import RpegError

SPLITS = ("train", "test")
# Where a tiny model's response ends: the first of these (the tokenizer's end token, decoded with
# its special tokens kept, or a newline for the one-line tasks).
EOS = "<eos>"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Problem:
    prompt: str
    answer: str  # the gold answer; as a response it scores 1.0 (countdown: one solution)
    meta: tuple[tuple[str, Any], ...] = ()  # sorted (key, value) pairs; a dict is accepted

    def __post_init__(self) -> None:
        meta = self.meta.items() if isinstance(self.meta, Mapping) else self.meta
        meta = tuple(sorted(((str(k), v) for k, v in meta), key=lambda kv: kv[0]))
        try:
            hash(meta)
        except TypeError:
            raise RpegError(f"Problem meta must hold hashable values (tuples, not lists): {meta!r}") from None
        object.__setattr__(self, "meta", meta)

    def get(self, key: str, default: Any = None) -> Any:
        """The meta value under `key` (`problem.get("target")`)."""
        return next((v for k, v in self.meta if k == key), default)


@dataclass(frozen=True, kw_only=True)
class Task(ABC):
    """A source of problems with a verifiable reward. Subclasses are frozen keyword dataclasses
    whose fields are the options `get_task(name, **options)` accepts."""

    name: ClassVar[str]
    test_fraction: float = 0.2  # share of the problem space held out for "test"
    format_bonus: float = 0.0  # reward for a stated but wrong answer (see the module docstring)

    def __post_init__(self) -> None:
        if not 0.0 < self.test_fraction < 1.0:
            raise RpegError(f"{self.name}: test_fraction must be in (0, 1), got {self.test_fraction!r}")
        if not 0.0 <= self.format_bonus < 1.0:
            raise RpegError(f"{self.name}: format_bonus must be in [0, 1), got {self.format_bonus!r}")

    @abstractmethod
    def problems(self, split: str, n: int, seed: int = 0) -> list[Problem]:
        """`n` distinct problems of `split`, the same ones for the same seed."""

    @abstractmethod
    def extract(self, response: str) -> str | None:
        """The answer `response` gives, or None when it gives none."""

    @abstractmethod
    def is_correct(self, problem: Problem, response: str) -> bool:
        """Whether `response` answers `problem` correctly. Never raises on any string."""

    def reward(self, problem: Problem, response: str) -> float:
        if self.is_correct(problem, response):
            return 1.0
        return self.format_bonus if self.format_bonus and self.extract(response) is not None else 0.0

    def accuracy(self, problems: list[Problem], responses: list[str]) -> float:
        """The share of `responses` that answer their problem correctly (full reward)."""
        return sum(self.reward(p, r) >= 1.0 for p, r in zip(problems, responses)) / len(problems)

    def split_of(self, key: str) -> str:
        """"test" or "train" for the problem with canonical key `key`."""
        digest = hashlib.blake2b(f"{self.name}:{key}".encode(), digest_size=8).digest()
        return "test" if int.from_bytes(digest, "big") / 2**64 < self.test_fraction else "train"

    def _check_request(self, split: str, n: int) -> None:
        if split not in SPLITS:
            raise RpegError(f"{self.name}: unknown split {split!r} (known: {', '.join(SPLITS)})")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RpegError(f"{self.name}: n must be a non-negative integer, got {n!r}")

    def _take(self, pool: list[T], split: str, n: int, seed: int) -> list[T]:
        """`n` of `split`'s problems `pool` (problems, or what makes them), in seeded order."""
        self._check_request(split, n)
        if n > len(pool):
            raise RpegError(f"{self!r} has {len(pool)} {split} problems, asked for {n}")
        pool = list(pool)
        random.Random(f"{seed}:{split}").shuffle(pool)
        return pool[:n]

    def _draw(self, draw: Callable[[random.Random], tuple[str, Problem]], split: str, n: int,
              seed: int) -> list[Problem]:
        """`n` distinct problems of `split` by rejection sampling `draw(rng)` -> (key, problem)."""
        self._check_request(split, n)
        rng = random.Random(f"{seed}:{split}")  # str seeds hash with sha512: stable across runs
        out: list[Problem] = []
        seen: set[str] = set()
        tries, limit = 0, 1000 + 50 * n
        while len(out) < n:
            if tries == limit:
                raise RpegError(f"{self!r}: found only {len(out)} distinct {split} problems in {tries} draws, "
                                f"asked for {n}; ask for fewer or widen the task's options")
            tries += 1
            key, problem = draw(rng)
            if problem.prompt not in seen and self.split_of(key) == split:
                seen.add(problem.prompt)
                out.append(problem)
        return out


def cut(response: str, stops: Iterable[str]) -> str:
    """`response` up to the first of `stops`."""
    for stop in stops:
        i = response.find(stop)
        if i >= 0:
            response = response[:i]
    return response
