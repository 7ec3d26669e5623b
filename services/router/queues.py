"""The kvc.queues consumer: every region's queue vectors, applied to this edge's policy
when addressed to its region and fresh.

The embedded broker (Tansu) can neither seek by time (``offsets_for_times`` answers 0)
nor report a correct end offset when batches hold several records (its high watermark
then falls short of the end, never beyond it). So the consumer starts, without a group,
``_TAIL`` records before the reported watermark, which is at or before the real end, and
skips vectors older than ``max_age_s`` by their ``sent_at_ns``: nothing fresh is missed,
nothing stale reaches the policy, and a router started after hours of broadcasts does not
replay them all (on Tansu every fetch lists all stored batches, so a full replay of a
long topic takes minutes). A thread of its own runs the librdkafka client; each vector is
handed to the event loop, the only place that touches the policy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from kvcompass.pipeline.clock import Clock
from kvcompass.services.health import Health
from kvcompass.services.kafka import BrokerWatch, consume_ready, consumer_config
from kvcompass.services.router.metrics import RouterMetrics
from kvcompass.services.router.policy import RegionQueues
from kvcompass.wire import QueueVector, WireError, decode

__all__ = ["QueueConsumer", "region_queues"]

_POLL_S = 0.2  # how often the thread looks at its stop flag when the topic is quiet
_TAIL = 2_000  # records read before the reported end at start (≥ 1 s of every region's)


def region_queues(vector: QueueVector) -> RegionQueues:
    return RegionQueues(vector.region, vector.seq, vector.sent_at_ns, dict(vector.queues))


class QueueConsumer:
    """Reads ``topic`` until :meth:`close`; ``apply`` gets each fresh vector for
    ``region`` (called from the consumer thread: it must hand over to the loop)."""

    def __init__(
        self,
        *,
        bootstrap: str,
        topic: str,
        region: str,
        fetch_wait_ms: int,
        max_age_s: float,
        apply: Callable[[RegionQueues], None],
        clock: Clock,
        health: Health,
        metrics: RouterMetrics,
    ) -> None:
        self._topic = topic
        self._region = region
        self._max_age_ns = int(max_age_s * 1e9)
        self._apply = apply
        self._clock = clock
        self._health = health
        self._metrics = metrics
        self._log = structlog.get_logger("kvcompass.router.queues")
        self._last_sent_ns: dict[str, int] = {}
        self._watch = BrokerWatch(health)
        # No group: offsets are never committed; the group id only satisfies librdkafka.
        self._consumer = Consumer(
            consumer_config(
                bootstrap,
                f"kvc-router-{region}",
                fetch_wait_ms,
                **self._watch.client_config(),
                **{"enable.partition.eof": True},
            )
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="queue-consumer", daemon=True)
        health.set("queues", False, "not started")

    def start(self) -> None:
        metadata = self._consumer.list_topics(self._topic, timeout=10)
        partitions = sorted(metadata.topics[self._topic].partitions)
        starts = []
        # Caught up once every partition is read up to the watermark seen now, or has
        # reported its end: under steady broadcasts a fetch always finds data, so an
        # end-of-partition event alone might never come.
        self._caught_up_at: dict[int, int] = {}
        for p in partitions:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self._topic, p), timeout=10
            )
            offset = max(low, high - _TAIL)
            starts.append(
                TopicPartition(self._topic, p, offset if offset > 0 else OFFSET_BEGINNING)
            )
            if high > low:
                self._caught_up_at[p] = high - 1
        self._consumer.assign(starts)
        self._pending_eof = set(self._caught_up_at)
        if not self._pending_eof:
            self._health.set("queues", True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._consumer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in consume_ready(self._consumer, 500, _POLL_S):
                error = message.error()
                if error is None:
                    self._watch.ok()
                    self._record(message.value())
                    partition = message.partition()
                    if (
                        partition in self._pending_eof
                        and (message.offset() or 0) >= (self._caught_up_at[partition])
                    ):
                        self._caught_up(partition)
                elif error.code() == KafkaError._PARTITION_EOF:
                    self._caught_up(message.partition())
                else:
                    self._log.warning("queues_error", error=error.str())

    def _caught_up(self, partition: int | None) -> None:
        if self._pending_eof:
            self._pending_eof.discard(partition or 0)
            if not self._pending_eof:
                self._health.set("queues", True)  # caught up once: ready

    def _record(self, value: bytes | None) -> None:
        try:
            vector = decode(value or b"", QueueVector)
        except WireError as exc:
            self._metrics.queue_vectors.labels("bad").inc()
            self._log.warning("bad_queue_vector", error=str(exc))
            return
        if not vector.addressed_to(self._region):
            self._metrics.queue_vectors.labels("not_addressed").inc()
            return
        age_ns = self._clock.wall_ns() - vector.sent_at_ns
        if age_ns > self._max_age_ns:
            self._metrics.queue_vectors.labels("stale").inc()
            return
        self._metrics.queue_vectors.labels("applied").inc()
        self._last_sent_ns[vector.region] = vector.sent_at_ns
        self._apply(region_queues(vector))

    def ages_s(self) -> dict[str, float]:
        """Age of the latest applied vector per source region (any thread)."""
        now = self._clock.wall_ns()
        return {r: max(0, now - ns) / 1e9 for r, ns in list(self._last_sent_ns.items())}
