"""ShardTables: the one maintenance-side class of a shard's region tables."""

from __future__ import annotations

import random
import re
import zlib
from dataclasses import replace
from typing import Any

import msgpack
import numpy as np
import pytest
from numpy.typing import NDArray

from kvcompass.errors import BadInput, InvariantBroken
from kvcompass.index import kernel, ludo
from kvcompass.index.errors import IndexCorrupt, SnapshotError, TableFull
from kvcompass.index.layout import IndexLayout, Tier
from kvcompass.index.ludo import LudoTable
from kvcompass.index.shard_tables import ShardTables
from kvcompass.keys import KeyHash, shard_of_array
from kvcompass.snapshot import ShardSnapshot, SnapshotMeta
from kvcompass.topology import load_builtin

TOPOLOGY = load_builtin("testbed-3region")
LAYOUT = IndexLayout.from_topology(TOPOLOGY)
N_SHARDS = 3


def keys_of(shard: int, n: int, seed: int = 0) -> NDArray[np.uint64]:
    """``n`` distinct 63-bit keys owned by ``shard``."""
    rng = np.random.default_rng(seed)
    k = np.unique(rng.integers(0, 1 << 63, 8 * n, dtype=np.uint64))
    owned: NDArray[np.uint64] = k[shard_of_array(k, N_SHARDS) == shard][:n]
    return owned


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


def test_take_patches_skips_only_tables_with_nothing_to_send() -> None:
    """Tables are skipped when clean, which must not hide a write, a grow or corruption."""
    tables = new_tables(capacity=8)
    us, eu = LAYOUT.slots[3][0], LAYOUT.slots[9][0]
    assert not any(t.changed for t in tables.tables.values())
    tables.set_tier(keys_of(1, 4), 3, Tier.VRAM)
    assert [t for t, table in tables.tables.items() if table.changed] == [us]
    assert set(tables.take_patches()) == {us}
    tables.set_tier(keys_of(1, 60, seed=1), 9, Tier.DRAM)  # grows the eu table
    patches = tables.take_patches()
    assert set(patches) == {eu}
    assert patches[eu].reload is not None
    assert tables.take_patches() == {}
    tables.tables[eu]._poison("broken on purpose")  # nothing written since the last take
    with pytest.raises(IndexCorrupt):
        tables.take_patches()


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


def snapshot_of(tables: ShardTables, **meta: object) -> ShardSnapshot:
    views, keys = tables.snapshot_parts()
    fields: dict[str, object] = {
        "shard": tables.shard,
        "epoch": 3,
        "next_seq": 17,
        "events_offset": 41,
        "patches_offset": 99,
        "generations": tables.generations,
        "worker_seq": {"us-0": 5},
        "owner": "kvc-mu/kvc:snap",
        "n_shards": tables.n_shards,
        "topology_digest": tables.layout.digest(),
    }
    fields.update(meta)
    return ShardSnapshot(SnapshotMeta(**fields), views, keys)  # type: ignore[arg-type]


def test_snapshot_round_trip() -> None:
    tables = new_tables(capacity=16)
    keys = keys_of(1, 300)
    tables.set_tier(keys, 9, Tier.VRAM)  # grows the eu table past its capacity
    tables.set_tier(keys[:100], 11, Tier.DRAM)
    tables.take_patches()
    snapshot = snapshot_of(tables)
    restored = ShardTables.restore(snapshot, LAYOUT, 1, N_SHARDS)
    assert restored.snapshot_parts() == (snapshot.views, snapshot.keys)
    assert restored.view_images() == tables.view_images()
    assert restored.generations == tables.generations
    assert restored.count == tables.count == 400
    assert restored.generations[LAYOUT.slots[9][0]] > 0


def test_refuses_a_shard_outside_the_count() -> None:
    with pytest.raises(BadInput, match=r"shard 3 is outside 0\.\.2"):
        ShardTables(LAYOUT, 3, N_SHARDS)


