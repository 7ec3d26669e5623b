"""Central directory: one coordinator with the exact global state, one WAN round trip away.

Model: every request's decision is made at a coordinator that knows every worker's
cached prefixes (the index: what workers publish) and every worker's queue exactly (the
simulator's :class:`WorldView`); it ranks the workers by the same joint score as
KVCompass (WAN from the origin, queue, capacity price, residual prefill, reload) with
full belief in its own directory. The edge pays the round trip from its region to the
coordinator's before the request can leave (``Decision.lookup_ms``). The coordinator's
region is the 1-median of the topology: the region with the smallest worker-weighted mean
RTT to every region (ties: the first listed), i.e. where a provider would put it to serve
its traffic fastest. Paper: §5.1 baseline (4), "a centralized coordinator with global KV
cache state", and §1/§2 (each query pays a wide-area round trip). Assumptions: the
coordinator's choice rule is KVCompass's score (the paper does not give one; this isolates
the cost of central discovery); the directory is read through this edge's index replica
(its contents are the index's); without a WorldView (the live router) the queues are the
edge's estimates, not exact; the coordinator is never a bottleneck (no queueing there).
"""

from __future__ import annotations

from kvcompass.index.reader import IndexReader
from kvcompass.levels import LevelPlan
from kvcompass.pipeline.clock import Clock
from kvcompass.routing.baselines.base import IndexedBaseline, Route
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.policy import RouteRequest
from kvcompass.routing.score import JointScore
from kvcompass.routing.world import WorldView
from kvcompass.topology import Topology

__all__ = ["CentralDirectory", "coordinator_region"]


def coordinator_region(topology: Topology) -> str:
    """The region with the least worker-weighted mean RTT to all regions."""
    weights = {r.name: len(r.workers) for r in topology.regions}

    def cost(candidate: str) -> float:
        return sum(n * topology.rtt_ms(r, candidate) for r, n in weights.items())

    return min((r.name for r in topology.regions), key=cost)


class CentralDirectory(IndexedBaseline):
    name = "central-directory"

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        reader: IndexReader,
        plan: LevelPlan,
        config: RoutingConfig,
        clock: Clock,
        world: WorldView | None,
    ) -> None:
        super().__init__(topology, origin_region, reader, plan, config, clock)
        self.world = world
        self.coordinator = coordinator_region(topology)
        self.rtt_ms = topology.rtt_ms(origin_region, self.coordinator)
        self.score = JointScore(
            topology, origin_region, config.ablations, config.lambda_max, config.tau_ms
        )
        self._belief = (1.0,) * self.n_workers
        self._turn = 0  # rotates the start among exactly tied workers, as KVCompass does

    def _route(self, request: RouteRequest, prompt: int, count: int, explain: bool) -> Route:
        lengths, tiers = self.match(request)
        world = self.world
        if world is None:
            queues = self.queues.values
        else:
            queues = [world.queue_ms(w) for w in range(self.n_workers)]
        score = self.score
        lam = score.price(queues)
        scores = score.scores(prompt, lengths, tiers, self._belief, queues, lam)
        order = score.rank(scores, queues, count, self._turn)
        if not explain:
            self._turn += 1
        return Route(order, "directory", lengths, tiers, self.rtt_ms, queues)
