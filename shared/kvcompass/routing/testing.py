"""Test doubles for routing: a hand-checkable topology, a stub reader, a real in-process index.

For the routing tests, the router's tests and the simulator: nothing here does I/O.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kvcompass.index.discovery import DiscoveryView, Match, MultiLevelQuery
from kvcompass.index.layout import IndexLayout, Tier
from kvcompass.index.reader import IndexNotReady, IndexReader
from kvcompass.index.shard_tables import ShardTables
from kvcompass.keys import Namespace, prefix_keys, shard_of_array
from kvcompass.levels import LevelPlan, plan_levels
from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import KVCompassPolicy, RegionQueues, RouteRequest, RoutingConfig
from kvcompass.topology import IndexSettings, Region, Topology, Worker

NS = Namespace("llama-3.1-8b", "tenant-a")


def _worker(worker_id: str, region: str, index: int, beta: float) -> Worker:
    return Worker(worker_id, region, index, beta, vram_bytes=10**9, dram_bytes=10**9)


#: Round numbers so every score term can be computed by hand: β = 0.1 ms/token (worker
#: a-1: 0.2), γ = 0.01 ms/token, intra-region one way 0.5 ms (RTT 1), a-b one way 50 ms
#: (RTT 100), so n1(a -> b) = 100 / 0.1 = 1000 -> 1008 (blocks of 16).
TOY = Topology(
    name="toy",
    description="two regions of two workers, round numbers",
    regions=(
        Region("a", (_worker("a-0", "a", 0, 0.1), _worker("a-1", "a", 1, 0.2))),
        Region("b", (_worker("b-0", "b", 2, 0.1), _worker("b-1", "b", 3, 0.1))),
    ),
    one_way_ms=np.array([[0.0, 50.0], [50.0, 0.0]]),
    gamma_ms_per_token=0.01,
    index=IndexSettings(block_size=16, value_bits=0, fingerprint_bits=0, levels=3),
    intra_region_one_way_ms=0.5,
)

A0, A1, B0, B1 = 0, 1, 2, 3


def tokens(n: int, seed: int = 0) -> NDArray[np.uint32]:
    return np.random.default_rng(seed).integers(0, 50_000, n, dtype=np.uint32)


def request(toks: NDArray[np.uint32], origin: str = "a", ns: Namespace = NS) -> RouteRequest:
    return RouteRequest("req", toks, origin, ns)


class StubReader:
    """An IndexReader that answers fixed matches (or is not ready)."""

    def __init__(self, n_workers: int) -> None:
        self.lengths = [0] * n_workers
        self.tiers = [0] * n_workers
        self.is_ready = True
        self.queries: list[MultiLevelQuery] = []

    def hold(self, worker: int, length: int, tier: Tier = Tier.VRAM) -> None:
        self.lengths[worker] = length
        self.tiers[worker] = int(tier) if length else 0

    def match(self, query: MultiLevelQuery) -> Match:
        self.queries.append(query)
        if not self.is_ready:
            raise IndexNotReady("stub not ready")
        return Match(list(self.lengths), list(self.tiers))

    def ready(self) -> bool:
        return self.is_ready


def queues(region: str, sent_at_ns: int, **by_index: float) -> RegionQueues:
    """RegionQueues with entries given as w<index>=ms."""
    return RegionQueues(
        region, sent_at_ns, sent_at_ns, {int(k[1:]): v for k, v in by_index.items()}
    )


@dataclass
class RealIndex:
    """Shard tables plus an edge's in-process DiscoveryView that follows their patches."""

    topology: Topology
    plan: LevelPlan = field(init=False)
    view: DiscoveryView = field(init=False)
    shards: dict[int, ShardTables] = field(init=False)
    n_shards: int = 2

    def __post_init__(self) -> None:
        self.plan = plan_levels(self.topology)
        layout = IndexLayout.from_topology(self.topology)
        rng = random.Random(3)
        self.shards = {
            s: ShardTables(layout, s, self.n_shards, initial_capacity=256, rng=rng)
            for s in range(self.n_shards)
        }
        images = {
            (s, t): img for s, st in self.shards.items() for t, img in st.view_images().items()
        }
        self.view = DiscoveryView.from_images(layout, self.n_shards, images)

    def set(
        self,
        worker: int,
        toks: NDArray[np.uint32],
        upto: int,
        tier: Tier,
        ns: Namespace = NS,
        above: int = 0,
    ) -> None:
        """Register (or with ABSENT, evict) ``worker``'s prefixes of ``toks`` longer than
        ``above`` up to ``upto``."""
        region = self.topology.workers[worker].region
        lengths = [c for c in self.plan.registration_lengths[region] if above < c <= upto]
        keys = np.asarray(list(prefix_keys(toks, lengths, ns).values()), dtype=np.uint64)
        owners = shard_of_array(keys, self.n_shards)
        for s, tables in self.shards.items():
            if np.any(owners == s):
                tables.set_tier(keys[owners == s], worker, tier)
        patches = {(s, t): p for s, st in self.shards.items() for t, p in st.take_patches().items()}
        self.view.apply(patches)


def kvcompass_policy(
    topology: Topology,
    reader: IndexReader,
    clock: ManualClock,
    config: RoutingConfig | None = None,
    origin: str = "a",
) -> KVCompassPolicy:
    return KVCompassPolicy(
        topology,
        origin,
        reader,
        plan_levels(topology),
        config or RoutingConfig(),
        clock,
    )
