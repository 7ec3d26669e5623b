"""Binary image of a Ludo table: a fixed header followed by 64-byte-aligned arrays.

A view lives in one flat buffer (a ``bytearray`` here, a shared-memory segment at the
edge), so a snapshot is that buffer's bytes and a restore is a copy plus a check. The
header carries the geometry (so a view refuses a snapshot of another table shape or seed)
and CRC32s of itself and of the payload (so a corrupt snapshot is refused, not served).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from kvcompass.index.errors import SnapshotError
from kvcompass.index.geometry import TableGeometry

__all__ = ["HEADER_SIZE", "ImageArrays", "ImageHeader", "ImageKind", "Layout", "layout_of"]

_MAGIC = b"KVCLUDO\x01"
_FORMAT_VERSION = 1
# magic, version, kind, value_bits, fingerprint_bits, 10 × u64 geometry and count,
# payload length, payload crc32, header crc32 (over everything before it).
_STRUCT = struct.Struct("<8sHHHH11QQII")
HEADER_SIZE = 128
_ALIGN = 64


class ImageKind:
    VIEW = 1
    MAINTENANCE = 2


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True, slots=True)
class Layout:
    """Byte offsets of every array inside an image of a given geometry."""

    seeds: int
    cells: int
    fingerprints: int
    words: int
    keys: int
    view_end: int
    maintenance_end: int
    cell_itemsize: int
    fingerprint_itemsize: int


def layout_of(g: TableGeometry) -> Layout:
    cell_size = g.value_bits // 8
    fp_size = 0 if g.fingerprint_bits == 0 else (1 if g.fingerprint_bits <= 8 else 2)
    seeds = HEADER_SIZE
    cells = _align(seeds + g.nb)
    fps = _align(cells + g.n_cells * cell_size)
    words = _align(fps + g.n_cells * fp_size)
    view_end = _align(words + g.n_words * 8)
    keys = view_end
    return Layout(
        seeds=seeds,
        cells=cells,
        fingerprints=fps,
        words=words,
        keys=keys,
        view_end=view_end,
        maintenance_end=keys + g.n_cells * 8,
        cell_itemsize=cell_size,
        fingerprint_itemsize=fp_size,
    )


class ImageArrays(NamedTuple):
    """Numpy views of an image's arrays, sharing its buffer (writes go to the image)."""

    seeds: NDArray[np.uint8]
    cells: NDArray[Any]  # uint32 or uint64, by value width
    fingerprints: NDArray[Any] | None  # uint8 or uint16; None without fingerprints
    words: NDArray[np.uint64]  # the Othello bits

    @classmethod
    def of(cls, buf: Any, g: TableGeometry, layout: Layout) -> ImageArrays:
        """The arrays of the image of geometry ``g`` held in ``buf`` (any buffer)."""
        cell_dtype = np.uint32 if layout.cell_itemsize == 4 else np.uint64
        fps = None
        if layout.fingerprint_itemsize:
            fp_dtype = np.uint8 if layout.fingerprint_itemsize == 1 else np.uint16
            fps = np.frombuffer(buf, fp_dtype, g.n_cells, layout.fingerprints)
        return cls(
            np.frombuffer(buf, np.uint8, g.nb, layout.seeds),
            np.frombuffer(buf, cell_dtype, g.n_cells, layout.cells),
            fps,
            np.frombuffer(buf, np.uint64, g.n_words, layout.words),
        )


@dataclass(frozen=True, slots=True)
class ImageHeader:
    kind: int
    geometry: TableGeometry
    count: int
    payload_length: int
    payload_crc: int

    def pack(self) -> bytes:
        g = self.geometry
        body = _STRUCT.pack(
            _MAGIC,
            _FORMAT_VERSION,
            self.kind,
            g.value_bits,
            g.fingerprint_bits,
            g.nb,
            g.ma,
            g.mb,
            g.capacity,
            g.generation,
            self.count,
            g.bucket_seed,
            g.othello_seed,
            g.slot_seed,
            g.fingerprint_seed,
            0,  # reserved
            self.payload_length,
            self.payload_crc,
            0,
        )
        head = body[: _STRUCT.size - 4]
        crc = zlib.crc32(head)
        return (head + struct.pack("<I", crc)).ljust(HEADER_SIZE, b"\0")

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> ImageHeader:
        if len(data) < HEADER_SIZE:
            raise SnapshotError(f"image too short for a header: {len(data)} bytes")
        raw = bytes(data[: _STRUCT.size])
        fields = _STRUCT.unpack(raw)
        if fields[0] != _MAGIC:
            raise SnapshotError(f"not a KVCompass Ludo image (magic {fields[0]!r})")
        if fields[1] != _FORMAT_VERSION:
            raise SnapshotError(f"unsupported image format version {fields[1]}")
        if zlib.crc32(raw[:-4]) != fields[-1]:
            raise SnapshotError("image header checksum mismatch (corrupt header)")
        (kind, value_bits, fp_bits) = fields[2:5]
        nb, ma, mb, capacity, generation, count = fields[5:11]
        bucket_seed, othello_seed, slot_seed, fp_seed = fields[11:15]
        try:
            geometry = TableGeometry(
                nb=nb,
                ma=ma,
                mb=mb,
                capacity=capacity,
                value_bits=value_bits,
                fingerprint_bits=fp_bits,
                generation=generation,
                bucket_seed=bucket_seed,
                othello_seed=othello_seed,
                slot_seed=slot_seed,
                fingerprint_seed=fp_seed,
            )
        except ValueError as exc:
            raise SnapshotError(f"image header describes an invalid table: {exc}") from exc
        if kind not in (ImageKind.VIEW, ImageKind.MAINTENANCE):
            raise SnapshotError(f"unknown image kind {kind}")
        return cls(kind, geometry, count, fields[16], fields[17])


def seal(
    buffer: bytearray | memoryview, kind: int, geometry: TableGeometry, count: int, end: int
) -> bytes:
    """Bytes of ``buffer[:end]`` with a fresh header (sizes and payload checksum)."""
    payload = memoryview(buffer)[HEADER_SIZE:end]
    header = ImageHeader(kind, geometry, count, len(payload), zlib.crc32(payload))
    out = bytearray(buffer[:end])
    out[:HEADER_SIZE] = header.pack()
    return bytes(out)


def open_image(data: bytes | bytearray | memoryview, expect_kind: int) -> ImageHeader:
    """Verify an image's header, kind, length and payload checksum; return the header."""
    header = ImageHeader.unpack(data)
    if header.kind != expect_kind:
        want = "view" if expect_kind == ImageKind.VIEW else "maintenance"
        raise SnapshotError(f"image is not a {want} image (kind {header.kind})")
    layout = layout_of(header.geometry)
    end = layout.view_end if header.kind == ImageKind.VIEW else layout.maintenance_end
    if header.payload_length != end - HEADER_SIZE or len(data) != end:
        raise SnapshotError(
            f"image length {len(data)} does not match its geometry (expected {end} bytes)"
        )
    if zlib.crc32(memoryview(data)[HEADER_SIZE:end]) != header.payload_crc:
        raise SnapshotError("image payload checksum mismatch (corrupt or truncated snapshot)")
    return header
