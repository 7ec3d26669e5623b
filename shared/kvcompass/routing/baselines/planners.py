"""The origin edge's query planners, one per namespace, built on first use (as KVCompass)."""

from __future__ import annotations

from kvcompass.index.discovery import MultiLevelQuery, QueryPlanner
from kvcompass.keys import Namespace
from kvcompass.levels import LevelPlan
from kvcompass.routing.policy import RouteRequest

__all__ = ["Planners"]


class Planners:
    def __init__(self, plan: LevelPlan, origin_region: str) -> None:
        self._plan = plan
        self._origin = origin_region
        self._by_namespace: dict[Namespace, QueryPlanner] = {}

    def query(self, request: RouteRequest) -> MultiLevelQuery:
        """The KVCompass lookup of the request's prompt: its keys at every level toward
        every region."""
        planner = self._by_namespace.get(request.namespace)
        if planner is None:
            planner = self._by_namespace[request.namespace] = QueryPlanner(
                self._plan, self._origin, request.namespace
            )
        return planner.query(request.tokens)
