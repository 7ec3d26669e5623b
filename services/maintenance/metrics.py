"""Prometheus metrics of a maintenance unit (one registry per process)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["MaintenanceMetrics"]


@dataclass
class MaintenanceMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.events_applied = Counter(
            "kvc_mu_events_applied", "Event batches applied.", ["shard"], registry=r
        )
        self.keys_applied = Counter("kvc_mu_keys_applied", "Key edits applied.", registry=r)
        self.duplicates = Counter(
            "kvc_mu_duplicates_dropped", "Redelivered batches dropped.", registry=r
        )
        self.worker_restarts = Counter(
            "kvc_mu_worker_restarts",
            "Batches of a new worker incarnation (its sequence numbers start over).",
            registry=r,
        )
        self.restart_cleared_keys = Counter(
            "kvc_mu_restart_cleared_keys",
            "Keys a worker's earlier runs held, cleared when a new incarnation appeared.",
            registry=r,
        )
        self.dead_letters = Counter(
            "kvc_mu_dead_letters",
            "Messages sent to the dead-letter topic, by reason (wire, event, sequence).",
            ["reason"],
            registry=r,
        )
        self.patch_batches = Counter("kvc_mu_patch_batches", "Patch batches published.", registry=r)
        self.patch_bytes = Counter("kvc_mu_patch_bytes", "Bytes of patch batches.", registry=r)
        self.snapshots = Counter("kvc_mu_snapshots", "Shard snapshots written.", registry=r)
        self.snapshot_failures = Counter(
            "kvc_mu_snapshot_failures", "Snapshots postponed because Redis failed.", registry=r
        )
        self.snapshot_age = Gauge(
            "kvc_mu_snapshot_age_seconds", "Age of the oldest owned shard snapshot.", registry=r
        )
        self.lost_snapshots = Counter(
            "kvc_mu_lost_snapshots",
            "Takeovers of a shard with a history but no usable snapshot (rebuilt from the log).",
            registry=r,
        )
        self.events_gone = Counter(
            "kvc_mu_events_gone",
            "kvc.events offsets a takeover needed that the log no longer holds.",
            registry=r,
        )
        self.events_log_resets = Counter(
            "kvc_mu_events_log_resets",
            "Takeovers that found the event log ending before the snapshot's position (the "
            "broker lost its log) and read the new log from its start.",
            registry=r,
        )
        self.foreign_patches = Counter(
            "kvc_mu_foreign_patches",
            "Patch batches of another owner found on this unit's patch partitions.",
            registry=r,
        )
        self.redis_up = Gauge("kvc_mu_redis_up", "1 while Redis answers, else 0.", registry=r)
        self.broker_up = Gauge(
            "kvc_mu_broker_up", "1 while the broker answers, else 0.", registry=r
        )
        self.owned_shards = Gauge("kvc_mu_owned_shards", "Shards this unit owns.", registry=r)
