"""The settings every KVCompass service reads, as frozen dataclasses over ``KVC_*``
variables (the machinery is :mod:`kvcompass.settings`): logging, where the broker and
Redis are, the process shell's status endpoint and deadlines, and what maintenance units
and edges must agree on. Each service extends one of these with its own fields."""

from __future__ import annotations

import dataclasses
from typing import Literal

from kvcompass.settings import EnvSettings, setting

__all__ = ["ClusterSettings", "PipelineSettings", "RunSettings", "ServiceSettings"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServiceSettings(EnvSettings):
    """What every KVCompass process reads: logging."""

    log_level: Literal["debug", "info", "warning", "error"] = setting(
        "info", "Lowest log level written (debug, info, warning, error)."
    )
    log_json: bool | None = setting(
        None, "JSON log lines on stderr; empty = JSON unless stderr is a terminal."
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterSettings(ServiceSettings):
    """Where the shared Kafka-protocol broker and Redis are, and the topic layout."""

    kafka_bootstrap: str | None = setting(
        None, "Kafka bootstrap servers (host:port,...); empty = the embedded broker."
    )
    redis_url: str | None = setting(
        None, "Redis URL (redis://host:port/db); empty = the embedded redis-server."
    )
    shards: int = setting(
        4, "Index shards = partitions of the events and patches topics (fixed per topic)."
    )
    topic_events: str = setting("kvc.events", "Topic of worker KV events (one partition/shard).")
    topic_patches: str = setting("kvc.patches", "Topic of index patch batches (one per shard).")
    topic_events_dlq: str = setting("kvc.events.dlq", "Dead-letter topic for bad events.")
    topic_queues: str = setting("kvc.queues", "Topic of per-region queue-length broadcasts.")
    replication_factor: int = setting(1, "Replication factor of topics created at start-up.")
    fetch_wait_ms: int = setting(
        20,
        "Consumers' fetch.wait.max.ms. The embedded broker (Tansu) looks for new data at "
        "0, 1/2, 3/4, ... of this wait, so an idle hop adds up to half of it. A fetch that "
        "finds data lists every record batch stored in the partition (batches are never "
        "deleted; measured: 5K in 9 ms, 20K in 25 ms, 100K in 115 ms) and returns nothing "
        "if that takes longer than the wait. Shorter waits cost the broker more CPU when "
        "idle (measured per consumer: ~7% at 20 ms, 10-17% at 10 ms).",
    )

    def validate(self) -> None:
        super().validate()
        if self.shards < 1:
            raise self.invalid("shards", "must be at least 1")
        if self.replication_factor < 1:
            raise self.invalid("replication_factor", "must be at least 1")
        if self.fetch_wait_ms < 1:
            raise self.invalid("fetch_wait_ms", "must be at least 1")
        topics = [self.topic_events, self.topic_patches, self.topic_events_dlq, self.topic_queues]
        if len(set(topics)) != len(topics):
            raise self.invalid("topic_events", f"topic names must be distinct, got {topics}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSettings(ClusterSettings):
    """What the process shell (:mod:`kvcompass.services.runtime`) reads for a long-running
    service: its status endpoint and how long start-up and shutdown may take."""

    metrics_port: int = setting(
        0, "Port of /metrics, /healthz and /readyz (HTTP); 0 = no endpoint."
    )
    metrics_host: str = setting("127.0.0.1", "Address the status endpoint listens on.")
    start_timeout_s: float = setting(
        15.0,
        "Seconds start-up may wait for the broker, the topics and Redis before the service "
        "refuses to start (exit status 2).",
    )
    drain_timeout_s: float = setting(
        20.0,
        "Seconds from the first SIGTERM/SIGINT to exit, in total; past it the process "
        "exits with status 3 without finishing the drain.",
    )

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.metrics_port <= 65535:
            raise self.invalid("metrics_port", "must be a TCP port (0-65535; 0 = off)")
        if self.start_timeout_s <= 0:
            raise self.invalid("start_timeout_s", "must be positive")
        if self.drain_timeout_s <= 0:
            raise self.invalid("drain_timeout_s", "must be positive")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineSettings(RunSettings):
    """What the maintenance units and the edges must agree on besides the cluster."""

    topology: str = setting(
        "testbed-3region", "Built-in topology name or path of a topology TOML file."
    )
    snapshot_prefix: str = setting("kvc:snap", "Redis key prefix of shard snapshots.")
    broker_timeout_s: float = setting(
        30.0,
        "Exit non-zero (status 3) when the broker stays unreachable this long, or comes "
        "back without the log this process has read; a supervisor restarts it.",
    )

    def validate(self) -> None:
        super().validate()
        if self.broker_timeout_s <= 0:
            raise self.invalid("broker_timeout_s", "must be positive")
