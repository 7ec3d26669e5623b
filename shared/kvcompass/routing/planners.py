"""An origin edge's query planners, one per namespace, built on first use.

Every policy that reads the index (KVCompass and the baselines that look up prefixes)
plans a request's lookup with the planner of its namespace. A planner's lengths and
shape depend on the plan and the edge only, so each after the first shares them and
builds only its namespace's hasher (a tenant's first request then costs a few µs of
planning, not tens).
"""

from __future__ import annotations

from kvcompass.index.discovery import MultiLevelQuery, QueryPlanner
from kvcompass.keys import Namespace
from kvcompass.levels import LevelPlan
from kvcompass.routing.policy import RouteRequest

__all__ = ["Planners"]


class Planners:
    """The planners of edge ``origin_region`` over ``plan`` (``chained``: each region's
    first length guarded, :class:`QueryPlanner`)."""

    def __init__(self, plan: LevelPlan, origin_region: str, chained: bool = False) -> None:
        self._plan = plan
        self._origin = origin_region
        self._chained = chained
        self._by_namespace: dict[Namespace, QueryPlanner] = {}
        self._first: QueryPlanner | None = None

    def __len__(self) -> int:
        """Namespaces planned so far."""
        return len(self._by_namespace)

    def planner(self, namespace: Namespace) -> QueryPlanner:
        planner = self._by_namespace.get(namespace)
        if planner is None:
            if self._first is None:
                planner = self._first = QueryPlanner(
                    self._plan, self._origin, namespace, self._chained
                )
            else:
                planner = self._first.for_namespace(namespace)
            self._by_namespace[namespace] = planner
        return planner

    def query(self, request: RouteRequest) -> MultiLevelQuery:
        """The lookup of the request's prompt: its keys at every level toward every
        region."""
        return self.planner(request.namespace).query(request.tokens)
