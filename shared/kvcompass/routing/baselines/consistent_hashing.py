"""Consistent hashing: six content-hash rings, one per chunk-size level.

Model: the edge keys the prompt at the six chunk-size levels (:class:`ChunkKeys`: 128,
256, ..., 4,096 tokens by default) and sends it to the owner, on that level's ring, of
the key of the longest level the prompt reaches; a prompt shorter than the first level
goes by the key of the whole prompt on the first ring. No directory is read and load is
ignored: a given prefix goes to one worker, whatever its queue. Paper: §5.1 baseline (1),
"six independent content-hash rings", the hash-placement family of §2 (an item's place
is a function of its key). Assumptions: the paper does not say which ring a request
follows; the longest level is the only rule that needs no directory (which ring's owner
actually holds a cache would take the DHT's lookups, see :mod:`.chord`) and is how
cluster routers use hashing for prefix affinity. Its consequence, stated: two prompts
share a worker only if they agree on their longest reached level, so a conversation
moves to a new worker each time it crosses a level, and prompts sharing a system prompt
shorter than their longest level are spread. Rings: 64 virtual nodes per worker, salted
by the level only (not by the run's seed: the simulator seeds each edge differently, and
every edge must place a key alike); the fallbacks of a decision are the least-loaded other
workers (a retry must go somewhere).
"""

from __future__ import annotations

from kvcompass.levels import LevelPlan
from kvcompass.pipeline.clock import Clock
from kvcompass.routing.baselines.base import Baseline, Route
from kvcompass.routing.baselines.placement import ChunkKeys, HashRing
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.policy import RouteRequest
from kvcompass.topology import Topology

__all__ = ["ConsistentHashing"]


class ConsistentHashing(Baseline):
    name = "consistent-hashing"

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        plan: LevelPlan,
        config: RoutingConfig,
        clock: Clock,
    ) -> None:
        super().__init__(topology, origin_region, config, clock)
        self.chunks = ChunkKeys(topology, plan, origin_region)
        ids = [w.id for w in topology.workers]
        self.rings = tuple(HashRing(ids, salt=level) for level in range(len(self.chunks.lengths)))

    def owner(self, request: RouteRequest) -> int:
        """The worker the prompt's longest reached level hashes to."""
        keys = self.chunks.keys(request.tokens, request.namespace)
        level = len(keys) - 1 if keys[-1][0] in self.chunks.lengths else 0
        return self.rings[level].owner(keys[-1][1])

    def _route(self, request: RouteRequest, prompt: int, count: int, explain: bool) -> Route:
        return Route(self.least_loaded([self.owner(request)], count), "hash")
