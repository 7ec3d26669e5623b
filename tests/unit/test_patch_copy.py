"""The compiled patch copies: a view writes a patch's images as numpy's scatter did, for
every layout the wire accepts, and refuses bad indices before writing anything.

(The table side, take_dirty, is held to the table by test_ludo_properties: a view fed
only the patches must hold the table's view state after every operation.)"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompass.index import LudoTable, LudoView, TablePatch, kernel
from kvcompass.index.patch_copy import DESCRIPTOR_ROWS
from kvcompass.index.patches import BucketImages, WordImages


def test_descriptor_rows_are_the_kernels() -> None:
    names = [f"table.{n}" for n, _ in kernel._DESCRIBED_TABLE]
    names += [f"othello.{n}" for n, _ in kernel._DESCRIBED_OTHELLO]
    assert {name: names.index(name) for name in DESCRIPTOR_ROWS} == DESCRIPTOR_ROWS


def view_of(value_bits: int, fingerprint_bits: int) -> LudoView:
    table = LudoTable.with_capacity(
        256, value_bits=value_bits, fingerprint_bits=fingerprint_bits, rng=random.Random(1)
    )
    return LudoView(table.view_image())


def numpy_view(view: LudoView) -> LudoView:
    """A copy of ``view`` that writes patches with numpy only."""
    copy = LudoView(view.image())
    copy._patch_target = None
    return copy


@st.composite
def patches(draw: st.DrawFn, view: LudoView) -> TablePatch:
    g = view.geometry
    n = draw(st.integers(0, 6))
    id_type = draw(st.sampled_from([np.int64, np.uint32, np.int32]))
    cell_type = draw(st.sampled_from([np.uint32, np.uint64]))
    buckets = np.array(draw(st.lists(st.integers(0, g.nb - 1), min_size=n, max_size=n)), id_type)
    cells = np.array(
        draw(st.lists(st.integers(0, 2**32 - 1), min_size=4 * n, max_size=4 * n)), cell_type
    ).reshape(n, 4)
    seeds = np.array(draw(st.lists(st.integers(0, 255), min_size=n, max_size=n)), np.uint8)
    fps = None
    if draw(st.booleans()):
        fps = np.array(
            draw(st.lists(st.integers(0, 255), min_size=4 * n, max_size=4 * n)), np.uint8
        ).reshape(n, 4)
    m = draw(st.integers(0, 4))
    indices = np.array(
        draw(st.lists(st.integers(0, g.n_words - 1), min_size=m, max_size=m)),
        draw(st.sampled_from([np.int64, np.uint32])),
    )
    values = np.array(draw(st.lists(st.integers(0, 2**64 - 1), min_size=m, max_size=m)), np.uint64)
    if draw(st.booleans()):  # a decoded patch's arrays sit in a message buffer
        cells = cells.copy()
        cells.setflags(write=False)
    elif draw(st.booleans()):  # every other column of a wider array: not contiguous
        cells = np.repeat(cells, 2, axis=1)[:, ::2]
    return TablePatch(
        g.generation, BucketImages(buckets, seeds, cells, fps), WordImages(indices, values)
    )


@pytest.mark.parametrize(("value_bits", "fingerprint_bits"), [(32, 0), (32, 8), (64, 12)])
@given(data=st.data())
@settings(max_examples=150, deadline=None)
def test_a_view_writes_a_patch_as_numpy_does(
    value_bits: int, fingerprint_bits: int, data: st.DataObject
) -> None:
    view = view_of(value_bits, fingerprint_bits)
    reference = numpy_view(view)
    for _ in range(3):
        patch = data.draw(patches(view))
        view.apply(patch)
        reference.apply(patch)
        assert view.image() == reference.image()


@pytest.mark.parametrize(
    ("buckets", "words", "message"),
    [([1, 300], [0], "bucket 300 is outside"), ([1], [0, 1 << 20], "word 1048576")],
)
def test_an_index_out_of_range_is_refused_before_anything_is_written(
    buckets: list[int], words: list[int], message: str
) -> None:
    view = view_of(32, 8)
    before = view.image()
    n = len(buckets)
    patch = TablePatch(
        view.geometry.generation,
        BucketImages(
            np.array(buckets, np.int64),
            np.full(n, 7, np.uint8),
            np.full((n, 4), 9, np.uint32),
            np.full((n, 4), 3, np.uint8),
        ),
        WordImages(np.array(words, np.int64), np.full(len(words), 5, np.uint64)),
    )
    with pytest.raises(IndexError, match=message):
        view.apply(patch)
    assert view.image() == before


def test_a_view_over_a_read_only_buffer_refuses_a_patch_and_stays_intact() -> None:
    image = view_of(32, 8).image()
    view = LudoView.attach(memoryview(bytes(image)))
    patch = TablePatch(
        view.geometry.generation,
        BucketImages(
            np.array([3], np.int64),
            np.array([1], np.uint8),
            np.full((1, 4), 2, np.uint32),
            None,
        ),
    )
    with pytest.raises(ValueError, match="read-only"):
        view.apply(patch)
    assert view.image() == image


def test_a_taken_patch_names_each_dirty_bucket_once_and_clears_the_marks() -> None:
    table = LudoTable.with_capacity(1024, value_bits=32, rng=random.Random(3))
    one = np.ones(1, np.uint64)
    for key in [*range(1, 40), *range(1, 40)]:  # every bucket written twice
        table.write_bits_many(np.array([key], np.uint64), one * 3, one)
    patch = table.take_patch()
    assert patch.buckets is not None
    order = patch.buckets.buckets.tolist()
    assert len(order) == len(set(order)) > 0
    assert table.take_patch().is_empty


def test_a_released_view_refuses_a_patch_instead_of_writing_by_address() -> None:
    """Once released, the shared memory under a view may be gone: nothing writes there."""
    view = view_of(32, 8)
    buffer = bytearray(view.image())
    attached = LudoView.attach(memoryview(buffer))
    before = bytes(buffer)
    attached.release()
    patch = TablePatch(
        attached.geometry.generation,
        BucketImages(
            np.array([3], np.int64), np.array([1], np.uint8), np.full((1, 4), 2, np.uint32), None
        ),
    )
    with pytest.raises(AttributeError):
        attached.apply(patch)
    assert bytes(buffer) == before
