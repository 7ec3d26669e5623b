"""Chord DHT: one DHT key per chunk-size level, lookups hopping between regions.

Model: the workers form one Chord ring (ids hashed from their worker ids alone, so every
edge builds the same ring whatever its seed; finger tables as in Chord). The DHT stores,
under each chunk-size level key of a prefix (:class:`ChunkKeys`), that prefix's holder
set; the contents are what the index says (who holds the prefix at that length, any
region, any tier). Per request the edge issues the lookups of all the prompt's level
keys at once from the origin region's first worker (its DHT entry point): each lookup is
routed recursively along closest preceding fingers to the key's successor, which answers
the edge directly. A lookup costs the one-way WAN of every hop (edge to entry node, node
to node, owner back to the edge; the intra-region latency between nodes of one region);
the request waits for the slowest lookup, so ``lookup_ms`` is the largest of those sums.
The request goes to the least-loaded holder (queue estimate) of the longest level that
has one; with no holder at any level, to the successor of the longest key, where a
hash-placement scheme puts a new entry. Paper: §5.1 baseline (2), "the six-level
hash-based layout with one DHT key per chunk-size level", and §2's hash-placement
family. Assumptions: parallel lookups (the paper does not say; sequential, longest
first, would cost more), recursive routing with a direct reply, holders chosen by the
edge's queue estimates (the DHT returns a set), no lookup caching, no churn (the ring is
fixed for the run); the chunk levels are the same-region levels of the plan, which every
worker registers.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from kvcompass.index.reader import IndexReader
from kvcompass.levels import LevelPlan
from kvcompass.pipeline.clock import Clock
from kvcompass.routing.baselines.base import Baseline, Route, read_match
from kvcompass.routing.baselines.placement import ChordRing, ChunkKeys
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.policy import RouteRequest
from kvcompass.topology import Topology

__all__ = ["ChordDHT"]


class ChordDHT(Baseline):
    name = "dht"

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        reader: IndexReader,
        plan: LevelPlan,
        config: RoutingConfig,
        clock: Clock,
    ) -> None:
        super().__init__(topology, origin_region, config, clock)
        self.reader = reader
        self.chunks = ChunkKeys(topology, plan, origin_region)
        self.ring = ChordRing([w.id for w in topology.workers], salt=0)
        self._entry = self.ring.position_of(self.local[0])
        regions = [self.topology.workers[w].region for w in self.ring.workers]
        # One-way ms between ring positions, and from the edge to each of them.
        self._hop = [[topology.wan_ms(a, b) for b in regions] for a in regions]
        self._edge = [topology.wan_ms(origin_region, r) for r in regions]

    def path_ms(self, path: Sequence[int]) -> float:
        """One lookup's time: edge to entry node, each hop, owner back to the edge."""
        hop = self._hop
        ms = self._edge[path[0]] + self._edge[path[-1]]
        return ms + sum(hop[a][b] for a, b in pairwise(path))

    def _route(self, request: RouteRequest, prompt: int, count: int, explain: bool) -> Route:
        keys = self.chunks.keys(request.tokens, request.namespace)
        paths = [self.ring.lookup(self._entry, key) for _, key in keys]
        lookup_ms = max(self.path_ms(p) for p in paths)
        lengths, tiers = read_match(self.reader, self.chunks.query(keys), self.n_workers)
        values = self.queues.values
        for n, _ in reversed(keys):
            holders = [w for w, m in enumerate(lengths) if m >= n]
            if holders:
                best = min(holders, key=values.__getitem__)
                return Route(
                    self.least_loaded([best], count), "dht-holder", lengths, tiers, lookup_ms
                )
        owner = self.ring.workers[paths[-1][-1]]
        return Route(self.least_loaded([owner], count), "dht-place", lengths, tiers, lookup_ms)
