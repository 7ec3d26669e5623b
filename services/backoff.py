"""When to try a failing dependency (Redis, the broker) again: waits that double from a
first delay up to a cap, reset by a success. Clock-free: callers pass ``now``."""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    def __init__(self, first_s: float, max_s: float) -> None:
        self.first_s, self.max_s = first_s, max_s
        #: The wait after the last failure (0 while the dependency answers).
        self.delay = 0.0
        self._next_try = 0.0

    def due(self, now: float) -> bool:
        return now >= self._next_try

    def failed(self, now: float) -> None:
        self.delay = min(max(2 * self.delay, self.first_s), self.max_s)
        self._next_try = now + self.delay

    def succeeded(self) -> None:
        self.delay = self._next_try = 0.0
