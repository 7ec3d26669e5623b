"""Local-only ("local-least-loaded"): a region without a discovery plane.

Model: the origin region's worker with the lowest queue estimate (ties: lower index);
caches and other regions are ignored. Paper: the local-only reference of §3.5 and the
testbed demo's baseline (each region serving its own traffic). Assumption: the queue
estimate includes the work this edge forwarded since the last report (as for every
baseline), so a burst spreads over the region instead of piling on one idle worker.
"""

from __future__ import annotations

from kvcompass.routing.baselines.base import Baseline, Route
from kvcompass.routing.policy import RouteRequest

__all__ = ["LocalLeastLoaded"]


class LocalLeastLoaded(Baseline):
    """Never leaves its region: the least-loaded local worker, then the next ones."""

    name = "local-least-loaded"

    def _route(self, request: RouteRequest, prompt: int, count: int, explain: bool) -> Route:
        return Route(sorted(self.local, key=self.queues.values.__getitem__), "least-loaded")
