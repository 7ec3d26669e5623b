"""Routing (paper §3.4): which worker of which region serves a request.

Core only: no I/O, time from an injected clock. :func:`make_policy` builds a policy by
name; the edge router drives it through :class:`RoutingPolicy`. The "kvcompass" policy
scores every worker by the joint score (:mod:`.score`) with cache belief (:mod:`.belief`),
queue estimates (:mod:`.queues`) and hot-prefix migration (:mod:`.migration`).
"""

from kvcompass.routing.baselines import LocalLeastLoaded, RandomPolicy, RoundRobin
from kvcompass.routing.belief import CacheBelief
from kvcompass.routing.config import Ablations, RoutingConfig
from kvcompass.routing.factory import POLICY_NAMES, make_policy
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

__all__ = [
    "POLICY_NAMES",
    "Ablations",
    "CacheBelief",
    "Candidate",
    "Decision",
    "Feedback",
    "HotPrefixTracker",
    "JointScore",
    "KVCompassPolicy",
    "LocalLeastLoaded",
    "MigrationOrder",
    "MigrationPlanner",
    "QueueEstimates",
    "QueueReporter",
    "RandomPolicy",
    "RegionQueues",
    "RoundRobin",
    "RouteRequest",
    "RoutingConfig",
    "RoutingPolicy",
    "from_vector",
    "make_policy",
    "queues_by_index",
    "to_vector",
]
