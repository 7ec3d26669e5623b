"""Images and snapshots: corrupt, truncated or foreign data is refused with a clear error."""

from __future__ import annotations

import random
import struct
import zlib

import numpy as np
import pytest

from kvcompass.errors import BadInput
from kvcompass.index import (
    GenerationMismatch,
    LudoTable,
    LudoView,
    OthelloReset,
    SnapshotError,
    TablePatch,
)
from kvcompass.index.image import HEADER_SIZE, layout_of

# Header byte offsets (little-endian struct "<8sHHHH11QQII", padded to HEADER_SIZE).
MAGIC = slice(0, 8)
VALUE_BITS = 12
COUNT = 16 + 5 * 8  # sixth u64: nb, ma, mb, capacity, generation, count
MA = 16 + 8
PAYLOAD_CRC = 112
VIEW_CRC = 16 + 10 * 8  # the eleventh u64: the key image's paired view checksum
HEADER_CRC = 116
HEADER_STRUCT_END = 120


def filled_table(n: int = 300, *, fingerprint_bits: int = 8, seed: int = 1) -> LudoTable:
    rng = random.Random(seed)
    table = LudoTable.with_capacity(
        n, value_bits=32, fingerprint_bits=fingerprint_bits, rng=random.Random(seed)
    )
    table.put_many([rng.getrandbits(63) for _ in range(n)], [1 + rng.getrandbits(31)] * n)
    return table


TABLE = filled_table()
IMAGE = TABLE.view_image()
# The production snapshot format: the view half and the key half, stored apart.
VIEW_HALF, KEY_HALF = TABLE.snapshot_parts()
LAYOUT = layout_of(TABLE.geometry)
#: Byte offset of the key array inside the key half.
KEYS = HEADER_SIZE


def flipped(data: bytes, pos: int, mask: int = 0x01) -> bytes:
    out = bytearray(data)
    out[pos] ^= mask
    return bytes(out)


def reseal(data: bytes | bytearray) -> bytes:
    """Recompute both checksums, so only the content checks can refuse ``data``."""
    out = bytearray(data)
    struct.pack_into("<I", out, PAYLOAD_CRC, zlib.crc32(out[HEADER_SIZE:]))
    struct.pack_into("<I", out, HEADER_CRC, zlib.crc32(out[:HEADER_CRC]))
    return bytes(out)


def reseal_pair(view: bytes | bytearray, keys: bytes | bytearray) -> tuple[bytes, bytes]:
    """Reseal both halves and pair the key half with the resealed view again."""
    view = reseal(view)
    out = bytearray(keys)
    struct.pack_into("<Q", out, VIEW_CRC, zlib.crc32(view[HEADER_SIZE:]))
    return view, reseal(out)


def restore_keys(keys: bytes) -> LudoTable:
    return LudoTable.from_parts(VIEW_HALF, keys)


def restore_view(view: bytes) -> LudoTable:
    return LudoTable.from_parts(view, KEY_HALF)


def test_valid_images_round_trip() -> None:
    view = LudoView(IMAGE)
    assert view.image(TABLE.count) == IMAGE
    assert LudoView(view.image()).image() == view.image()
    assert LudoTable.from_parts(VIEW_HALF, KEY_HALF).snapshot_parts() == (VIEW_HALF, KEY_HALF)
    assert reseal(IMAGE) == IMAGE
    assert reseal_pair(VIEW_HALF, KEY_HALF) == (VIEW_HALF, KEY_HALF)
    assert issubclass(SnapshotError, ValueError)
    assert issubclass(SnapshotError, BadInput)


def payload_positions(end: int) -> list[int]:
    """Bytes in every array of the image, plus its first and last payload byte."""
    picks = {
        HEADER_SIZE,
        end - 1,
        LAYOUT.seeds + 3,
        LAYOUT.cells + 17,
        LAYOUT.fingerprints + 5,
        LAYOUT.words + 1,
        LAYOUT.view_end - 1,
    }
    rng = random.Random(3)
    picks.update(rng.randrange(HEADER_SIZE, end) for _ in range(20))
    return sorted(p for p in picks if p < end)


