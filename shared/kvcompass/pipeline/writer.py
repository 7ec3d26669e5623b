"""A maintenance unit's writer for one shard: take over, apply events once, emit patches.

The unit is the sole writer of its shard while the consumer group assigns it the shard.
Everything it decides is here, without Kafka, Redis or a clock of its own; the service
feeds it messages and offsets and sends what it returns:

1. :meth:`ShardWriter.take_over` restores the last good snapshot (checked against this
   shard, shard count, topology and owner), picks an epoch above every epoch this owner
   ever used (the snapshot's and the patch stream's, which survives a Redis loss), and
   returns the announcement batch and where to resume ``kvc.events``. A shard with a
   history but no usable snapshot is rebuilt from the event log, and says so.
2. :meth:`ShardWriter.apply` applies a batch exactly once (:mod:`.sequences` drops
   redeliveries); a batch it cannot apply raises :class:`~kvcompass.errors.BadInput`
   (dead-lettered) before anything changed.
3. :meth:`ShardWriter.flush` turns what changed into the next :class:`PatchBatch`.
4. :meth:`ShardWriter.snapshot` is the state to persist, with the offsets it covers;
   after an :class:`~kvcompass.errors.InvariantBroken` there is none, ever.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvcompass.errors import BadInput, ConfigError, InvariantBroken
from kvcompass.index.errors import SnapshotError
from kvcompass.index.layout import IndexLayout
from kvcompass.index.shard_tables import ShardTables
from kvcompass.keys import shard_of
from kvcompass.pipeline.clock import Clock, stamp_ns
from kvcompass.pipeline.sequences import Admission, WorkerSequences
from kvcompass.pipeline.staging import StagedWrites
from kvcompass.snapshot import ShardSnapshot, SnapshotMeta
from kvcompass.topology import Topology
from kvcompass.wire import KVEventBatch, PatchBatch, TablePatchWire, TableReload, WireError

__all__ = ["BadEvent", "PersistSnapshot", "ShardWriter", "Takeover"]

#: Read per batch: through the enum class, each read costs ~40 ns (as in sequences).
_RESTART, _DUPLICATE = Admission.RESTART, Admission.DUPLICATE

#: Stores a snapshot and returns the key edges load a grown table's view from.
PersistSnapshot = Callable[[ShardSnapshot], str]


class BadEvent(BadInput):
    """A well-formed batch whose content this shard cannot apply (dead-lettered)."""


@dataclass(frozen=True, slots=True)
class Takeover:
    """What a takeover decided; the service publishes ``announce`` and resumes there."""

    #: Batch 0 of the new epoch, without tables: edges reload the shard at once instead
    #: of at its next write (an idle shard might have none for a long time).
    announce: PatchBatch
    #: First ``kvc.events`` offset to read.
    resume_offset: int
    #: The state came from the snapshot.
    restored: bool
    #: The shard had a history (committed offsets, or this owner's patches) but no usable
    #: snapshot: it is rebuilt from the event log.
    snapshot_lost: bool
    #: Why a snapshot that was there was not used ("" when it was, or there was none).
    snapshot_refused: str
    #: Offsets below ``resume_offset`` whose events the state should hold but the log no
    #: longer has (0: none). Nonzero means keys may be wrong until workers re-announce.
    events_gone: int
    #: The snapshot's position lies past the event log's end: the broker lost the log the
    #: snapshot was cut from (a memory broker restarted), and the new log is read from its
    #: start instead of skipping its first events.
    log_reset: bool = False


class ShardWriter:
    """Tables, per-worker sequence numbers and stream positions of one shard."""

    def __init__(
        self,
        shard: int,
        n_shards: int,
        topology: Topology,
        *,
        owner: str,
        clock: Clock,
        max_seq_jump: int = 1_000_000,
        initial_capacity: int = 4096,
        rng: random.Random | None = None,
    ) -> None:
        try:  # the fields every patch batch carries unchecked (PatchBatch.of_writer)
            PatchBatch(shard, 0, 0, 0, -1, 0, owner=owner)
        except WireError as exc:
            raise ConfigError(f"shard writer {shard} of {owner!r}: {exc}") from exc
        self.shard = shard
        self.n_shards = n_shards
        self.owner = owner
        self.layout = IndexLayout.from_topology(topology)
        self.topology_digest = self.layout.digest()
        # Per worker id: its global index, region, and its table and field there (one
        # lookup per batch: the writer's state is cold between a unit's reads).
        self._workers = {
            w.id: (w.index, w.region, *self.layout.slots[w.index]) for w in topology.workers
        }
        self._clock = clock
        self._max_seq_jump = max_seq_jump
        self._initial_capacity = initial_capacity
        self._rng = rng or random.Random()
        self.tables = self._empty_tables()
        self.sequences = WorkerSequences(max_seq_jump)
        self.epoch = 0
        self.next_seq = 0
        self.events_offset = -1
        self.patches_offset = 0
        self._flushed_offset = -1
        self._generations: dict[int, int] = {}
        # Per table, the writes that stage() accepted and nothing wrote yet.
        self._staged = StagedWrites(len(self.layout.tables), n_shards, shard)
        self._taken_over = False
        self._broken: str | None = None
        self.applied_keys = 0
        self.duplicates = 0
        self.restarts = 0
        #: Keys that worker restarts cleared (what the earlier runs had cached).
        self.restart_cleared_keys = 0

    def _empty_tables(self) -> ShardTables:
        return ShardTables(
            self.layout,
            self.shard,
            self.n_shards,
            initial_capacity=self._initial_capacity,
            rng=self._rng,
        )

    # -- takeover --------------------------------------------------------------------

    def take_over(
        self,
        snapshot: ShardSnapshot | None,
        *,
        stream_epoch: int | None,
        stream_end: int,
        committed: bool,
        events_low: int,
        events_high: int | None = None,
        patches_restarted: bool = False,
    ) -> Takeover:
        """Become the shard's writer.

        ``stream_epoch``: the highest epoch of this owner's batches on the shard's patch
        partition (None: there are none); ``stream_end``: the offset after the last batch
        there; ``committed``: the group had committed ``kvc.events`` offsets for the shard;
        ``events_low``: the event log's first offset still held; ``events_high``: its end
        (None: unknown); ``patches_restarted``: the patch partition was read from its
        start because it ended before the snapshot's ``patches_offset`` (a new log). A
        snapshot of another owner raises :class:`ConfigError` (two groups would write one
        snapshot prefix).
        """
        if self._taken_over:
            raise RuntimeError(f"shard {self.shard} was already taken over")
        refused = ""
        meta = None
        # The service reads the stream from the snapshot's position, so the epochs before
        # it are known only from the snapshot: a meta that passed its checks bounds the
        # new epoch even when the tables it describes are refused.
        fence = 0
        if snapshot is not None:
            try:
                self.check_meta(snapshot.meta)
                fence = snapshot.meta.epoch
                meta = self._restore(snapshot)
            except (SnapshotError, BadInput) as exc:
                refused = str(exc)
                self.tables = self._empty_tables()
                self.sequences = WorkerSequences(self._max_seq_jump)
        history = committed or stream_epoch is not None
        wanted = 0 if meta is None else meta.events_offset + 1
        # A log that ends before the snapshot's position is not the log the snapshot was
        # cut from; its records are all newer than the snapshot (sequence numbers drop
        # any redelivery), so they are read from its start, not from the old position.
        # A new log may already have grown past that position (every worker re-sends
        # its cache when its broker loses the log), but the patch log, which only this
        # owner writes, is still short then: a broker that lost one lost both.
        log_reset = meta is not None and (
            (events_high is not None and wanted > events_high) or patches_restarted
        )
        resume = events_low if log_reset else max(wanted, events_low)
        self.epoch = max(fence, stream_epoch or 0) + 1
        self.events_offset = self._flushed_offset = resume - 1
        # A snapshot's offset into a lost patch log would send edges past the new log's
        # end; the new log's own end is where the next batch lands.
        old_offset = 0 if meta is None or patches_restarted else meta.patches_offset
        self.patches_offset = max(old_offset, stream_end)
        self._generations = self.tables.generations
        self.next_seq = 1
        self._taken_over = True
        announce = PatchBatch(
            shard=self.shard,
            epoch=self.epoch,
            seq=0,
            events_from=resume,
            events_to=resume - 1,
            produced_at_ns=self._clock.wall_ns(),
            owner=self.owner,
        )
        return Takeover(
            announce=announce,
            resume_offset=resume,
            restored=meta is not None,
            snapshot_lost=meta is None and history,
            snapshot_refused=refused,
            events_gone=0 if log_reset else resume - wanted,
            log_reset=log_reset,
        )

    def _restore(self, snapshot: ShardSnapshot) -> SnapshotMeta:
        """Load the snapshot's state, or raise what is wrong with it (nothing kept)."""
        meta = snapshot.meta
        tables = ShardTables.restore(
            snapshot, self.layout, self.shard, self.n_shards, rng=self._rng
        )
        sequences = WorkerSequences.from_map(meta.worker_seq, self._max_seq_jump)
        self.tables, self.sequences = tables, sequences
        return meta

    def check_meta(self, meta: SnapshotMeta) -> None:
        """Raise unless ``meta`` is of this shard, shard count, layout and owner:
        :class:`ConfigError` for another owner, :class:`SnapshotError` otherwise."""
        if meta.owner and meta.owner != self.owner:
            raise ConfigError(
                f"the snapshot of shard {self.shard} belongs to {meta.owner!r}, this unit is "
                f"{self.owner!r}: two consumer groups share one snapshot prefix"
            )
        expected = (self.shard, self.n_shards, self.topology_digest, self.owner)
        found = (meta.shard, meta.n_shards, meta.topology_digest, meta.owner)
        for name, want, got in zip(
            ("shard", "n_shards", "topology_digest", "owner"), expected, found, strict=True
        ):
            if want != got:
                raise SnapshotError(f"meta: {name} is {got!r}, expected {want!r}")

    # -- events ----------------------------------------------------------------------

    def apply(self, batch: KVEventBatch, offset: int) -> Admission:
        """Apply a batch read at ``offset`` (DUPLICATE: dropped, a redelivery).

        Every key of every event, in order: ``write_bits(key, clear=3 << 2·field,
        bits=tier << 2·field)`` (tier 0 for EVICT), as one call for the whole batch.
        """
        admission = self.stage(batch, offset)
        self.write_staged()
        return admission

    def stage(self, batch: KVEventBatch, offset: int) -> Admission:
        """:meth:`apply`, but the writes wait for :meth:`write_staged` (or a flush or
        snapshot, which call it): the batches a unit reads at once then cost one table
        call per table instead of one per batch (a batch often holds only a few keys).
        """
        self._check_usable()
        if offset <= self.events_offset:
            # Read again (a consumer reset): the state already holds its effect.
            self.duplicates += 1
            return Admission.DUPLICATE
        columns = batch.columns
        keys = columns.keys
        table_id, field = self._check(batch, keys)
        worker_id, incarnation, seq = batch.worker_id, batch.worker_incarnation, batch.worker_seq
        admission = self.sequences.admit(worker_id, incarnation, seq)
        self.events_offset = offset
        if admission is _DUPLICATE:
            self.duplicates += 1
            return admission
        restart = admission is _RESTART
        if restart:
            # A new run of a worker starts with an empty cache: what its earlier runs
            # cached, and any eviction of theirs the log lost, must not outlive them.
            # Their staged writes land first; the clear is a function of the log, so a
            # replay from a snapshot clears the same keys.
            self.write_staged()
            self.restart_cleared_keys += self.tables.clear_worker(self._workers[batch.worker_id][0])
        # Checked columns: keys of a checked batch that passed _check (63-bit, of this
        # shard), checked tiers, in the worker's field.
        self._staged.add(table_id, field, keys, columns.tiers, columns.counts)
        self.applied_keys += len(keys)
        self.restarts += restart
        self.sequences.record(worker_id, incarnation, seq)
        return admission

    def write_staged(self) -> None:
        """Write every staged batch, in staging order, one call per table.

        A failure part-way (a cuckoo move that finds no seed) leaves a table that cannot
        be trusted: the writer is broken from then on and never snapshots again.
        """
        self._check_usable()
        try:
            for table_id, keys, clear, bits, n in self._staged.take():
                self.tables.write_staged(table_id, keys, clear, bits, n)
        except InvariantBroken as exc:
            self._broken = f"write to shard {self.shard} failed: {exc}"
            raise
        except Exception as exc:
            self._broken = f"write to shard {self.shard} failed: {exc!r}"
            raise InvariantBroken(self._broken) from exc

    def skip(self, offset: int) -> None:
        """Account for an offset whose message was dead-lettered."""
        self.events_offset = max(self.events_offset, offset)

    def _check(self, batch: KVEventBatch, keys: NDArray[np.uint64]) -> tuple[int, int]:
        """The batch's (table id, field), or BadEvent naming what is wrong with it
        (``keys``: its key column)."""
        if batch.shard != self.shard:
            raise BadEvent(f"batch is for shard {batch.shard}, this is shard {self.shard}")
        known = self._workers.get(batch.worker_id)
        if known is None:
            raise BadEvent(f"unknown worker {batch.worker_id!r}")
        _, region, table_id, field = known
        if batch.region != region:
            raise BadEvent(f"worker {batch.worker_id!r} is in {region!r}, not {batch.region!r}")
        # A batch's tiers already match its kinds (KVEventBatch refuses anything else).
        j = self._staged.first_foreign(keys)
        if j >= 0:
            owner = shard_of(int(keys[j]), self.n_shards)
            raise BadEvent(
                f"events[{batch.event_of_key(j)}]: key {int(keys[j])} "
                f"(length {int(batch.length_array[j])}) belongs to shard {owner}"
            )
        return table_id, field

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise InvariantBroken(f"shard {self.shard} is broken ({self._broken})")
        if not self._taken_over:
            raise RuntimeError(f"shard {self.shard}: take_over() first")

    @property
    def broken(self) -> bool:
        return self._broken is not None

    # -- output ----------------------------------------------------------------------

    def flush(self, persist: PersistSnapshot | None = None) -> PatchBatch | None:
        """The next patch batch: everything applied since the last flush (None: nothing).

        Offsets that only carried duplicates or dead letters still advance the range,
        so the consumer position is never ahead of what a batch covers. A table that grew
        travels as a :class:`TableReload` naming a snapshot ``persist`` stored first; if
        ``persist`` raises, nothing was taken and the next flush tries again.
        """
        now = stamp_ns(self._clock)  # before anything is taken: a bad clock loses nothing
        self.write_staged()
        seq = self.next_seq
        tables, seen = self.tables.tables, self._generations
        grown = [t for t in self.tables.written if tables[t].geometry.generation != seen[t]]
        reload_key = None
        if grown:
            if persist is None:
                raise ValueError(f"tables {grown} grew: flush needs a way to persist them")
            reload_key = persist(self._snapshot(next_seq=seq + 1))
        patches = []
        for table_id, patch in sorted(self.tables.take_patches().items()):
            if patch.reload is None:
                patches.append(TablePatchWire.of_table(table_id, patch))
            elif reload_key is not None:
                patches.append(TablePatchWire(table_id, TableReload(patch.generation, reload_key)))
            else:  # refused: a view image does not travel inline
                patches.append(TablePatchWire(table_id, patch))
        for t in grown:
            seen[t] = tables[t].geometry.generation
        if not patches and self.events_offset == self._flushed_offset:
            return None
        batch = PatchBatch.of_writer(
            self.shard,
            self.epoch,
            seq,
            self._flushed_offset + 1,
            self.events_offset,
            now,
            tuple(patches),
            self.owner,
        )
        self.next_seq = seq + 1
        self._flushed_offset = self.events_offset
        return batch

    def delivered(self, seq: int, offset: int) -> None:
        """Batch ``seq`` of this epoch landed at ``offset`` of the patch partition: an
        edge starting from a later snapshot may resume after it."""
        if seq < self.next_seq:
            self.patches_offset = max(self.patches_offset, offset + 1)

    def snapshot(self, *, keys: bool = True) -> ShardSnapshot:
        """The shard's state now, to persist (take it right after a flush: an edge that
        loads it resumes at ``next_seq``). Never after an InvariantBroken. ``keys``
        False: the view halves only, all an edge reads (a maintenance unit restores
        from both)."""
        self.write_staged()
        return self._snapshot(self.next_seq, keys=keys)

    def snapshot_meta(self) -> SnapshotMeta:
        """The meta :meth:`snapshot` would carry now, with no table image sealed: all an
        edge compares its position with (the simulator's anti-entropy when nothing can be
        lost, where no edge ever loads the images)."""
        self.write_staged()
        return self._meta(self.next_seq)

    def _snapshot(self, next_seq: int, *, keys: bool = True) -> ShardSnapshot:
        if keys:
            views, key_images = self.tables.snapshot_parts()
        else:
            views, key_images = self.tables.view_images(), {}
        return ShardSnapshot(self._meta(next_seq), views, key_images)

    def _meta(self, next_seq: int) -> SnapshotMeta:
        return SnapshotMeta(
            shard=self.shard,
            epoch=self.epoch,
            next_seq=next_seq,
            events_offset=self.events_offset,
            patches_offset=self.patches_offset,
            generations=self.tables.generations,
            worker_seq=self.sequences.to_map(),
            created_ns=self._clock.wall_ns(),
            owner=self.owner,
            n_shards=self.n_shards,
            topology_digest=self.topology_digest,
        )
