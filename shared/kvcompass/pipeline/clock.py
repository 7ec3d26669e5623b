"""The one place pipeline code gets time from, so tests and the simulator can set it."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock", "stamp_ns"]

#: The latest wall-clock stamp a message carries (its field is a non-negative int64).
_LATEST_NS = (1 << 63) - 1


class Clock(Protocol):
    """Elapsed time for deadlines and cadences; wall time only to stamp messages."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards."""
        ...

    def wall_ns(self) -> int:
        """Nanoseconds since the Unix epoch (may step; never used for ordering)."""
        ...


def stamp_ns(clock: Clock) -> int:
    """``clock.wall_ns()`` to stamp a message with; ValueError outside 0..2^63-1, which
    no message may carry (callers check before taking anything to send)."""
    now = clock.wall_ns()
    if not 0 <= now <= _LATEST_NS:
        raise ValueError(f"the clock reads {now} ns, outside 0..2^63-1")
    return now


class SystemClock:
    """The process's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ns(self) -> int:
        return time.time_ns()


class ManualClock:
    """A clock that moves only when told to (tests, the simulator)."""

    def __init__(self, monotonic: float = 0.0, wall_ns: int = 0) -> None:
        self._monotonic = monotonic
        self._wall_ns = wall_ns

    def monotonic(self) -> float:
        return self._monotonic

    def wall_ns(self) -> int:
        return self._wall_ns

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds`` (≥ 0)."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back {-seconds} s")
        self._monotonic += seconds
        self._wall_ns += round(seconds * 1e9)
