"""Binary images of a Ludo table: a fixed header followed by 64-byte-aligned arrays.

A view lives in one flat buffer (a ``bytearray`` here, a shared-memory segment at the
edge), so a snapshot is that buffer's bytes and a restore is a copy plus a check. The
header carries the geometry (so a view refuses a snapshot of another table shape or seed)
and CRC32s of itself and of the payload (so a corrupt snapshot is refused, not served).

A snapshot's key half is a second image (kind KEYS): the same header, naming the view
image it belongs to by that image's payload CRC, then the full key of every cell. Every
byte of both is checked: the header CRC covers the header fields, its padding must be
zero, and the payload CRC covers the arrays (CRC32 catches every error burst up to 32
bits, so every single flipped byte).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from isal.isal_zlib import crc32  # zlib's CRC-32, SIMD (pyproject: isal)
from numpy.typing import NDArray

from kvcompass.index.errors import SnapshotError
from kvcompass.index.geometry import TableGeometry

__all__ = [
    "HEADER_SIZE",
    "ImageArrays",
    "ImageHeader",
    "ImageKind",
    "ImageLayout",
    "layout_of",
    "open_image",
    "open_key_image",
    "payload_of",
    "seal",
    "seal_keys",
]

_MAGIC = b"KVCLUDO\x01"
_FORMAT_VERSION = 1
# magic, version, kind, value_bits, fingerprint_bits, 10 × u64 geometry and count, the
# paired view's payload crc32 (key images; 0 in views), payload length, payload crc32,
# header crc32 (over everything before it); zero padding up to HEADER_SIZE.
_STRUCT = struct.Struct("<8sHHHH11QQII")
HEADER_SIZE = 128
_ALIGN = 64


class ImageKind:
    VIEW = 1
    # 2 was a view and keys in one image, a format nothing reads any more.
    KEYS = 3


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True, slots=True)
class ImageLayout:
    """Byte offsets of every array inside a view image of a given geometry."""

    seeds: int
    cells: int
    fingerprints: int
    words: int
    view_end: int
    #: Length of the key image (header and one int64 key per cell).
    keys_end: int
    cell_itemsize: int
    fingerprint_itemsize: int


def layout_of(g: TableGeometry) -> ImageLayout:
    cell_size = g.value_bits // 8
    fp_size = 0 if g.fingerprint_bits == 0 else (1 if g.fingerprint_bits <= 8 else 2)
    seeds = HEADER_SIZE
    cells = _align(seeds + g.nb)
    fps = _align(cells + g.n_cells * cell_size)
    words = _align(fps + g.n_cells * fp_size)
    view_end = _align(words + g.n_words * 8)
    return ImageLayout(
        seeds=seeds,
        cells=cells,
        fingerprints=fps,
        words=words,
        view_end=view_end,
        keys_end=HEADER_SIZE + g.n_cells * 8,
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
    def of(cls, buf: Any, g: TableGeometry, layout: ImageLayout) -> ImageArrays:
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
    #: Key images: the payload CRC of the view image they pair with (0 in views).
    view_crc: int = 0

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
            self.view_crc,
            self.payload_length,
            self.payload_crc,
            0,
        )
        head = body[: _STRUCT.size - 4]
        crc = crc32(head)
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
        if crc32(raw[:-4]) != fields[-1]:
            raise SnapshotError("image header checksum mismatch (corrupt header)")
        if any(data[_STRUCT.size : HEADER_SIZE]):
            raise SnapshotError("image header padding is not zero (corrupt header)")
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
        if kind not in (ImageKind.VIEW, ImageKind.KEYS):
            raise SnapshotError(f"unknown image kind {kind}")
        return cls(kind, geometry, count, fields[16], fields[17], fields[15])


def payload_of(buffer: bytearray | memoryview, end: int) -> NDArray[np.uint8]:
    """``buffer[HEADER_SIZE:end]``, an image's payload as it stands: read-only, not
    copied (to compare two images without sealing either)."""
    payload = np.frombuffer(buffer, np.uint8, end - HEADER_SIZE, HEADER_SIZE)
    payload.flags.writeable = False
    return payload


def seal(
    buffer: bytearray | memoryview, kind: int, geometry: TableGeometry, count: int, end: int
) -> bytes:
    """Bytes of ``buffer[:end]`` with a fresh header (sizes and payload checksum)."""
    payload = memoryview(buffer)[HEADER_SIZE:end]
    header = ImageHeader(kind, geometry, count, len(payload), crc32(payload))
    return b"".join((header.pack(), payload))  # one copy of the payload (snapshots: MBs)


def seal_keys(view: ImageHeader, keys: NDArray[np.int64]) -> bytes:
    """The key image of the view with header ``view``: one int64 key per cell (-1: empty)."""
    payload = np.ascontiguousarray(keys).data.cast("B")
    header = ImageHeader(
        ImageKind.KEYS,
        view.geometry,
        view.count,
        len(payload),
        crc32(payload),
        view.payload_crc,
    )
    return b"".join((header.pack(), payload))


def open_image(data: bytes | bytearray | memoryview, expect_kind: int) -> ImageHeader:
    """Verify an image's header, kind, length and payload checksum; return the header."""
    header = ImageHeader.unpack(data)
    if header.kind != expect_kind:
        want = "view" if expect_kind == ImageKind.VIEW else "key"
        raise SnapshotError(f"image is not a {want} image (kind {header.kind})")
    layout = layout_of(header.geometry)
    end = layout.view_end if header.kind == ImageKind.VIEW else layout.keys_end
    if header.payload_length != end - HEADER_SIZE or len(data) != end:
        raise SnapshotError(
            f"image length {len(data)} does not match its geometry (expected {end} bytes)"
        )
    if crc32(memoryview(data)[HEADER_SIZE:end]) != header.payload_crc:
        raise SnapshotError("image payload checksum mismatch (corrupt or truncated snapshot)")
    if header.kind == ImageKind.VIEW and header.view_crc != 0:
        raise SnapshotError("view image names a paired view (only key images do)")
    return header


def open_key_image(data: bytes | bytearray | memoryview, view: ImageHeader) -> NDArray[np.int64]:
    """Verify the key image paired with the view of header ``view``; return its keys."""
    header = open_image(data, ImageKind.KEYS)
    if header.view_crc != view.payload_crc:
        raise SnapshotError(
            f"key image belongs to another view (view checksum {header.view_crc:#010x}, "
            f"this view's is {view.payload_crc:#010x})"
        )
    if header.geometry != view.geometry or header.count != view.count:
        raise SnapshotError("key image describes another table than its view")
    return np.frombuffer(data, np.int64, view.geometry.n_cells, HEADER_SIZE)
