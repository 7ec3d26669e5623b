"""SkyWalker: a load balancer per region, locality first, selective pushing across regions.

Model: the origin region's balancer keeps a request at home while any local worker is
free (queue estimate 0), choosing among the free ones the longest cache match (the index;
ties: lower index). When none is, it pushes the request to a remote region only if that
region's pending queue is empty, i.e. one of its workers is free; the nearest such region
(RTT) wins, and inside it the free worker with the longest match. Otherwise the request
waits at home, on the least-loaded local worker (ties: longest match, then lower index).
Cache matches never pull a request to a remote region, and a busy remote holder is never
used: the failure §5.2 describes ("considers only queue occupancy, sending requests away
from KV cache holders"). Paper: §5.1 baseline (5), SkyWalker (EuroSys '26), "a load
balancer on each region ... forwards a request to a replica only when the replica's
pending queue is empty using selective pushing". Assumptions: a replica is a region (its
workers behind its balancer); "pending queue empty" is read as "has a free worker" on
this edge's queue estimates (reports plus its own forwarded work), the same estimates
every baseline gets; the cache-aware choice inside a region uses our index in place of
SkyWalker's per-region prefix trees.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcompass.index.reader import IndexReader
from kvcompass.levels import LevelPlan
from kvcompass.pipeline.clock import Clock
from kvcompass.routing.baselines.base import IndexedBaseline, Route
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.policy import RouteRequest
from kvcompass.topology import Topology

__all__ = ["SkyWalker"]


class SkyWalker(IndexedBaseline):
    name = "skywalker"

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        reader: IndexReader,
        plan: LevelPlan,
        config: RoutingConfig,
        clock: Clock,
    ) -> None:
        super().__init__(topology, origin_region, reader, plan, config, clock)
        remote = sorted(
            (r for r in topology.regions if r.name != origin_region),
            key=lambda r: topology.rtt_ms(origin_region, r.name),
        )
        self.remote_regions = tuple(tuple(w.index for w in r.workers) for r in remote)

    def _route(self, request: RouteRequest, prompt: int, count: int, explain: bool) -> Route:
        lengths, tiers = self.match(request)
        values = self.queues.values

        def free(workers: Sequence[int]) -> list[int]:
            return sorted((w for w in workers if values[w] <= 0.0), key=lambda w: -lengths[w])

        home = free(self.local)
        if home:
            return Route(self.least_loaded(home, count), "local-free", lengths, tiers)
        for workers in self.remote_regions:
            pushed = free(workers)
            if pushed:
                return Route(self.least_loaded(pushed, count), "push", lengths, tiers)
        queued = sorted(self.local, key=lambda w: (values[w], -lengths[w]))
        return Route(self.least_loaded(queued, count), "local-queued", lengths, tiers)