@pytest.mark.parametrize("pos", payload_positions(LAYOUT.view_end))
def test_flipped_payload_byte_refused_by_view(pos: int) -> None:
    with pytest.raises(SnapshotError, match="payload checksum mismatch"):
        LudoView(flipped(IMAGE, pos))


@pytest.mark.parametrize("pos", payload_positions(LAYOUT.view_end))
def test_flipped_payload_byte_refused_by_restore(pos: int) -> None:
    with pytest.raises(SnapshotError, match="payload checksum mismatch"):
        restore_view(flipped(VIEW_HALF, pos, 0x80))


@pytest.mark.parametrize("pos", payload_positions(LAYOUT.keys_end))
def test_flipped_key_byte_refused_by_restore(pos: int) -> None:
    with pytest.raises(SnapshotError, match="payload checksum mismatch"):
        restore_keys(flipped(KEY_HALF, pos))
    with pytest.raises(SnapshotError, match="payload checksum mismatch"):
        restore_keys(flipped(KEY_HALF, KEYS + 8 * 7 + 2))


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_flipped_byte_of_both_halves_refused(mask: int) -> None:
    """The format production restores from: no single flipped byte is ever accepted.

    (Before the key half carried its own checksum, about 1 flip in (number of buckets)
    in its keys was accepted and restored a different key.)
    """
    accepted = []
    for pos in range(len(VIEW_HALF)):
        try:
            restore_view(flipped(VIEW_HALF, pos, mask))
            accepted.append(("view", pos))
        except SnapshotError:
            pass
    for pos in range(len(KEY_HALF)):
        try:
            restore_keys(flipped(KEY_HALF, pos, mask))
            accepted.append(("keys", pos))
        except SnapshotError:
            pass
    assert accepted == []


HEADER_ERRORS = (
    r"not a KVCompass Ludo image|unsupported image format version|header checksum"
    r"|header padding is not zero"
)


@pytest.mark.parametrize("mask", [0x01, 0x80])
def test_every_flipped_header_byte_refused(mask: int) -> None:
    """Every header byte, its zero padding included."""
    for pos in range(HEADER_SIZE):
        for data, opener in (
            (IMAGE, LudoView),
            (VIEW_HALF, restore_view),
            (KEY_HALF, restore_keys),
        ):
            with pytest.raises(SnapshotError, match=HEADER_ERRORS):
                opener(flipped(data, pos, mask))


def test_header_padding_outside_the_crc_is_checked() -> None:
    for data, opener in ((IMAGE, LudoView), (KEY_HALF, restore_keys)):
        with pytest.raises(SnapshotError, match="header padding is not zero"):
            opener(flipped(data, HEADER_STRUCT_END))
        with pytest.raises(SnapshotError, match="header padding is not zero"):
            opener(flipped(data, HEADER_SIZE - 1, 0x80))


@pytest.mark.parametrize("cut", [0, 1, 10, HEADER_SIZE - 1, HEADER_SIZE, 1000, -64, -1])
def test_truncated_image_refused(cut: int) -> None:
    for data, opener in ((IMAGE, LudoView), (VIEW_HALF, restore_view), (KEY_HALF, restore_keys)):
        short = data[:cut]
        with pytest.raises(SnapshotError, match=r"too short|does not match its geometry"):
            opener(short)


@pytest.mark.parametrize("extra", [b"\0", b"\0" * 64, b"junk"])
def test_extra_bytes_refused(extra: bytes) -> None:
    with pytest.raises(SnapshotError, match=r"image length \d+ does not match its geometry"):
        LudoView(IMAGE + extra)
    with pytest.raises(SnapshotError, match="does not match its geometry"):
        restore_view(VIEW_HALF + extra)
    with pytest.raises(SnapshotError, match="does not match its geometry"):
        restore_keys(KEY_HALF + extra)


