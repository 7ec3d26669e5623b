"""ShardTables: the one maintenance-side class of a shard's region tables."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from kvcompass.errors import BadInput
from kvcompass.index.layout import IndexLayout, Tier
from kvcompass.index.shard_tables import ShardTables
from kvcompass.keys import shard_of_array
from kvcompass.topology import load_builtin

TOPOLOGY = load_builtin("testbed-3region")
LAYOUT = IndexLayout.from_topology(TOPOLOGY)
N_SHARDS = 3


def keys_of(shard: int, n: int, seed: int = 0) -> np.ndarray:
    """``n`` distinct 63-bit keys owned by ``shard``."""
    rng = np.random.default_rng(seed)
    k = np.unique(rng.integers(0, 1 << 63, 8 * n, dtype=np.uint64))
    return k[shard_of_array(k, N_SHARDS) == shard][:n]


def foreign_key(shard: int) -> int:
    k = keys_of((shard + 1) % N_SHARDS, 1, seed=99)
    return int(k[0])


def new_tables(shard: int = 1, capacity: int = 64) -> ShardTables:
    return ShardTables(LAYOUT, shard, N_SHARDS, initial_capacity=capacity, rng=random.Random(3))


def state(tables: ShardTables) -> tuple[dict[int, bytes], dict[int, bytes]]:
    return tables.snapshot_parts()


def test_set_tier_then_read_back_and_patch() -> None:
    tables = new_tables()
    keys = keys_of(1, 200)
    tables.set_tier(keys, 3, Tier.VRAM)
    tables.set_tier(keys[:50].tolist(), 4, Tier.DRAM)
    assert all(tables.tier(int(k), 3) == Tier.VRAM for k in keys)
    assert [tables.tier(int(k), 4) for k in keys[48:52]] == [Tier.DRAM] * 2 + [Tier.ABSENT] * 2
    patches = tables.take_patches()
    assert set(patches) == {LAYOUT.slots[3][0]}  # workers 3 and 4 share a us table
    assert tables.take_patches() == {}
    tables.set_tier(keys, 3, Tier.ABSENT)
    tables.set_tier(keys[:50], 4, Tier.ABSENT)
    assert tables.count == 0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (1 << 63, "63-bit"),
        (-1, "63-bit"),
        (None, "belongs to shard"),  # a key of another shard
    ],
)
def test_a_rejected_set_tier_changes_nothing(bad: int | None, message: str) -> None:
    """Validate every key first, then write: no valid key of a refused call lands."""
    tables = new_tables()
    tables.set_tier(keys_of(1, 20, seed=1), 2, Tier.DRAM)
    tables.take_patches()
    before = state(tables)
    keys = keys_of(1, 100, seed=2).tolist()
    keys.insert(60, foreign_key(1) if bad is None else bad)
    with pytest.raises(BadInput, match=message):
        tables.set_tier(keys, 2, Tier.VRAM)
    assert tables.take_patches() == {}
    assert state(tables) == before
    assert all(tables.tier(k, 2) == Tier.ABSENT for k in keys[:60] if 0 <= k < 1 << 63)


def test_a_rejected_write_columns_changes_nothing() -> None:
    tables = new_tables()
    table_id, field = LAYOUT.slots[0]
    keys = keys_of(1, 30)
    clear = np.full(30, 3 << (2 * field), dtype=np.uint64)
    bits = np.full(30, 1 << (2 * field), dtype=np.uint64)
    before = state(tables)
    too_wide = bits.copy()
    too_wide[-1] = np.uint64(1 << 40)  # testbed tables hold 32-bit values
    with pytest.raises(BadInput, match="does not fit 32 bits"):
        tables.write_columns(table_id, keys, clear, too_wide)
    with pytest.raises(BadInput, match="equal-length"):
        tables.write_columns(table_id, keys, clear[:-1], bits)
    with pytest.raises(BadInput, match="no table 99"):
        tables.write_columns(99, keys, clear, bits)
    with pytest.raises(BadInput, match="worker 14 is outside"):
        tables.set_tier(keys, 14, Tier.VRAM)
    assert tables.take_patches() == {}
    assert state(tables) == before
    tables.write_columns(table_id, keys, clear, bits)
    assert all(tables.tier(int(k), 0) == Tier.VRAM for k in keys)


def test_write_columns_applies_in_order() -> None:
    """Later columns of the same key win, as the event order says."""
    tables = new_tables()
    table_id, field = LAYOUT.slots[5]
    key = keys_of(1, 1)
    clear = np.uint64(3 << (2 * field))
    col = np.concatenate([key, key, key])
    tables.write_columns(
        table_id,
        col,
        np.full(3, clear),
        np.array([1, 2, 1], dtype=np.uint64) << np.uint64(2 * field),
    )
    assert tables.tier(int(key[0]), 5) == Tier.VRAM


def test_snapshot_parts_round_trip() -> None:
    tables = new_tables(capacity=16)
    keys = keys_of(1, 300)
    tables.set_tier(keys, 9, Tier.VRAM)  # grows the eu table past its capacity
    tables.set_tier(keys[:100], 11, Tier.DRAM)
    tables.take_patches()
    views, key_parts = tables.snapshot_parts()
    restored = ShardTables.from_parts(LAYOUT, 1, N_SHARDS, views, key_parts)
    assert restored.snapshot_parts() == (views, key_parts)
    assert restored.view_images() == tables.view_images()
    assert restored.generations == tables.generations
    assert restored.count == tables.count == 400
    with pytest.raises(BadInput, match="has tables"):
        ShardTables.from_parts(LAYOUT, 1, N_SHARDS, {0: views[0]}, key_parts)


def test_refuses_a_shard_outside_the_count() -> None:
    with pytest.raises(BadInput, match=r"shard 3 is outside 0\.\.2"):
        ShardTables(LAYOUT, 3, N_SHARDS)


def test_layout_digest_is_stable_and_covers_what_tables_depend_on() -> None:
    digest = LAYOUT.digest()
    assert digest == IndexLayout.from_topology(load_builtin("testbed-3region")).digest()
    # A literal: a changed digest makes every stored snapshot unusable.
    assert digest == "923ca95439609f4949caa11cfc6ae042"
    idx = TOPOLOGY.index
    others = [
        replace(TOPOLOGY, index=replace(idx, fingerprint_bits=16)),
        replace(TOPOLOGY, index=replace(idx, value_bits=64)),
    ]
    first, second = LAYOUT.tables[:2]
    swapped = replace(first, workers=(second.workers[0], *first.workers[1:]))
    layouts = [IndexLayout.from_topology(t) for t in others] + [
        replace(LAYOUT, tables=(replace(first, region="mars"), *LAYOUT.tables[1:])),
        replace(LAYOUT, tables=(swapped, *LAYOUT.tables[1:])),
        replace(LAYOUT, tables=LAYOUT.tables[:-1]),
    ]
    digests = {layout.digest() for layout in layouts}
    assert digest not in digests
    assert len(digests) == len(layouts)
