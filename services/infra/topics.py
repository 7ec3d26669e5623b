"""The KVCompass topics and their idempotent creation through the Kafka admin API.

``kvc.events`` and ``kvc.patches`` have one partition per shard: the producer picks the
partition from the key, so the count is part of the data layout. It can never change in
place (Tansu has no CreatePartitions; on Kafka more partitions would remap keys to other
shards), so an existing topic with another count is an error, not something to fix up.
"""

from __future__ import annotations

import concurrent.futures
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # documented, not re-exported
    AdminClient,
    NewTopic,
)

from kvcompass.services.infra.errors import TopicError, TopicPartitionMismatch
from kvcompass.services.kafka import KafkaLog
from kvcompass.services.settings import ClusterSettings

__all__ = [
    "PARTITIONS_ARE_FIXED",
    "TopicSpec",
    "create_topics",
    "ensure_topics",
    "partition_problems",
    "topic_specs",
]

log = structlog.get_logger(__name__)
_FIXED = "fixed"
PARTITIONS_ARE_FIXED = (
    "A topic's partition count cannot be changed in place (Tansu has no CreatePartitions; "
    "on Kafka it would move keys to other shards): delete the topic, or restart the "
    "embedded broker (memory storage), and retry."
)


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create; ``source`` names the setting its partition count comes from."""

    name: str
    partitions: int
    source: str = _FIXED
    configs: tuple[tuple[str, str], ...] = ()


def topic_specs(settings: ClusterSettings) -> tuple[TopicSpec, ...]:
    """The topics every KVCompass deployment needs, named as the settings say."""
    shards = settings.env_name("shards")
    return (
        TopicSpec(settings.topic_events, settings.shards, shards),
        TopicSpec(settings.topic_patches, settings.shards, shards),
        TopicSpec(settings.topic_events_dlq, 1),
        TopicSpec(settings.topic_queues, 1),
    )


def ensure_topics(
    bootstrap: str, settings: ClusterSettings, *, timeout: float = 10.0
) -> dict[str, int]:
    """Create the KVCompass topics on ``bootstrap`` unless they exist; verify the counts.

    Returns ``{topic: partitions}``. Raises :class:`TopicPartitionMismatch` when an
    existing topic has another partition count, :class:`TopicError` on other failures.
    """
    return create_topics(
        bootstrap,
        topic_specs(settings),
        replication_factor=settings.replication_factor,
        timeout=timeout,
    )


def create_topics(
    bootstrap: str,
    specs: Sequence[TopicSpec],
    *,
    replication_factor: int = 1,
    timeout: float = 10.0,
) -> dict[str, int]:
    """Create ``specs`` (an existing topic is fine) and check every partition count."""
    # librdkafka's log lines become structlog events (the stubs only know str/int/float).
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": KafkaLog()}
    admin = AdminClient(config)
    try:
        created, existing, counts = _create(admin, bootstrap, specs, replication_factor, timeout)
    except TopicError as exc:
        # A kept error must not keep the client alive through its traceback: an open
        # connection makes the broker wait 5 s on shutdown.
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        del admin
    _check_counts(specs, counts)
    log.info(
        "topics_ready", bootstrap=bootstrap, created=created, existing=existing, partitions=counts
    )
    return counts


def _create(
    admin: AdminClient,
    bootstrap: str,
    specs: Sequence[TopicSpec],
    replication_factor: int,
    timeout: float,
) -> tuple[list[str], list[str], dict[str, int]]:
    deadline = time.monotonic() + timeout
    new = [
        NewTopic(s.name, s.partitions, replication_factor, config=dict(s.configs)) for s in specs
    ]
    futures = admin.create_topics(new, request_timeout=timeout, operation_timeout=timeout)
    created, existing = [], []
    for name, future in futures.items():
        # exception(), not result(): a raised error would keep this frame (and the
        # client) alive in a reference cycle until the next garbage collection.
        try:
            error = future.exception(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            raise TopicError(
                f"creating topic {name!r} on {bootstrap}: no answer in {timeout:g} s"
            ) from None
        if error is None:
            created.append(name)
            continue
        kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else error
        if (
            isinstance(kafka_error, KafkaError)
            and kafka_error.code() == KafkaError.TOPIC_ALREADY_EXISTS
        ):
            existing.append(name)
            continue
        raise TopicError(f"creating topic {name!r} on {bootstrap} failed: {kafka_error}") from error
    counts = _partition_counts(admin, [s.name for s in specs], bootstrap, deadline)
    admin.poll(0)  # hand queued librdkafka log lines to the logger
    return created, existing, counts


def _partition_counts(
    admin: AdminClient, names: Sequence[str], bootstrap: str, deadline: float
) -> dict[str, int]:
    """Poll cluster metadata (all topics: asking for one would auto-create it on Tansu)."""
    while True:
        remaining = deadline - time.monotonic()
        try:
            topics = admin.list_topics(timeout=max(remaining, 0.1)).topics
        except KafkaException as exc:
            raise TopicError(f"listing topics on {bootstrap} failed: {exc.args[0]}") from exc
        ready = {
            n: len(topics[n].partitions)
            for n in names
            if n in topics and topics[n].error is None and topics[n].partitions
        }
        if len(ready) == len(names):
            return ready
        if remaining <= 0:
            missing = sorted(set(names) - set(ready))
            raise TopicError(f"topics {missing} did not appear on {bootstrap} in time")
        time.sleep(0.02)


def partition_problems(specs: Sequence[TopicSpec], counts: Mapping[str, int]) -> list[str]:
    """One sentence per topic in ``counts`` whose partition count differs from its spec,
    naming both numbers and the setting behind the required one."""
    problems = []
    for spec in specs:
        actual = counts.get(spec.name)
        if actual is None or actual == spec.partitions:
            continue
        if spec.source == _FIXED:
            hint = "this topic always has 1 partition"
        else:
            hint = f"{spec.source}={spec.partitions}; or set {spec.source}={actual} to match it"
        problems.append(
            f"topic {spec.name!r} exists with {actual} partitions but {spec.partitions} "
            f"are required ({hint})"
        )
    return problems


def _check_counts(specs: Sequence[TopicSpec], counts: Mapping[str, int]) -> None:
    problems = partition_problems(specs, counts)
    if problems:
        raise TopicPartitionMismatch("; ".join(problems) + ". " + PARTITIONS_ARE_FIXED)
