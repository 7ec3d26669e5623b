"""The routing core's policy interface, as the router uses it.

STAND-IN until the routing branch lands: these types copy the shared contract of issue 9
(``kvcompass.routing.policy``) field for field, so that the service layer is built and
tested against it now. When ``kvcompass.routing`` exists this module becomes a
re-export of it and ``make_policy`` its factory; nothing else in the router changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace

__all__ = [
    "Candidate",
    "Decision",
    "Feedback",
    "MigrationOrder",
    "RegionQueues",
    "RouteRequest",
    "RoutingPolicy",
]


@dataclass(frozen=True, slots=True)
class RouteRequest:
    request_id: str
    tokens: NDArray[np.uint32]
    origin_region: str
    namespace: Namespace


@dataclass(frozen=True, slots=True)
class Candidate:
    """One worker's score terms (ms)."""

    worker: int
    worker_id: str
    region: str
    wan_ms: float
    queue_ms: float
    matched_tokens: int
    tier: Tier
    belief: float
    prefill_ms: float
    reload_ms: float
    score: float


@dataclass(frozen=True, slots=True)
class MigrationOrder:
    prefix_tokens: int
    target_worker: int
    source_worker: int | None
    mode: Literal["copy", "recompute"]


@dataclass(frozen=True, slots=True)
class Decision:
    worker: int
    worker_id: str
    region: str
    reason: str
    claimed_tokens: int
    lam: float
    candidates: tuple[Candidate, ...]
    fallbacks: tuple[int, ...]
    migration: MigrationOrder | None = None


@dataclass(frozen=True, slots=True)
class RegionQueues:
    region: str
    seq: int
    sent_at_ns: int
    queue_ms: Mapping[int, float]


@dataclass(frozen=True, slots=True)
class Feedback:
    worker: int
    claimed_tokens: int
    reused_tokens: int
    queue_vector: RegionQueues | None
    cross_region: bool


class RoutingPolicy(Protocol):
    name: str

    def decide(self, request: RouteRequest, explain: bool = False) -> Decision: ...
    def observe(self, feedback: Feedback) -> None: ...
    def on_queues(self, queues: RegionQueues) -> None: ...
    def on_forward(self, decision: Decision, expected_service_ms: float) -> None: ...
    def on_failure(self, worker: int) -> None: ...
