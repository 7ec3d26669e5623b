"""Oracle: the least-loaded worker of the whole pool, from the exact state.

Model: every request goes to the worker with the smallest queue at this instant, read
exactly from the simulator's :class:`WorldView`; caches and distance are ignored. Ties
(an idle pool) rotate: the scan starts one worker further at each decision, so equal
workers share the load instead of all going to worker 0. Paper: §5.3, Fig. 14 ("forwards
every request to the least-loaded worker in the whole worker pool"; its peak load factor
is the floor any scheme can reach). Assumptions: without a WorldView (the live router) it
uses the edge's queue estimates, so live it is "least-loaded by estimate", not an oracle;
the exact queue is what the simulator counts as queued at the worker, so requests still
crossing the WAN are not in it.
"""

from __future__ import annotations

from kvcompass.pipeline.clock import Clock
from kvcompass.routing.baselines.base import Baseline, Route
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.policy import RouteRequest
from kvcompass.routing.world import WorldView
from kvcompass.topology import Topology

__all__ = ["Oracle"]


class Oracle(Baseline):
    name = "oracle"

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        config: RoutingConfig,
        clock: Clock,
        world: WorldView | None,
    ) -> None:
        super().__init__(topology, origin_region, config, clock)
        self.world = world
        self._start = 0

    def _route(self, request: RouteRequest, prompt: int, count: int, explain: bool) -> Route:
        n, world = self.n_workers, self.world
        queues = self.queues.values if world is None else [world.queue_ms(w) for w in range(n)]
        start = self._start
        if not explain:
            self._start = (start + 1) % n
        rotated = [(start + i) % n for i in range(n)]
        order = sorted(rotated, key=queues.__getitem__)[:count]
        return Route(order, "least-loaded", queues=queues)
