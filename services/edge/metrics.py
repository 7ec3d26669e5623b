"""Prometheus metrics of an edge replayer (one registry per process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["EdgeMetrics"]


class EdgeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.applied = Counter("kvc_edge_batches_applied", "Patch batches applied.", registry=r)
        self.skipped = Counter(
            "kvc_edge_batches_skipped", "Batches the view already held (redeliveries).", registry=r
        )
        self.foreign = Counter(
            "kvc_edge_foreign_batches",
            "Batches of another writer than the snapshot's, ignored.",
            registry=r,
        )
        self.rejected = Counter(
            "kvc_edge_batches_rejected", "Undecodable or misrouted batches.", registry=r
        )
        self.resyncs = Counter(
            "kvc_edge_resyncs",
            "Shard reloads, by cause: stream (a gap or new epoch), snapshot (anti-entropy), "
            "reload (a table reload failed).",
            ["shard", "cause"],
            registry=r,
        )
        self.log_resets = Counter(
            "kvc_edge_patch_log_resets",
            "Offsets past the patch partition's end (the broker lost its log and began a "
            "new one): the partition was read from its start instead.",
            ["shard"],
            registry=r,
        )
        self.refused = Counter(
            "kvc_edge_snapshots_refused", "Snapshots refused as corrupt.", ["shard"], registry=r
        )
        self.lag = Gauge("kvc_edge_lag_ms", "Age of the newest applied batch.", registry=r)
        self.ready = Gauge(
            "kvc_edge_ready", "1 when every shard is loaded and the stream is drained.", registry=r
        )
        self.loaded = Gauge("kvc_edge_shards_loaded", "Shards with a loaded view.", registry=r)
        self.broker_up = Gauge("kvc_edge_broker_up", "1 while the broker answers.", registry=r)
        self.redis_up = Gauge("kvc_edge_redis_up", "1 while Redis answers.", registry=r)
        self.redis_errors = Counter(
            "kvc_edge_redis_errors", "Redis calls that failed (each retry counts).", registry=r
        )
