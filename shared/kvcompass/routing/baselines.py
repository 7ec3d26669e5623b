"""Baselines that ignore the index: the demo's local least-loaded, round-robin, random.

They keep the same queue estimates as KVCompass (with pending work), so the comparison
isolates what the index and the joint score add. Their candidates are priced as a full
recompute (their terms are informative only: these policies do not score).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvcompass.index.layout import Tier
from kvcompass.pipeline.clock import Clock
from kvcompass.routing.config import RoutingConfig
from kvcompass.routing.policy import (
    Candidate,
    Decision,
    Feedback,
    RegionQueues,
    RouteRequest,
    prompt_length,
)
from kvcompass.routing.queues import QueueEstimates
from kvcompass.topology import Topology

__all__ = ["LocalLeastLoaded", "RandomPolicy", "RoundRobin"]


class _Baseline:
    name = ""
    reason = ""

    def __init__(
        self, topology: Topology, origin_region: str, config: RoutingConfig, clock: Clock
    ) -> None:
        self.topology = topology
        self.origin_region = origin_region
        self.queues = QueueEstimates(topology, origin_region, clock, config.piggyback_weight)
        self._top = 1 + config.fallbacks
        self._wan = tuple(topology.rtt_ms(origin_region, w.region) for w in topology.workers)

    def _order(self, count: int) -> Sequence[int]:
        """At least ``min(count, eligible)`` workers, best first."""
        raise NotImplementedError

    def decide(self, request: RouteRequest, explain: bool = False) -> Decision:
        prompt = prompt_length(request, self.origin_region)
        count = len(self._wan) if explain else self._top
        order = list(self._order(count))[:count]
        best = order[0]
        candidates = tuple(self._candidate(w, prompt) for w in order)
        worker = self.topology.workers[best]
        return Decision(
            worker=best,
            worker_id=worker.id,
            region=worker.region,
            reason=self.reason,
            claimed_tokens=0,
            lam=0.0,
            candidates=candidates,
            fallbacks=tuple(order[1 : self._top]),
        )

    def _candidate(self, w: int, prompt: int) -> Candidate:
        worker = self.topology.workers[w]
        queue = self.queues.values[w]
        prefill = worker.beta_ms_per_token * prompt
        wan = self._wan[w]
        return Candidate(
            w,
            worker.id,
            worker.region,
            wan,
            queue,
            0,
            Tier.ABSENT,
            1.0,
            prefill,
            0.0,
            wan + queue + prefill,
        )

    def observe(self, feedback: Feedback) -> None:
        if feedback.queue_vector is not None:
            self.queues.apply(feedback.queue_vector, piggybacked=feedback.cross_region)

    def on_queues(self, queues: RegionQueues) -> None:
        self.queues.apply(queues, piggybacked=False)

    def on_forward(self, decision: Decision, expected_service_ms: float) -> None:
        self.queues.add_pending(decision.worker, expected_service_ms)

    def on_failure(self, worker: int) -> None:
        self.queues.mark_down(worker)


class LocalLeastLoaded(_Baseline):
    """The origin region's worker with the lowest queue estimate (ties: lower index);
    caches ignored. The demo's baseline: what a region does without a discovery plane."""

    name = "local-least-loaded"
    reason = "least-loaded"

    def __init__(
        self, topology: Topology, origin_region: str, config: RoutingConfig, clock: Clock
    ) -> None:
        super().__init__(topology, origin_region, config, clock)
        self._local = tuple(w.index for w in topology.region(origin_region).workers)

    def _order(self, count: int) -> Sequence[int]:
        return sorted(self._local, key=self.queues.values.__getitem__)


class RoundRobin(_Baseline):
    """Every worker of every region in turn, whatever its load, cache or distance."""

    name = "round-robin"
    reason = "round-robin"

    def __init__(
        self, topology: Topology, origin_region: str, config: RoutingConfig, clock: Clock
    ) -> None:
        super().__init__(topology, origin_region, config, clock)
        self._n = len(topology.workers)
        self._next = 0

    def _order(self, count: int) -> Sequence[int]:
        start, n = self._next, self._n
        self._next = (start + 1) % n
        return [(start + i) % n for i in range(min(n, count))]


class RandomPolicy(_Baseline):
    """A uniformly random worker of any region (seeded: runs repeat)."""

    name = "random"
    reason = "random"

    def __init__(
        self,
        topology: Topology,
        origin_region: str,
        config: RoutingConfig,
        clock: Clock,
        seed: int,
    ) -> None:
        super().__init__(topology, origin_region, config, clock)
        self._rng = random.Random(seed)
        self._n = len(topology.workers)

    def _order(self, count: int) -> Sequence[int]:
        return self._rng.sample(range(self._n), min(self._n, count))
