"""The keyless Ludo lookup view: numpy arrays over one flat buffer, built from patches.

A lookup is an Othello bit (two cells) choosing one of the key's two buckets, the
bucket's seed choosing one of its four cells, and that cell's value. No key is stored
or compared: a key that was never inserted gets some cell's value (a false hit) unless
the table carries fingerprint bits, which then turn most such answers into 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcompass.hashing import GOLDEN64, MASK32, MASK64, mix64, mix64_array
from kvcompass.index import probe
from kvcompass.index.errors import GenerationMismatch, SnapshotError
from kvcompass.index.geometry import TableGeometry
from kvcompass.index.image import (
    HEADER_SIZE,
    ImageArrays,
    ImageHeader,
    ImageKind,
    layout_of,
    open_image,
    payload_of,
    seal,
)
from kvcompass.index.patch_copy import apply_images
from kvcompass.index.patches import TablePatch

__all__ = ["LudoView"]

_CHUNK = 1 << 15  # keys per vectorised pass: arrays stay in L2, temporaries are reused
_U32 = np.uint64(32)
_U6 = np.uint64(6)
_U63 = np.uint64(63)
_U1 = np.uint64(1)
_UMASK32 = np.uint64(MASK32)


class LudoView:
    """A replica of one table's view state; mutate it only through :meth:`apply`."""

    #: Bindings made by every view of this process so far: a holder of descriptors that
    #: saw the same count knows none of them was rebound, without looking at each.
    bindings = 0

    def __init__(self, image: bytes | bytearray | memoryview) -> None:
        """Load a sealed view image (a snapshot or a reload patch), verifying it."""
        header = open_image(image, ImageKind.VIEW)
        self._buf: bytearray | memoryview = bytearray(image)
        self._bind(header.geometry)
        self.count_hint = header.count

    @classmethod
    def attach(cls, buffer: memoryview | bytearray) -> LudoView:
        """Wrap a writable buffer that already holds a view image, without copying.

        Used for shared memory: the header is checked (magic, sizes, its own checksum)
        but not the payload, which the writer keeps changing.
        """
        header = ImageHeader.unpack(buffer)
        if header.kind != ImageKind.VIEW:
            raise SnapshotError(f"buffer does not hold a view image (kind {header.kind})")
        if len(buffer) < layout_of(header.geometry).view_end:
            raise SnapshotError("buffer is shorter than its view image")
        view = cls.__new__(cls)
        view._buf = buffer
        view._bind(header.geometry)
        view.count_hint = header.count
        return view

    @classmethod
    def empty(cls, geometry: TableGeometry) -> LudoView:
        """A view of an empty table of the given geometry."""
        layout = layout_of(geometry)
        return cls(seal(bytearray(layout.view_end), ImageKind.VIEW, geometry, 0, layout.view_end))

    def _bind(self, g: TableGeometry) -> None:
        self.geometry = g
        layout = layout_of(g)
        buf = self._buf
        self._seeds, self._cells, self._fps, self._words = ImageArrays.of(buf, g, layout)
        # Per-bucket rows of the cells and fingerprints, for patches.
        self._cell_rows = self._cells.reshape(-1, 4)
        self._fp_rows = None if self._fps is None else self._fps.reshape(-1, 4)
        self._layout = layout
        # Scalar path: memoryviews index into Python ints several times faster than numpy.
        mv = memoryview(buf)
        self._mv_seeds = mv[layout.seeds : layout.seeds + g.nb]
        size = layout.cell_itemsize
        self._mv_cells = mv[layout.cells : layout.cells + g.n_cells * size].cast(
            "I" if size == 4 else "Q"
        )
        self._mv_words = mv[layout.words : layout.words + 8 * g.n_words].cast("Q")
        self._mv_fps = None
        if self._fps is not None:
            fsize = layout.fingerprint_itemsize
            self._mv_fps = mv[layout.fingerprints : layout.fingerprints + g.n_cells * fsize].cast(
                "B" if fsize == 1 else "H"
            )
        # This binding's row for the compiled match (kvcompass.index.probe); a new array
        # per binding, so a holder of the row tells a new buffer or new seeds by identity.
        self.descriptor = np.zeros(probe.N_COLUMNS, np.uint64)
        LudoView.bindings += 1
        base = np.frombuffer(buf, np.uint8, 1).ctypes.data
        probe.describe(self.descriptor, base, g, layout)
        # Where patch images land (kvcompass.index.patch_copy); None: a read-only buffer,
        # which only numpy's scatter may refuse to write.
        self._patch_target = (
            (
                base + layout.seeds,
                base + layout.cells,
                base + layout.words,
                base + layout.fingerprints if layout.fingerprint_itemsize else 0,
                layout.cell_itemsize,
                layout.fingerprint_itemsize,
                g.nb,
                g.n_words,
            )
            if self._cells.flags.writeable
            else None
        )
        self._scalar = (
            g.bucket_seed,
            g.othello_seed,
            g.slot_seed,
            g.nb,
            g.ma,
            g.mb,
            g.fingerprint_seed,
            64 - g.fingerprint_bits,
        )

    # -- facts ---------------------------------------------------------------------

    @property
    def generation(self) -> int:
        return self.geometry.generation

    @property
    def nbytes(self) -> int:
        """Bytes of lookup state: seeds, cells, fingerprints and Othello bits."""
        g = self.geometry
        layout = self._layout
        return (
            g.nb
            + g.n_cells * (layout.cell_itemsize + layout.fingerprint_itemsize)
            + ((g.n_nodes + 7) // 8)
        )

    def image(self, count: int = 0) -> bytes:
        """This view as a sealed image (a snapshot an edge can bootstrap from)."""
        return seal(self._buf, ImageKind.VIEW, self.geometry, count, self._layout.view_end)

    def release(self) -> None:
        """Drop every array and memoryview over the buffer, so shared memory under it
        can be closed. The view is unusable afterwards."""
        for mv in (self._mv_seeds, self._mv_cells, self._mv_words, self._mv_fps):
            if mv is not None:
                mv.release()
        del self._seeds, self._cells, self._fps, self._words, self.descriptor
        del self._cell_rows, self._fp_rows, self._patch_target  # no write by address either
        if isinstance(self._buf, memoryview):
            self._buf.release()

    def raw_image(self) -> bytes:
        """The buffer's bytes as they are (header not refreshed, no checksum)."""
        return bytes(self._buf[: self._layout.view_end])

    def payload(self) -> NDArray[np.uint8]:
        """The image's payload (past its header) as it stands, read-only and not copied:
        to compare with a table's (:meth:`LudoTable.view_payload`)."""
        return payload_of(self._buf, self._layout.view_end)

    # -- patches -------------------------------------------------------------------

    def apply(self, patch: TablePatch) -> None:
        """Apply one patch; applying it again changes nothing."""
        if patch.reload is not None:
            header = open_image(patch.reload, ImageKind.VIEW)
            if header.geometry.generation < self.geometry.generation:
                raise GenerationMismatch(
                    f"reload of generation {header.geometry.generation} is older than "
                    f"the view's {self.geometry.generation}"
                )
            self._buf = bytearray(patch.reload)
            self._bind(header.geometry)
            return
        if patch.generation != self.geometry.generation:
            raise GenerationMismatch(
                f"patch for generation {patch.generation}, view holds "
                f"{self.geometry.generation}: reload from a snapshot"
            )
        if patch.othello_reset is not None:
            reset = patch.othello_reset
            if len(reset.words) != 8 * self.geometry.n_words:
                raise SnapshotError("Othello reset has the wrong number of words")
            self._words[:] = np.frombuffer(reset.words, dtype=np.uint64)
            g = self.geometry.with_othello_seed(reset.othello_seed)
            self._buf[:HEADER_SIZE] = ImageHeader(ImageKind.VIEW, g, 0, 0, 0).pack()
            self._bind(g)
        # The compiled copy takes empty images as they are (it writes nothing for them).
        if self._patch_target is not None and apply_images(
            self._patch_target, patch.buckets, patch.words
        ):
            return
        words = patch.words if len(patch.words) else None
        images = patch.buckets if patch.buckets is not None and len(patch.buckets) else None
        if words is not None:
            self._words[words.indices] = words.values
        if images is not None:
            b = images.buckets
            self._seeds[b] = images.seeds
            self._cell_rows[b] = images.cells
            if self._fp_rows is not None and images.fingerprints is not None:
                self._fp_rows[b] = images.fingerprints

    # -- lookups -------------------------------------------------------------------

    def lookup(self, key: int) -> int:
        """The value stored for ``key`` (0: no holder, or a fingerprint mismatch)."""
        bseed, oseed, sseed, nb, ma, mb, fseed, fshift = self._scalar
        hb = mix64(key ^ bseed)
        x = mix64(key ^ oseed)
        ia = ((x & MASK32) * ma) >> 32
        ib = ma + (((x >> 32) * mb) >> 32)
        words = self._mv_words
        if ((words[ia >> 6] >> (ia & 63)) ^ (words[ib >> 6] >> (ib & 63))) & 1:
            b = ((hb >> 32) * nb) >> 32
        else:
            b = ((hb & MASK32) * nb) >> 32
        seed = self._mv_seeds[b]
        x = mix64(key ^ sseed ^ (((seed >> 5) * GOLDEN64) & MASK64))
        pos = (b << 2) | ((x >> ((seed & 31) << 1)) & 3)
        value: int = self._mv_cells[pos]
        fps = self._mv_fps
        if fps is not None and value and fps[pos] != mix64(key ^ fseed) >> fshift:
            return 0
        return value

    def lookup_batch(self, keys: NDArray[np.uint64]) -> NDArray[Any]:
        """Values for many keys at once (vectorised, processed in cache-sized chunks)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        out = np.empty(len(keys), dtype=self._cells.dtype)
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start : start + _CHUNK]
            out[start : start + len(chunk)] = self._lookup_chunk(chunk)
        return out

    def _lookup_chunk(self, keys: NDArray[np.uint64]) -> NDArray[Any]:
        g = self.geometry
        tmp = np.empty_like(keys)
        hb = keys ^ np.uint64(g.bucket_seed)
        mix64_array(hb, out=hb, scratch=tmp)
        x = keys ^ np.uint64(g.othello_seed)
        mix64_array(x, out=x, scratch=tmp)
        # Othello cells: ia from the low half, ib from the high half.
        ia = x & _UMASK32
        ia *= np.uint64(g.ma)
        ia >>= _U32
        ib = x >> _U32
        ib *= np.uint64(g.mb)
        ib >>= _U32
        ib += np.uint64(g.ma)
        words = self._words
        bit = words[ia >> _U6] >> (ia & _U63)
        bit ^= words[ib >> _U6] >> (ib & _U63)
        bit &= _U1
        # Bucket: low half of hb (choice 0) or high half (choice 1), reduced to nb.
        b = np.where(bit.astype(bool), hb >> _U32, hb & _UMASK32)
        b *= np.uint64(g.nb)
        b >>= _U32
        seeds = self._seeds[b].astype(np.uint64)
        x = keys ^ np.uint64(g.slot_seed)
        x ^= (seeds >> np.uint64(5)) * np.uint64(GOLDEN64)
        mix64_array(x, out=x, scratch=tmp)
        x >>= (seeds & np.uint64(31)) << _U1
        x &= np.uint64(3)
        b <<= np.uint64(2)
        b |= x
        values = self._cells[b]
        if self._fps is not None:
            fp = g.fingerprints_array(keys)
            values[self._fps[b] != fp] = 0
        return values
