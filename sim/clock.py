"""Virtual time: a heap of events ordered by (time, sequence number). Nothing sleeps.

The sequence number breaks ties in the order events were scheduled, so two events at the same
instant are always handled in the same order, run after run.
"""

from __future__ import annotations

import heapq
from typing import Generic, TypeVar

E = TypeVar("E")


class EventQueue(Generic[E]):
    """Events scheduled at simulated times; `now` is the time of the last one popped."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, E]] = []
        self._seq = 0
        self.now = 0.0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, time: float, event: E) -> None:
        if time < self.now:
            raise ValueError(f"cannot schedule at {time} s, before now ({self.now} s)")
        heapq.heappush(self._heap, (time, self._seq, event))
        self._seq += 1

    def peek_time(self) -> float:
        return self._heap[0][0]

    def pop(self) -> tuple[float, E]:
        time, _, event = heapq.heappop(self._heap)
        self.now = time
        return time, event
