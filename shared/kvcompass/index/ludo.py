"""The Ludo table, maintenance side: full keys, cuckoo moves, seeds and the locator.

The table keeps its view image (seeds, cells, fingerprints) in one buffer laid out as
:mod:`kvcompass.index.image` describes, with cells already in view order (a key's
position inside its bucket is its slot under the bucket's seed), so a patch is a copy of
the touched buckets and Othello words. Beside the image it keeps the full key of every
cell and the locator's graph. Writes mark what they touch; :meth:`LudoTable.take_patch`
turns the marks into absolute-state patches.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import numpy as np
from numpy.typing import NDArray

from kvcompass.frozen_init import field_builder
from kvcompass.hashing import MASK64
from kvcompass.index import kernel, write_call
from kvcompass.index.addresses import address_of
from kvcompass.index.errors import IndexCorrupt, SnapshotError, TableFull
from kvcompass.index.geometry import DEFAULT_LOAD_LIMIT, TableGeometry
from kvcompass.index.image import (
    ImageArrays,
    ImageHeader,
    ImageKind,
    layout_of,
    open_image,
    open_key_image,
    payload_of,
    seal,
    seal_keys,
)
from kvcompass.index.kernel import MAX_CUCKOO_MOVES, TableArrays
from kvcompass.index.othello import OthelloGraph
from kvcompass.index.patch_copy import take_dirty
from kvcompass.index.patches import OthelloReset, TablePatch, WordImages
from kvcompass.index.seeds import find_seeds_array

__all__ = ["MAX_CUCKOO_MOVES", "LudoTable", "compile_write_kernel"]

#: Fresh Othello hash seeds to try after a cycle before growing the table instead.
_OTHELLO_ATTEMPTS = 16
_EMPTY = -1
#: Slot of the dirty-list length in the kernel's table and Othello state arrays.
_N_DIRTY = 1
#: Results for "nothing dirty", shared by every patch (so empty and read-only).
_NO_WORDS = WordImages()
_NO_WORDS.values.setflags(write=False)
#: A patch of parts the table built valid, without the dataclass's field-by-field init.
_build_patch = field_builder(TablePatch)


class LudoTable:
    """One generation-stamped Ludo table mapping 63-bit keys to nonzero values.

    A value of 0 means "absent": writing 0 removes the key. Every mutating call
    records what it touched; :meth:`take_patch` returns the patch that brings a view to
    the same state and clears the record. After an :class:`IndexCorrupt` the table
    refuses every write, patch, image and snapshot part.
    """

    def __init__(
        self,
        geometry: TableGeometry,
        *,
        load_limit: float = DEFAULT_LOAD_LIMIT,
        rng: random.Random | None = None,
    ) -> None:
        self._rng = rng or random.Random()
        self._load_limit = load_limit
        self._reset_storage(geometry)
        self._reload_pending = False
        #: Why the table can no longer be trusted (None while it can).
        self._corrupt: str | None = None
        #: A write broke the table: nothing derived from it may leave the process. (Set
        #: with the reason, never cleared; an attribute: a shard checks every table's per
        #: flush, and a property's call cost more than the rest of the check.)
        self.corrupt = False

    @classmethod
    def with_capacity(
        cls,
        capacity: int,
        *,
        value_bits: int = 32,
        fingerprint_bits: int = 0,
        load_limit: float = DEFAULT_LOAD_LIMIT,
        rng: random.Random | None = None,
    ) -> LudoTable:
        rng = rng or random.Random()
        g = TableGeometry.for_capacity(
            capacity,
            value_bits=value_bits,
            fingerprint_bits=fingerprint_bits,
            load_limit=load_limit,
            rng=rng,
        )
        return cls(g, load_limit=load_limit, rng=rng)

    def _reset_storage(self, g: TableGeometry) -> None:
        self.geometry = g
        layout = layout_of(g)
        self._layout = layout
        self._buf = bytearray(layout.view_end)
        image = ImageArrays.of(self._buf, g, layout)
        self._words = image.words
        # Without fingerprints in the view, a scratch array keeps the write paths uniform.
        fps = image.fingerprints
        if fps is None:
            fps = np.zeros(g.n_cells, dtype=np.uint8)
        self._t = TableArrays(
            keys=np.full(g.n_cells, _EMPTY, dtype=np.int64),
            kid=np.full(g.n_cells, _EMPTY, dtype=np.int32),
            # Each key's other candidate bucket: cuckoo searches then need no hashing.
            alt=np.full(g.n_cells, _EMPTY, dtype=np.int32),
            # Each key's slot-hash word 0 (its cell under seeds 0..31): seed searches and
            # moves then hash only for the rare seeds of 32 and above.
            sig=np.zeros(g.n_cells, dtype=np.uint64),
            fill=np.zeros(g.nb, dtype=np.uint8),
            seeds=image.seeds,
            cells=image.cells,
            fps=fps,
            bucket_dirty=np.zeros(g.nb, dtype=np.uint8),
            dirty_buckets=np.zeros(g.nb, dtype=np.int64),
            bucket_mark=np.zeros(g.nb, dtype=np.int32),
            state=np.zeros(3, dtype=np.int64),
        )
        self._othello = OthelloGraph(g.n_nodes, g.n_words, g.capacity)
        # The kernel's dirty counts, read per flush: a memoryview reads an int without
        # making a numpy scalar.
        self._dirty_buckets = self._t.state.data
        self._dirty_words = self._othello.arrays.state.data
        # Valid while self._t and self._othello keep their arrays (until the next reset).
        self._write_desc = kernel.write_descriptor(self._t, self._othello.arrays)
        # Where a patch's dirty marks, cell and fingerprint rows come from, by address
        # (kvcompass.index.patch_copy).
        cells = self._t.cells
        self._patch_source = (
            address_of(self._write_desc),
            address_of(cells),
            cells.itemsize,
            cells.dtype,
            address_of(fps),
            fps.itemsize if g.fingerprint_bits else 0,
            fps.dtype,
        )
        self._geo = kernel.geometry_vector(g)  # rewritten in place when the seed changes
        # The kernel's C entry takes all of the above by address (write_at).
        self._write_target = (
            address_of(self._write_desc),
            address_of(cells),
            cells.itemsize,
            address_of(fps),
            fps.itemsize,
            address_of(self._geo),
        )
        self._value_mask = g.value_mask
        self._othello_reset = False

    # -- reads -------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self.geometry.capacity

    @property
    def count(self) -> int:
        """Keys present."""
        return int(self._t.state[0])

    @property
    def load(self) -> float:
        """Occupied share of all cells."""
        return self.count / self.geometry.n_cells

    def get(self, key: int) -> int:
        """The key's value, 0 when absent."""
        keys = self._t.keys
        for b in self.geometry.buckets(key):
            for p in range(b << 2, (b << 2) + 4):
                if keys[p] == key:
                    return int(self._t.cells[p])
        return 0

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self.get(key) != 0

    def __len__(self) -> int:
        return self.count

    def items(self) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
        """All present keys and their values, as arrays."""
        keys = self._t.keys
        occ = np.flatnonzero(keys >= 0)
        return keys[occ].astype(np.uint64), self._t.cells[occ].astype(np.uint64)

    # -- writes ------------------------------------------------------------------

    def put(self, key: int, value: int) -> TablePatch:
        """Set a key's value (0 removes it) and return the patch for the views."""
        self.write(key, value)
        return self.take_patch()

    def write(self, key: int, value: int) -> None:
        """Set a key's value (0 removes it) without taking the patch yet."""
        self.write_bits(key, self._value_mask, value)

    def write_bits(self, key: int, clear: int, bits: int) -> None:
        """value := (value & ~clear) | bits, in one lookup (0 afterwards removes the key)."""
        if not 0 <= key < 1 << 63:
            raise ValueError(f"key must be a 63-bit non-negative int, got {key}")
        if not 0 <= bits <= self._value_mask:
            raise ValueError(f"value {bits} does not fit {self.geometry.value_bits} bits")
        self._apply(
            np.array([key], dtype=np.uint64),
            np.array([clear & MASK64], dtype=np.uint64),
            np.array([bits], dtype=np.uint64),
        )

    def write_bits_many(
        self,
        keys: NDArray[np.uint64],
        clear: NDArray[np.uint64],
        bits: NDArray[np.uint64],
        *,
        checked: bool = False,
    ) -> None:
        """:meth:`write_bits` for every ``(keys[i], clear[i], bits[i])``, in order.

        The maintenance unit's batch write: one compiled call per event batch.
        ``checked``: the caller passes contiguous uint64 vectors of one length whose keys
        and bits it has already checked (:class:`ShardTables` does), so they are not
        scanned twice.
        """
        if checked:
            self._apply(keys, clear, bits)
            return
        if not (keys.shape == clear.shape == bits.shape) or keys.ndim != 1:
            raise ValueError(
                f"keys, clear and bits must be equal-length vectors: "
                f"{keys.shape} {clear.shape} {bits.shape}"
            )
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        bits = np.ascontiguousarray(bits, dtype=np.uint64)
        if len(keys) and int(keys.max()) >= 1 << 63:
            raise ValueError("keys must be 63-bit non-negative ints")
        if len(bits) and int(bits.max()) > self._value_mask:
            raise ValueError(f"a value does not fit {self.geometry.value_bits} bits")
        self._apply(keys, np.ascontiguousarray(clear, dtype=np.uint64), bits)

    def put_many(
        self, keys: Iterable[int] | NDArray[np.uint64], values: Iterable[int] | NDArray[np.uint64]
    ) -> TablePatch:
        """Apply many writes and return one coalesced patch.

        Only the last write of each key matters for the final state, so the batch is
        reduced to that; value changes of present keys are then applied vectorised, and
        removals and inserts (which may move keys) by the compiled write path.
        """
        k = np.asarray(keys if isinstance(keys, np.ndarray) else list(keys), dtype=np.uint64)
        v = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.uint64)
        if k.shape != v.shape or k.ndim != 1:
            raise ValueError(f"keys and values must be equal-length vectors: {k.shape} {v.shape}")
        if len(k) and int(k.max()) >= 1 << 63:
            raise ValueError("keys must be 63-bit non-negative ints")
        if len(v) and int(v.max()) > self.geometry.value_mask:
            raise ValueError(f"a value does not fit {self.geometry.value_bits} bits")
        _, first_of_reversed = np.unique(k[::-1], return_index=True)
        last = len(k) - 1 - first_of_reversed
        k, v = k[last], v[last]
        pos = self._positions(k)
        change = (pos >= 0) & (v != 0)
        if change.any():
            p = pos[change]
            self._t.cells[p] = v[change]
            kernel.mark_buckets(self._t, p >> 2)
        rest = ~change
        k, v = k[rest], v[rest]
        self._apply(k, np.full(len(k), self._value_mask, dtype=np.uint64), v)
        return self.take_patch()

    def _positions(self, keys: NDArray[np.uint64]) -> NDArray[np.int64]:
        """Cell of every key, -1 for absent keys (vectorised)."""
        b0, b1 = self.geometry.buckets_array(keys)
        b0 = b0.astype(np.int64)
        b1 = b1.astype(np.int64)
        stored = self._t.keys.reshape(-1, 4)
        want = keys.astype(np.int64)[:, None]
        hit0 = stored[b0] == want
        hit1 = stored[b1] == want
        pos = np.full(len(keys), -1, dtype=np.int64)
        in0 = hit0.any(axis=1)
        in1 = hit1.any(axis=1) & ~in0
        pos[in0] = b0[in0] * 4 + hit0[in0].argmax(axis=1)
        pos[in1] = b1[in1] * 4 + hit1[in1].argmax(axis=1)
        return pos

    def remove(self, key: int) -> TablePatch:
        return self.put(key, 0)

    def _apply(
        self, keys: NDArray[np.uint64], clear: NDArray[np.uint64], bits: NDArray[np.uint64]
    ) -> None:
        """Run validated writes through the kernel, doing the whole-table steps it asks for."""
        self._check_intact()
        # numba compiles one machine-code version per array flag set: a read-only array
        # (keys decoded straight from a message buffer) would compile a second version on
        # the hot path (1.8 s). Copies are cheap next to the writes; every caller then
        # runs the version compile_write_kernel() built at set-up.
        if not keys.flags.writeable:
            keys = keys.copy()
        if not clear.flags.writeable:
            clear = clear.copy()
        if not bits.flags.writeable:
            bits = bits.copy()
        i = 0
        n = len(keys)
        while i < n:
            status, i = kernel.apply_writes(
                self._write_desc, self._t.cells, self._t.fps, self._geo, keys, clear, bits, i
            )
            if status != kernel.DONE:
                i = self._resume_after(int(status), int(i))

    def write_at(self, keys: int, clear: int, bits: int, n: int) -> None:
        """:meth:`write_bits_many` of ``n`` checked writes whose uint64 columns are given
        by address (a maintenance unit's staged writes): run by the kernel's C entry,
        with no array made or unboxed. The caller keeps the columns alive meanwhile."""
        self._check_intact()
        i = 0
        while i < n:
            status, i = write_call.write_at(self._write_target, keys, clear, bits, n, i)
            if status != kernel.DONE:
                i = self._resume_after(status, i)

    def _resume_after(self, status: int, i: int) -> int:
        """Take the whole-table step a kernel stop at write ``i`` asks for; the write to
        resume at."""
        if status == kernel.NEED_GROW:
            self._grow()  # then retry the same write in the new generation
            return i
        if status == kernel.NEED_REBUILD:
            self._rebuild_othello()
            return i + 1
        if status == kernel.NO_SEED:
            raise self._poison("no bucket seed separates a bucket's keys mid-move")
        raise self._poison(f"the write kernel stopped with an unknown status {status}")

    def _poison(self, reason: str) -> IndexCorrupt:
        """Mark the table untrustworthy: nothing derived from it may leave the process."""
        self._corrupt = reason
        self.corrupt = True
        return IndexCorrupt(f"{reason}: reload the table from its last snapshot")

    def _check_intact(self) -> None:
        if self._corrupt is not None:
            raise IndexCorrupt(f"table is corrupt ({self._corrupt}); reload it from a snapshot")

    # -- rebuilds ------------------------------------------------------------------

    def _rebuild_othello(self) -> None:
        """Rebuild the locator with fresh hash seeds until its graph is a forest."""
        keys = self._t.keys
        occ = np.flatnonzero(keys >= 0)
        k = keys[occ].astype(np.uint64)
        b0, _ = self.geometry.buckets_array(k)
        bits = ((occ >> 2).astype(np.uint64) != b0).astype(np.uint8)
        for _ in range(_OTHELLO_ATTEMPTS):
            g = self.geometry.with_othello_seed(self._rng.getrandbits(64))
            ia, ib = g.nodes_array(k)
            kids = self._othello.rebuild(ia.astype(np.int64), ib.astype(np.int64), bits)
            if kids is not None:
                self.geometry = g
                self._geo[:] = kernel.geometry_vector(g)  # in place: _write_target has it
                self._t.kid[:] = _EMPTY
                self._t.kid[occ] = kids
                self._othello_reset = True
                return
        self._grow()

    def _grow(self) -> None:
        """Rebuild into a new generation with twice the capacity (views must reload)."""
        keys, values = self.items()
        g = self.geometry
        new = TableGeometry.for_capacity(
            2 * g.capacity,
            value_bits=g.value_bits,
            fingerprint_bits=g.fingerprint_bits,
            load_limit=self._load_limit,
            generation=g.generation + 1,
            rng=self._rng,
        )
        try:
            self._bulk_load(new, keys, values)
        except TableFull as exc:  # storage was already reset: the keys are gone
            raise self._poison(f"growing lost the table: {exc}") from exc

    def _bulk_load(
        self, g: TableGeometry, keys: NDArray[np.uint64], values: NDArray[np.uint64]
    ) -> None:
        """Replace the whole table by ``keys``/``values`` laid out in geometry ``g``."""
        self._reset_storage(g)
        self._reload_pending = True
        if len(keys) == 0:
            return
        placed, bucket = _greedy_placement(g, keys)
        self._write_buckets(g, keys[placed], values[placed], bucket[placed])
        self._rebuild_othello()
        rest = ~placed
        self._apply(keys[rest], np.full(int(rest.sum()), self._value_mask, np.uint64), values[rest])
        self._forget_dirty()
        self._othello_reset = False

    def _write_buckets(
        self,
        g: TableGeometry,
        keys: NDArray[np.uint64],
        values: NDArray[np.uint64],
        bucket: NDArray[np.int64],
    ) -> None:
        order = np.argsort(bucket, kind="stable")
        keys, values, bucket = keys[order], values[order], bucket[order]
        starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
        rank = np.arange(len(bucket)) - np.repeat(starts, np.diff(np.r_[starts, len(bucket)]))
        mat = np.zeros((g.nb, 4), dtype=np.uint64)
        occ = np.zeros((g.nb, 4), dtype=bool)
        mat[bucket, rank] = keys
        occ[bucket, rank] = True
        seeds, cells = find_seeds_array(g, mat, occ)
        pos = bucket * 4 + cells[bucket, rank].astype(np.int64)
        t = self._t
        t.seeds[:] = seeds
        t.cells[pos] = values
        if g.fingerprint_bits:
            t.fps[pos] = g.fingerprints_array(keys)
        t.keys[pos] = keys.astype(np.int64)
        t.alt[:] = _alt_array(g, t.keys)
        t.sig[:] = _sig_array(g, t.keys)
        t.fill[:] = np.bincount(bucket, minlength=g.nb)
        t.state[0] = len(keys)

    @classmethod
    def build(
        cls,
        keys: NDArray[np.uint64],
        values: NDArray[np.uint64],
        *,
        capacity: int | None = None,
        value_bits: int = 32,
        fingerprint_bits: int = 0,
        load_limit: float = DEFAULT_LOAD_LIMIT,
        rng: random.Random | None = None,
    ) -> LudoTable:
        """Bulk-build a table from distinct keys and nonzero values (vectorised)."""
        keys = np.asarray(keys, dtype=np.uint64)
        values = np.asarray(values, dtype=np.uint64)
        if len(np.unique(keys)) != len(keys):
            raise ValueError("bulk build needs distinct keys")
        if np.any(values == 0):
            raise ValueError("bulk build needs nonzero values (0 means absent)")
        table = cls.with_capacity(
            max(capacity or 0, len(keys)),
            value_bits=value_bits,
            fingerprint_bits=fingerprint_bits,
            load_limit=load_limit,
            rng=rng,
        )
        table._bulk_load(table.geometry, keys, values)
        table._reload_pending = False
        return table

    # -- patches -------------------------------------------------------------------

    @property
    def changed(self) -> bool:
        """Whether :meth:`take_patch` has anything to return, or would refuse (corrupt):
        a cheap test per flush."""
        return bool(
            self.corrupt
            or self._reload_pending
            or self._othello_reset
            or self._dirty_buckets[_N_DIRTY]
            or self._dirty_words[_N_DIRTY]
        )

    def take_patch(self) -> TablePatch:
        """The absolute-state patch for everything written since the last call."""
        self._check_intact()
        g = self.geometry
        othello = self._othello
        if self._reload_pending:
            self._reload_pending = False
            self._othello_reset = False
            self._forget_dirty()
            return TablePatch(g.generation, reload=self.view_image())
        reset = None
        if self._othello_reset:
            reset = OthelloReset(g.othello_seed, othello.words.tobytes())
            self._othello_reset = False
        buckets, words = take_dirty(*self._patch_source, reset is None)
        return _build_patch(
            g.generation, buckets, _NO_WORDS if words is None else words, reset, None
        )

    def _forget_dirty(self) -> None:
        """Clear the dirty buckets and words: a reload carries the whole table."""
        take_dirty(*self._patch_source, False)

    # -- images and snapshots ---------------------------------------------------------

    def _sync_words(self) -> None:
        self._words[:] = self._othello.words

    def view_image(self) -> bytes:
        """The keyless view of this table, as a sealed image."""
        self._check_intact()
        self._sync_words()
        return seal(self._buf, ImageKind.VIEW, self.geometry, self.count, self._layout.view_end)

    def view_payload(self) -> NDArray[np.uint8]:
        """The view image's payload (past its header) as it stands, read-only and not
        copied: to compare with a view's, valid until the next write."""
        self._check_intact()
        self._sync_words()
        return payload_of(self._buf, self._layout.view_end)

    def snapshot_parts(self) -> tuple[bytes, bytes]:
        """The sealed view image and the sealed key image: the two halves of a snapshot.

        Stored apart, an edge fetches only the view half; a maintenance unit needs both.
        The key half names its view half by checksum, so halves of two snapshots never
        restore together.
        """
        view = self.view_image()
        return view, seal_keys(ImageHeader.unpack(view), self._t.keys)

    @classmethod
    def from_parts(
        cls,
        view_image: bytes | bytearray | memoryview,
        keys: bytes | bytearray | memoryview,
        *,
        load_limit: float = DEFAULT_LOAD_LIMIT,
        rng: random.Random | None = None,
    ) -> LudoTable:
        """Rebuild a table from :meth:`snapshot_parts`; refuse corrupt or mismatched halves."""
        header = open_image(view_image, ImageKind.VIEW)
        key_arr = open_key_image(keys, header)
        return cls._restore(
            header.geometry, header.count, memoryview(view_image), key_arr, load_limit, rng
        )

    @classmethod
    def _restore(
        cls,
        g: TableGeometry,
        count: int,
        view: memoryview,
        keys: NDArray[np.int64],
        load_limit: float,
        rng: random.Random | None,
    ) -> LudoTable:
        table = cls(g, load_limit=load_limit, rng=rng)
        layout = table._layout
        table._buf[:] = bytes(view[: layout.view_end])
        occ = np.flatnonzero(keys >= 0)
        if len(occ) != count:
            raise SnapshotError(f"snapshot holds {len(occ)} keys but its header says {count}")
        if np.any(keys < _EMPTY):
            raise SnapshotError("snapshot holds a negative key")
        if len(np.unique(keys[occ])) != len(occ):
            raise SnapshotError("snapshot holds a key twice")
        t = table._t
        t.keys[:] = keys
        t.alt[:] = _alt_array(g, keys)
        t.sig[:] = _sig_array(g, keys)
        t.fill[:] = np.bincount(occ >> 2, minlength=g.nb)
        t.state[0] = len(occ)
        k = keys[occ].astype(np.uint64)
        b0, b1 = g.buckets_array(k)
        bucket = (occ >> 2).astype(np.uint64)
        if np.any((bucket != b0) & (bucket != b1)):
            raise SnapshotError("snapshot places a key outside its candidate buckets")
        ia, ib = g.nodes_array(k)
        kids = table._othello.rebuild(
            ia.astype(np.int64), ib.astype(np.int64), (bucket != b0).astype(np.uint8)
        )
        if kids is None:
            raise SnapshotError("snapshot locator graph has a cycle")
        # Bits of a forest are unique only up to one flip per tree: keep the stored ones
        # so the restored table stays byte-identical to the views built from it, after
        # checking that they classify every key right.
        stored = np.frombuffer(view, np.uint64, g.n_words, layout.words)
        bits_of = np.unpackbits(stored.view(np.uint8), bitorder="little")
        if np.any((bits_of[ia] ^ bits_of[ib]) != (bucket != b0)):
            raise SnapshotError("snapshot locator bits do not match its keys")
        table._othello.set_words(stored)
        t.kid[occ] = kids
        # The view must answer for exactly these keys: a value in every occupied cell,
        # none elsewhere, and each key's fingerprint.
        empty = np.ones(g.n_cells, dtype=bool)
        empty[occ] = False
        if np.any(t.cells[empty] != 0) or np.any(t.cells[occ] == 0):
            raise SnapshotError("snapshot view values do not match its keys")
        if g.fingerprint_bits and np.any(
            t.fps[occ] != g.fingerprints_array(keys[occ].astype(np.uint64))
        ):
            raise SnapshotError("snapshot view fingerprints do not match its keys")
        return table


