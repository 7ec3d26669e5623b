"""The routing core's policy interface, as the router uses it (``kvcompass.routing``)."""

from __future__ import annotations

from kvcompass.routing import (
    Candidate,
    Decision,
    Feedback,
    MigrationOrder,
    RegionQueues,
    RouteRequest,
    RoutingPolicy,
)

__all__ = [
    "Candidate",
    "Decision",
    "Feedback",
    "MigrationOrder",
    "RegionQueues",
    "RouteRequest",
    "RoutingPolicy",
]
