"""Baselines as routing policies (issue 10): one module per scheme, each with its model.

Every baseline is driven like KVCompass (:class:`~kvcompass.routing.policy.RoutingPolicy`)
and built by :func:`kvcompass.routing.make_policy`. Each module's docstring states the
model, the paper's description it follows, and every assumption made. Shared pieces:
:mod:`.base` (queue estimates, pricing, the decision), :mod:`.placement` (chunk-level
keys, hash rings, Chord), :mod:`.planners` (the KVCompass index query).
"""

from kvcompass.routing.baselines.base import Baseline, Route
from kvcompass.routing.baselines.central_directory import CentralDirectory, coordinator_region
from kvcompass.routing.baselines.chord import ChordDHT
from kvcompass.routing.baselines.consistent_hashing import ConsistentHashing
from kvcompass.routing.baselines.dynamo import DynamoRouter
from kvcompass.routing.baselines.local_only import LocalLeastLoaded
from kvcompass.routing.baselines.oracle import Oracle
from kvcompass.routing.baselines.planetserve import PlanetServe
from kvcompass.routing.baselines.random_policy import RandomPolicy
from kvcompass.routing.baselines.round_robin import RoundRobin
from kvcompass.routing.baselines.skywalker import SkyWalker

__all__ = [
    "Baseline",
    "CentralDirectory",
    "ChordDHT",
    "ConsistentHashing",
    "DynamoRouter",
    "LocalLeastLoaded",
    "Oracle",
    "PlanetServe",
    "RandomPolicy",
    "RoundRobin",
    "Route",
    "SkyWalker",
    "coordinator_region",
]