def compile_write_kernel(value_bits: int = 0, fingerprint_bits: int = -1) -> None:
    """Compile (or load from numba's on-disk cache) the write path for these tables.

    Services call it before taking traffic; the default covers every value and
    fingerprint width. The first compile on a machine takes tens of seconds, later
    processes load the cached machine code in about a second.
    """
    for bits in (32, 64) if value_bits == 0 else (value_bits,):
        for fp in (0, 16) if fingerprint_bits < 0 else (fingerprint_bits,):
            # Enough keys to exercise every path (insert, move, re-seed, update, remove).
            table = LudoTable.with_capacity(
                16, value_bits=bits, fingerprint_bits=fp, rng=random.Random(0)
            )
            keys = np.arange(1, 41, dtype=np.uint64)
            table.put_many(keys, keys)
            table.put_many(keys, np.zeros_like(keys))
            # ... and the C entry a maintenance unit's staged writes go through.
            clear = np.full(len(keys), table.geometry.value_mask, dtype=np.uint64)
            table.write_at(address_of(keys), address_of(clear), address_of(keys), len(keys))
    kernel.first_foreign(np.zeros(1, dtype=np.uint64), 1, 0)  # ShardTables' unchecked writes


def _greedy_placement(
    g: TableGeometry, keys: NDArray[np.uint64]
) -> tuple[NDArray[np.bool_], NDArray[np.int64]]:
    """Place keys in their first, then second, candidate bucket while room lasts."""
    b0, b1 = g.buckets_array(keys)
    bucket = np.full(len(keys), -1, dtype=np.int64)
    fill = np.zeros(g.nb, dtype=np.int64)
    for cand in (b0.astype(np.int64), b1.astype(np.int64)):
        todo = np.flatnonzero(bucket < 0)
        c = cand[todo]
        order = np.argsort(c, kind="stable")
        cs = c[order]
        starts = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]])
        rank = np.arange(len(cs)) - np.repeat(starts, np.diff(np.r_[starts, len(cs)]))
        ok = rank + fill[cs] < 4
        chosen = todo[order[ok]]
        bucket[chosen] = cand[chosen]
        fill += np.bincount(cs[ok], minlength=g.nb)
    return bucket >= 0, bucket


def _alt_array(g: TableGeometry, cell_keys: NDArray[np.int64]) -> NDArray[np.int32]:
    """For every cell, the other candidate bucket of the key it holds (-1 if empty)."""
    alt = np.full(g.n_cells, _EMPTY, dtype=np.int32)
    occ = np.flatnonzero(cell_keys >= 0)
    b0, b1 = g.buckets_array(cell_keys[occ].astype(np.uint64))
    here = (occ >> 2).astype(np.uint64)
    alt[occ] = np.where(here == b0, b1, b0).astype(np.int32)
    return alt


def _sig_array(g: TableGeometry, cell_keys: NDArray[np.int64]) -> NDArray[np.uint64]:
    """For every cell, slot-hash word 0 of the key it holds (0 if empty)."""
    sig = np.zeros(g.n_cells, dtype=np.uint64)
    occ = np.flatnonzero(cell_keys >= 0)
    sig[occ] = g.slot_words_array(cell_keys[occ].astype(np.uint64), 0)
    return sig
