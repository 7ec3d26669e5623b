"""Replay the patch stream into shared-memory views, resyncing on any gap.

Per shard the replayer expects (epoch, seq). A batch below it is a duplicate or from an
older owner and is skipped; the expected one is applied under the shard's sequence lock;
anything else (a gap, a new epoch) means the stream no longer continues the view, so
the shard is reloaded from its current Redis snapshot and the partition is re-read from
the snapshot's ``kvc.patches`` offset. The replayer never seeks by "latest" or by time.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis
import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge

from kvcompass.index.errors import GenerationMismatch, SnapshotError
from kvcompass.index.layout import IndexLayout
from kvcompass.index.patches import TablePatch
from kvcompass.services.edge.settings import EdgeSettings
from kvcompass.services.kafka import consume_ready, consumer_config
from kvcompass.services.snapstore import SnapshotStore
from kvcompass.shm import SharedIndexWriter
from kvcompass.topology import Topology
from kvcompass.wire import PatchBatch, TableReload, WireError, decode

__all__ = ["EdgeReplayer", "EdgeStatus"]

log = structlog.get_logger("kvcompass.edge")


@dataclass
class _Shard:
    loaded: bool = False
    epoch: int = -1
    next_seq: int = 0
    last_produced_ns: int = 0
    applied: int = 0
    resyncs: int = 0


@dataclass(frozen=True)
class EdgeStatus:
    ready: bool
    shards_loaded: int
    lag_ms: float  # age of the newest applied batch's production time, worst shard
    applied: int
    resyncs: int
    skipped: int


class EdgeReplayer:
    """Owns the shared-memory segments; ``run`` until ``stop`` is set."""

    def __init__(
        self,
        settings: EdgeSettings,
        topology: Topology,
        *,
        kafka_bootstrap: str,
        redis_url: str,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.layout = IndexLayout.from_topology(topology)
        self.stop = threading.Event()
        self.writer = SharedIndexWriter(
            settings.shm_prefix, settings.shards, len(self.layout.tables)
        )
        self._store = SnapshotStore(redis.Redis.from_url(redis_url), settings.snapshot_prefix)
        # Partitions are assigned by hand; the group id is only a client requirement.
        self._consumer = Consumer(
            consumer_config(
                kafka_bootstrap, f"kvc-edge-{settings.shm_prefix}", settings.fetch_wait_ms
            )
        )
        self._shards = [_Shard() for _ in range(settings.shards)]
        self._faults = random.Random(settings.fault_seed)
        self._held: Message | None = None  # a batch held back to reorder it
        self._idle = False
        self._skipped = 0
        r = registry or CollectorRegistry()
        self._m_applied = Counter("kvc_edge_batches_applied", "Patch batches applied.", registry=r)
        self._m_resyncs = Counter(
            "kvc_edge_resyncs", "Shard reloads after a gap or new epoch.", ["shard"], registry=r
        )
        self._m_lag = Gauge("kvc_edge_lag_ms", "Age of the newest applied batch.", registry=r)
        self._m_ready = Gauge(
            "kvc_edge_ready", "1 when every shard is loaded and the stream is drained.", registry=r
        )
        self._m_loaded = Gauge("kvc_edge_shards_loaded", "Shards with a loaded view.", registry=r)
        self._assigned = False
        self._resume_at: dict[int, int] = {}
        self._last_activity = time.monotonic()

    # -- lifecycle ---------------------------------------------------------------------

    def run(self, max_seconds: float | None = None) -> None:
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        log.info("edge_started", shards=self.settings.shards, shm_prefix=self.settings.shm_prefix)
        try:
            while not self.stop.is_set():
                if deadline is not None and time.monotonic() > deadline:
                    break
                self._load_missing()
                if not self._assigned:
                    if self.stop.wait(self.settings.bootstrap_retry_s):
                        break
                    continue
                # Returns at the first message; the timeout only paces the idle loop.
                messages = consume_ready(self._consumer, 1000, 0.05)
                self._idle = not messages
                for message in self._with_faults(messages):
                    self._handle(message)
                status = self.status()
                self._m_ready.set(int(status.ready))
                self._m_loaded.set(status.shards_loaded)
                if messages:
                    self._last_activity = time.monotonic()
                elif time.monotonic() - self._last_activity >= self.settings.snapshot_check_s:
                    self._check_against_snapshots()
                    self._last_activity = time.monotonic()
        finally:
            self._consumer.close()

    def close(self) -> None:
        """Unlink the shared-memory segments (after ``run`` returned)."""
        self.writer.close()

    def status(self) -> EdgeStatus:
        now = time.time_ns()
        loaded = [s for s in self._shards if s.loaded]
        lag = max(
            ((now - s.last_produced_ns) / 1e6 for s in loaded if s.last_produced_ns),
            default=0.0,
        )
        return EdgeStatus(
            ready=len(loaded) == len(self._shards) and self._idle,
            shards_loaded=len(loaded),
            lag_ms=lag,
            applied=sum(s.applied for s in self._shards),
            resyncs=sum(s.resyncs for s in self._shards),
            skipped=self._skipped,
        )

    # -- loading -------------------------------------------------------------------------

    def _load_missing(self) -> None:
        missing = [i for i, s in enumerate(self._shards) if not s.loaded]
        if not missing:
            return
        for shard in missing:
            self._load(shard)
        if all(s.loaded for s in self._shards) and not self._assigned:
            self._consumer.assign(
                [
                    TopicPartition(self.settings.topic_patches, shard, self._resume_at[shard])
                    for shard in range(self.settings.shards)
                ]
            )
            self._assigned = True
            log.info("edge_bootstrapped", shards=self.settings.shards)

    def _load(self, shard: int) -> bool:
        """Load a shard's current snapshot into fresh segments; False if none exists."""
        snapshot = self._store.load(shard, with_keys=False)
        if snapshot is None:
            return False
        meta = snapshot.meta
        for table, image in sorted(snapshot.views.items()):
            self.writer.load_table(shard, table, image)
        s = self._shards[shard]
        s.loaded, s.epoch, s.next_seq = True, meta.epoch, meta.next_seq
        self.writer.set_position(shard, meta.next_seq - 1, meta.epoch)
        self._resume_at[shard] = meta.patches_offset
        log.info(
            "shard_loaded",
            shard=shard,
            epoch=meta.epoch,
            next_seq=meta.next_seq,
            patches_offset=meta.patches_offset,
        )
        return True

    def _check_against_snapshots(self) -> None:
        """Reload every shard whose Redis snapshot is ahead of its view (anti-entropy)."""
        for shard, s in enumerate(self._shards):
            vkey = self._store.current(shard)
            if vkey is None:
                continue
            meta = self._store.load_meta(vkey)
            if (meta.epoch, meta.next_seq) > (s.epoch, s.next_seq):
                self._resync(shard, f"snapshot at {meta.epoch}/{meta.next_seq} is ahead")

    def _resync(self, shard: int, why: str) -> None:
        s = self._shards[shard]
        s.resyncs += 1
        self._m_resyncs.labels(str(shard)).inc()
        log.warning("shard_resync", shard=shard, reason=why)
        if self._load(shard) and self._assigned:
            self._rewind(shard, self._resume_at[shard])

    def _rewind(self, shard: int, offset: int) -> None:
        tp = TopicPartition(self.settings.topic_patches, shard, offset)
        try:
            self._consumer.seek(tp)
        except KafkaException:
            # seek needs a partition that is already fetching; re-assign it instead.
            self._consumer.incremental_unassign([tp])
            self._consumer.incremental_assign([tp])

    # -- the stream ------------------------------------------------------------------------

    def _with_faults(self, messages: list[Message]) -> Iterator[Message]:
        s = self.settings
        if not (s.fault_drop or s.fault_duplicate or s.fault_reorder):
            yield from messages
            return
        rng = self._faults
        for message in messages:
            if rng.random() < s.fault_drop:
                continue
            if self._held is None and rng.random() < s.fault_reorder:
                self._held = message
                continue
            yield message
            if rng.random() < s.fault_duplicate:
                yield message
            if self._held is not None:
                held, self._held = self._held, None
                yield held
        if self._held is not None and not messages:
            held, self._held = self._held, None
            yield held

    def _handle(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("consume_error", error=str(error))
            return
        try:
            batch = decode(message.value() or b"", PatchBatch)
        except WireError as exc:
            self._skipped += 1
            log.error("patch_undecodable", offset=message.offset(), error=str(exc))
            return
        s = self._shards[batch.shard]
        if (batch.epoch, batch.seq) < (s.epoch, s.next_seq):
            self._skipped += 1  # a duplicate, or a batch the snapshot already holds
            return
        if batch.epoch != s.epoch or batch.seq != s.next_seq:
            self._resync(
                batch.shard,
                f"expected epoch {s.epoch} seq {s.next_seq}, got {batch.epoch}/{batch.seq}",
            )
            s = self._shards[batch.shard]
            if (batch.epoch, batch.seq) != (s.epoch, s.next_seq):
                return  # re-read from the snapshot's offset
        self._apply(batch)

    def _apply(self, batch: PatchBatch) -> None:
        shard = batch.shard
        patches: dict[int, TablePatch] = {}
        for entry in batch.tables:
            if isinstance(entry.patch, TableReload):
                try:
                    image = self._store.load_view(entry.patch.snapshot_key, entry.table_id)
                except SnapshotError as exc:
                    self._resync(shard, str(exc))
                    return
                self.writer.load_table(shard, entry.table_id, image)
            else:
                patches[entry.table_id] = entry.patch
        if patches:
            try:
                self.writer.apply(shard, patches)
            except GenerationMismatch as exc:
                self._resync(shard, str(exc))
                return
        s = self._shards[shard]
        s.next_seq = batch.seq + 1
        s.last_produced_ns = batch.produced_at_ns
        s.applied += 1
        self.writer.set_position(shard, batch.seq, batch.epoch)
        self._m_applied.inc()
        self._m_lag.set(max(0.0, (time.time_ns() - batch.produced_at_ns) / 1e6))
