"""Round-robin: every worker of every region in turn, whatever its load, cache or distance.

Model: a cursor over the global worker indices, advanced once per decision. Paper: the
load-blind reference point (no section describes it; the issue asks for it).
Assumption: each edge keeps its own cursor, starting at worker 0 (edges do not share one).
"""

from __future__ import annotations

from kvcompass.pipeline.clock import Clock
from kvcompass.routing.baselines.base import Baseline, Route
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.policy import RouteRequest
from kvcompass.topology import Topology

__all__ = ["RoundRobin"]


class RoundRobin(Baseline):
    name = "round-robin"

    def __init__(
        self, topology: Topology, origin_region: str, config: RoutingConfig, clock: Clock
    ) -> None:
        super().__init__(topology, origin_region, config, clock)
        self._next = 0

    def _route(self, request: RouteRequest, prompt: int, count: int, explain: bool) -> Route:
        start, n = self._next, self.n_workers
        if not explain:
            self._next = (start + 1) % n
        return Route([(start + i) % n for i in range(min(n, count))], "round-robin")