def test_layout_digest_is_stable_and_covers_what_tables_depend_on() -> None:
    digest = LAYOUT.digest()
    assert digest == IndexLayout.from_topology(load_builtin("testbed-3region")).digest()
    # Literals: a changed digest makes every stored snapshot unusable. SHA-256 keys keep
    # the digest they had before the key hash was selectable.
    assert digest == "0e9c0dee445b6c9f65d05ec393584690"
    idx = TOPOLOGY.index
    sha256 = IndexLayout.from_topology(
        replace(TOPOLOGY, index=replace(idx, key_hash=KeyHash.SHA256))
    )
    assert sha256.digest() == "923ca95439609f4949caa11cfc6ae042"
    others = [
        replace(TOPOLOGY, index=replace(idx, fingerprint_bits=16)),
        replace(TOPOLOGY, index=replace(idx, value_bits=64)),
        replace(TOPOLOGY, index=replace(idx, key_hash=KeyHash.SHA256)),
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


# -- snapshots refuse corruption -------------------------------------------------------


def small_shard(shard: int = 1) -> ShardTables:
    """A shard with keys in every table, small enough to flip every byte of it."""
    tables = ShardTables(LAYOUT, shard, N_SHARDS, initial_capacity=8, rng=random.Random(5))
    keys = keys_of(shard, 24, seed=shard)
    for worker in (0, 9, 12):  # us, eu, asia: one table each
        tables.set_tier(keys, worker, Tier.VRAM)
    tables.take_patches()
    return tables


def restore(snapshot: ShardSnapshot, shard: int = 1) -> ShardTables:
    return ShardTables.restore(snapshot, LAYOUT, shard, N_SHARDS)


def test_every_flipped_byte_of_every_part_is_refused_naming_the_part() -> None:
    snapshot = snapshot_of(small_shard())
    meta_bytes = snapshot.meta.to_bytes()
    restore(ShardSnapshot(SnapshotMeta.from_bytes(meta_bytes), snapshot.views, snapshot.keys))
    parts: list[tuple[str, bytes]] = [("meta", meta_bytes)]
    parts += [(f"view:{t}", v) for t, v in snapshot.views.items()]
    parts += [(f"keys:{t}", k) for t, k in snapshot.keys.items()]
    assert len(parts) == 1 + 2 * len(LAYOUT.tables)
    flips = 0
    for name, data in parts:
        for pos in range(len(data)):
            for mask in (0x01, 0x80):
                bad = bytearray(data)
                bad[pos] ^= mask
                views, keys = dict(snapshot.views), dict(snapshot.keys)
                if name.startswith("view:"):
                    views[int(name[5:])] = bytes(bad)
                elif name.startswith("keys:"):
                    keys[int(name[5:])] = bytes(bad)
                meta = bytes(bad) if name == "meta" else meta_bytes
                with pytest.raises(SnapshotError) as info:
                    restore(ShardSnapshot(SnapshotMeta.from_bytes(meta), views, keys))
                assert str(info.value).startswith(f"{name}: "), (name, pos, str(info.value))
                flips += 1
    assert flips == 2 * sum(len(data) for _, data in parts)


@pytest.mark.parametrize("mask", [0x01, 0x10, 0xFF])
def test_no_flipped_meta_byte_is_accepted(mask: int) -> None:
    """(Before the meta had a checksum, 27-33% of such flips decoded to other positions.)"""
    data = snapshot_of(small_shard()).meta.to_bytes()
    for pos in range(len(data)):
        bad = bytearray(data)
        bad[pos] ^= mask
        with pytest.raises(SnapshotError, match=r"^meta: "):
            SnapshotMeta.from_bytes(bytes(bad))


def test_another_shards_tables_are_refused() -> None:
    theirs = small_shard(shard=0)
    snapshot = snapshot_of(theirs)
    with pytest.raises(SnapshotError, match=r"^meta: snapshot is for shard 0, expected 1"):
        restore(snapshot, shard=1)
    # Relabelled as shard 1 (a valid meta): the keys still give it away.
    relabelled = snapshot_of(theirs, shard=1)
    with pytest.raises(SnapshotError, match=r"^keys:0: key \d+ belongs to shard 0, not 1"):
        restore(relabelled, shard=1)


def test_another_shard_count_or_layout_is_refused() -> None:
    tables = small_shard()
    with pytest.raises(SnapshotError, match=r"^meta: snapshot is for n_shards 4, expected 3"):
        restore(snapshot_of(tables, n_shards=4))
    with pytest.raises(SnapshotError, match=r"^meta: snapshot is for topology 'ab12'"):
        restore(snapshot_of(tables, topology_digest="ab12"))
    with pytest.raises(SnapshotError, match=r"^meta: snapshot is for topology ''"):
        restore(snapshot_of(tables, topology_digest=""))  # written before it was recorded


def test_parts_that_do_not_belong_together_are_refused() -> None:
    tables = small_shard()
    old = snapshot_of(tables)
    tables.set_tier(keys_of(1, 3, seed=8), 12, Tier.DRAM)
    new = snapshot_of(tables)
    t = LAYOUT.slots[12][0]
    assert new.views[t] != old.views[t]
    mixed = ShardSnapshot(new.meta, new.views, {**new.keys, t: old.keys[t]})
    with pytest.raises(SnapshotError, match=f"^keys:{t}: key image belongs to another view"):
        restore(mixed)
    swapped = ShardSnapshot(new.meta, {**new.views, 0: new.views[1], 1: new.views[0]}, new.keys)
    with pytest.raises(SnapshotError, match=r"^keys:0: key image belongs to another view"):
        restore(swapped)
    g = tables.generations[t]
    stale = snapshot_of(tables, generations={**tables.generations, t: g + 1})
    with pytest.raises(SnapshotError, match=f"^view:{t}: generation {g}, the meta records {g + 1}"):
        restore(stale)
    missing = ShardSnapshot(new.meta, {k: v for k, v in new.views.items() if k != t}, new.keys)
    with pytest.raises(SnapshotError, match=r"^meta: records tables"):
        restore(missing)
    with pytest.raises(SnapshotError, match=r"^keys: the snapshot was loaded without"):
        restore(ShardSnapshot(new.meta, new.views))
    # An edge verifies the view halves alone.
    ShardSnapshot(new.meta, new.views).verify(
        shard=1, n_shards=N_SHARDS, topology_digest=LAYOUT.digest()
    )


def packed_meta(**changes: object) -> bytes:
    raw = msgpack.unpackb(snapshot_of(small_shard()).meta.to_bytes()[:-4], strict_map_key=False)
    raw.update(changes)
    for name in [k for k, v in changes.items() if v is DROP]:
        del raw[name]
    body: bytes = msgpack.packb(raw, use_bin_type=True)
    return body + zlib.crc32(body).to_bytes(4, "little")


DROP = object()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"v": 1}, "unknown format version 1"),
        ({"epoch": -1}, "'epoch': -1 is not an integer"),
        ({"epoch": True}, "'epoch': True is not an integer"),
        ({"epoch": "5"}, "'epoch'"),
        ({"epoch": 1.0}, "'epoch'"),
        ({"shard": 3}, "'shard': 3 is not an integer in 0..2"),
        ({"events_offset": -2}, "'events_offset'"),
        ({"patches_offset": -1}, "'patches_offset'"),
        ({"next_seq": 1 << 63}, "'next_seq'"),
        ({"generations": {0: -1}}, "'generations'"),
        ({"generations": [1]}, "'generations' is not a map"),
        ({"worker_seq": {"us-0": "x"}}, "'worker_seq'"),
        ({"worker_seq": {7: 1}}, "'worker_seq'"),
        ({"owner": "x" * 201}, "'owner'"),
        ({"topology_digest": 5}, "'topology_digest'"),
        ({"created_ns": DROP}, "field 'created_ns' is missing"),
    ],
)
def test_meta_fields_are_checked(changes: dict[str, object], message: str) -> None:
    with pytest.raises(SnapshotError, match=f"^meta: .*{re.escape(message)}"):
        SnapshotMeta.from_bytes(packed_meta(**changes))


