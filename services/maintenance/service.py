"""The maintenance unit: Kafka and Redis around one :class:`ShardWriter` per owned shard.

The writers decide everything (:mod:`kvcompass.pipeline.writer`); this module only moves
messages. One consumer group reads ``kvc.events``; every assigned partition is a shard
this unit now writes. On assignment it loads the shard's snapshot from Redis, reads the
shard's patch partition to its end (the epochs there fence the takeover even when Redis
lost everything), lets the writer take over, stores the new epoch's snapshot and
publishes the writer's announcement. Events are staged as they come and flushed into
patch batches when a read comes back short (caught up) or every ``flush_ms`` under load.
Snapshots go to Redis periodically, on revocation and on shutdown, and only then are
``kvc.events`` offsets committed.

Failures, by the error model (:mod:`kvcompass.errors`):

- a batch the writer refuses (:class:`~kvcompass.errors.BadInput`) goes to the dead-letter
  topic with the reason, and the unit moves on;
- Redis down: the unit keeps consuming and publishing patches; snapshots (and so offset
  commits) wait, retried with a doubling backoff, one log line per change of state;
- anything else (an :class:`~kvcompass.errors.InvariantBroken`, a bug) ends ``run`` at
  once: nothing is snapshotted or committed, the next owner restores the last good
  snapshot and replays, and the sequence numbers drop what was already applied.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

import redis
import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from kvcompass.errors import BadInput, ConfigError, Transient
from kvcompass.index.errors import SnapshotError
from kvcompass.index.ludo import compile_write_kernel
from kvcompass.pipeline.clock import Clock, SystemClock
from kvcompass.pipeline.sequences import Admission, SequenceRefused
from kvcompass.pipeline.writer import ShardWriter
from kvcompass.services.backoff import Backoff
from kvcompass.services.health import Health
from kvcompass.services.kafka import (
    BrokerLost,
    BrokerOutage,
    BrokerWatch,
    consume_ready,
    consumer_config,
    producer_config,
)
from kvcompass.services.maintenance.metrics import MaintenanceMetrics
from kvcompass.services.maintenance.settings import MaintenanceSettings
from kvcompass.services.maintenance.stream import read_tail
from kvcompass.services.preflight import check_topics
from kvcompass.services.snapstore import SnapshotStore
from kvcompass.settings import redact_url
from kvcompass.snapshot import ShardSnapshot
from kvcompass.topology import Topology
from kvcompass.wire import (
    DeadLetter,
    KVEventBatch,
    PatchBatch,
    TableReload,
    WireError,
    decode,
    encode,
)

__all__ = ["MaintenanceUnit"]

log = structlog.get_logger("kvcompass.mu")

T = TypeVar("T")

_CONSUME_BATCH = 500
#: How long start-up checks and takeover reads wait for the broker.
_BROKER_TIMEOUT_S = 10.0
#: The settings fields naming the topics this unit reads and writes.
_TOPICS = ("topic_events", "topic_patches", "topic_events_dlq")
_BACKOFF_FIRST_S = 0.25
_BACKOFF_MAX_S = 5.0
_BROKER_DOWN = frozenset({KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT})


@dataclass
class _Owned:
    writer: ShardWriter
    log: Any  # structlog's bound logger, bound to the shard
    last_snapshot: float
    pending_keys: int = 0
    read: bool = False  # read events since the last flush (flushing others finds nothing)


class MaintenanceUnit:
    """Owns the shards the group assigns it. Use as a context manager around :meth:`run`:
    entering connects and checks the broker, the topics and Redis (one ConfigError or
    Transient naming the setting); leaving closes every client."""

    def __init__(
        self,
        settings: MaintenanceSettings,
        topology: Topology,
        *,
        kafka_bootstrap: str,
        redis_url: str,
        health: Health | None = None,
        registry: CollectorRegistry | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.topology = topology
        self.owner = f"{settings.group_id}/{settings.snapshot_prefix}"
        self.health = health or Health()
        self.metrics = MaintenanceMetrics(registry or CollectorRegistry())
        self.owned: dict[int, _Owned] = {}
        self._bootstrap = kafka_bootstrap
        self._redis_url = redis_url
        self._clock = clock or SystemClock()
        self._stop = threading.Event()
        self._redis: redis.Redis | None = None
        self._store: SnapshotStore | None = None
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._tail: Consumer | None = None
        self._redis_backoff = Backoff(_BACKOFF_FIRST_S, _BACKOFF_MAX_S)
        # Set once run() fails: from then on nothing may be persisted, not even by the
        # revocation that closing the consumer triggers.
        self._crashed = False
        self._outage: BrokerOutage | None = None
        self._broker_watch = BrokerWatch(self.health)
        self._last_flush = 0.0

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> Self:
        try:
            self._open()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and not self._crashed:
            self._crashed = True
        self._close()

    def _open(self) -> None:
        s = self.settings
        try:
            self._redis = redis.Redis.from_url(
                self._redis_url, socket_connect_timeout=2.0, socket_timeout=5.0
            )
        except ValueError as exc:
            raise ConfigError(f"KVC_REDIS_URL={redact_url(self._redis_url)!r}: {exc}") from None
        try:
            self._redis.ping()
        except redis.RedisError as exc:
            raise Transient(
                f"KVC_REDIS_URL={redact_url(self._redis_url)!r}: Redis did not answer ({exc})"
            ) from None
        self._set_redis(True, "")
        self._store = SnapshotStore(self._redis, s.snapshot_prefix)
        try:
            self._producer = Producer(
                producer_config(self._bootstrap, error_cb=self._on_client_error)
            )
        except KafkaException as exc:
            raise ConfigError(f"KVC_KAFKA_BOOTSTRAP={self._bootstrap!r}: {exc}") from None
        self._check_topics(self._producer)
        # Load (or, on a new machine, compile) the index write path before joining the
        # group, so the first events after an assignment are not held up by it.
        started = self._clock.monotonic()
        compile_write_kernel()
        log.info("write_kernel_ready", seconds=round(self._clock.monotonic() - started, 2))
        self._consumer = Consumer(
            consumer_config(
                self._bootstrap,
                s.group_id,
                s.fetch_wait_ms,
                **{
                    # Every assignment names its offset (the snapshot's); an offset out
                    # of range then means the log this unit applied is gone: an error,
                    # never a silent jump to another position.
                    "auto.offset.reset": "error",
                    "session.timeout.ms": s.session_timeout_ms,
                    "heartbeat.interval.ms": max(100, s.session_timeout_ms // 6),
                    "error_cb": self._on_client_error,
                },
            )
        )
        # Reads patch partitions at takeover; assigned explicitly, never joins a group.
        self._tail = Consumer(
            consumer_config(self._bootstrap, f"{s.group_id}.tail", s.fetch_wait_ms)
        )

    def _check_topics(self, producer: Producer, timeout_s: float = _BROKER_TIMEOUT_S) -> None:
        """The topics exist, and the shard count is the partition count of both."""
        try:
            topics = producer.list_topics(timeout=timeout_s).topics
        except KafkaException as exc:
            raise Transient(
                f"KVC_KAFKA_BOOTSTRAP={self._bootstrap!r}: no broker answered within "
                f"{timeout_s:g} s ({exc})"
            ) from None
        check_topics(self.settings, topics, _TOPICS, self._bootstrap)
        self._broker_answered()

    def _close(self) -> None:
        for consumer in (self._consumer, self._tail):
            if consumer is not None:
                consumer.close()
        self._consumer = self._tail = None
        if self._producer is not None:
            # Batches already produced describe state as it was; deliver what we can.
            remaining = self._producer.flush(min(5.0, self.settings.drain_timeout_s))
            if remaining:
                log.error("patches_undelivered_at_exit", count=remaining)
            self._producer = None
        if self._redis is not None:
            self._redis.close()
            self._redis = None
        if self._crashed and self.owned:
            log.error("mu_exit_without_snapshot", shards=sorted(self.owned))
        self.owned.clear()

    def run(self, stop: threading.Event) -> None:
        """Consume and apply until ``stop`` is set, then drain within ``drain_timeout_s``
        (flush, snapshot, commit every owned shard; leave the group)."""
        s = self.settings
        consumer = _opened(self._consumer)
        self._stop = stop
        consumer.subscribe(
            [s.topic_events],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self.health.set("shards_loaded", False, "waiting for the group's assignment")
        log.info("mu_started", group=s.group_id, topic=s.topic_events, owner=self.owner)
        try:
            while not stop.is_set():
                if self._outage is not None:
                    self._await_broker(self._outage)
                messages = consume_ready(consumer, _CONSUME_BATCH, s.flush_ms / 1000)
                # A short read means the unit is caught up: publish now rather than
                # wait out the window; under load the window coalesces writes.
                caught_up = len(messages) < _CONSUME_BATCH
                if messages and self._outage is None:
                    self._broker_answered()  # once per read, not per message
                self.health.set("caught_up", caught_up)
                self._apply_read(messages, flush_runs=caught_up)
                self._maybe_flush(force=caught_up)
                self._maybe_snapshot()
            self._drain()
        except BaseException:
            self._crashed = True
            raise

    def _drain(self) -> None:
        started = self._clock.monotonic()
        deadline = started + self.settings.drain_timeout_s
        for shard in list(self.owned):
            self._release(shard, deadline)
        _opened(self._consumer).close()  # leaves the group now, not at exit
        self._consumer = None
        log.info("mu_stopped", drain_s=round(self._clock.monotonic() - started, 3))

    # -- rebalancing -------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.health.set("shards_loaded", False, f"taking over {len(partitions)} shards")
        for tp in partitions:
            tp.offset = self._take_over(tp.partition)
        consumer.assign(partitions)
        self.health.set("shards_loaded", True)
        self.metrics.owned_shards.set(len(self.owned))

    def _take_over(self, shard: int) -> int:
        """Become the shard's writer; returns the ``kvc.events`` offset to resume at."""
        s = self.settings
        slog = log.bind(shard=shard)
        snapshot = self._load_snapshot(shard, slog)
        writer = ShardWriter(
            shard,
            s.shards,
            self.topology,
            owner=self.owner,
            clock=self._clock,
            max_seq_jump=s.max_seq_jump,
            initial_capacity=s.initial_capacity,
        )
        start = 0
        if snapshot is not None:
            try:
                writer.check_meta(snapshot.meta)
                start = snapshot.meta.patches_offset
            except (SnapshotError, BadInput):
                pass  # take_over refuses it again and says why; read the whole stream
        tail = read_tail(
            _opened(self._tail),
            s.topic_patches,
            shard,
            start,
            self.owner,
            quiet_s=max(0.3, 3 * s.fetch_wait_ms / 1000),
            timeout_s=_BROKER_TIMEOUT_S * 3,
        )
        if tail.foreign:
            slog.warning("foreign_patches", count=tail.foreign, topic=s.topic_patches)
            self.metrics.foreign_patches.inc(tail.foreign)
        events = TopicPartition(s.topic_events, shard)
        try:
            low, high = _opened(self._tail).get_watermark_offsets(events, timeout=_BROKER_TIMEOUT_S)
            committed = _opened(self._consumer).committed([events], timeout=_BROKER_TIMEOUT_S)
        except KafkaException as exc:
            raise Transient(f"broker did not answer while taking over shard {shard}") from exc
        takeover = writer.take_over(
            snapshot,
            stream_epoch=tail.epoch,
            stream_end=tail.end,
            patches_restarted=tail.restarted,
            committed=committed[0].offset >= 0,
            events_low=low,
            events_high=high,
        )
        if takeover.snapshot_refused:
            slog.error("snapshot_refused", reason=takeover.snapshot_refused)
        if takeover.snapshot_lost:
            slog.error("snapshot_lost", rebuild_from_offset=takeover.resume_offset)
            self.metrics.lost_snapshots.inc()
        if takeover.log_reset:
            slog.error(
                "events_log_reset",
                snapshot_offset=snapshot.meta.events_offset if snapshot else None,
                log_end=high,
                effect="the broker lost the event log; the new one is read from its start",
            )
            self.metrics.events_log_resets.inc()
        if takeover.events_gone:
            slog.error("events_gone", count=takeover.events_gone, resume=takeover.resume_offset)
            self.metrics.events_gone.inc(takeover.events_gone)
        owned = _Owned(writer, slog, last_snapshot=self._clock.monotonic())
        self.owned[shard] = owned
        # Edges that reload on the announcement must find the new epoch's snapshot.
        self._snapshot(shard, deadline=None, commit=False)
        self._publish(owned, takeover.announce)
        slog.info(
            "shard_assigned",
            epoch=writer.epoch,
            stream_epoch=tail.epoch,
            resume_offset=takeover.resume_offset,
            restored=takeover.restored,
            keys=writer.tables.count,
        )
        return takeover.resume_offset

    def _load_snapshot(self, shard: int, slog: Any) -> ShardSnapshot | None:
        """The shard's current snapshot (None: none, or unreadable); waits out Redis."""
        store = _opened(self._store)
        while True:
            try:
                snapshot = store.load(shard)
            except SnapshotError as exc:
                slog.error("snapshot_refused", reason=str(exc))
                return None
            except redis.RedisError as exc:
                self._redis_failed(exc)
                if self._stop.wait(self._redis_backoff.delay):
                    raise Transient(f"Redis unreachable while taking over shard {shard}") from exc
                continue
            self._redis_ok()
            return snapshot

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._crashed:
            return  # persist nothing
        deadline = self._clock.monotonic() + self.settings.drain_timeout_s
        for tp in partitions:
            if tp.partition in self.owned:
                self._release(tp.partition, deadline)
        self.metrics.owned_shards.set(len(self.owned))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another unit may already own these: writing a snapshot now could clobber its.
        for tp in partitions:
            if self.owned.pop(tp.partition, None) is not None:
                log.warning("shard_lost", shard=tp.partition)
        self.metrics.owned_shards.set(len(self.owned))

    def _release(self, shard: int, deadline: float) -> None:
        owned = self.owned[shard]
        self._flush(shard)
        self._snapshot(shard, deadline=deadline, commit=True)
        del self.owned[shard]
        owned.log.info("shard_released", epoch=owned.writer.epoch)

    # -- events ------------------------------------------------------------------------

    def _apply_read(self, messages: list[Message], *, flush_runs: bool) -> None:
        """Apply a read; ``flush_runs`` publishes each shard's patches as soon as its
        run of messages is applied (a read often holds several shards' runs in a row,
        and the last shard's would otherwise hold back the others)."""
        for i, message in enumerate(messages):
            self._handle(message)
            shard = message.partition()
            run_ends = i + 1 == len(messages) or messages[i + 1].partition() != shard
            owned = None if shard is None else self.owned.get(shard)
            if flush_runs and run_ends and owned is not None and owned.read:
                self._flush(owned.writer.shard)

    def _handle(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._AUTO_OFFSET_RESET:
                raise BrokerLost(
                    f"{self.settings.topic_events} partition {message.partition()}: the "
                    f"offset this unit resumes at is gone ({error.str()}): the broker lost "
                    "the event log (a memory broker restarted?)"
                )
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("consume_error", error=str(error))
            return
        shard = message.partition()
        offset = message.offset()
        owned = None if shard is None else self.owned.get(shard)
        if owned is None or offset is None:
            return  # a message fetched just before a revocation
        owned.read = True
        cleared = owned.writer.restart_cleared_keys
        try:
            batch = decode(message.value() or b"", KVEventBatch)
            admission = owned.writer.stage(batch, offset)  # written at the next flush
        except BadInput as exc:
            self._dead_letter(owned, message, exc)
            owned.writer.skip(offset)
            return
        if admission is Admission.DUPLICATE:
            self.metrics.duplicates.inc()
            return
        if admission is Admission.RESTART:
            cleared = owned.writer.restart_cleared_keys - cleared
            owned.log.info(
                "worker_restarted",
                worker=batch.worker_id,
                incarnation=batch.worker_incarnation,
                cleared_keys=cleared,
            )
            self.metrics.worker_restarts.inc()
            self.metrics.restart_cleared_keys.inc(cleared)
        self.metrics.events_applied.labels(str(shard)).inc()
        self.metrics.keys_applied.inc(batch.n_keys)
        owned.pending_keys += batch.n_keys

    def _dead_letter(self, owned: _Owned, message: Message, exc: BadInput) -> None:
        reason = (
            "wire"
            if isinstance(exc, WireError)
            else "sequence"
            if isinstance(exc, SequenceRefused)
            else "event"
        )
        letter = DeadLetter(
            topic=message.topic() or self.settings.topic_events,
            partition=message.partition() or 0,
            offset=message.offset() or 0,
            reason=str(exc),
            payload=message.value() or b"",
        )
        _opened(self._producer).produce(self.settings.topic_events_dlq, encode(letter), partition=0)
        self.metrics.dead_letters.labels(reason).inc()
        owned.log.warning(
            "event_dead_lettered", offset=message.offset(), kind=reason, reason=str(exc)
        )

    # -- patches -----------------------------------------------------------------------

    def _maybe_flush(self, force: bool = False) -> None:
        now = self._clock.monotonic()
        due = force or (now - self._last_flush) * 1000 >= self.settings.flush_ms
        for shard, owned in list(self.owned.items()):
            if owned.read and (due or owned.pending_keys >= self.settings.flush_keys):
                self._flush(shard)
        if due:
            self._last_flush = now
        _opened(self._producer).poll(0)

    def _flush(self, shard: int) -> None:
        owned = self.owned[shard]
        owned.pending_keys = 0
        owned.read = False
        try:
            batch = owned.writer.flush(self._persist)
        except Transient:
            # A grown table's snapshot could not be stored; the writer kept everything
            # and the next flush tries again.
            owned.read = True
            return
        if batch is None:
            return
        reloads = [t for t in batch.tables if isinstance(t.patch, TableReload)]
        if reloads:
            owned.log.info(
                "table_grew",
                tables=[t.table_id for t in reloads],
                snapshot=[
                    t.patch.snapshot_key for t in reloads if isinstance(t.patch, TableReload)
                ],
            )
        self._publish(owned, batch)

    def _persist(self, snapshot: ShardSnapshot) -> str:
        """Store a snapshot a reload names (the writer's ``persist``); Transient if not."""
        if not self._redis_backoff.due(self._clock.monotonic()):
            raise Transient("Redis is unreachable; retrying later")
        try:
            key = _opened(self._store).save(snapshot)
        except redis.RedisError as exc:
            self._redis_failed(exc)
            raise Transient(f"Redis: {exc}") from exc
        self._redis_ok()
        return key

    def _publish(self, owned: _Owned, batch: PatchBatch) -> None:
        data = encode(batch)
        writer = owned.writer

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                # Edges will see a gap and reload; the next snapshot covers its content.
                owned.log.error("patch_delivery_failed", seq=batch.seq, error=str(err))
                return
            offset = msg.offset()
            if offset is not None:
                writer.delivered(batch.seq, offset)

        _opened(self._producer).produce(
            self.settings.topic_patches, data, partition=batch.shard, on_delivery=delivered
        )
        self.metrics.patch_batches.inc()
        self.metrics.patch_bytes.inc(len(data))

    # -- snapshots -----------------------------------------------------------------------

    def _maybe_snapshot(self) -> None:
        now = self._clock.monotonic()
        oldest = 0.0
        for shard, owned in list(self.owned.items()):
            age = now - owned.last_snapshot
            if age >= self.settings.snapshot_interval_s and self._redis_backoff.due(now):
                self._flush(shard)
                if self._snapshot(shard, deadline=None, commit=True):
                    age = 0.0
            oldest = max(oldest, age)
        self.metrics.snapshot_age.set(oldest)

    def _snapshot(self, shard: int, *, deadline: float | None, commit: bool) -> bool:
        """Make the shard durable in Redis, then commit the offsets it covers. False when
        it had to wait (Redis down, or the drain deadline passed): nothing committed."""
        owned = self.owned[shard]
        now = self._clock.monotonic()
        if not self._redis_backoff.due(now):
            return False
        timeout = self.settings.drain_timeout_s if deadline is None else deadline - now
        if timeout <= 0:
            owned.log.error("snapshot_skipped", reason="drain deadline passed")
            return False
        remaining = _opened(self._producer).flush(timeout)
        if remaining:
            owned.log.error("patch_flush_incomplete", remaining=remaining)
        snapshot = owned.writer.snapshot()  # InvariantBroken: the unit stops, persists nothing
        try:
            vkey = _opened(self._store).save(snapshot)
        except redis.RedisError as exc:
            self._redis_failed(exc)
            self.metrics.snapshot_failures.inc()
            return False
        self._redis_ok()
        owned.last_snapshot = self._clock.monotonic()
        self.metrics.snapshots.inc()
        meta = snapshot.meta
        if commit and meta.events_offset >= 0:
            events = TopicPartition(self.settings.topic_events, shard, meta.events_offset + 1)
            try:
                _opened(self._consumer).commit(offsets=[events], asynchronous=False)
            except KafkaException as exc:
                # Only a hint (a takeover resumes at the snapshot): log, carry on.
                owned.log.warning("offset_commit_failed", error=str(exc))
        owned.log.info(
            "shard_snapshot",
            snapshot=vkey,
            epoch=meta.epoch,
            events_offset=meta.events_offset,
            patches_offset=meta.patches_offset,
            next_seq=meta.next_seq,
        )
        return True

    # -- dependencies' health ------------------------------------------------------------

    def _redis_failed(self, exc: Exception) -> None:
        self._redis_backoff.failed(self._clock.monotonic())
        if self._set_redis(False, str(exc)):
            log.error(
                "redis_unreachable",
                error=str(exc),
                retry_s=self._redis_backoff.delay,
                effect="snapshots and offset commits wait; patches keep flowing",
            )

    def _redis_ok(self) -> None:
        self._redis_backoff.succeeded()
        if self._set_redis(True, ""):
            log.info("redis_reachable")

    def _set_redis(self, ok: bool, detail: str) -> bool:
        self.metrics.redis_up.set(int(ok))
        first = "redis" not in self.health.report()
        return self.health.set("redis", ok, detail) and not first

    def _broker_answered(self) -> None:
        self.metrics.broker_up.set(1)
        self._broker_watch.ok()

    def _on_client_error(self, error: KafkaError) -> None:
        self._broker_watch.on_error(error)  # the health condition and one line per change
        if error.code() in _BROKER_DOWN:
            self.metrics.broker_up.set(0)
            if self._outage is None:
                self._outage = BrokerOutage(
                    self._clock.monotonic(), self.settings.broker_timeout_s, self._bootstrap
                )

    def _await_broker(self, outage: BrokerOutage) -> None:
        """While the broker is lost: ask it now and then whether it is back; past
        ``broker_timeout_s``, or when it answers without this unit's topics, BrokerLost."""
        if not outage.probe_due(self._clock.monotonic()):
            return
        try:
            self._check_topics(_opened(self._producer), timeout_s=outage.PROBE_S)
        except Transient:
            return
        except ConfigError as exc:
            raise BrokerLost(f"the broker came back without its log ({exc})") from None
        # Back with its topics: the group rebalances and every fetch resumes at an
        # offset that must still exist (else _AUTO_OFFSET_RESET above).
        self._outage = None
        self._broker_answered()


def _opened(client: T | None) -> T:
    """A client this unit opened in ``__enter__`` (a clear error if used outside)."""
    if client is None:
        raise RuntimeError("MaintenanceUnit used outside its `with` block")
    return client
