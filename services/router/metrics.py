"""The router's Prometheus metrics.

One process: its registry. A group of processes (``KVC_ROUTER_PROCESSES`` > 1): every
process writes them to the group's files and any scrape merges them
(:mod:`~kvcompass.services.router.group_metrics`): counters and histograms are summed,
each gauge states its ``multiprocess_mode`` (``live*``: a dead process's value leaves
the aggregate). Gauges that change with time alone (ages) are set by the views watcher
every 0.25 s, since a scrape of the group's files cannot call a process's function.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvcompass.services.router.policy import Decision

__all__ = ["RouterMetrics"]

# Decisions take tens of microseconds; forwards up to seconds.
_DECISION_BUCKETS = (10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 5e-3, 20e-3)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "kvc_router_decisions",
            "Routing decisions by target region and reason.",
            ["region", "reason"],
            registry=registry,
        )
        self.decision_seconds = Histogram(
            "kvc_router_decision_seconds",
            "Time of policy.decide (keys, index lookups, score).",
            buckets=_DECISION_BUCKETS,
            registry=registry,
        )
        self.cross_region = Counter(
            "kvc_router_cross_region_forwards",
            "Requests forwarded to a worker of another region, by target region.",
            ["region"],
            registry=registry,
        )
        self.requests = Counter(
            "kvc_router_requests",
            "Client requests by endpoint and HTTP status.",
            ["endpoint", "status"],
            registry=registry,
        )
        self.upstream_failures = Counter(
            "kvc_router_upstream_failures",
            "Forwards that failed (unreachable, timeout or 5xx), by worker.",
            ["worker"],
            registry=registry,
        )
        self.claimed_tokens = Counter(
            "kvc_router_claimed_tokens",
            "Prompt tokens the router claimed a worker held (responses that reported).",
            registry=registry,
        )
        self.false_claimed_tokens = Counter(
            "kvc_router_false_claimed_tokens",
            "Claimed tokens the worker did not reuse; false-claim rate = this / claimed.",
            registry=registry,
        )
        self.false_claim_rate = Gauge(
            "kvc_router_false_claim_rate",
            "Unreused / claimed tokens since start.",
            registry=registry,
            # group: recomputed at scrape from the summed token counters
            multiprocess_mode="livemax",
        )
        self.belief = Gauge(
            "kvc_router_belief",
            "Cache belief b_r per worker, as of the latest decision.",
            ["worker"],
            registry=registry,
            # group: the latest decision's, whichever process made it
            multiprocess_mode="livemostrecent",
        )
        self.queue_ms = Gauge(
            "kvc_router_queue_estimate_ms",
            "Queue estimate per worker, as of the latest decision.",
            ["worker"],
            registry=registry,
            # group: the latest decision's, whichever process made it
            multiprocess_mode="livemostrecent",
        )
        self.queue_age = Gauge(
            "kvc_router_queue_vector_age_seconds",
            "Age (by its sent_at_ns) of the latest queue vector applied, per source region.",
            ["region"],
            registry=registry,
            # group: the process furthest behind the topic
            multiprocess_mode="livemax",
        )
        self.queue_vectors = Counter(
            "kvc_router_queue_vectors",
            "kvc.queues records by outcome (applied, stale, not_addressed, bad).",
            ["outcome"],
            registry=registry,
        )
        self.index_live = Gauge(
            "kvc_router_index_live",
            "1 while the edge's views are loaded and caught up, else 0.",
            registry=registry,
            # group: 0 while any live process lacks the views
            multiprocess_mode="livemin",
        )
        self.index_age = Gauge(
            "kvc_router_index_age_seconds",
            "Seconds since the edge's views were last live (0 while they are).",
            registry=registry,
            # group: the oldest view any live process routes from
            multiprocess_mode="livemax",
        )
        self.index_decisions = Counter(
            "kvc_router_index_decisions",
            "Decisions by what answered the index lookup: live views, the last loaded "
            "(stale) ones, or none (routing by load and WAN alone).",
            ["index"],
            registry=registry,
        )
        self._claimed = 0
        self._false = 0
        self._per_worker: dict[str, tuple[Gauge, Gauge]] = {}

    def decided(self, decision: Decision, seconds: float, index: str) -> None:
        self.decision_seconds.observe(seconds)
        self.index_decisions.labels(index).inc()
        self.decisions.labels(decision.region, decision.reason).inc()
        for c in decision.candidates:
            belief, queue_ms = self._per_worker.get(c.worker_id) or self._worker(c.worker_id)
            belief.set(c.belief)
            queue_ms.set(c.queue_ms)

    def _worker(self, worker_id: str) -> tuple[Gauge, Gauge]:
        """A worker's two gauges, looked up once: ``labels()`` on every candidate of
        every decision cost more than the sets."""
        pair = self.belief.labels(worker_id), self.queue_ms.labels(worker_id)
        self._per_worker[worker_id] = pair
        return pair

    def queue_ages(self, queue_ages_s: Mapping[str, float]) -> None:
        for region, age_s in queue_ages_s.items():
            self.queue_age.labels(region).set(age_s)

    def claims(self, claimed: int, reused: int) -> None:
        if claimed <= 0:
            return
        false = max(0, claimed - reused)
        self.claimed_tokens.inc(claimed)
        self.false_claimed_tokens.inc(false)
        self._claimed += claimed
        self._false += false
        self.false_claim_rate.set(self._false / self._claimed)