def test_meta_round_trip_and_refuses_garbage() -> None:
    meta = snapshot_of(small_shard()).meta
    assert SnapshotMeta.from_bytes(meta.to_bytes()) == meta
    assert SnapshotMeta.from_bytes(packed_meta()) == meta
    not_msgpack = b"\xc1" + zlib.crc32(b"\xc1").to_bytes(4, "little")  # 0xc1: never used
    for data in (b"", b"abc", b"\x00" * 4, not_msgpack):
        with pytest.raises(SnapshotError, match=r"^meta: "):
            SnapshotMeta.from_bytes(data)


# -- a table broken mid-move is never persisted ----------------------------------------


def test_a_write_that_breaks_mid_move_poisons_the_shard(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's "no seed found mid-move" is an invariant break, not TableFull: the
    shard then refuses to produce any snapshot part, image or patch."""
    tables = small_shard()
    real = kernel.apply_writes

    def no_seed_halfway(*args: Any) -> tuple[int, int]:
        desc, cells, fps, geo, keys, clear, bits, start = args
        half = len(keys) // 2
        real(desc, cells, fps, geo, keys[:half], clear[:half], bits[:half], start)
        return kernel.NO_SEED, half

    monkeypatch.setattr(kernel, "apply_writes", no_seed_halfway)
    with pytest.raises(IndexCorrupt, match="no bucket seed separates") as info:
        tables.set_tier(keys_of(1, 10, seed=6), 9, Tier.DRAM)
    assert isinstance(info.value, InvariantBroken)
    assert not isinstance(info.value, TableFull)
    monkeypatch.setattr(kernel, "apply_writes", real)
    for produce in (
        tables.snapshot_parts,
        tables.view_images,
        tables.take_patches,
        lambda: tables.set_tier(keys_of(1, 2, seed=7), 9, Tier.VRAM),
        lambda: tables.tables[LAYOUT.slots[9][0]].snapshot_parts(),
    ):
        with pytest.raises(IndexCorrupt, match="reload it from a snapshot"):
            produce()
    # The shard's other tables are intact, but the shard as a whole is not persisted.
    assert tables.tables[LAYOUT.slots[0][0]].snapshot_parts()


def test_a_grow_that_loses_the_table_poisons_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Growing resets the storage before re-placing the keys: failing there loses them."""
    table = LudoTable.with_capacity(8, rng=random.Random(2))

    def no_seed(*args: Any) -> Any:
        raise TableFull("no bucket seed separates the keys of 1 buckets")

    monkeypatch.setattr(ludo, "find_seeds_array", no_seed)
    with pytest.raises(IndexCorrupt, match="growing lost the table"):
        table.put_many(np.arange(1, 40, dtype=np.uint64), np.ones(39, dtype=np.uint64))
    with pytest.raises(IndexCorrupt):
        table.snapshot_parts()
