"""Episode: a multi-turn step's workload — turns, observation tokens, tool latency — on the job.

A job whose rollouts are episodes (docs/agents.md) keeps `job.response` as everything after the prompt
(sampled and observation tokens: what the logprob and training passes read), and says how it splits:

    turns               mean replies the model samples per episode (1: single-turn)
    max_turns           the environment's cap
    observation_tokens  tokens the environment appends after each reply that calls a tool
    tool_latency_s      wall seconds of one tool call (its mean)
    tool_cpu_s          host CPU seconds of one call (the tool pool's load)
    prefix_cache        the engine keeps an episode's context cached between turns (vLLM's automatic
                        prefix caching); without it each turn prefills the whole context again

A turn-count of 1 with no observation tokens is a single-turn job; `Job.episode` is None then.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from rpeg.errors import RpegError
from rpeg.graph.bounds import MAX_TOKENS, problem, problems

MAX_TURNS = 1_000_000  # a reply has a token at least; verl's "no limit" is max_length // 3 turns
MAX_TOOL_SECONDS = 86_400.0  # a day per call: anything longer is a typo


@dataclass(frozen=True, kw_only=True, slots=True)
class Episode:
    turns: float = 1.0
    max_turns: int = 1
    observation_tokens: float = 0.0
    tool_latency_s: float = 0.0
    tool_cpu_s: float = 0.0
    prefix_cache: bool = True

    def __post_init__(self) -> None:
        bad = problems([problem("episode.turns", self.turns, positive=True, maximum=MAX_TURNS),
                        problem("episode.max_turns", self.max_turns, positive=True, maximum=MAX_TURNS),
                        problem("episode.observation_tokens", self.observation_tokens, minimum=0, maximum=MAX_TOKENS),
                        problem("episode.tool_latency_s", self.tool_latency_s, minimum=0, maximum=MAX_TOOL_SECONDS),
                        problem("episode.tool_cpu_s", self.tool_cpu_s, minimum=0, maximum=MAX_TOOL_SECONDS)])
        if not bad and self.turns < 1:
            bad.append(f"episode.turns = {self.turns:g}: an episode has at least one reply")
        if not bad and self.turns > self.max_turns:
            bad.append(f"episode.turns = {self.turns:g} exceeds episode.max_turns = {self.max_turns}")
        if not isinstance(self.prefix_cache, bool):
            bad.append(f"episode.prefix_cache = {self.prefix_cache!r}: expected true or false")
        if bad:
            raise RpegError("job: " + "; ".join(bad))
        for name in ("turns", "observation_tokens", "tool_latency_s", "tool_cpu_s"):  # one YAML spelling
            object.__setattr__(self, name, float(getattr(self, name)))

    def replace(self, **changes) -> Episode:
        return dataclasses.replace(self, **changes)

    @property
    def tool_turns(self) -> float:
        """Replies per episode that call a tool (every reply but the last)."""
        return self.turns - 1.0

    @property
    def rounds(self) -> int:
        """Rounds of turns a step's episodes take when their turns go to the engine together: the mean
        turns rounded up, at most max_turns."""
        return max(1, min(self.max_turns, math.ceil(self.turns - 1e-9)))

    def observed(self) -> float:
        """Observation tokens per episode (mean)."""
        return self.tool_turns * self.observation_tokens

    def sampled_share(self, response_mean: float) -> float:
        """The share of a `response_mean`-token response the model samples (the rest is observations)."""
        return 1.0 - self.observed() / response_mean

    def describe(self) -> str:
        return (f"{self.turns:g} turns (max {self.max_turns}), {self.observation_tokens:g} observation tokens and "
                f"{self.tool_latency_s:g} s per tool call, prefix cache {'on' if self.prefix_cache else 'off'}")