def test_wrong_magic_refused() -> None:
    for magic in (b"KVCLUDO\x02", b"\0" * 8, b"PK\x03\x04abcd"):
        data = magic + IMAGE[8:]
        with pytest.raises(SnapshotError, match="not a KVCompass Ludo image"):
            LudoView(data)
        with pytest.raises(SnapshotError, match="not a KVCompass Ludo image"):
            restore_keys(magic + KEY_HALF[8:])
    with pytest.raises(SnapshotError, match="not a KVCompass Ludo image"):
        LudoView(b"x" * len(IMAGE))


def test_wrong_format_version_refused() -> None:
    data = bytearray(IMAGE)
    struct.pack_into("<H", data, 8, 2)
    with pytest.raises(SnapshotError, match="unsupported image format version 2"):
        LudoView(reseal(data))


def test_key_image_is_not_a_view_image() -> None:
    with pytest.raises(SnapshotError, match="not a view image"):
        LudoView(KEY_HALF)
    with pytest.raises(SnapshotError, match="not a view image"):
        LudoView(KEY_HALF[: len(IMAGE)])
    with pytest.raises(SnapshotError, match="not a view image"):
        LudoTable.from_parts(KEY_HALF, KEY_HALF)


def test_view_image_is_not_a_key_image() -> None:
    with pytest.raises(SnapshotError, match="not a key image"):
        restore_keys(IMAGE)
    with pytest.raises(SnapshotError, match="not a key image"):
        restore_keys(LudoView(IMAGE).image())


@pytest.mark.parametrize("kind", [2, 4])  # 2: the retired view-and-keys image
def test_unknown_kind_refused(kind: int) -> None:
    data = bytearray(IMAGE)
    struct.pack_into("<H", data, 10, kind)
    with pytest.raises(SnapshotError, match=f"unknown image kind {kind}"):
        LudoView(reseal(data))


@pytest.mark.parametrize(
    ("offset", "fmt", "value"),
    [
        (VALUE_BITS, "<H", 16),  # no such value width
        (VALUE_BITS + 2, "<H", 17),  # fingerprint bits out of range
        (16, "<Q", 0),  # no buckets
        (MA, "<Q", 2**31),  # a locator too large to address
    ],
)
def test_header_describing_an_invalid_table_refused(offset: int, fmt: str, value: int) -> None:
    data = bytearray(IMAGE)
    struct.pack_into(fmt, data, offset, value)
    with pytest.raises(SnapshotError, match="image header describes an invalid table"):
        LudoView(reseal(data))


def test_header_of_another_shape_refused() -> None:
    # A valid header for a table with twice the buckets: the length no longer matches.
    data = bytearray(IMAGE)
    struct.pack_into("<Q", data, 16, 2 * TABLE.geometry.nb)
    with pytest.raises(SnapshotError, match="does not match its geometry"):
        LudoView(reseal(data))


def test_restore_refuses_a_wrong_key_count() -> None:
    view, keys = bytearray(VIEW_HALF), bytearray(KEY_HALF)
    struct.pack_into("<Q", view, COUNT, TABLE.count + 1)
    struct.pack_into("<Q", keys, COUNT, TABLE.count + 1)
    with pytest.raises(SnapshotError, match=f"holds {TABLE.count} keys but its header says"):
        LudoTable.from_parts(*reseal_pair(view, keys))
    # Only the key half's count changed: it no longer describes its view.
    with pytest.raises(SnapshotError, match="describes another table than its view"):
        restore_keys(reseal(keys))


def key_array() -> np.ndarray:
    return np.frombuffer(KEY_HALF, np.int64, TABLE.geometry.n_cells, KEYS).copy()


def with_keys(keys: np.ndarray) -> bytes:
    data = bytearray(KEY_HALF)
    data[KEYS : LAYOUT.keys_end] = keys.tobytes()
    return reseal(data)


