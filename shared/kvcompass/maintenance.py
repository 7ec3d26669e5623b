"""A maintenance unit's state for one shard: apply KV events exactly once, emit patches.

The unit is the sole writer of its shard. Events arrive at least once (Kafka redelivers
after a crash or a rebalance); each batch carries its worker's sequence number, and a
batch at or below the last one applied for that worker is dropped, so a redelivery never
applies twice. A batch is validated in full before anything changes, so a malformed one
is rejected whole (the service dead-letters it) and leaves the tables untouched.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvcompass.index.layout import IndexLayout
from kvcompass.index.ludo import LudoTable
from kvcompass.index.patches import TablePatch
from kvcompass.keys import shard_of_array
from kvcompass.snapshot import ShardSnapshot, SnapshotMeta
from kvcompass.topology import Topology
from kvcompass.wire import KVEventBatch

__all__ = ["BadEvent", "Flush", "ShardState"]


#: One batch's writes to a table: keys, bits to clear, bits to set.
_Writes = tuple[NDArray[np.uint64], NDArray[np.uint64], NDArray[np.uint64]]


class BadEvent(ValueError):
    """A well-formed message whose content this shard cannot apply (dead-lettered)."""


@dataclass(frozen=True, slots=True)
class Flush:
    """Patches of one flush and the ``kvc.events`` offsets they cover."""

    tables: dict[int, TablePatch]
    events_from: int
    events_to: int

    @property
    def reloads(self) -> list[int]:
        """Tables that grew into a new generation (their views must reload)."""
        return [t for t, p in self.tables.items() if p.reload is not None]


class ShardState:
    """Tables, per-worker sequence numbers and stream positions of one shard."""

    def __init__(
        self,
        shard: int,
        n_shards: int,
        topology: Topology,
        *,
        tables: Mapping[int, LudoTable] | None = None,
        meta: SnapshotMeta | None = None,
        initial_capacity: int = 4096,
        rng: random.Random | None = None,
    ) -> None:
        self.shard = shard
        self.n_shards = n_shards
        self.layout = IndexLayout.from_topology(topology)
        self._workers = {w.id: (w.index, w.region) for w in topology.workers}
        rng = rng or random.Random()
        self.tables: dict[int, LudoTable] = dict(tables or {})
        for spec in self.layout.tables:
            if spec.table_id not in self.tables:
                self.tables[spec.table_id] = LudoTable.with_capacity(
                    initial_capacity,
                    value_bits=spec.value_bits,
                    fingerprint_bits=self.layout.fingerprint_bits,
                    rng=rng,
                )
        self.epoch = meta.epoch if meta else 0
        self.next_seq = meta.next_seq if meta else 0
        self.events_offset = meta.events_offset if meta else -1
        self.patches_offset = meta.patches_offset if meta else 0
        self.worker_seq: dict[str, int] = dict(meta.worker_seq) if meta else {}
        self._flushed_offset = self.events_offset
        # Per table, the (keys, clear, bits) that stage() accepted and nothing wrote yet.
        self._staged: dict[int, list[_Writes]] = {}
        self.applied_keys = 0
        self.duplicates = 0

    @classmethod
    def from_snapshot(
        cls, snapshot: ShardSnapshot, n_shards: int, topology: Topology
    ) -> ShardState:
        """Restore from a snapshot; refuses a snapshot of another shard or topology."""
        meta = snapshot.meta
        tables = {
            t: LudoTable.from_parts(snapshot.views[t], snapshot.keys[t]) for t in snapshot.views
        }
        state = cls(meta.shard, n_shards, topology, tables=tables, meta=meta)
        if set(tables) != {t.table_id for t in state.layout.tables}:
            raise BadEvent(f"snapshot of shard {meta.shard} has tables {sorted(tables)}")
        return state

    # -- events ----------------------------------------------------------------------

    def apply(self, batch: KVEventBatch, offset: int) -> bool:
        """Apply a batch read at ``offset``; False when it was a duplicate (dropped).

        Every key of every event, in order: ``write_bits(key, clear=3 << 2·field,
        bits=tier << 2·field)`` (tier 0 for EVICT), as one call for the whole batch.
        """
        applied = self.stage(batch, offset)
        self.write_staged()
        return applied

    def stage(self, batch: KVEventBatch, offset: int) -> bool:
        """:meth:`apply`, but the writes wait for :meth:`write_staged` (or a flush or
        snapshot, which call it): the batches a unit reads at once then cost one table
        call per table instead of one per batch (a batch often holds only a few keys).
        """
        table_id, field = self._check(batch)
        self.events_offset = offset
        if batch.worker_seq <= self.worker_seq.get(batch.worker_id, -1):
            self.duplicates += 1
            return False
        keys = batch.key_array
        if len(keys):
            shift = 2 * field
            bits = batch.key_tiers().astype(np.uint64) << np.uint64(shift)
            clear = np.full(len(keys), 3 << shift, dtype=np.uint64)
            self._staged.setdefault(table_id, []).append((keys, clear, bits))
        self.applied_keys += len(keys)
        self.worker_seq[batch.worker_id] = batch.worker_seq
        return True

    def write_staged(self) -> None:
        """Write every staged batch, in staging order, one call per table."""
        for table_id, parts in self._staged.items():
            if len(parts) == 1:
                keys, clear, bits = parts[0]
            else:
                keys, clear, bits = (np.concatenate(column) for column in zip(*parts, strict=True))
            self.tables[table_id].write_bits_many(keys, clear, bits)
        self._staged.clear()

    def skip(self, offset: int) -> None:
        """Account for an offset whose message was dead-lettered."""
        self.events_offset = offset

    def _check(self, batch: KVEventBatch) -> tuple[int, int]:
        """The batch's (table id, field), or BadEvent naming what is wrong with it."""
        if batch.shard != self.shard:
            raise BadEvent(f"batch is for shard {batch.shard}, this is shard {self.shard}")
        known = self._workers.get(batch.worker_id)
        if known is None:
            raise BadEvent(f"unknown worker {batch.worker_id!r}")
        index, region = known
        if batch.region != region:
            raise BadEvent(f"worker {batch.worker_id!r} is in {region!r}, not {batch.region!r}")
        # A batch's tiers already match its kinds (KVEventBatch refuses anything else).
        keys = batch.key_array
        if len(keys):
            owners = shard_of_array(keys, self.n_shards)
            foreign = np.flatnonzero(owners != self.shard)
            if len(foreign):
                j = int(foreign[0])
                raise BadEvent(
                    f"events[{batch.event_of_key(j)}]: key {int(keys[j])} "
                    f"(length {int(batch.length_array[j])}) belongs to shard {int(owners[j])}"
                )
        return self.layout.slots[index]

    # -- output ----------------------------------------------------------------------

    def flush(self) -> Flush | None:
        """Patches for everything applied since the last flush (None when nothing).

        Offsets that only carried duplicates or dead letters still advance the range,
        so the consumer position is never ahead of what a batch covers.
        """
        self.write_staged()
        tables = {}
        for table_id, table in self.tables.items():
            patch = table.take_patch()
            if not patch.is_empty:
                tables[table_id] = patch
        if not tables and self.events_offset == self._flushed_offset:
            return None
        flush = Flush(tables, self._flushed_offset + 1, self.events_offset)
        self._flushed_offset = self.events_offset
        return flush

    def snapshot(self, created_ns: int = 0) -> ShardSnapshot:
        """The shard's state now (call right after a flush: patches are not included)."""
        self.write_staged()
        views: dict[int, bytes] = {}
        keys: dict[int, bytes] = {}
        for table_id, table in self.tables.items():
            views[table_id], keys[table_id] = table.snapshot_parts()
        meta = SnapshotMeta(
            shard=self.shard,
            epoch=self.epoch,
            next_seq=self.next_seq,
            events_offset=self.events_offset,
            patches_offset=self.patches_offset,
            generations={t: tb.geometry.generation for t, tb in self.tables.items()},
            worker_seq=dict(self.worker_seq),
            created_ns=created_ns,
        )
        return ShardSnapshot(meta, views, keys)
