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
from array import array
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from kvcompass.hashing import MASK32, MASK64
from kvcompass.index.errors import SnapshotError, TableFull
from kvcompass.index.geometry import DEFAULT_LOAD_LIMIT, SEEDS_PER_WORD, TableGeometry
from kvcompass.index.image import ImageKind, layout_of, open_image, seal
from kvcompass.index.othello import OthelloGraph
from kvcompass.index.patches import BucketImages, OthelloReset, TablePatch, WordImages
from kvcompass.index.seeds import find_seed, find_seeds_array

__all__ = ["MAX_CUCKOO_MOVES", "LudoTable"]

#: Longest cuckoo path: at most 4 displaced keys (5 buckets), as in Ludo.
MAX_CUCKOO_MOVES = 4
#: Fresh Othello hash seeds to try after a cycle before growing the table instead.
_OTHELLO_ATTEMPTS = 16
_EMPTY = -1


class LudoTable:
    """One generation-stamped Ludo table mapping 63-bit keys to nonzero values.

    A value of 0 means "absent": writing 0 removes the key. Every mutating call
    records what it touched; :meth:`take_patch` returns the patch that brings a view to
    the same state and clears the record.
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
        mv = memoryview(self._buf)
        self._seeds = mv[layout.seeds : layout.seeds + g.nb]
        cell_code: Literal["I", "Q"] = "I" if g.value_bits == 32 else "Q"
        self._cells = mv[layout.cells : layout.cells + g.n_cells * layout.cell_itemsize].cast(
            cell_code
        )
        if g.fingerprint_bits:
            fp_code: Literal["H", "B"] = "H" if layout.fingerprint_itemsize == 2 else "B"
            fp_bytes = g.n_cells * layout.fingerprint_itemsize
            self._fps = mv[layout.fingerprints : layout.fingerprints + fp_bytes].cast(fp_code)
        else:
            # No fingerprints in the view; a scratch array keeps the write paths uniform.
            self._fps = memoryview(bytearray(g.n_cells))
        self._keys = array("q", [_EMPTY]) * g.n_cells
        self._kid = array("i", [_EMPTY]) * g.n_cells
        # Each key's other candidate bucket: cuckoo searches then need no hashing.
        self._alt = array("i", [_EMPTY]) * g.n_cells
        # Each key's slot-hash word 0 (its cell under seeds 0..31): seed searches and
        # moves then hash only for the rare seeds of 32 and above.
        self._sig = array("Q", [0]) * g.n_cells
        self._fill = bytearray(g.nb)
        self._bseed = g.bucket_seed
        self._nb = g.nb
        self._value_mask = g.value_mask
        self.count = 0
        self._othello = OthelloGraph(g.n_nodes, g.n_words, g.capacity)
        self._dirty: set[int] = set()
        self._othello_reset = False

    # -- reads -------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self.geometry.capacity

    @property
    def load(self) -> float:
        """Occupied share of all cells."""
        return self.count / self.geometry.n_cells

    def _find(self, key: int, b0: int, b1: int) -> int:
        keys = self._keys
        p = b0 << 2
        if keys[p] == key:
            return p
        if keys[p + 1] == key:
            return p + 1
        if keys[p + 2] == key:
            return p + 2
        if keys[p + 3] == key:
            return p + 3
        p = b1 << 2
        if keys[p] == key:
            return p
        if keys[p + 1] == key:
            return p + 1
        if keys[p + 2] == key:
            return p + 2
        if keys[p + 3] == key:
            return p + 3
        return -1

    def get(self, key: int) -> int:
        """The key's value, 0 when absent."""
        b0, b1 = self.geometry.buckets(key)
        pos = self._find(key, b0, b1)
        return 0 if pos < 0 else self._cells[pos]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self.get(key) != 0

    def __len__(self) -> int:
        return self.count

    def items(self) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
        """All present keys and their values, as arrays."""
        keys = np.frombuffer(self._keys, dtype=np.int64)
        occ = np.flatnonzero(keys >= 0)
        cells = np.frombuffer(self._cells, dtype=self._cell_dtype)
        return keys[occ].astype(np.uint64), cells[occ].astype(np.uint64)

    @property
    def _cell_dtype(self) -> np.dtype[np.unsignedinteger[Any]]:
        return np.dtype(np.uint32 if self.geometry.value_bits == 32 else np.uint64)

    # -- writes ------------------------------------------------------------------

    def put(self, key: int, value: int) -> TablePatch:
        """Set a key's value (0 removes it) and return the patch for the views."""
        self._put(key, value)
        return self.take_patch()

    def write(self, key: int, value: int) -> None:
        """Set a key's value (0 removes it) without taking the patch yet."""
        self._put(key, value)

    def put_many(
        self, keys: Iterable[int] | NDArray[np.uint64], values: Iterable[int] | NDArray[np.uint64]
    ) -> TablePatch:
        """Apply many writes and return one coalesced patch.

        Only the last write of each key matters for the final state, so the batch is
        reduced to that; value changes of present keys are then applied vectorised, and
        removals and inserts (which may move keys) one by one.
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
        present = pos >= 0
        change = present & (v != 0)
        if change.any():
            p = pos[change]
            _, cells, _ = self._arrays()
            cells[p] = v[change]
            self._dirty.update((p >> 2).tolist())
        for p in pos[present & (v == 0)].tolist():
            self._delete(p)
        insert = ~present & (v != 0)
        put = self._put
        for key, value in zip(k[insert].tolist(), v[insert].tolist(), strict=True):
            put(key, value)
        return self.take_patch()

    def _positions(self, keys: NDArray[np.uint64]) -> NDArray[np.int64]:
        """Cell of every key, -1 for absent keys (vectorised)."""
        b0, b1 = self.geometry.buckets_array(keys)
        b0 = b0.astype(np.int64)
        b1 = b1.astype(np.int64)
        stored = np.frombuffer(self._keys, dtype=np.int64).reshape(-1, 4)
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

    def _put(self, key: int, value: int) -> None:
        self._modify(key, self._value_mask, value)

    def write_bits(self, key: int, clear: int, bits: int) -> None:
        """value := (value & ~clear) | bits, in one lookup (0 afterwards removes the key).

        The maintenance unit's per-key write: set one worker's 2-bit tier field.
        """
        self._modify(key, clear, bits)

    def write_bits_many(
        self, keys: NDArray[np.uint64], clear: NDArray[np.uint64], bits: NDArray[np.uint64]
    ) -> None:
        """:meth:`write_bits` for every ``(keys[i], clear[i], bits[i])``, in order.

        The maintenance unit's batch write: one call per event batch.
        """
        if not (keys.shape == clear.shape == bits.shape) or keys.ndim != 1:
            raise ValueError(
                f"keys, clear and bits must be equal-length vectors: "
                f"{keys.shape} {clear.shape} {bits.shape}"
            )
        modify = self._modify
        for key, c, b in zip(keys.tolist(), clear.tolist(), bits.tolist(), strict=True):
            modify(key, c, b)

    def _modify(self, key: int, clear: int, bits: int) -> None:
        if not 0 <= key < 1 << 63:
            raise ValueError(f"key must be a 63-bit non-negative int, got {key}")
        if not 0 <= bits <= self._value_mask:
            raise ValueError(f"value {bits} does not fit {self.geometry.value_bits} bits")
        x = key ^ self._bseed  # inlined mix64: this is the hot path of every write
        x ^= x >> 33
        x = (x * 0xFF51AFD7ED558CCD) & MASK64
        x ^= x >> 33
        x = (x * 0xC4CEB9FE1A85EC53) & MASK64
        x ^= x >> 33
        nb = self._nb
        b0 = ((x & MASK32) * nb) >> 32
        b1 = ((x >> 32) * nb) >> 32
        pos = self._find(key, b0, b1)
        if pos >= 0:
            old = self._cells[pos]
            value = (old & ~clear) | bits
            if value == old:
                return
            if value:
                self._cells[pos] = value
                self._dirty.add(pos >> 2)
            else:
                self._delete(pos)
        elif bits:
            self._insert(key, bits, b0, b1)

    def _delete(self, pos: int) -> None:
        self._othello.remove_edge(self._kid[pos])
        self._clear(pos)
        self.count -= 1

    def _clear(self, pos: int) -> None:
        self._keys[pos] = _EMPTY
        self._kid[pos] = _EMPTY
        self._alt[pos] = _EMPTY
        self._cells[pos] = 0
        self._fps[pos] = 0
        self._fill[pos >> 2] -= 1
        self._dirty.add(pos >> 2)

    def _insert(self, key: int, value: int, b0: int, b1: int) -> None:
        if self.count >= self.capacity:
            self._grow()
            b0, b1 = self.geometry.buckets(key)
        g = self.geometry
        a, b = g.nodes(key)
        # Cycle test before any move: moves only toggle bits, never change edges.
        tree = self._othello.smaller_side(a, b)
        toggle = tree is not None
        fill = self._fill
        x = key ^ g.slot_seed  # slot_word(key, 0), inlined: the key's cell under seeds < 32
        x ^= x >> 33
        x = (x * 0xFF51AFD7ED558CCD) & MASK64
        x ^= x >> 33
        x = (x * 0xC4CEB9FE1A85EC53) & MASK64
        sig0 = x ^ (x >> 33)
        if fill[b0] < 4 or fill[b1] < 4:
            root = self._roomiest(key, sig0, b0, b1)
        else:
            try:
                root = self._displace(b0, b1, toggle)
            except TableFull:
                self._grow()
                self._put(key, value)
                return
        fp = g.fingerprint(key) if g.fingerprint_bits else 0
        pos = self._place(root, key, value, fp, b1 if root == b0 else b0, sig0)
        self.count += 1
        bit = 0 if root == b0 else 1
        if tree is None:
            self._rebuild_othello()
        else:
            self._kid[pos] = self._othello.add_edge(a, b, bit, tree)

    def _roomiest(self, key: int, sig0: int, b0: int, b1: int) -> int:
        """A candidate bucket with room, preferring one whose seed needs no change."""
        fill, seeds, keys = self._fill, self._seeds, self._keys
        for b in (b0, b1):
            if fill[b] < 4:
                seed = seeds[b]
                if seed < SEEDS_PER_WORD and keys[(b << 2) | ((sig0 >> (seed << 1)) & 3)] < 0:
                    return b
        return b0 if fill[b0] < 4 else b1

    def _place(
        self,
        bucket: int,
        key: int,
        value: int,
        fp: int,
        alt: int,
        sig0: int,
        kid: int = _EMPTY,
    ) -> int:
        """Put a key into a bucket with a free cell, re-seeding it if needed.

        ``sig0`` is the key's slot-hash word 0.
        """
        keys, cells, fps, kids, alts = self._keys, self._cells, self._fps, self._kid, self._alt
        sigs = self._sig
        base = bucket << 2
        self._fill[bucket] += 1
        self._dirty.add(bucket)
        # Keep the bucket's seed when the new key's cell under it is free: one hash
        # instead of a seed search, and only one cell of the bucket changes.
        seed = self._seeds[bucket]
        if seed < SEEDS_PER_WORD:
            pos = base + ((sig0 >> (seed << 1)) & 3)
        else:
            pos = base + self.geometry.slot(key, seed)
        if keys[pos] == _EMPTY:
            keys[pos], cells[pos], fps[pos], kids[pos], alts[pos] = key, value, fp, kid, alt
            sigs[pos] = sig0
            return pos
        entries = [
            (keys[q], cells[q], fps[q], kids[q], alts[q], sigs[q])
            for q in range(base, base + 4)
            if keys[q] != _EMPTY
        ]
        entries.append((key, value, fp, kid, alt, sig0))
        seed, slots = find_seed(self.geometry, [e[0] for e in entries], [e[5] for e in entries])
        for q in range(base, base + 4):
            keys[q], cells[q], fps[q], kids[q], alts[q], sigs[q] = _EMPTY, 0, 0, _EMPTY, _EMPTY, 0
        for entry, s in zip(entries, slots, strict=True):
            q = base + s
            keys[q], cells[q], fps[q], kids[q], alts[q], sigs[q] = entry
        self._seeds[bucket] = seed
        return base + slots[-1]

    def _displace(self, b0: int, b1: int, toggle: bool) -> int:
        """Free a cell in b0 or b1 by a breadth-first cuckoo path; return that bucket."""
        keys, fill, alts = self._keys, self._fill, self._alt
        # Each entry: (bucket, parent entry, position in the parent of the key moving
        # here, path length in buckets). A bucket is tested for room when enqueued.
        entries: list[tuple[int, int, int, int]] = [(b0, -1, -1, 1), (b1, -1, -1, 1)]
        seen = {b0, b1}
        found = -1
        i = 0
        while found < 0 and i < len(entries):
            bucket, _, _, depth = entries[i]
            if depth > MAX_CUCKOO_MOVES:
                break
            base = bucket << 2
            for q in range(base, base + 4):
                alt = alts[q]
                if alt in seen:  # includes alt == bucket: a key with one candidate
                    continue
                seen.add(alt)
                entries.append((alt, i, q, depth + 1))
                if fill[alt] < 4:
                    found = len(entries) - 1
                    break
            i += 1
        if found < 0:
            raise TableFull("no cuckoo path frees a cell")
        # Move keys backwards from the free end, so every key lands before its old
        # cell is reused.
        e = found
        while entries[e][1] >= 0:
            bucket, parent, q, _ = entries[e]
            key, value, fp, kid = keys[q], self._cells[q], self._fps[q], self._kid[q]
            sig0 = self._sig[q]
            self._clear(q)
            self._place(bucket, key, value, fp, q >> 2, sig0, kid)
            if toggle:
                self._othello.toggle(kid)
            e = parent
        return entries[e][0]

    # -- rebuilds ------------------------------------------------------------------

    def _rebuild_othello(self) -> None:
        """Rebuild the locator with fresh hash seeds until its graph is a forest."""
        keys = np.frombuffer(self._keys, dtype=np.int64)
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
                kid = np.full(g.n_cells, _EMPTY, dtype=np.int32)
                kid[occ] = kids
                self._kid = array("i", kid.tobytes())
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
        self._bulk_load(new, keys, values)

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
        for key, value in zip(keys[~placed].tolist(), values[~placed].tolist(), strict=True):
            self._put(key, value)
        self._dirty.clear()
        self._othello.dirty_words.clear()
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
        layout = self._layout
        np.frombuffer(self._buf, np.uint8, g.nb, layout.seeds)[:] = seeds
        np.frombuffer(self._buf, self._cell_dtype, g.n_cells, layout.cells)[pos] = values
        if g.fingerprint_bits:
            fp_dtype = np.uint8 if layout.fingerprint_itemsize == 1 else np.uint16
            fps = np.frombuffer(self._buf, fp_dtype, g.n_cells, layout.fingerprints)
            fps[pos] = g.fingerprints_array(keys)
        key_arr = np.full(g.n_cells, _EMPTY, dtype=np.int64)
        key_arr[pos] = keys.astype(np.int64)
        self._keys = array("q", key_arr.tobytes())
        self._alt = _alt_array(g, key_arr)
        self._sig = _sig_array(g, key_arr)
        self._fill = bytearray(np.bincount(bucket, minlength=g.nb).astype(np.uint8).tobytes())
        self.count = len(keys)

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

    def take_patch(self) -> TablePatch:
        """The absolute-state patch for everything written since the last call."""
        g = self.geometry
        othello = self._othello
        if self._reload_pending:
            self._reload_pending = False
            self._othello_reset = False
            self._dirty.clear()
            othello.dirty_words.clear()
            return TablePatch(g.generation, reload=self.view_image())
        reset = None
        words = WordImages()
        if self._othello_reset:
            reset = OthelloReset(g.othello_seed, othello.words.tobytes())
            self._othello_reset = False
        elif othello.dirty_words:
            idx = np.fromiter(othello.dirty_words, dtype=np.int64, count=len(othello.dirty_words))
            all_words = np.frombuffer(othello.words, dtype=np.uint64)
            words = WordImages(idx, all_words[idx])
        othello.dirty_words.clear()
        buckets = None
        if self._dirty:
            b = np.fromiter(self._dirty, dtype=np.int64, count=len(self._dirty))
            self._dirty.clear()
            seeds, cells, fps = self._arrays()
            buckets = BucketImages(
                b,
                seeds[b],
                cells.reshape(-1, 4)[b],
                None if fps is None else fps.reshape(-1, 4)[b],
            )
        return TablePatch(g.generation, buckets, words, reset)

    def _arrays(self) -> tuple[NDArray[np.uint8], NDArray[Any], NDArray[Any] | None]:
        """Numpy views of the image's seeds, cells and fingerprints."""
        g, layout = self.geometry, self._layout
        seeds = np.frombuffer(self._buf, np.uint8, g.nb, layout.seeds)
        cells = np.frombuffer(self._buf, self._cell_dtype, g.n_cells, layout.cells)
        fps = None
        if g.fingerprint_bits:
            fp_dtype = np.uint8 if layout.fingerprint_itemsize == 1 else np.uint16
            fps = np.frombuffer(self._buf, fp_dtype, g.n_cells, layout.fingerprints)
        return seeds, cells, fps

    # -- images and snapshots ---------------------------------------------------------

    def _sync_words(self) -> None:
        layout = self._layout
        words = np.frombuffer(self._buf, np.uint64, self.geometry.n_words, layout.words)
        words[:] = np.frombuffer(self._othello.words, dtype=np.uint64)

    def view_image(self) -> bytes:
        """The keyless view of this table, as a sealed image."""
        self._sync_words()
        return seal(self._buf, ImageKind.VIEW, self.geometry, self.count, self._layout.view_end)

    def snapshot(self) -> bytes:
        """Everything needed to restore this table: view image plus full keys."""
        self._sync_words()
        buf = bytearray(self._buf)
        buf.extend(self._keys.tobytes())
        layout = self._layout
        return seal(buf, ImageKind.MAINTENANCE, self.geometry, self.count, layout.maintenance_end)

    def snapshot_parts(self) -> tuple[bytes, bytes]:
        """The sealed view image and the raw key array: the two halves of a snapshot.

        Stored apart, an edge fetches only the view half; a maintenance unit needs both.
        """
        return self.view_image(), self._keys.tobytes()

    @classmethod
    def restore(
        cls,
        data: bytes | bytearray | memoryview,
        *,
        load_limit: float = DEFAULT_LOAD_LIMIT,
        rng: random.Random | None = None,
    ) -> LudoTable:
        """Rebuild a table from :meth:`snapshot` bytes; refuse corrupt or foreign data."""
        header = open_image(data, ImageKind.MAINTENANCE)
        layout = layout_of(header.geometry)
        keys = np.frombuffer(data, np.int64, header.geometry.n_cells, layout.keys)
        view = memoryview(data)[: layout.view_end]
        return cls._restore(header.geometry, header.count, view, keys, load_limit, rng)

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
        g = header.geometry
        if len(keys) != 8 * g.n_cells:
            raise SnapshotError(
                f"key array has {len(keys)} bytes, the view's geometry needs {8 * g.n_cells}"
            )
        key_arr = np.frombuffer(keys, np.int64)
        return cls._restore(g, header.count, memoryview(view_image), key_arr, load_limit, rng)

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
        table._keys = array("q", keys.tobytes())
        table._alt = _alt_array(g, keys)
        table._sig = _sig_array(g, keys)
        table._fill = bytearray(np.bincount(occ >> 2, minlength=g.nb).astype(np.uint8).tobytes())
        table.count = len(occ)
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
        table._othello.words = array("Q", stored.tobytes())
        kid = np.full(g.n_cells, _EMPTY, dtype=np.int32)
        kid[occ] = kids
        table._kid = array("i", kid.tobytes())
        return table


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


def _alt_array(g: TableGeometry, cell_keys: NDArray[np.int64]) -> array[int]:
    """For every cell, the other candidate bucket of the key it holds (-1 if empty)."""
    alt = np.full(g.n_cells, _EMPTY, dtype=np.int32)
    occ = np.flatnonzero(cell_keys >= 0)
    b0, b1 = g.buckets_array(cell_keys[occ].astype(np.uint64))
    here = (occ >> 2).astype(np.uint64)
    alt[occ] = np.where(here == b0, b1, b0).astype(np.int32)
    return array("i", alt.tobytes())


def _sig_array(g: TableGeometry, cell_keys: NDArray[np.int64]) -> array[int]:
    """For every cell, slot-hash word 0 of the key it holds (0 if empty)."""
    sig = np.zeros(g.n_cells, dtype=np.uint64)
    occ = np.flatnonzero(cell_keys >= 0)
    sig[occ] = g.slot_words_array(cell_keys[occ].astype(np.uint64), 0)
    return array("Q", sig.tobytes())
