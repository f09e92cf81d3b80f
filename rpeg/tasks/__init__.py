"""Datasets and verifiable rewards for RL runs, registered by name: `get_task("countdown")`, and the
environments of multi-turn, tool-using episodes: `get_environment("calculator", task, max_turns=3)`.

Pure Python (no torch, no ray): a trainer asks a task for prompts with `problems(split, n, seed)`
and scores each sampled response with `reward(problem, response)`. base.py holds the interface
and the train/test split; one file per task. tools.py, chat.py, environment.py and episode.py are
the agent side (docs/agents.md).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

from rpeg.errors import RpegError
from rpeg.tasks.arithmetic import Arithmetic
from rpeg.tasks.base import EOS, Problem, Task
from rpeg.tasks.calculator import calculator_env
from rpeg.tasks.countdown import Countdown
from rpeg.tasks.environment import Environment
from rpeg.tasks.gsm8k import GSM8K
from rpeg.tasks.word_problems import WordProblems

TASKS: dict[str, type[Task]] = {t.name: t for t in (Arithmetic, Countdown, GSM8K, WordProblems)}
# name -> factory(task, **options) -> a fresh Environment (one per episode)
ENVIRONMENTS: dict[str, Callable[..., Environment]] = {"calculator": calculator_env}


def get_task(name: str, **options) -> Task:
    """The task `name` built with `options` (its dataclass fields)."""
    if not isinstance(name, str) or name not in TASKS:
        raise RpegError(f"unknown task {name!r} (known: {', '.join(TASKS)})")
    cls = TASKS[name]
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise RpegError(f"task {name!r} has no option {unknown[0]!r} (known: {', '.join(known)})")
    try:
        return cls(**options)
    except (TypeError, ValueError) as e:  # a value of the wrong kind (ops: 0, level: [1]): one line, not a traceback
        raise RpegError(f"task {name!r}: the options {_shown(options)} do not make one ({e})") from None


def _shown(options: dict) -> str:
    text = ", ".join(f"{k}: {v!r}" for k, v in options.items())
    return text if len(text) <= 200 else text[:197] + "..."


def environment_options(name: str, options: dict) -> None:
    """Refuse an unknown environment or option in one line (before any worker starts)."""
    if not isinstance(name, str) or name not in ENVIRONMENTS:
        raise RpegError(f"unknown environment {name!r} (known: {', '.join(ENVIRONMENTS)})")
    known = [p for p in inspect.signature(ENVIRONMENTS[name]).parameters if p != "task"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise RpegError(f"environment {name!r} has no option {unknown[0]!r} (known: {', '.join(known)})")


def get_environment(name: str, task: Task, **options) -> Callable[[], Environment]:
    """A factory of fresh `name` environments on `task` with `options` (one per episode)."""
    environment_options(name, options)
    factory = ENVIRONMENTS[name]
    try:
        factory(task, **options)  # fail here, once, on a task or value the environment refuses
    except (TypeError, ValueError) as e:
        raise RpegError(f"environment {name!r}: the options {_shown(options)} do not make one ({e})") from None
    return lambda: factory(task, **options)


__all__ = ["ENVIRONMENTS", "EOS", "GSM8K", "TASKS", "Arithmetic", "Countdown", "Environment", "Problem", "Task",
           "WordProblems", "environment_options", "get_environment", "get_task"]
