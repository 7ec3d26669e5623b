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
        self.dead_letters = Counter(
            "kvc_mu_dead_letters", "Messages sent to the dead-letter topic.", ["reason"], registry=r
        )
        self.patch_batches = Counter("kvc_mu_patch_batches", "Patch batches published.", registry=r)
        self.patch_bytes = Counter("kvc_mu_patch_bytes", "Bytes of patch batches.", registry=r)
        self.snapshots = Counter("kvc_mu_snapshots", "Shard snapshots written.", registry=r)
        self.snapshot_age = Gauge(
            "kvc_mu_snapshot_age_seconds", "Age of the oldest owned shard snapshot.", registry=r
        )
        self.owned_shards = Gauge("kvc_mu_owned_shards", "Shards this unit owns.", registry=r)
