"""The maintenance side of one shard: its region tables, written by tier and by column.

A maintenance unit owns a few shards; each is one :class:`ShardTables`, the only class
that writes region tables. Every write is validated in full before the first table
changes, so a rejected call leaves the tables and the next patches untouched.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

import numpy as np
from numpy.typing import NDArray

from kvcompass.errors import BadInput
from kvcompass.index import kernel
from kvcompass.index.errors import SnapshotError
from kvcompass.index.layout import IndexLayout, Tier
from kvcompass.index.ludo import LudoTable
from kvcompass.index.patches import TablePatch
from kvcompass.keys import shard_of
from kvcompass.snapshot import ShardSnapshot

__all__ = ["ShardTables", "first_foreign"]

_KEY_LIMIT = 1 << 63
#: Up to this many values, _largest scans them in Python.
_FEW = 32


class ShardTables:
    """Full-key tables of one shard, one per region table of the layout."""

    def __init__(
        self,
        layout: IndexLayout,
        shard: int,
        n_shards: int,
        *,
        tables: Mapping[int, LudoTable] | None = None,
        initial_capacity: int = 1024,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 <= shard < n_shards:
            raise BadInput(f"shard {shard} is outside 0..{n_shards - 1}")
        self.layout = layout
        self.shard = shard
        self.n_shards = n_shards
        if tables is None:
            rng = rng or random.Random()
            tables = {
                spec.table_id: LudoTable.with_capacity(
                    initial_capacity,
                    value_bits=spec.value_bits,
                    fingerprint_bits=layout.fingerprint_bits,
                    rng=rng,
                )
                for spec in layout.tables
            }
        want = {spec.table_id for spec in layout.tables}
        if set(tables) != want:
            raise BadInput(f"shard {shard} needs tables {sorted(want)}, got {sorted(tables)}")
        self._tables = dict(tables)
        # Tables written since the last take_patches (all at first: tables handed in may
        # hold writes). Only they can have a patch or have grown.
        self._written: set[int] = set(self._tables)

    # -- reads -------------------------------------------------------------------------

    @property
    def tables(self) -> Mapping[int, LudoTable]:
        """Table id -> table (read them; write through this class)."""
        return self._tables

    def tier(self, key: int, worker: int) -> Tier:
        table_id, field = self.layout.slots[worker]
        return Tier((self._tables[table_id].get(key) >> (field << 1)) & 3)

    @property
    def count(self) -> int:
        """Entries across the tables (a prefix held in two region tables counts twice)."""
        return sum(len(t) for t in self._tables.values())

    @property
    def generations(self) -> dict[int, int]:
        return {t: table.geometry.generation for t, table in self._tables.items()}

    @property
    def written(self) -> AbstractSet[int]:
        """Ids of the tables written since the last :meth:`take_patches`."""
        return self._written

    # -- writes ------------------------------------------------------------------------

    def set_tier(self, keys: Iterable[int] | NDArray[np.uint64], worker: int, tier: Tier) -> None:
        """Record that ``worker`` holds (or, with ABSENT, dropped) every key in ``tier``.

        Writes are staged in the tables; :meth:`take_patches` returns the patches.
        """
        if not 0 <= worker < self.layout.n_workers:
            raise BadInput(f"worker {worker} is outside 0..{self.layout.n_workers - 1}")
        table_id, field = self.layout.slots[worker]
        k = _key_array(keys)
        shift = field << 1
        clear = np.full(len(k), 3 << shift, dtype=np.uint64)
        bits = np.full(len(k), int(tier) << shift, dtype=np.uint64)
        self.write_columns(table_id, k, clear, bits)

    def clear_worker(self, worker: int) -> int:
        """Record that ``worker`` holds nothing any more: its tier field is cleared in
        every key of its table (keys no other worker holds are removed). Returns how
        many keys it held. Writes are staged like :meth:`set_tier`'s."""
        if not 0 <= worker < self.layout.n_workers:
            raise BadInput(f"worker {worker} is outside 0..{self.layout.n_workers - 1}")
        table_id, field = self.layout.slots[worker]
        keys, values = self._tables[table_id].items()
        held = keys[((values >> np.uint64(field << 1)) & np.uint64(3)) != 0]
        self.set_tier(held, worker, Tier.ABSENT)
        return len(held)

    def write_staged(self, table_id: int, keys: int, clear: int, bits: int, n: int) -> None:
        """:meth:`write_columns` of ``n`` checked writes given by the addresses of their
        uint64 columns (:meth:`LudoTable.write_at`): a maintenance unit's staged writes,
        keys of this shard, bits within the table's fields."""
        table = self._tables[table_id]
        self._written.add(table_id)
        table.write_at(keys, clear, bits, n)

    def write_columns(
        self,
        table_id: int,
        keys: NDArray[np.uint64],
        clear: NDArray[np.uint64],
        bits: NDArray[np.uint64],
    ) -> None:
        """value := (value & ~clear[i]) | bits[i] for every keys[i] of one table, in order.

        One compiled call. Refuses the whole call, changing nothing, when any key is not
        a 63-bit key of this shard or any value does not fit the table.
        """
        table = self._tables.get(table_id)
        if table is None:
            raise BadInput(f"no table {table_id} in this layout")
        self._written.add(table_id)
        if keys.ndim != 1 or not (keys.shape == clear.shape == bits.shape):
            raise BadInput(
                f"keys, clear and bits must be equal-length vectors: "
                f"{keys.shape} {clear.shape} {bits.shape}"
            )
        if len(keys) == 0:
            return
        keys = _key_array(keys)
        bits = np.ascontiguousarray(bits, dtype=np.uint64)
        if _largest(bits) > table.geometry.value_mask:
            raise BadInput(f"a value does not fit {table.geometry.value_bits} bits")
        j = first_foreign(keys, self.n_shards, self.shard)
        if j >= 0:
            owner = shard_of(int(keys[j]), self.n_shards)
            raise BadInput(f"key {int(keys[j])} belongs to shard {owner}, not {self.shard}")
        clear = np.ascontiguousarray(clear, dtype=np.uint64)
        table.write_bits_many(keys, clear, bits, checked=True)

    # -- output ------------------------------------------------------------------------

    def take_patches(self) -> dict[int, TablePatch]:
        """Patches of every table written since the last call (table id -> patch).

        Raises IndexCorrupt if any table is corrupt, written since or not.
        """
        out = {}
        written, self._written = self._written, set()
        for table_id, table in self._tables.items():
            # Most tables of a shard see no write between flushes; a changed one has
            # something to send (LudoTable.changed), so its patch is never empty.
            if (table_id in written or table.corrupt) and table.changed:
                out[table_id] = table.take_patch()
        return out

    def view_images(self) -> dict[int, bytes]:
        return {table_id: t.view_image() for table_id, t in self._tables.items()}

    def snapshot_parts(self) -> tuple[dict[int, bytes], dict[int, bytes]]:
        """Per table id, the sealed view half and the sealed key half.

        Raises IndexCorrupt, producing nothing, when a write broke any of the tables.
        """
        views: dict[int, bytes] = {}
        keys: dict[int, bytes] = {}
        for table_id, table in self._tables.items():
            views[table_id], keys[table_id] = table.snapshot_parts()
        return views, keys

    @classmethod
    def restore(
        cls,
        snapshot: ShardSnapshot,
        layout: IndexLayout,
        shard: int,
        n_shards: int,
        *,
        rng: random.Random | None = None,
    ) -> ShardTables:
        """Rebuild shard ``shard`` from its snapshot.

        Refuses, with a :class:`SnapshotError` naming the part, a snapshot that is
        corrupt or of another shard, shard count or layout.
        """
        snapshot.verify(shard=shard, n_shards=n_shards, topology_digest=layout.digest())
        if not snapshot.keys:
            raise SnapshotError("keys: the snapshot was loaded without its key halves")
        want = {spec.table_id for spec in layout.tables}
        if set(snapshot.views) != want:
            raise SnapshotError(
                f"meta: tables {sorted(snapshot.views)}, the layout has {sorted(want)}"
            )
        rng = rng or random.Random()
        tables = {}
        for spec in layout.tables:
            t = spec.table_id
            try:
                table = LudoTable.from_parts(snapshot.views[t], snapshot.keys[t], rng=rng)
            except SnapshotError as exc:
                raise SnapshotError(f"keys:{t}: {exc}") from exc
            g = table.geometry
            if (g.value_bits, g.fingerprint_bits) != (spec.value_bits, layout.fingerprint_bits):
                raise SnapshotError(
                    f"view:{t}: {g.value_bits}-bit values and {g.fingerprint_bits}-bit "
                    f"fingerprints, the layout has {spec.value_bits} and {layout.fingerprint_bits}"
                )
            tables[t] = table
        return cls(layout, shard, n_shards, tables=tables)


