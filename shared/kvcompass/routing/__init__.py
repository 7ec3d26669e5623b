"""Routing (paper §3.4): which worker of which region serves a request.

Core only: no I/O, time from an injected clock. :func:`make_policy` builds a policy by
name; the edge router drives it through :class:`RoutingPolicy`. The "kvcompass" policy
scores every worker by the joint score (:mod:`.score`) with cache belief (:mod:`.belief`),
queue estimates (:mod:`.queues`), hot-prefix migration (:mod:`.migration`) and, beyond
the paper, credit for prefixes it has just sent (:mod:`.pending`), chained lookups
(``RoutingConfig.prefix_chain``) and a steeper capacity price (``RoutingConfig.tau_ms``).
The paper's baselines (:mod:`.baselines`) are policies of the same interface.
"""

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
from kvcompass.routing.belief import CacheBelief
from kvcompass.routing.config import (
    PAPER_PRICE,
    Ablations,
    RoutingConfig,
    ShippedChoices,
    routing_config,
)
from kvcompass.routing.factory import NEEDS_READER, POLICY_NAMES, make_policy
from kvcompass.routing.kvcompass import KVCompassPolicy
from kvcompass.routing.migration import HotPrefixTracker, MigrationOrder, MigrationPlanner
from kvcompass.routing.policy import (
    Candidate,
    Decision,
    Feedback,
    RegionQueues,
    RouteRequest,
    RoutingPolicy,
)
from kvcompass.routing.queues import (
    QueueEstimates,
    QueueReporter,
    from_vector,
    queues_by_index,
    to_vector,
)
from kvcompass.routing.score import JointScore
from kvcompass.routing.world import WorldView

__all__ = [
    "NEEDS_READER",
    "PAPER_PRICE",
    "POLICY_NAMES",
    "Ablations",
    "CacheBelief",
    "Candidate",
    "CentralDirectory",
    "ChordDHT",
    "ConsistentHashing",
    "Decision",
    "DynamoRouter",
    "Feedback",
    "HotPrefixTracker",
    "JointScore",
    "KVCompassPolicy",
    "LocalLeastLoaded",
    "MigrationOrder",
    "MigrationPlanner",
    "Oracle",
    "PlanetServe",
    "QueueEstimates",
    "QueueReporter",
    "RandomPolicy",
    "RegionQueues",
    "RoundRobin",
    "RouteRequest",
    "RoutingConfig",
    "RoutingPolicy",
    "ShippedChoices",
    "SkyWalker",
    "WorldView",
    "from_vector",
    "make_policy",
    "queues_by_index",
    "routing_config",
    "to_vector",
]
