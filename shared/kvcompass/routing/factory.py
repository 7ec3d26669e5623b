"""Build a routing policy by name (the router's ``KVC_POLICY``)."""

from __future__ import annotations

from kvcompass.errors import ConfigError
from kvcompass.index.reader import IndexReader
from kvcompass.levels import LevelPlan, plan_levels
from kvcompass.pipeline.clock import Clock, SystemClock
from kvcompass.routing.baselines import LocalLeastLoaded, RandomPolicy, RoundRobin
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.kvcompass import KVCompassPolicy
from kvcompass.routing.policy import RoutingPolicy
from kvcompass.topology import Topology

__all__ = ["POLICY_NAMES", "make_policy"]

POLICY_NAMES = ("kvcompass", "local-least-loaded", "round-robin", "random")


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
) -> RoutingPolicy:
    """The policy ``name`` for the edge of ``origin_region``.

    ``reader`` is required by "kvcompass" (the others never look at caches); ``plan``
    defaults to the topology's levels; ``seed`` seeds "random". Raises ConfigError for an
    unknown name or region, or a missing reader.
    """
    if origin_region not in {r.name for r in topology.regions}:
        raise ConfigError(f"origin region {origin_region!r} is not in topology {topology.name!r}")
    config = config or RoutingConfig()
    clock = clock or SystemClock()
    if name == "kvcompass":
        if reader is None:
            raise ConfigError('policy "kvcompass" needs an index reader')
        plan = plan or plan_levels(topology)
        return KVCompassPolicy(topology, origin_region, reader, plan, config, clock)
    if name == "local-least-loaded":
        return LocalLeastLoaded(topology, origin_region, config, clock)
    if name == "round-robin":
        return RoundRobin(topology, origin_region, config, clock)
    if name == "random":
        return RandomPolicy(topology, origin_region, config, clock, seed)
    raise ConfigError(f"unknown routing policy {name!r}; known: {', '.join(POLICY_NAMES)}")
