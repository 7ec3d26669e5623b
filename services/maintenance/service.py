"""The maintenance unit's consume–apply–publish loop.

One consumer group over ``kvc.events``; every assigned partition is a shard this unit now
writes. On assignment it restores the shard's Redis snapshot (or starts empty), bumps the
shard epoch, snapshots again, and resumes at the snapshot's offset + 1 (never at the
group's committed offset, which may be ahead of what the snapshot holds). Events are
applied as they come; once a shard's part of a short read is applied (or every
``flush_ms`` under load) the touched tables' patches go to the shard's partition of
``kvc.patches``. Snapshots are written periodically, on revocation and on
shutdown, each after the producer has delivered every earlier patch batch, and only
then are ``kvc.events`` offsets committed. A crash at any point therefore replays from
the last snapshot: nothing acknowledged is lost and redeliveries are dropped by the
per-worker sequence numbers.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import redis
import structlog
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from kvcompass.index.ludo import compile_write_kernel
from kvcompass.maintenance import BadEvent, Flush, ShardState
from kvcompass.services.kafka import consume_ready, consumer_config, producer_config
from kvcompass.services.maintenance.metrics import MaintenanceMetrics
from kvcompass.services.maintenance.settings import MaintenanceSettings
from kvcompass.services.snapstore import SnapshotStore
from kvcompass.topology import Topology
from kvcompass.wire import (
    DeadLetter,
    KVEventBatch,
    PatchBatch,
    TablePatchWire,
    TableReload,
    WireError,
    decode,
    encode,
)

__all__ = ["MaintenanceUnit"]

log = structlog.get_logger("kvcompass.mu")

_CONSUME_BATCH = 500


@dataclass
class _Owned:
    state: ShardState
    last_snapshot: float = field(default_factory=time.monotonic)
    pending_keys: int = 0
    read: bool = False  # read events since the last flush (flushing others finds nothing)


class MaintenanceUnit:
    """Owns the shards the group assigns it; ``run`` until ``stop`` is set."""

    def __init__(
        self,
        settings: MaintenanceSettings,
        topology: Topology,
        *,
        kafka_bootstrap: str,
        redis_url: str,
        metrics: MaintenanceMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.topology = topology
        self.metrics = metrics or MaintenanceMetrics()
        self.stop = threading.Event()
        self.owned: dict[int, _Owned] = {}
        self._store = SnapshotStore(redis.Redis.from_url(redis_url), settings.snapshot_prefix)
        self._consumer = Consumer(
            consumer_config(
                kafka_bootstrap,
                settings.group_id,
                settings.fetch_wait_ms,
                **{
                    "auto.offset.reset": "earliest",
                    "session.timeout.ms": settings.session_timeout_ms,
                    "heartbeat.interval.ms": max(100, settings.session_timeout_ms // 6),
                },
            )
        )
        self._producer = Producer(producer_config(kafka_bootstrap))
        self._last_flush = time.monotonic()

    # -- lifecycle -------------------------------------------------------------------

    def run(self, max_seconds: float | None = None) -> None:
        """Consume and apply until ``stop`` is set (or ``max_seconds`` pass), then drain."""
        s = self.settings
        # Load (or, on a new machine, compile) the index write path before joining the
        # group, so the first events after an assignment are not held up by it.
        started = time.monotonic()
        compile_write_kernel()
        log.info("write_kernel_ready", seconds=round(time.monotonic() - started, 2))
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        self._consumer.subscribe(
            [s.topic_events],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info("mu_started", group=s.group_id, topic=s.topic_events)
        try:
            while not self.stop.is_set():
                if deadline is not None and time.monotonic() > deadline:
                    break
                messages = consume_ready(self._consumer, _CONSUME_BATCH, s.flush_ms / 1000)
                # A short read means the unit is caught up: publish now rather than
                # wait out the window; under load the window coalesces writes.
                caught_up = len(messages) < _CONSUME_BATCH
                self._apply_read(messages, flush_runs=caught_up)
                self._maybe_flush(force=caught_up)
                self._maybe_snapshot()
        finally:
            self._drain()

    def _drain(self) -> None:
        """Flush, snapshot and commit every owned shard, then leave the group."""
        started = time.monotonic()
        for shard in list(self.owned):
            self._release(shard, snapshot=True)
        self._consumer.close()
        log.info("mu_stopped", drain_s=round(time.monotonic() - started, 3))

    # -- rebalancing -------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            state = self._restore(tp.partition)
            state.epoch += 1
            state.next_seq = 0
            self._store.save(state.snapshot(time.time_ns()))
            self.owned[tp.partition] = _Owned(state)
            self._announce_epoch(state)
            tp.offset = state.events_offset + 1
            log.info(
                "shard_assigned",
                shard=tp.partition,
                epoch=state.epoch,
                resume_offset=tp.offset,
                keys=sum(len(t) for t in state.tables.values()),
            )
        consumer.assign(partitions)
        self.metrics.owned_shards.set(len(self.owned))

    def _announce_epoch(self, state: ShardState) -> None:
        """Batch 0 of a new epoch, without tables: edges reload the shard right away
        instead of at its next write (an idle shard might have none for a long time)."""
        batch = PatchBatch(
            shard=state.shard,
            epoch=state.epoch,
            seq=state.next_seq,
            events_from=state.events_offset + 1,
            events_to=state.events_offset,
            produced_at_ns=time.time_ns(),
        )
        self._producer.produce(self.settings.topic_patches, encode(batch), partition=state.shard)
        state.next_seq += 1

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.partition in self.owned:
                self._release(tp.partition, snapshot=True)
        self.metrics.owned_shards.set(len(self.owned))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Another unit may already own these: writing a snapshot now could clobber its.
        for tp in partitions:
            self.owned.pop(tp.partition, None)
            log.warning("shard_lost", shard=tp.partition)
        self.metrics.owned_shards.set(len(self.owned))

    def _restore(self, shard: int) -> ShardState:
        snapshot = self._store.load(shard)
        if snapshot is None:
            return ShardState(
                shard,
                self.settings.shards,
                self.topology,
                initial_capacity=self.settings.initial_capacity,
            )
        return ShardState.from_snapshot(snapshot, self.settings.shards, self.topology)

    def _release(self, shard: int, *, snapshot: bool) -> None:
        owned = self.owned[shard]
        self._flush(shard)
        if snapshot:
            self._snapshot(shard)
        del self.owned[shard]
        log.info("shard_released", shard=shard, epoch=owned.state.epoch)

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
                self._flush(owned.state.shard)

    def _handle(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("consume_error", error=str(error))
            return
        shard = message.partition()
        offset = message.offset()
        owned = None if shard is None else self.owned.get(shard)
        if owned is None or offset is None:
            return  # a message fetched just before a revocation
        owned.read = True
        payload = message.value() or b""
        try:
            batch = decode(payload, KVEventBatch)
            applied = owned.state.stage(batch, offset)  # written at the next flush
        except (WireError, BadEvent) as exc:
            self._dead_letter(message, str(exc), "wire" if isinstance(exc, WireError) else "bad")
            owned.state.skip(offset)
            return
        if applied:
            self.metrics.events_applied.labels(str(shard)).inc()
            self.metrics.keys_applied.inc(batch.n_keys)
            owned.pending_keys += batch.n_keys
        else:
            self.metrics.duplicates.inc()

    def _dead_letter(self, message: Message, reason: str, kind: str) -> None:
        letter = DeadLetter(
            topic=message.topic() or self.settings.topic_events,
            partition=message.partition() or 0,
            offset=message.offset() or 0,
            reason=reason,
            payload=message.value() or b"",
        )
        self._producer.produce(self.settings.topic_events_dlq, encode(letter), partition=0)
        self.metrics.dead_letters.labels(kind).inc()
        log.warning(
            "event_dead_lettered",
            shard=message.partition(),
            offset=message.offset(),
            reason=reason,
        )

    # -- patches and snapshots -------------------------------------------------------------

    def _maybe_flush(self, force: bool = False) -> None:
        now = time.monotonic()
        due = force or (now - self._last_flush) * 1000 >= self.settings.flush_ms
        for shard, owned in list(self.owned.items()):
            if owned.read and (due or owned.pending_keys >= self.settings.flush_keys):
                self._flush(shard)
        if due:
            self._last_flush = now
        self._producer.poll(0)

    def _flush(self, shard: int) -> None:
        owned = self.owned[shard]
        state = owned.state
        flush = state.flush()
        owned.pending_keys = 0
        owned.read = False
        if flush is None:
            return
        # A batch without tables still tells edges (and lag monitors) how far this unit
        # has read kvc.events.
        seq = state.next_seq
        state.next_seq = seq + 1
        reload_key = self._snapshot_for_reload(shard, flush) if flush.reloads else None
        tables = tuple(
            TablePatchWire(
                t,
                TableReload(p.generation, reload_key)
                if p.reload is not None and reload_key is not None
                else p,
            )
            for t, p in sorted(flush.tables.items())
        )
        batch = PatchBatch(
            shard=shard,
            epoch=state.epoch,
            seq=seq,
            events_from=flush.events_from,
            events_to=flush.events_to,
            produced_at_ns=time.time_ns(),
            tables=tables,
        )
        data = encode(batch)

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                # Without this batch the edges would see a gap and reload; the next
                # snapshot covers its content, so nothing is lost, only fresher.
                log.error("patch_delivery_failed", shard=shard, seq=seq, error=str(err))
                return
            offset = msg.offset()
            if offset is not None and shard in self.owned:
                self.owned[shard].state.patches_offset = max(
                    self.owned[shard].state.patches_offset, offset + 1
                )

        self._producer.produce(
            self.settings.topic_patches, data, partition=shard, on_delivery=delivered
        )
        self.metrics.patch_batches.inc()
        self.metrics.patch_bytes.inc(len(data))

    def _snapshot_for_reload(self, shard: int, flush: Flush) -> str:
        """A table grew: its views reload from a snapshot that must exist first."""
        self._producer.flush()
        vkey = self._store.save(self.owned[shard].state.snapshot(time.time_ns()))
        log.info("table_grew", shard=shard, tables=flush.reloads, snapshot=vkey)
        return vkey

    def _maybe_snapshot(self) -> None:
        now = time.monotonic()
        oldest = 0.0
        for shard, owned in list(self.owned.items()):
            age = now - owned.last_snapshot
            if age >= self.settings.snapshot_interval_s:
                self._flush(shard)
                self._snapshot(shard)
                age = 0.0
            oldest = max(oldest, age)
        self.metrics.snapshot_age.set(oldest)

    def _snapshot(self, shard: int) -> None:
        """Make the shard durable in Redis, then commit the offsets it covers."""
        owned = self.owned[shard]
        remaining = self._producer.flush(self.settings.drain_timeout_s)
        if remaining:
            log.error("patch_flush_incomplete", shard=shard, remaining=remaining)
        state = owned.state
        vkey = self._store.save(state.snapshot(time.time_ns()))
        owned.last_snapshot = time.monotonic()
        self.metrics.snapshots.inc()
        if state.events_offset >= 0:
            self._consumer.commit(
                offsets=[
                    TopicPartition(self.settings.topic_events, shard, state.events_offset + 1)
                ],
                asynchronous=False,
            )
        log.info(
            "shard_snapshot",
            shard=shard,
            snapshot=vkey,
            events_offset=state.events_offset,
            patches_offset=state.patches_offset,
            next_seq=state.next_seq,
        )
