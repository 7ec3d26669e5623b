"""A shard writer's compiled staging: each table's columns are its batches' writes in
staging order (as numpy built them), the shard check is keys.shard_of's, and a refused
batch stages nothing."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompass.keys import shard_of
from kvcompass.pipeline.staging import StagedWrites

KEY_MAX = (1 << 63) - 1
U8 = np.uint8

#: One staged batch: table id, field, per event (tier, its keys).
Batch = tuple[int, int, list[tuple[int, list[int]]]]

batches = st.tuples(
    st.integers(0, 3),
    st.integers(0, 31),
    st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.integers(0, KEY_MAX), max_size=5)), max_size=4
    ),
)


def columns(events: list[tuple[int, list[int]]]) -> tuple[np.ndarray, ...]:
    """A batch's key, tier and count columns; keys unaligned and read-only, as decoded."""
    keys = np.array([k for _, ks in events for k in ks], dtype=np.uint64)
    unaligned = np.frombuffer(b"\0" + keys.tobytes(), np.uint64, offset=1)
    tiers = np.array([t for t, _ in events], dtype=U8)
    counts = np.array([len(ks) for _, ks in events], dtype=np.uint32)
    return unaligned, tiers, counts


def read(address: int, n: int) -> list[int]:
    """``n`` uint64 items at ``address`` (a taken column)."""
    return list((ctypes.c_uint64 * n).from_address(address))


@given(st.lists(st.lists(batches, max_size=6), min_size=1, max_size=3))
@settings(max_examples=300, deadline=None)
def test_taken_columns_are_each_tables_writes_in_staging_order(
    rounds: list[list[Batch]],
) -> None:
    staged = StagedWrites(4, 1, 0)
    for batches_of_round in rounds:
        want: dict[int, list[tuple[int, int, int]]] = {}
        for table_id, field, events in batches_of_round:
            staged.add(table_id, field, *columns(events))
            writes = [(k, 3 << 2 * field, tier << 2 * field) for tier, ks in events for k in ks]
            if writes:
                want.setdefault(table_id, []).extend(writes)
        taken = staged.take()
        assert [t for t, *_ in taken] == list(want)  # tables in first-staged order
        for table_id, keys, clear, bits, n in taken:
            got = list(zip(read(keys, n), read(clear, n), read(bits, n), strict=True))
            assert got == want[table_id]
        assert staged.take() == []


@given(st.lists(st.integers(0, KEY_MAX), max_size=20), st.integers(1, 64))
def test_first_foreign_is_the_first_key_shard_of_puts_elsewhere(
    keys: list[int], n_shards: int
) -> None:
    shard = shard_of(keys[0], n_shards) if keys else 0
    staged = StagedWrites(1, n_shards, shard)
    want = next((j for j, k in enumerate(keys) if shard_of(k, n_shards) != shard), -1)
    assert staged.first_foreign(columns([(1, keys)])[0]) == want


@pytest.mark.parametrize(
    ("table_id", "field", "tiers", "counts", "message"),
    [
        (4, 0, [1], [2], "no table 4"),
        (0, 32, [1], [2], "no field 32"),
        (0, 0, [4], [2], "tier 4"),
        (0, 0, [1], [1], "add up to 1, but there are 2 keys"),
        (0, 0, [1, 1], [2], "2 tiers but 1 key counts"),
    ],
)
def test_a_refused_batch_stages_nothing(
    table_id: int, field: int, tiers: list[int], counts: list[int], message: str
) -> None:
    staged = StagedWrites(4, 1, 0)
    staged.add(0, 1, *columns([(2, [9])]))
    keys = np.array([5, 6], dtype=np.uint64)
    with pytest.raises(ValueError, match=message):
        staged.add(table_id, field, keys, np.array(tiers, U8), np.array(counts, np.uint32))
    [(table, keys_taken, _, bits, n)] = staged.take()
    assert (table, read(keys_taken, n), read(bits, n)) == (0, [9], [2 << 2])


@pytest.mark.parametrize(
    ("column", "bad", "message"),
    [
        (0, np.array([5, 6], dtype=np.int64), "keys: expected"),
        (0, np.array([5, 7, 6, 7], dtype=np.uint64)[::2], "contiguous"),
        (1, np.array([1], dtype=np.uint16), "tiers: expected"),
        (2, np.array([2], dtype=np.uint64), "counts: expected"),
    ],
)
def test_a_column_of_the_wrong_type_or_layout_is_refused_and_stages_nothing(
    column: int, bad: np.ndarray, message: str
) -> None:
    staged = StagedWrites(4, 1, 0)
    staged.add(0, 1, *columns([(2, [9])]))
    good: list[np.ndarray] = [
        np.array([5, 6], dtype=np.uint64),
        np.array([1], U8),
        np.array([2], np.uint32),
    ]
    good[column] = bad
    with pytest.raises((ValueError, BufferError), match=message):
        staged.add(0, 0, *good)
    with pytest.raises((ValueError, BufferError), match=message if column == 0 else "keys"):
        staged.first_foreign(bad if column == 0 else np.array([1.5]))
    [(table, keys_taken, _, bits, n)] = staged.take()
    assert (table, read(keys_taken, n), read(bits, n)) == (0, [9], [2 << 2])
