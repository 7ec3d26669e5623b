"""Arrays made over bytes or a bytearray through numpy's C API are the arrays
np.frombuffer makes (dtype, shape, flags, values, the owner as base, held once), and
what frombuffer would refuse is refused."""

from __future__ import annotations

import sys
from typing import Any, cast

import numpy as np
import pytest

from kvcompass.event_buffers import ShardEventBuffers
from kvcompass.ndarrays import array_at, buffer_fields


def flags(array: np.ndarray[Any, Any]) -> tuple[bool, ...]:
    f = array.flags
    return (f.c_contiguous, f.f_contiguous, f.aligned, f.writeable, f.owndata)


@pytest.mark.parametrize("owner_type", [bytes, bytearray])
@pytest.mark.parametrize(
    ("dtype", "offset", "rows", "width"),
    [
        (np.dtype("<u8"), 0, 5, 0),
        (np.dtype("<u4"), 8, 3, 4),
        (np.dtype("u1"), 3, 7, 0),
        (np.dtype(np.int64), 16, 0, 0),
        (np.dtype("<u2"), 2, 4, 4),
    ],
)
def test_an_array_over_memory_is_the_array_frombuffer_makes(
    owner_type: type, dtype: np.dtype[Any], offset: int, rows: int, width: int
) -> None:
    owner = owner_type(bytes(range(256)) * 2)
    made = array_at(owner, offset, dtype, rows, width)
    count = rows * max(width, 1)
    want = np.frombuffer(owner, dtype, count=count, offset=offset)
    want = want.reshape(rows, width) if width else want
    assert (made.dtype, made.shape, made.tolist()) == (want.dtype, want.shape, want.tolist())
    assert flags(made) == flags(want)
    assert made.base is owner
    assert made.flags.writeable == (owner_type is bytearray)


def test_the_array_holds_its_owner_once() -> None:
    owner = bytes(64)
    before = sys.getrefcount(owner)
    arrays = [array_at(owner, 0, np.dtype("<u8"), 8) for _ in range(10)]
    assert sys.getrefcount(owner) == before + 10
    del arrays
    assert sys.getrefcount(owner) == before


def test_memory_past_the_owner_and_other_owners_are_refused() -> None:
    for owner, offset, rows, width, message in [
        (bytes(64), 0, 9, 0, "past the owner's end"),
        (bytes(64), 8, 8, 0, "past the owner's end"),
        (bytes(64), 0, 2, 5, "past the owner's end"),
        (bytes(64), 0, -1, 0, "no array"),
        (bytes(64), -8, 1, 0, "offset"),
        (memoryview(bytes(64)), 0, 1, 0, "not memoryview"),
    ]:
        with pytest.raises(ValueError, match=message):
            array_at(owner, offset, np.dtype("<u8"), rows, width)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        array_at(bytes(64), 0, np.uint64, 1)  # type: ignore[arg-type]  # a type, not a dtype


def test_a_publishers_columns_are_read_only_arrays_over_their_own_bytes() -> None:
    buffers = ShardEventBuffers(1, 16)
    buffers.add(1, 1, [16, 32], np.array([5, 7], np.uint64))
    [(_, kinds, tiers, counts, lengths, keys)] = buffers.take()
    for column in (kinds, tiers, counts, lengths, keys):
        assert isinstance(cast(object, column.base), bytes)  # numpy types it as an array
        assert not column.flags.writeable
        assert column.flags.c_contiguous
    assert keys.tolist() == [5, 7]


def exported(obj: Any, writable: bool = False) -> tuple[Any, ...]:
    """The same fields from the exporter's own buffer (memoryview asks for all of it)."""
    view = memoryview(obj)
    if writable and view.readonly:
        raise ValueError("read-only")
    return (
        view.nbytes, view.itemsize, view.format, view.readonly, view.ndim,
        view.shape, view.strides, view.obj is obj,
    )  # fmt: skip


@pytest.mark.parametrize(
    "obj",
    [
        np.arange(5, dtype=np.uint64),
        np.arange(6, dtype=np.int64).reshape(3, 2),
        np.arange(4, dtype=np.uint8),
        np.arange(8, dtype="<u4").reshape(2, 4),
        np.arange(3, dtype=np.uint16),
        *(np.arange(3, dtype=t) for t in (np.int8, np.int16, np.int32, np.uint32)),
        *(np.arange(3, dtype=t) for t in (np.longlong, np.ulonglong)),  # "q", "Q"
        np.frombuffer(b"\0" + bytes(16), np.uint64, offset=1),  # unaligned, read-only
        np.zeros(0, np.int64),
        np.arange(4, dtype=">u8"),  # not native: the exporter's own buffer
        np.arange(4, dtype=np.float64),
        array_at(bytes(32), 0, np.dtype("<u8"), 4),
    ],
)
def test_a_numpy_arrays_buffer_read_from_its_fields_is_the_one_it_exports(obj: Any) -> None:
    before = sys.getrefcount(obj)
    assert buffer_fields(obj) == exported(obj)
    assert sys.getrefcount(obj) == before  # the view's reference was released
    if obj.flags.writeable:
        assert buffer_fields(obj, writable=True) == exported(obj, writable=True)


def test_what_the_fields_cannot_give_is_refused_as_the_exporter_refuses_it() -> None:
    strided = np.arange(8, dtype=np.uint64)[::2]
    with pytest.raises(ValueError, match="contiguous"):
        buffer_fields(strided)
    frozen = np.arange(4, dtype=np.uint64)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        buffer_fields(frozen, writable=True)
    assert buffer_fields(b"abcd")[:3] == (4, 1, "B")  # not numpy: its own export