def test_restore_refuses_a_key_outside_its_buckets() -> None:
    keys = key_array()
    occupied = np.flatnonzero(keys >= 0)
    g = TABLE.geometry
    # Move one key into a cell of a bucket that is neither of its candidates.
    key = int(keys[occupied[0]])
    candidates = set(g.buckets(key))
    target = next(p for p in np.flatnonzero(keys < 0).tolist() if p // 4 not in candidates)
    keys[target], keys[occupied[0]] = keys[occupied[0]], -1
    with pytest.raises(SnapshotError, match="outside its candidate buckets"):
        restore_keys(with_keys(keys))


def test_restore_refuses_keys_the_view_does_not_hold() -> None:
    keys = key_array()
    occupied = np.flatnonzero(keys >= 0)
    changed = keys.copy()
    changed[occupied[0]] ^= 1 << 40  # another key in the same cell
    with pytest.raises(SnapshotError, match=r"outside its candidate buckets|do not match"):
        restore_keys(with_keys(changed))
    twice = keys.copy()
    twice[occupied[1]] = keys[occupied[0]]
    with pytest.raises(SnapshotError, match="holds a key twice"):
        restore_keys(with_keys(twice))
    negative = keys.copy()
    negative[np.flatnonzero(keys < 0)[0]] = -2
    with pytest.raises(SnapshotError, match="negative key"):
        restore_keys(with_keys(negative))


def test_restore_refuses_locator_bits_that_misclassify() -> None:
    g = TABLE.geometry
    keys, _ = TABLE.items()
    node, _ = g.nodes(int(keys[0]))
    view = bytearray(VIEW_HALF)
    view[LAYOUT.words + node // 8] ^= 1 << (node % 8)
    with pytest.raises(SnapshotError, match="locator bits do not match"):
        LudoTable.from_parts(*reseal_pair(view, KEY_HALF))


# -- generations ------------------------------------------------------------------------


def grow_once(table: LudoTable, rng: random.Random) -> list[TablePatch]:
    """Insert keys one by one until the table moves to its next generation."""
    patches = []
    generation = table.geometry.generation
    while table.geometry.generation == generation:
        patches.append(table.put(rng.getrandbits(63), 1 + rng.getrandbits(31)))
    return patches


def test_old_generation_patch_after_reload_raises() -> None:
    rng = random.Random(11)
    table = LudoTable.with_capacity(16, fingerprint_bits=8, rng=random.Random(11))
    view = LudoView.empty(table.geometry)
    old = grow_once(table, rng)
    for patch in old:
        view.apply(patch)
    reload = old[-1]
    assert reload.reload is not None
    assert view.generation == 1 == table.geometry.generation
    stale = next(p for p in old if p.reload is None and p.buckets is not None)
    assert stale.generation == 0
    image = view.image()
    with pytest.raises(GenerationMismatch, match="patch for generation 0, view holds 1"):
        view.apply(stale)
    assert view.image() == image
    # An older reload is refused too; the same reload again is harmless.
    newer = grow_once(table, rng)
    for patch in newer:
        view.apply(patch)
    assert view.generation == 2
    with pytest.raises(GenerationMismatch, match="reload of generation 1 is older"):
        view.apply(reload)
    view.apply(newer[-1])
    assert view.image() == LudoView(table.view_image()).image()


def test_view_that_missed_a_reload_refuses_newer_patches() -> None:
    rng = random.Random(12)
    table = LudoTable.with_capacity(16, rng=random.Random(12))
    view = LudoView(table.view_image())
    grow_once(table, rng)  # the view never sees these
    patch = table.put(rng.getrandbits(63), 5)
    assert patch.generation == 1
    with pytest.raises(GenerationMismatch, match="reload from a snapshot"):
        view.apply(patch)
    assert view.generation == 0


def test_othello_reset_of_the_wrong_size_refused() -> None:
    view = LudoView(IMAGE)
    g = TABLE.geometry
    bad = TablePatch(g.generation, othello_reset=OthelloReset(1, bytes(8 * (g.n_words + 1))))
    with pytest.raises(SnapshotError, match="wrong number of words"):
        view.apply(bad)


def test_corrupt_reload_patch_refused() -> None:
    view = LudoView(IMAGE)
    patch = TablePatch(TABLE.geometry.generation + 1, reload=flipped(IMAGE, HEADER_SIZE + 1))
    with pytest.raises(SnapshotError, match="payload checksum"):
        view.apply(patch)
    assert view.image(TABLE.count) == IMAGE


# -- empty tables -----------------------------------------------------------------------


@pytest.mark.parametrize(("value_bits", "fingerprint_bits"), [(32, 0), (64, 8), (32, 16)])
def test_empty_table_view_answers_zero(value_bits: int, fingerprint_bits: int) -> None:
    rng = random.Random(value_bits + fingerprint_bits)
    table = LudoTable.with_capacity(
        100, value_bits=value_bits, fingerprint_bits=fingerprint_bits, rng=rng
    )
    keys = [0, 1, 2**63 - 1] + [rng.getrandbits(63) for _ in range(500)]
    arr = np.array(keys, dtype=np.uint64)
    for view in (LudoView.empty(table.geometry), LudoView(table.view_image())):
        assert view.generation == 0
        assert all(view.lookup(k) == 0 for k in keys)
        assert not view.lookup_batch(arr).any()
        assert view.lookup_batch(np.zeros(0, dtype=np.uint64)).shape == (0,)
    assert LudoView.empty(table.geometry).image() == LudoView(table.view_image()).image()
    # Emptied again after inserts and removals: every cell is zero once more.
    view = LudoView(table.view_image())
    view.apply(table.put_many(keys, [7] * len(keys)))
    assert (view.lookup_batch(arr) == 7).all()
    view.apply(table.put_many(keys, [0] * len(keys)))
    assert len(table) == 0
    assert not view.lookup_batch(arr).any()
    assert all(view.lookup(k) == 0 for k in keys[:50])


def test_view_nbytes_counts_lookup_state() -> None:
    g = TABLE.geometry
    view = LudoView(IMAGE)
    assert view.nbytes == g.nb + g.n_cells * (4 + 1) + (g.n_nodes + 7) // 8
    assert view.nbytes < len(IMAGE)


# -- snapshot halves ------------------------------------------------------------------


def test_snapshot_parts_round_trip() -> None:
    view_half, key_half = TABLE.snapshot_parts()
    assert view_half == IMAGE
    assert LudoTable.from_parts(view_half, key_half).snapshot_parts() == (view_half, key_half)


def test_snapshot_parts_refuse_mismatched_halves() -> None:
    view_half, key_half = TABLE.snapshot_parts()
    with pytest.raises(SnapshotError, match="does not match its geometry"):
        LudoTable.from_parts(view_half, key_half[:-8])
    with pytest.raises(SnapshotError, match="not a view image"):
        LudoTable.from_parts(key_half, key_half)
    with pytest.raises(SnapshotError, match="payload checksum"):
        LudoTable.from_parts(flipped(view_half, LAYOUT.cells), key_half)
    # Keys of another table with the same geometry sizes: refused, not trusted.
    other = filled_table(seed=2)
    assert other.geometry.nb == TABLE.geometry.nb
    with pytest.raises(SnapshotError, match="belongs to another view"):
        LudoTable.from_parts(view_half, other.snapshot_parts()[1])


def test_halves_of_two_snapshots_of_one_table_refused() -> None:
    """Same table, same generation, one write apart: the key half names its view."""
    table = filled_table(seed=4)
    old_view, old_keys = table.snapshot_parts()
    table.put(12345, 9)
    new_view, new_keys = table.snapshot_parts()
    assert LudoTable.from_parts(new_view, new_keys).get(12345) == 9
    for view, keys in ((old_view, new_keys), (new_view, old_keys)):
        with pytest.raises(SnapshotError, match="belongs to another view"):
            LudoTable.from_parts(view, keys)
