"""A tiny discrete-event core: a heap of (time, sequence, event); an event's `fire` returns the
events it causes. Sequence numbers belong to each simulator, so two simulations never share state.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from typing import Protocol


class Event(Protocol):
    def fire(self, sim: Simulator) -> Iterable[tuple[float, Event]]: ...


class Simulator:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Event]] = []
        self._seq = itertools.count()
        self.fired = 0

    def at(self, time: float, event: Event) -> None:
        if time < self.now - 1e-12:
            raise ValueError(f"event scheduled in the past ({time} < {self.now})")
        heapq.heappush(self._heap, (time, next(self._seq), event))

    def run(self, max_events: int = 10_000_000) -> float:
        while self._heap:
            time, _, event = heapq.heappop(self._heap)
            self.now = time
            for t, e in event.fire(self) or ():
                self.at(t, e)
            self.fired += 1
            if self.fired > max_events:
                raise RuntimeError(f"simulation did not finish within {max_events} events")
        return self.now
