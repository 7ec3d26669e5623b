"""Build a routing policy by name (the router's ``KVC_POLICY``, the simulator's ``--policy``)."""

from __future__ import annotations

from kvcompass.errors import ConfigError
from kvcompass.index.reader import IndexReader
from kvcompass.levels import LevelPlan, plan_levels
from kvcompass.pipeline.clock import Clock, SystemClock
from kvcompass.routing.baselines import (
    CentralDirectory,
    ChordDHT,
    ConsistentHashing,
    DynamoRouter,
    LocalLeastLoaded,
    Oracle,
    PlanetServe,
    RandomPolicy,
    RoundRobin,
    SkyWalker,
)
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.kvcompass import KVCompassPolicy
from kvcompass.routing.policy import RoutingPolicy
from kvcompass.routing.world import WorldView
from kvcompass.topology import Topology

__all__ = ["NEEDS_READER", "POLICY_NAMES", "make_policy"]

POLICY_NAMES = (
    "kvcompass",
    "local-least-loaded",
    "round-robin",
    "random",
    "consistent-hashing",
    "dht",
    "planetserve",
    "central-directory",
    "skywalker",
    "dynamo",
    "oracle",
)
#: The policies that read the index (the others never look at caches, or only at their own
#: routing history).
NEEDS_READER = frozenset({"kvcompass", "dht", "central-directory", "skywalker", "dynamo"})


def make_policy(
    name: str,
    topology: Topology,
    origin_region: str,
    reader: IndexReader | None = None,
    *,
    config: RoutingConfig | None = None,
    clock: Clock | None = None,
    plan: LevelPlan | None = None,
    seed: int = 0,
    world: WorldView | None = None,
) -> RoutingPolicy:
    """The policy ``name`` for the edge of ``origin_region``.

    ``reader`` is required by the policies in :data:`NEEDS_READER`; ``plan`` defaults to
    the topology's levels; ``seed`` seeds the random choices (the hash rings do not
    depend on it: every edge must place keys alike); ``world`` is the exact pool state a
    simulator gives ("oracle" and "central-directory" use it, the others ignore it).
    Raises ConfigError for an unknown name or region, or a missing reader.
    """
    if origin_region not in {r.name for r in topology.regions}:
        raise ConfigError(f"origin region {origin_region!r} is not in topology {topology.name!r}")
    if name not in POLICY_NAMES:
        raise ConfigError(f"unknown routing policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    config = config or RoutingConfig()
    clock = clock or SystemClock()
    if name == "local-least-loaded":
        return LocalLeastLoaded(topology, origin_region, config, clock)
    if name == "round-robin":
        return RoundRobin(topology, origin_region, config, clock)
    if name == "random":
        return RandomPolicy(topology, origin_region, config, clock, seed)
    if name == "oracle":
        return Oracle(topology, origin_region, config, clock, world)
    plan = plan or plan_levels(topology)
    if name == "consistent-hashing":
        return ConsistentHashing(topology, origin_region, plan, config, clock)
    if name == "planetserve":
        return PlanetServe(topology, origin_region, plan, config, clock, seed)
    if reader is None:
        raise ConfigError(f"policy {name!r} needs an index reader")
    if name == "kvcompass":
        return KVCompassPolicy(topology, origin_region, reader, plan, config, clock)
    if name == "dht":
        return ChordDHT(topology, origin_region, reader, plan, config, clock)
    if name == "central-directory":
        return CentralDirectory(topology, origin_region, reader, plan, config, clock, world)
    if name == "skywalker":
        return SkyWalker(topology, origin_region, reader, plan, config, clock)
    return DynamoRouter(topology, origin_region, reader, plan, config, clock)