def _key_array(keys: Iterable[int] | NDArray[np.uint64]) -> NDArray[np.uint64]:
    """Keys as a contiguous uint64 vector, or BadInput when one is not a 63-bit key."""
    try:
        if isinstance(keys, np.ndarray):
            if keys.dtype.kind not in "iu":
                raise BadInput(f"keys must be integers, got dtype {keys.dtype}")
            if keys.dtype.kind == "i" and len(keys) and int(keys.min()) < 0:
                raise BadInput("keys must be 63-bit non-negative ints")
            k = np.ascontiguousarray(keys, dtype=np.uint64)
        else:
            k = np.asarray(list(keys), dtype=np.uint64)
    except OverflowError as exc:  # a negative key or one of 64+ bits
        raise BadInput("keys must be 63-bit non-negative ints") from exc
    if k.ndim != 1:
        raise BadInput(f"keys must be a vector, got shape {k.shape}")
    if len(k) and _largest(k) >= _KEY_LIMIT:
        raise BadInput("keys must be 63-bit non-negative ints")
    return k


def _largest(values: NDArray[np.uint64]) -> int:
    """The largest of non-empty ``values``: Python's max for a few (a batch usually holds
    1-3 keys), where numpy's call costs more than the scan."""
    if len(values) <= _FEW:
        return int(max(values.tolist()))
    return int(values.max())


def first_foreign(keys: NDArray[np.uint64], n_shards: int, shard: int) -> int:
    """Index of the first of ``keys`` not of ``shard`` (:func:`kvcompass.keys.shard_of`),
    -1 if every key is: the one check of every write to a shard, compiled. It runs on a
    writable copy: a decoded batch's read-only (maybe unaligned) keys would make numba
    compile it again on the hot path."""
    return kernel.first_foreign(keys.copy(), n_shards, shard) if len(keys) else -1
