"""Start-up checks of a service's dependencies, before any service object is built.

Each check either passes (and records its readiness condition) or raises one error whose
message names the setting and its value: :class:`ConfigError` for a value that cannot
work (a malformed address, a missing topic, a partition count that differs from
``KVC_SHARDS``), :class:`Transient` for a server that did not answer by the start
deadline. The process shell turns either into exit status 2 and one log line.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from kvcompass.errors import ConfigError, Transient
from kvcompass.services.health import Health
from kvcompass.services.infra.topics import (
    PARTITIONS_ARE_FIXED,
    partition_problems,
    topic_specs,
)
from kvcompass.services.kafka import KafkaLog
from kvcompass.services.settings import ClusterSettings, RunSettings
from kvcompass.settings import redact_url

__all__ = ["Address", "check_kafka", "check_redis", "check_topics"]

_REDIS_RETRY_S = 0.1


@dataclass(frozen=True)
class Address:
    """A server address and where it came from (a variable, or the infra state file)."""

    value: str
    source: str

    def __str__(self) -> str:
        return f"{self.source}={redact_url(self.value)!r}"


def check_kafka(
    settings: RunSettings,
    bootstrap: Address,
    topic_fields: Sequence[str],
    deadline: float,
    health: Health,
) -> None:
    """The broker answers by ``deadline`` and has the topics named by ``topic_fields``
    (settings fields such as ``topic_events``) with the partition counts they need."""
    _check_bootstrap_syntax(bootstrap)
    errors: list[KafkaError] = []
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap.value,
        "logger": KafkaLog(),
        "error_cb": errors.append,
    }
    admin = AdminClient(config)
    try:
        # All topics: asking for one by name makes Tansu create it.
        topics = admin.list_topics(timeout=max(deadline - time.monotonic(), 0.1)).topics
    except KafkaException:
        admin.poll(0)  # deliver the error callbacks that say why
        why = errors[-1].str() if errors else "no answer"
        raise Transient(
            f"{bootstrap}: no broker answered within {settings.start_timeout_s:g} s "
            f"({settings.env_name('start_timeout_s')}; last error: {why})"
        ) from None
    finally:
        del admin
    check_topics(settings, topics, topic_fields, bootstrap.value)
    health.set("broker", True)


def check_topics(
    settings: ClusterSettings,
    topics: Mapping[str, Any],  # name -> TopicMetadata (not exported to type checkers)
    topic_fields: Sequence[str],
    bootstrap: str,
) -> None:
    """ConfigError unless ``topics`` (a metadata reply listing every topic: asking for one
    by name makes Tansu create it) has the topics named by ``topic_fields`` with the
    partition counts they need. At start, and when a lost broker answers again."""
    names = {getattr(settings, f): f for f in topic_fields}
    for name, field in names.items():
        if name not in topics or topics[name].error is not None:
            raise ConfigError(
                f"{settings.env_name(field)}={name!r}: no such topic on {bootstrap} "
                "(`kvcompass infra up` creates the topics)"
            )
    specs = [s for s in topic_specs(settings) if s.name in names]
    counts = {n: len(topics[n].partitions) for n in names}
    problems = partition_problems(specs, counts)
    if problems:
        raise ConfigError("; ".join(problems) + ". " + PARTITIONS_ARE_FIXED)


def check_redis(settings: RunSettings, url: Address, deadline: float, health: Health) -> None:
    """Redis at ``url`` answers PING by ``deadline``."""
    try:
        client = redis.Redis.from_url(url.value, socket_connect_timeout=1.0, socket_timeout=1.0)
    except ValueError as exc:
        raise ConfigError(f"{url}: {exc}") from None
    try:
        while True:
            try:
                client.ping()
            except redis.RedisError as exc:
                if time.monotonic() >= deadline:
                    raise Transient(
                        f"{url}: Redis did not answer within {settings.start_timeout_s:g} s "
                        f"({settings.env_name('start_timeout_s')}; last error: {exc})"
                    ) from None
                time.sleep(_REDIS_RETRY_S)
            else:
                break
    finally:
        client.close()
    health.set("redis", True)


def _check_bootstrap_syntax(bootstrap: Address) -> None:
    """``host:port[,host:port...]``, each optionally with a ``scheme://`` prefix."""
    servers = [s.strip() for s in bootstrap.value.split(",")]
    for server in servers:
        parts = urlsplit(server if "//" in server else f"//{server}")
        try:
            port = parts.port
        except ValueError:
            port = None
        if not server or not parts.hostname or port is None or port == 0:
            raise ConfigError(f"{bootstrap}: expected host:port[,host:port...], got {server!r}")
