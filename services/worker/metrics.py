"""Prometheus metrics of a worker host (one registry; every series names its worker)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["WorkerMetrics"]

_TTFT_BUCKETS_MS = (5, 10, 25, 50, 100, 200, 400, 800, 1600, 3200, 6400, 12800)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "kvc_worker_requests", "Completions answered, by outcome.", ["worker", "status"],
            registry=registry,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "kvc_worker_prompt_tokens", "Prompt tokens received.", ["worker"], registry=registry
        )
        self.reused_tokens = Counter(
            "kvc_worker_reused_tokens", "Prompt tokens served from cache, by tier.",
            ["worker", "tier"], registry=registry,
        )  # fmt: skip
        self.claimed_tokens = Counter(
            "kvc_worker_claimed_tokens", "Prompt tokens the edge claimed this worker held.",
            ["worker"], registry=registry,
        )  # fmt: skip
        self.ttft_ms = Histogram(
            "kvc_worker_ttft_ms", "Emulated time to first token (ms).", ["worker"],
            buckets=_TTFT_BUCKETS_MS, registry=registry,
        )  # fmt: skip
        self.queue_ms = Gauge(
            "kvc_worker_queue_ms", "Expected wait before a new prefill starts (ms).", ["worker"],
            registry=registry,
        )  # fmt: skip
        self.running = Gauge(
            "kvc_worker_running", "Completions queued, prefilling or decoding.", ["worker"],
            registry=registry,
        )  # fmt: skip
        self.cache_blocks = Gauge(
            "kvc_worker_cache_blocks", "Cached blocks, by tier.", ["worker", "tier"],
            registry=registry,
        )  # fmt: skip
        self.events = Counter(
            "kvc_worker_prefix_events", "Prefix changes published, by kind.", ["worker", "kind"],
            registry=registry,
        )  # fmt: skip
        self.migrations = Counter(
            "kvc_worker_migrations", "Migrations accepted, by mode.", ["worker", "mode"],
            registry=registry,
        )  # fmt: skip
        self.events_acked = Counter(
            "kvc_worker_event_batches_acked",
            "Event batches the broker acknowledged (all workers of the process).",
            registry=registry,
        )
        self.reannouncements = Counter(
            "kvc_worker_reannouncements",
            "Times the broker came back without its log and every worker of the process "
            "sent its cache's whole state again.",
            registry=registry,
        )
        self.queue_vectors = Counter(
            "kvc_worker_queue_vectors", "Queue vectors sent on kvc.queues, by region.",
            ["region"], registry=registry,
        )  # fmt: skip
