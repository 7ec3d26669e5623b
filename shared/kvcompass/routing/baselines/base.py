"""What every baseline shares: queue estimates, pricing, the decision, the feedback hooks.

A baseline only chooses (:meth:`Baseline._route`); this base turns the choice into the
same :class:`Decision` KVCompass gives, so the router and the simulator drive every
scheme alike. Every baseline keeps the queue estimates KVCompass keeps (reports plus its
own pending work), so a comparison isolates what the choice rule adds. Candidates are
priced with the score's terms at belief 1 and no capacity price (informative only: a
baseline does not rank by them unless its docstring says so).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

from kvcompass.index.discovery import MultiLevelQuery
from kvcompass.index.layout import Tier
from kvcompass.index.reader import IndexNotReady, IndexReader
from kvcompass.levels import LevelPlan
from kvcompass.pipeline.clock import Clock
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.planners import Planners
from kvcompass.routing.policy import (
    Candidate,
    Decision,
    RouteRequest,
    prompt_length,
)
from kvcompass.routing.queues import QueueEstimates, QueueFed
from kvcompass.topology import Topology

__all__ = ["Baseline", "IndexedBaseline", "Route", "dry_run_rng", "read_match"]

_TIERS = tuple(Tier)


class Route(NamedTuple):
    """A baseline's choice: workers best first (the first is where the request goes),
    the per-worker matches it saw (empty: it looked at no cache), its discovery time, and
    the queues it went by when they are not the edge's estimates (exact, or a snapshot)."""

    order: Sequence[int]
    reason: str
    lengths: Sequence[int] = ()
    tiers: Sequence[int] = ()
    lookup_ms: float = 0.0
    queues: Sequence[float] = ()


def read_match(
    reader: IndexReader, query: MultiLevelQuery, n_workers: int
) -> tuple[Sequence[int], Sequence[int]]:
    """Per-worker matched lengths and tiers; nothing matched while the index is not ready
    (a baseline then routes as if no cache existed, as KVCompass does)."""
    try:
        match = reader.match(query)
    except IndexNotReady:
        zeros = (0,) * n_workers
        return zeros, zeros
    return match.lengths, match.tiers


def dry_run_rng(rng: random.Random, explain: bool) -> random.Random:
    """``rng`` itself, or for an explaining (dry) run a copy, so explaining draws nothing."""
    if not explain:
        return rng
    copy = random.Random()
    copy.setstate(rng.getstate())
    return copy


class Baseline(QueueFed):
    """One edge region's baseline policy; subclasses implement :meth:`_route`."""

    name = ""

    def __init__(
        self, topology: Topology, origin_region: str, config: RoutingConfig, clock: Clock
    ) -> None:
        self.topology = topology
        self.origin_region = origin_region
        self.config = config
        self.clock = clock
        self.queues = QueueEstimates(topology, origin_region, clock, config.piggyback_weight)
        self.n_workers = len(topology.workers)
        self.local = tuple(w.index for w in topology.region(origin_region).workers)
        self._top = 1 + config.fallbacks
        self._wan = tuple(topology.rtt_ms(origin_region, w.region) for w in topology.workers)
        self._gamma = topology.gamma_ms_per_token

    def _route(self, request: RouteRequest, prompt: int, count: int, explain: bool) -> Route:
        """At least ``min(count, n_workers)`` workers, best first. ``explain``: a dry run
        (change no state)."""
        raise NotImplementedError

    def least_loaded(self, first: Sequence[int], count: int) -> list[int]:
        """``first``, then the other workers by queue estimate (ties: lower index): the
        fallbacks of a scheme that names only one worker."""
        values = self.queues.values
        order = list(dict.fromkeys(first))
        if len(order) < count:
            chosen = set(order)
            rest = sorted(
                (w for w in range(self.n_workers) if w not in chosen), key=values.__getitem__
            )
            order += rest[: count - len(order)]
        return order

    def decide(self, request: RouteRequest, explain: bool = False) -> Decision:
        prompt = prompt_length(request, self.origin_region)
        count = self.n_workers if explain else self._top
        route = self._route(request, prompt, count, explain)
        order = list(route.order)[:count]
        best = order[0]
        lengths, tiers = route.lengths, route.tiers
        queues = route.queues or self.queues.values
        candidates = tuple(self._candidate(w, prompt, lengths, tiers, queues) for w in order)
        worker = self.topology.workers[best]
        return Decision(
            best,
            worker.id,
            worker.region,
            route.reason,
            candidates[0].matched_tokens,
            0.0,
            candidates,
            tuple(order[1 : self._top]),
            None,
            route.lookup_ms,
        )

    def _candidate(
        self,
        w: int,
        prompt: int,
        lengths: Sequence[int],
        tiers: Sequence[int],
        queues: Sequence[float],
    ) -> Candidate:
        worker = self.topology.workers[w]
        matched = min(lengths[w], prompt) if lengths else 0
        tier = _TIERS[tiers[w]] if matched else Tier.ABSENT
        queue = queues[w]
        prefill = worker.beta_ms_per_token * (prompt - matched)
        reload = self._gamma * matched if tier == Tier.DRAM else 0.0
        wan = self._wan[w]
        return Candidate(
            w,
            worker.id,
            worker.region,
            wan,
            queue,
            matched,
            tier,
            1.0,
            prefill,
            reload,
            wan + queue + prefill + reload,
        )


class IndexedBaseline(Baseline):
    """A baseline whose directory is what the index says (see each scheme's docstring)."""

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        reader: IndexReader,
        plan: LevelPlan,
        config: RoutingConfig,
        clock: Clock,
    ) -> None:
        super().__init__(topology, origin_region, config, clock)
        self.reader = reader
        self.planners = Planners(plan, origin_region)

    def match(self, request: RouteRequest) -> tuple[Sequence[int], Sequence[int]]:
        """Per worker, the prompt's matched length and tier (nothing when not ready)."""
        return read_match(self.reader, self.planners.query(request), self.n_workers)
