"""PlanetServe: a hash radix tree of the prefixes this edge has routed, plus load balancing.

Model: the tree's nodes are the prompt's chunk-size level prefixes (:class:`ChunkKeys`;
a node is named by the hash of its whole path, which is what a radix tree over hashed
chunks amounts to), each listing the workers requests through it were sent to, in
order. A request walks down its levels; from the deepest node reached upward, it goes to
the first listed worker whose queue estimate is within the pool's 80th percentile (the
node's designated worker, unless it is among the most loaded); if every listed worker is
above it, to the least-loaded worker of the pool; if the prompt reaches no node, to a
random worker (seeded). The chosen worker is then listed at every node of the prompt.
Paper: §5.1 baseline (3), "PlanetServe using hash radix tree" (and §7: a radix-tree
index for prefix reuse); the choice rule follows PlanetServe's published HR-tree
evaluation code (designated worker at the matched node, the 80th-percentile load cutoff
walking up the tree, a random worker for a new prefix), read, not copied. Assumptions:
the tree is built from this edge's own decisions, not from cache events (so it does not
see evictions or other edges' traffic); its depth is our six chunk levels rather than
PlanetServe's ten 10-token chunks; load is the edge's queue estimate; the whole pool is
eligible; the tree keeps at most ``MAX_NODES`` nodes, forgetting the oldest first (the
original grows without bound).
"""

from __future__ import annotations

import math
import random

from kvcompass.levels import LevelPlan
from kvcompass.pipeline.clock import Clock
from kvcompass.routing.baselines.base import Baseline, Route, dry_run_rng
from kvcompass.routing.baselines.placement import ChunkKeys
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.policy import RouteRequest
from kvcompass.topology import Topology

__all__ = ["MAX_NODES", "PlanetServe"]

#: Nodes the tree keeps (about 100 MB of Python objects at most).
MAX_NODES = 1 << 20
#: A listed worker is used while its load is at most this quantile of the pool's.
LOAD_QUANTILE = 0.8


class PlanetServe(Baseline):
    name = "planetserve"

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        plan: LevelPlan,
        config: RoutingConfig,
        clock: Clock,
        seed: int,
    ) -> None:
        super().__init__(topology, origin_region, config, clock)
        self.chunks = ChunkKeys(topology, plan, origin_region)
        self.tree: dict[int, list[int]] = {}
        self._rng = random.Random(seed)
        self._cutoff_rank = max(math.ceil(LOAD_QUANTILE * self.n_workers) - 1, 0)

    def _route(self, request: RouteRequest, prompt: int, count: int, explain: bool) -> Route:
        keys = [k for _, k in self.chunks.keys(request.tokens, request.namespace)]
        values = self.queues.values
        tree = self.tree
        nodes = [tree[k] for k in keys if k in tree]
        worker, reason = -1, "hrt-new"
        if nodes:
            cutoff = sorted(values)[self._cutoff_rank]
            reason = "hrt-balance"
            for listed in reversed(nodes):
                worker = next((w for w in listed if values[w] <= cutoff), -1)
                if worker >= 0:
                    reason = "hrt-match"
                    break
            else:
                worker = min(range(self.n_workers), key=values.__getitem__)
        else:
            worker = dry_run_rng(self._rng, explain).randrange(self.n_workers)
        if not explain:
            self._insert(keys, worker)
        return Route(self.least_loaded([worker], count), reason)

    def _insert(self, keys: list[int], worker: int) -> None:
        tree = self.tree
        for k in keys:
            listed = tree.get(k)
            if listed is None:
                if len(tree) >= MAX_NODES:
                    del tree[next(iter(tree))]
                tree[k] = [worker]
            elif worker not in listed:
                listed.append(worker)
