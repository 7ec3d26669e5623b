"""Random: a uniformly random worker of any region.

Model: seeded uniform choice over the whole pool, the "random routing" of the paper's
M/G/1 argument (§3.5: each worker sees a Poisson share of the arrivals). Assumption: one
generator per edge, seeded with the run's seed, so runs repeat.
"""

from __future__ import annotations

import random

from kvcompass.pipeline.clock import Clock
from kvcompass.routing.baselines.base import Baseline, Route, dry_run_rng
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.policy import RouteRequest
from kvcompass.topology import Topology

__all__ = ["RandomPolicy"]


class RandomPolicy(Baseline):
    name = "random"

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        config: RoutingConfig,
        clock: Clock,
        seed: int,
    ) -> None:
        super().__init__(topology, origin_region, config, clock)
        self._rng = random.Random(seed)

    def _route(self, request: RouteRequest, prompt: int, count: int, explain: bool) -> Route:
        n = self.n_workers
        rng = dry_run_rng(self._rng, explain)
        return Route(rng.sample(range(n), min(n, count)), "random")
