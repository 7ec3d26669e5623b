"""The simulator's virtual time: a settable clock and a time-ordered event queue."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from kvcompass.pipeline.clock import ManualClock

__all__ = ["EventQueue", "Handler", "SimClock"]

Handler = Callable[[Any], None]


class SimClock(ManualClock):
    """A :class:`ManualClock` the event loop sets to each event's exact time.

    ``advance(t − now)`` would add float rounding at every step, and an engine whose next
    event is due at ``t`` must see ``monotonic() == t`` to process it.
    """

    def set(self, t: float) -> None:
        if t < self._monotonic:
            raise ValueError(f"a clock cannot go back from {self._monotonic} to {t}")
        self._monotonic = t
        self._wall_ns = round(t * 1e9)


class EventQueue:
    """Events as (time, handler, argument); equal times run in scheduling order, which
    makes a run a function of its inputs and seed alone."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Handler, Any]] = []
        self._order = itertools.count()

    def push(self, t: float, handler: Handler, arg: Any = None) -> None:
        heapq.heappush(self._heap, (t, next(self._order), handler, arg))

    def pop(self) -> tuple[float, Handler, Any]:
        t, _, handler, arg = heapq.heappop(self._heap)
        return t, handler, arg

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)
