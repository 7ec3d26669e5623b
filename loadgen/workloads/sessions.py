"""Which conversation an arrival belongs to, when arrival times are given (Poisson or a
trace) and conversations have think times between turns.

An arrival continues the open session that has been ready longest (its think time since
its previous turn has passed); if none is ready it opens a new session. Arrival times
are thus exactly the given process, think time is the least gap between two turns, and
sessions open at whatever rate keeps up with the arrivals (rate / mean turns in steady
state). Open sessions are capped (each holds its prompt): at the cap, the session ready
soonest continues early, so think times shrink under a rate the cap cannot hold.
"""

from __future__ import annotations

import heapq
from typing import Generic, TypeVar

__all__ = ["TurnScheduler"]

S = TypeVar("S")


class TurnScheduler(Generic[S]):
    def __init__(self, max_open: int) -> None:
        if max_open < 1:
            raise ValueError("at least one open session")
        self.max_open = max_open
        self._ready: list[tuple[float, int, S]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._ready)

    def next(self, now: float) -> S | None:
        """The session whose turn ``now`` is, or None: open a new one."""
        if self._ready and (self._ready[0][0] <= now or len(self._ready) >= self.max_open):
            return heapq.heappop(self._ready)[2]
        return None

    def wait(self, session: S, ready_at: float) -> None:
        """``session`` has another turn, not before ``ready_at``."""
        self._seq += 1
        heapq.heappush(self._ready, (ready_at, self._seq, session))
