"""Datasets and verifiable rewards for RL runs, registered by name: `get_task("countdown")`.

Pure Python (no torch, no ray): a trainer asks a task for prompts with `problems(split, n, seed)`
and scores each sampled response with `reward(problem, response)`. base.py holds the interface
and the train/test split; one file per task.
"""

from __future__ import annotations

import dataclasses

from rpeg.errors import RpegError
from rpeg.tasks.arithmetic import Arithmetic
from rpeg.tasks.base import EOS, Problem, Task
from rpeg.tasks.countdown import Countdown
from rpeg.tasks.gsm8k import GSM8K
from rpeg.tasks.word_problems import WordProblems

TASKS: dict[str, type[Task]] = {t.name: t for t in (Arithmetic, Countdown, GSM8K, WordProblems)}


def get_task(name: str, **options) -> Task:
    """The task `name` built with `options` (its dataclass fields)."""
    if not isinstance(name, str) or name not in TASKS:
        raise RpegError(f"unknown task {name!r} (known: {', '.join(TASKS)})")
    cls = TASKS[name]
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise RpegError(f"task {name!r} has no option {unknown[0]!r} (known: {', '.join(known)})")
    return cls(**options)


__all__ = ["EOS", "GSM8K", "TASKS", "Arithmetic", "Countdown", "Problem", "Task", "WordProblems", "get_task"]
