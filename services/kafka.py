"""Kafka client settings shared by the services, tuned for this broker and workload, and
the bridge from librdkafka's callbacks to structured logs and readiness.

Clients built from :func:`consumer_config` / :func:`producer_config` log through
:class:`KafkaLog`: librdkafka's own lines arrive as structlog events (``librdkafka``,
with ``facility`` / ``client`` / ``text``) instead of raw ``%3|...`` lines on stderr.
Passing ``**watch.client_config()`` of a :class:`BrokerWatch` as well turns the client's
error callbacks into the ``broker`` readiness condition.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError, Message

from kvcompass.errors import Transient
from kvcompass.services.health import Health

__all__ = [
    "MAX_MESSAGE_BYTES",
    "BrokerLost",
    "BrokerOutage",
    "BrokerWatch",
    "KafkaLog",
    "consume_ready",
    "consumer_config",
    "producer_config",
]


class BrokerLost(Transient):
    """The broker stayed unreachable past ``broker_timeout_s``, or came back without the
    log this process read (a memory broker restarted): exit for the supervisor."""


class BrokerOutage:
    """One loss of the broker, as time passes: when to ask it again whether it is back,
    and when to give up (:class:`BrokerLost`). Clock-free: callers pass ``now``."""

    #: How often a lost broker is asked whether it is back (seconds).
    PROBE_S = 1.0

    def __init__(self, since: float, timeout_s: float, bootstrap: str) -> None:
        self.since = since
        self.timeout_s = timeout_s
        self.bootstrap = bootstrap
        self._next_probe = since + self.PROBE_S

    def probe_due(self, now: float) -> bool:
        """True when the broker should be asked now; BrokerLost once it has been away
        longer than the timeout."""
        down_s = now - self.since
        if down_s > self.timeout_s:
            raise BrokerLost(
                f"the broker at KVC_KAFKA_BOOTSTRAP={self.bootstrap} did not answer for "
                f"{down_s:.0f} s (KVC_BROKER_TIMEOUT_S={self.timeout_s:g})"
            )
        if now < self._next_probe:
            return False
        self._next_probe = now + self.PROBE_S
        return True


# Error codes meaning "no broker can be reached" (as opposed to one request failing).
_UNREACHABLE = frozenset(
    {
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TRANSPORT,
        KafkaError._RESOLVE,
        KafkaError._AUTHENTICATION,
    }
)
# librdkafka repeats a failed connection attempt as a FAIL line on every reconnect; the
# error callback reports the same failure, once per change through BrokerWatch.
_REPEATED_FACILITIES = frozenset({"FAIL"})


class KafkaLog:
    """The ``logger`` of a confluent-kafka client: librdkafka lines as structlog events.

    librdkafka calls ``log(level, "%s [%s] %s", facility, client, text)`` with a stdlib
    level, from inside the client's ``poll`` / ``consume`` / ``flush``.
    """

    def __init__(self, name: str = "kvcompass.kafka") -> None:
        self._log = structlog.get_logger(name)

    def log(self, level: int, fmt: str, *args: object) -> None:
        if len(args) == 3:
            facility, client, text = (str(a) for a in args)
        else:  # not librdkafka's shape: keep the text whole
            facility, client, text = "", "", fmt % args
        if facility in _REPEATED_FACILITIES:
            level = min(level, logging.DEBUG)
        self._log.log(level, "librdkafka", facility=facility, client=client, text=text)


class BrokerWatch:
    """Keeps ``health``'s ``broker`` condition from client callbacks; logs each change once.

    A client reports trouble through ``error_cb`` but never reports recovery, so the loop
    calls :meth:`ok` whenever a client call proved the broker answers (a fetched message,
    a delivery report, a metadata reply).
    """

    def __init__(self, health: Health, condition: str = "broker") -> None:
        self._health = health
        self._condition = condition
        self._log = structlog.get_logger("kvcompass.kafka")

    def client_config(self) -> dict[str, Any]:
        """The ``error_cb`` and ``logger`` entries of a client's configuration."""
        return {"error_cb": self.on_error, "logger": KafkaLog()}

    def on_error(self, error: KafkaError) -> None:
        detail = f"{error.name()}: {error.str()}"
        if error.fatal():
            self._health.set(self._condition, False, detail)
            self._log.error("kafka_fatal_error", code=error.name(), error=error.str())
        elif error.code() in _UNREACHABLE:
            if self._health.set(self._condition, False, detail):
                self._log.warning("broker_unreachable", code=error.name(), error=error.str())
        else:
            self._log.warning("kafka_error", code=error.name(), error=error.str())

    def ok(self) -> None:
        """The broker answered: the condition is ok again (logged only if it was not)."""
        if self._health.set(self._condition, True):
            self._log.info("broker_reachable")


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
        "logger": KafkaLog(),
        "group.id": group_id,
        "enable.auto.commit": False,
        "fetch.wait.max.ms": fetch_wait_ms,
        "fetch.max.bytes": MAX_MESSAGE_BYTES,
        "max.partition.fetch.bytes": MAX_MESSAGE_BYTES,
        "receive.message.max.bytes": MAX_MESSAGE_BYTES + 1024 * 1024,
        **extra,
    }


def producer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    """An ordered producer: one request in flight per connection, so retries never
    reorder a partition's records; a retry may duplicate one, which every consumer drops
    by its own sequence numbers (a worker's batch seq at the MU, a patch seq at the edge).

    Not librdkafka's idempotence: it keeps producer state on the broker, and a broker that
    comes back without it (the embedded memory broker, a rebuilt cluster) fails every
    idempotent producer fatally (UNKNOWN_PRODUCER_ID). That killed every worker host and
    lost its buffered events; this producer delivers them once the broker is back.
    """
    return {
        "bootstrap.servers": bootstrap,
        "logger": KafkaLog(),
        "enable.idempotence": False,
        "max.in.flight.requests.per.connection": 1,
        "acks": "all",
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
