"""The edge replayer: Kafka and Redis in, the core's PatchFollower decides, shared memory out.

Per shard a :class:`~kvcompass.pipeline.PatchFollower` judges each ``kvc.patches`` batch.
A resync reloads the shard from its current Redis snapshot (verified part by part) and
re-reads the partition from the snapshot's offset; the replayer never seeks by "latest"
or by time. Faults of the infrastructure never take the views away from readers:

- Redis unreachable: the views stay as they are and batches that need no snapshot keep
  applying; Redis is retried with a doubling backoff and each change of state is one log
  line. A shard that must reload meanwhile is marked not ready until it has.
- Broker lost (librdkafka reports every broker down): every shard is marked not ready at
  once; when the broker answers again every shard follows the stream in place from where
  it stopped, its view kept. If it stays away ``broker_timeout_s``, :class:`BrokerLost`
  ends ``run`` and the process exits non-zero for its supervisor.

Offsets are only hints: a memory broker comes back with an empty log numbered from 0, so
an offset past the partition's end (the edge's own, or a snapshot's cut from the lost
log) is never sought; the partition is read from its start and the follower skips what
the view holds (it judges batches by epoch and seq, never by offset).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from functools import partial
from types import TracebackType
from typing import Self, TypeVar

import redis
import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from prometheus_client import CollectorRegistry

from kvcompass.errors import ConfigError, Transient
from kvcompass.index.errors import GenerationMismatch, SnapshotError
from kvcompass.index.layout import IndexLayout
from kvcompass.index.patches import TablePatch
from kvcompass.pipeline import PatchFollower, SnapshotCheck, Verdict
from kvcompass.pipeline.clock import Clock, SystemClock
from kvcompass.services.backoff import Backoff
from kvcompass.services.edge.metrics import EdgeMetrics
from kvcompass.services.edge.settings import EdgeSettings
from kvcompass.services.health import Health
from kvcompass.services.kafka import (
    BrokerLost,
    BrokerOutage,
    KafkaLog,
    consume_ready,
    consumer_config,
)
from kvcompass.services.preflight import check_topics
from kvcompass.services.snapstore import SnapshotStore
from kvcompass.settings import redact_url
from kvcompass.shm import SharedIndexWriter
from kvcompass.snapshot import SnapshotMeta
from kvcompass.topology import Topology
from kvcompass.wire import PatchBatch, TableReload, WireError, decode

__all__ = ["EdgeReplayer", "Poll"]

log = structlog.get_logger("kvcompass.edge")

T = TypeVar("T")

#: A poll of the patch stream; tests wrap it (e.g. in a FaultySource).
Poll = Callable[[], Sequence[Message]]

_CONNECT_TIMEOUT_S = 10.0  # start-up checks of the broker and Redis
# Caught up: the stream was found empty this recently (a per-poll flag would flap, and
# every flap is a readiness log line).
_CAUGHT_UP_WINDOW_S = 1.0
_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError)


class EdgeReplayer:
    """Owns the consumer, the Redis client and the shared-memory writer (a context
    manager); ``run(stop)`` replays until ``stop`` is set."""

    def __init__(
        self,
        settings: EdgeSettings,
        topology: Topology,
        *,
        kafka_bootstrap: str,
        redis_url: str,
        health: Health,
        registry: CollectorRegistry,
        clock: Clock | None = None,
        wrap_source: Callable[[Poll], Poll] | None = None,
    ) -> None:
        self.settings = settings
        self.layout = IndexLayout.from_topology(topology)
        self._digest = self.layout.digest()
        self.health = health
        self.metrics = EdgeMetrics(registry)
        self._clock = clock or SystemClock()
        self._bootstrap, self._redis_url = kafka_bootstrap, redis_url
        self._wrap_source = wrap_source or (lambda poll: poll)
        n = settings.shards
        self.followers = [PatchFollower(shard) for shard in range(n)]
        self._logs = [log.bind(shard=shard) for shard in range(n)]
        self._retry_at = [0.0] * n  # per shard: next attempt to load a snapshot
        self._resume_at = [0] * n  # per shard: kvc.patches offset of its snapshot
        self._next_offset = [0] * n  # per shard: the offset after the last batch read
        self._redis_backoff = Backoff(settings.bootstrap_retry_s, settings.redis_retry_max_s)
        self._assigned = False
        self._drained_at: float | None = None  # when a poll last found the stream empty
        self._last_progress = 0.0
        self._outage: BrokerOutage | None = None
        self._foreign_owners: set[str] = set()
        self._stack = contextlib.ExitStack()

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> Self:
        """Connect and check Redis, the broker and the patch topic; create the views."""
        with contextlib.ExitStack() as stack:
            self._redis = self._connect_redis()
            stack.callback(self._redis.close)
            self._store = SnapshotStore(self._redis, self.settings.snapshot_prefix)
            self._consumer = self._connect_kafka()
            stack.callback(self._consumer.close)
            self.writer = SharedIndexWriter(
                self.settings.shm_prefix, self.settings.shards, len(self.layout.tables)
            )
            stack.callback(self.writer.close)
            self._stack = stack.pop_all()
        self._set_health("broker", True)
        self._set_health("redis", True)
        self._report()  # not ready until every shard is loaded and the stream drained
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()

    def _connect_redis(self) -> redis.Redis:
        shown = f"KVC_REDIS_URL={redact_url(self._redis_url)}"
        try:
            client = redis.Redis.from_url(
                self._redis_url,
                socket_connect_timeout=_CONNECT_TIMEOUT_S / 5,
                socket_timeout=_CONNECT_TIMEOUT_S / 2,
            )
        except ValueError as exc:
            raise ConfigError(f"{shown}: {exc}") from None
        try:
            client.ping()
        except redis.RedisError as exc:
            client.close()
            raise Transient(f"Redis does not answer at {shown}: {exc}") from None
        return client

    def _connect_kafka(self) -> Consumer:
        s = self.settings
        shown = f"KVC_KAFKA_BOOTSTRAP={self._bootstrap}"
        # Partitions are assigned by hand; the group id is only a client requirement.
        config = consumer_config(
            self._bootstrap,
            f"kvc-edge-{s.shm_prefix}",
            s.fetch_wait_ms,
            # An offset the broker no longer has (it lost its log) restarts the
            # partition from its beginning; the follower then resyncs on what it reads.
            **{
                "auto.offset.reset": "earliest",
                "error_cb": self._on_kafka_error,
                "logger": KafkaLog(),
            },
        )
        try:
            consumer = Consumer(config)
        except KafkaException as exc:
            raise ConfigError(f"{shown}: {exc.args[0]}") from None
        try:
            self._check_topic(consumer, _CONNECT_TIMEOUT_S)
        except KafkaException as exc:
            consumer.close()
            raise Transient(f"the broker does not answer at {shown}: {exc.args[0]}") from None
        except ConfigError:
            consumer.close()
            raise
        return consumer

    def _check_topic(self, consumer: Consumer, timeout: float) -> None:
        """The patch topic exists with one partition per shard (KafkaException: no answer)."""
        topics = consumer.list_topics(timeout=timeout).topics
        check_topics(self.settings, topics, ("topic_patches",), self._bootstrap)

    # -- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Replay until ``stop`` is set; :class:`BrokerLost` when the broker stays away."""
        s = self.settings
        poll = self._wrap_source(lambda: consume_ready(self._consumer, 1000, 0.05))
        self._last_progress = self._clock.monotonic()
        log.info("edge_started", shards=s.shards, shm_prefix=s.shm_prefix)
        while not stop.is_set():
            if self._outage is not None:
                self._await_broker(self._outage)
                stop.wait(BrokerOutage.PROBE_S / 10)
                continue
            self._load_missing()
            if not self._assigned:
                self._consumer.poll(0)  # serves librdkafka's callbacks: a lost broker
                self._report()
                stop.wait(s.bootstrap_retry_s)
                continue
            messages = poll()
            if not messages:
                self._drained_at = self._clock.monotonic()
            rewound: set[int] = set()
            for message in messages:
                if message.partition() not in rewound:
                    self._handle(message, rewound)
            if self._clock.monotonic() - self._last_progress >= s.snapshot_check_s:
                self._check_against_snapshots()
                self._last_progress = self._clock.monotonic()
            self._report()
        log.info("edge_stopped")

    def _report(self) -> None:
        loaded = sum(f.is_loaded for f in self.followers)
        up = self._outage is None
        self._set_health("shards_loaded", loaded == len(self.followers), f"{loaded} loaded")
        drained = self._drained_at is not None and (
            self._clock.monotonic() - self._drained_at < _CAUGHT_UP_WINDOW_S
        )
        self._set_health("caught_up", drained and up)
        now_ns = self._clock.wall_ns()
        lag_ns = max((f.lag_ns(now_ns) for f in self.followers), default=0)
        self.metrics.lag.set(lag_ns / 1e6)
        self.metrics.loaded.set(loaded)
        self.metrics.ready.set(int(self.health.ready()))

    def _set_health(self, name: str, ok: bool, detail: str = "") -> None:
        if self.health.set(name, ok, detail):
            log.info("readiness", condition=name, ok=ok, detail=detail)
        if name == "broker":
            self.metrics.broker_up.set(int(ok))
        elif name == "redis":
            self.metrics.redis_up.set(int(ok))

    # -- loading -------------------------------------------------------------------------

    def _load_missing(self) -> None:
        now = self._clock.monotonic()
        for shard, follower in enumerate(self.followers):
            if not follower.is_loaded and now >= self._retry_at[shard] and not self._reload(shard):
                self._retry_at[shard] = now + self.settings.bootstrap_retry_s
        if not self._assigned and all(f.is_loaded for f in self.followers):
            self._consumer.assign(
                [self._start(s, self._resume_at[s]) for s in range(len(self.followers))]
            )
            self._assigned = True
            log.info("edge_bootstrapped", shards=len(self.followers))

    def _load(self, shard: int) -> bool:
        """Load the shard's current snapshot into fresh segments; False if there is no
        usable one (none yet, corrupt, or Redis down): the shard stays not ready."""
        shard_log = self._logs[shard]
        try:
            snapshot = self._redis_call(partial(self._store.load, shard, with_keys=False))
            if snapshot is None:
                return False
            snapshot.verify(
                shard=shard, n_shards=self.settings.shards, topology_digest=self._digest
            )
        except SnapshotError as exc:
            # Nothing was loaded: the shard keeps its old view, not ready, and retries.
            self.metrics.refused.labels(str(shard)).inc()
            shard_log.error("snapshot_refused", error=str(exc))
            return False
        for table, image in sorted(snapshot.views.items()):
            self.writer.load_table(shard, table, image)
        meta = snapshot.meta
        self.followers[shard].loaded(meta)
        self.writer.set_position(shard, meta.next_seq - 1, meta.epoch)
        self._resume_at[shard] = meta.patches_offset
        shard_log.info(
            "shard_loaded",
            epoch=meta.epoch,
            next_seq=meta.next_seq,
            owner=meta.owner,
            patches_offset=meta.patches_offset,
        )
        return True

    def _mark_not_ready(self, shard: int) -> None:
        seq, epoch, _ = self.writer.position(shard)
        self.writer.set_position(shard, seq, epoch, ready=False)

    def _resync(self, shard: int, cause: str, reason: str, rewound: set[int]) -> None:
        """Reload the shard and re-read its partition from the snapshot's offset.

        ``cause`` (a metric label): ``stream`` (a gap or a new epoch), ``snapshot``
        (anti-entropy), ``reload`` (a table reload failed).
        """
        self.metrics.resyncs.labels(str(shard), cause).inc()
        self._logs[shard].warning("shard_resync", cause=cause, reason=reason)
        self.followers[shard].unload()
        self._mark_not_ready(shard)
        rewound.add(shard)  # the rest of this read is re-read after the reload
        self._reload(shard)

    def _reload(self, shard: int) -> bool:
        """Load the shard's snapshot and, once streaming, re-read from its offset."""
        if not self._load(shard):
            return False
        if self._assigned:
            self._rewind(shard)
        return True

    def _start(self, shard: int, offset: int) -> TopicPartition:
        """Where to read the shard's partition, wanting ``offset``: there, unless it lies
        past the partition's end. Then the log is not the one the offset was taken from
        (a memory broker restarted empty) and it is read from its start: re-reading costs
        skips, seeking past the end would never reach the batches written since."""
        tp = TopicPartition(self.settings.topic_patches, shard)
        try:
            low, high = self._consumer.get_watermark_offsets(tp, timeout=_CONNECT_TIMEOUT_S / 5)
        except KafkaException:
            low, high = OFFSET_BEGINNING, -1  # no answer: the start is always safe
        if offset > high:
            self.metrics.log_resets.labels(str(shard)).inc()
            self._logs[shard].warning("patch_log_reset", offset=offset, log_end=high)
            offset = low
        self._next_offset[shard] = offset
        return TopicPartition(tp.topic, shard, offset)

    def _rewind(self, shard: int) -> None:
        tp = self._start(shard, self._resume_at[shard])
        try:
            self._consumer.seek(tp)
        except KafkaException:
            # seek needs a partition that is already fetching; re-assign it instead.
            self._consumer.incremental_unassign([tp])
            self._consumer.incremental_assign([tp])

    def _check_against_snapshots(self) -> None:
        """Anti-entropy: reload shards whose snapshot is ahead or has another writer."""
        for shard, follower in enumerate(self.followers):
            if not follower.is_loaded:
                continue
            try:
                meta = self._redis_call(partial(self._current_meta, shard))
            except SnapshotError as exc:  # superseded while read, or corrupt: next round
                self._logs[shard].warning("snapshot_unreadable", error=str(exc))
                continue
            if meta is None:
                continue
            check = follower.compare(meta)
            if check is SnapshotCheck.OWNER_CHANGED:
                old = follower.position.owner if follower.position else ""
                self._logs[shard].warning("snapshot_owner_changed", old=old, new=meta.owner)
            if check is not SnapshotCheck.CURRENT:
                why = f"snapshot at {meta.epoch}/{meta.next_seq} by {meta.owner!r}: {check.value}"
                self._resync(shard, "snapshot", why, set())

    def _current_meta(self, shard: int) -> SnapshotMeta | None:
        vkey = self._store.current(shard)
        return None if vkey is None else self._store.load_meta(vkey)

    # -- Redis -------------------------------------------------------------------------

    def _redis_call(self, call: Callable[[], T | None]) -> T | None:
        """``call()``, or None while Redis is unreachable (then retried with backoff);
        a failure other than Redis's (a corrupt snapshot) propagates."""
        now = self._clock.monotonic()
        if not self._redis_backoff.due(now):
            return None
        try:
            value = call()
        except _REDIS_ERRORS as exc:
            self.metrics.redis_errors.inc()
            self._redis_backoff.failed(now)
            self._set_health("redis", False, str(exc))
            return None
        self._redis_backoff.succeeded()
        self._set_health("redis", True)
        return value

    # -- the broker --------------------------------------------------------------------

    def _on_kafka_error(self, error: KafkaError) -> None:
        """librdkafka's error callback (runs inside poll calls, on this thread)."""
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._broker_lost(str(error))
        else:
            log.debug("kafka_error", error=str(error))

    def _broker_lost(self, reason: str) -> None:
        if self._outage is not None:
            return
        self._outage = BrokerOutage(
            self._clock.monotonic(), self.settings.broker_timeout_s, self._bootstrap
        )
        for shard in range(len(self.followers)):
            self._mark_not_ready(shard)
        log.error("broker_lost", error=reason, exit_after_s=self.settings.broker_timeout_s)
        self._set_health("broker", False, reason)
        self._report()

    def _await_broker(self, outage: BrokerOutage) -> None:
        """While the broker is lost: ask it now and then whether it is back; give up past
        ``broker_timeout_s`` or when it comes back without the patch topic."""
        now = self._clock.monotonic()
        if not outage.probe_due(now):
            return
        try:
            self._check_topic(self._consumer, outage.PROBE_S)
        except KafkaException:
            return
        except ConfigError as exc:
            raise BrokerLost(f"the broker came back without its log ({exc})") from None
        log.info("broker_back", down_s=round(now - outage.since, 1))
        self._outage = None
        self._set_health("broker", True)
        if self._assigned:
            self._resume_in_place()

    def _resume_in_place(self) -> None:
        """Each loaded view is as current as it was before the outage: it is ready again
        and follows the stream from where it stopped, or from the start of a log the
        broker lost and began anew. What the new log holds decides the rest: batches the
        view has are skipped, a new writer's epoch reloads the shard once."""
        assignment = []
        for shard, follower in enumerate(self.followers):
            assignment.append(self._start(shard, self._next_offset[shard]))
            if follower.is_loaded:
                seq, epoch, _ = self.writer.position(shard)
                self.writer.set_position(shard, seq, epoch)
        self._consumer.assign(assignment)

    # -- the stream ----------------------------------------------------------------------

    def _handle(self, message: Message, rewound: set[int]) -> None:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._ALL_BROKERS_DOWN:
                self._broker_lost(str(error))
            elif error.code() != KafkaError._PARTITION_EOF:
                log.warning("consume_error", error=str(error), partition=message.partition())
            return
        partition = message.partition()
        if partition is None or not 0 <= partition < len(self.followers):
            return  # never assigned; librdkafka delivers only assigned partitions
        offset = message.offset()
        if offset is not None:
            self._next_offset[partition] = offset + 1
        shard_log = self._logs[partition]
        try:
            batch = decode(message.value() or b"", PatchBatch)
        except WireError as exc:
            self.metrics.rejected.inc()
            shard_log.error("patch_undecodable", offset=message.offset(), error=str(exc))
            return
        follower = self.followers[partition]
        if not follower.is_loaded:
            return  # waits for a reload, which re-reads from the snapshot's offset
        verdict = follower.offer(batch)
        if verdict is Verdict.APPLY:
            self._apply(partition, batch, rewound)
        elif verdict is Verdict.SKIP:
            self.metrics.skipped.inc()
        elif verdict is Verdict.RESYNC:
            pos = follower.position
            want = f"{pos.epoch}/{pos.next_seq}" if pos else "a snapshot"
            why = f"expected {want}, got {batch.epoch}/{batch.seq}"
            self._resync(partition, "stream", why, rewound)
        elif verdict is Verdict.IGNORE_FOREIGN:
            self.metrics.foreign.inc()
            if batch.owner not in self._foreign_owners:
                self._foreign_owners.add(batch.owner)
                following = follower.position.owner if follower.position else ""
                shard_log.warning("foreign_patches_ignored", owner=batch.owner, following=following)
        else:
            self.metrics.rejected.inc()
            shard_log.error("patch_misrouted", batch_shard=batch.shard, offset=message.offset())

    def _apply(self, shard: int, batch: PatchBatch, rewound: set[int]) -> None:
        patches: dict[int, TablePatch] = {}
        for entry in batch.tables:
            if not isinstance(entry.patch, TableReload):
                patches[entry.table_id] = entry.patch
                continue
            load = partial(self._store.load_view, entry.patch.snapshot_key, entry.table_id)
            try:
                image = self._redis_call(load)
            except SnapshotError:
                image = None  # superseded twice already: the current snapshot has it
            if image is None:
                why = f"table {entry.table_id}: reload image unavailable"
                self._resync(shard, "reload", why, rewound)
                return
            self.writer.load_table(shard, entry.table_id, image)
        if patches:
            try:
                self.writer.apply(shard, patches)
            except GenerationMismatch as exc:
                self._resync(shard, "reload", str(exc), rewound)
                return
        self.followers[shard].applied(batch)
        self.writer.set_position(shard, batch.seq, batch.epoch)
        self.metrics.applied.inc()
        self._last_progress = self._clock.monotonic()
