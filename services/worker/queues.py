"""When a worker host sends its region's queue vector on ``kvc.queues``, and to whom.

The rule of paper §3.4: the own region's edges get a vector every ``local_period_s``
(they route most requests here and need it live); every ``remote_period_s`` (Δ) the
other regions get one too, except those that a response carried a vector to within Δ
(the piggybacked copy is as fresh). The routing core's ``QueueReporter`` states the same
rule; this host keeps its own until that lands on main (the lead may swap it in).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["QueueSchedule"]


class QueueSchedule:
    """Destinations of each period's vector for one region. Clock-free: pass ``now``."""

    def __init__(
        self,
        region: str,
        regions: Sequence[str],
        local_period_s: float,
        remote_period_s: float,
        now: float,
    ) -> None:
        self.region = region
        self._others = tuple(r for r in regions if r != region)
        self.local_period_s = local_period_s
        self.remote_period_s = remote_period_s
        self._next_remote = now
        self._piggybacked: dict[str, float] = {}

    def piggybacked(self, region: str, now: float) -> None:
        """A response just carried the vector to ``region``'s edge."""
        if region != self.region:
            self._piggybacked[region] = now

    def destinations(self, now: float) -> tuple[str, ...]:
        """The regions this period's vector goes to (own region first)."""
        if now < self._next_remote:
            return (self.region,)
        self._next_remote = max(self._next_remote + self.remote_period_s, now)
        fresh_since = now - self.remote_period_s
        remote = tuple(r for r in self._others if self._piggybacked.get(r, -1e18) < fresh_since)
        return (self.region, *remote)
