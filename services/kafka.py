"""Kafka client settings shared by the services, tuned for this broker and workload."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, Message

__all__ = ["MAX_MESSAGE_BYTES", "consume_ready", "consumer_config", "producer_config"]

#: Patch batches of a large flush and reload images can be big; raise every client limit.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def consumer_config(
    bootstrap: str, group_id: str, fetch_wait_ms: int, **extra: Any
) -> dict[str, Any]:
    """A consumer that never auto-commits (offsets follow durable state).

    ``fetch_wait_ms``: see ``ClusterSettings.fetch_wait_ms`` (the embedded broker looks
    for new data a few times within the wait and gives up on reads that take longer).
    """
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "fetch.wait.max.ms": fetch_wait_ms,
        "fetch.max.bytes": MAX_MESSAGE_BYTES,
        "max.partition.fetch.bytes": MAX_MESSAGE_BYTES,
        "receive.message.max.bytes": MAX_MESSAGE_BYTES + 1024 * 1024,
        **extra,
    }


def producer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    """An idempotent producer: retries never duplicate or reorder a partition's records."""
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "linger.ms": 1,
        "message.max.bytes": MAX_MESSAGE_BYTES,
        **extra,
    }


def consume_ready(consumer: Consumer, max_messages: int, timeout: float) -> list[Message]:
    """Up to ``max_messages`` already fetched; waits up to ``timeout`` s only for the first.

    ``Consumer.consume(n, timeout)`` returns early only once it holds ``n`` messages, so
    under a trickle it adds its whole timeout to every message's latency.
    """
    messages: list[Message] = consumer.consume(max_messages, 0)
    if messages:
        return messages
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(max_messages - 1, 0)]
