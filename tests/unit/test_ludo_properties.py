"""Ludo table and keyless view: the view built from patches answers like the table.

Random operation sequences (inserts, updates, removals of present and absent keys, and
``put_many`` batches mixing all of them with repeated keys) run on small tables, so that
growth into new generations and Othello rebuilds both happen. After every operation the
view that saw only the emitted patches must hold exactly the table's view state, and
answer every present key with its value; snapshots, replays and restores must agree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, target
from hypothesis import strategies as st

from kvcompass.index import GenerationMismatch, LudoTable, LudoView, TablePatch
from kvcompass.index.ludo import MAX_CUCKOO_MOVES
from kvcompass.wire import TablePatchWire

MAX_KEY = 2**63 - 1
EDGE_KEYS = [0, 1, 2, MAX_KEY, MAX_KEY - 1]

PROPERTY_SETTINGS = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- model -------------------------------------------------------------------------------


@dataclass
class Harness:
    """A table, a view fed only its patches, and a reference dict."""

    table: LudoTable
    view: LudoView
    ref: dict[int, int] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)  # keys written once, absent now
    patches: list[TablePatch] = field(default_factory=list)
    reloads: int = 0
    resets: int = 0

    @classmethod
    def new(cls, capacity: int, value_bits: int, fingerprint_bits: int, seed: int) -> Harness:
        table = LudoTable.with_capacity(
            capacity,
            value_bits=value_bits,
            fingerprint_bits=fingerprint_bits,
            rng=random.Random(seed),
        )
        return cls(table, LudoView.empty(table.geometry))

    @property
    def mask(self) -> int:
        return self.table.geometry.value_mask

    def value(self, raw: int) -> int:
        return raw & self.mask or 1

    def record(self, key: int, value: int) -> None:
        if value:
            self.ref[key] = value
            self.gone.discard(key)
        elif key in self.ref:
            del self.ref[key]
            self.gone.add(key)

    def take(self, patch: TablePatch) -> None:
        """Feed a patch to the view, twice: the second application must change nothing."""
        generation = self.view.generation
        self.patches.append(patch)
        self.reloads += patch.reload is not None
        self.resets += patch.othello_reset is not None
        if patch.reload is None:
            assert patch.generation == generation
            # Every patch a table makes passes the wire checks (TablePatchWire.of_table,
            # which a maintenance unit's flush uses, skips them).
            TablePatchWire(0, patch)
        else:
            assert patch.generation > generation
        self.view.apply(patch)
        if patch.othello_reset is not None:
            assert self.view.geometry.othello_seed == patch.othello_reset.othello_seed
        once = self.view.image()
        self.view.apply(patch)
        assert self.view.image() == once
        assert self.view.generation == self.table.geometry.generation

    def check(self, *, scalar: bool = False) -> None:
        table, view, ref = self.table, self.view, self.ref
        assert len(table) == len(ref)
        assert table.count <= table.capacity
        # The view holds exactly the table's view state, byte for byte.
        assert view.image() == LudoView(table.view_image()).image()
        keys = np.array(sorted(ref), dtype=np.uint64)
        want = np.array([ref[k] for k in sorted(ref)], dtype=np.uint64)
        got = view.lookup_batch(keys)
        assert got.dtype == np.dtype(np.uint32 if table.geometry.value_bits == 32 else np.uint64)
        assert np.array_equal(got.astype(np.uint64), want)
        for k in list(ref)[:: max(1, len(ref) // 16)]:  # a sample, scalar path
            assert view.lookup(k) == ref[k]
        if scalar:
            for k, v in ref.items():
                assert table.get(k) == v
                assert view.lookup(k) == v
            for k in self.gone:
                assert table.get(k) == 0
                assert k not in table
            table_keys, table_values = table.items()
            assert dict(zip(table_keys.tolist(), table_values.tolist(), strict=True)) == ref


# -- operations ----------------------------------------------------------------------

KEYS = st.one_of(st.sampled_from(EDGE_KEYS), st.integers(0, MAX_KEY))
RAW_VALUES = st.integers(0, 2**64 - 1)

# A batch item: (kind, key or index, raw value).
BATCH_ITEM = st.tuples(
    st.sampled_from(["insert", "update", "remove", "remove_absent", "repeat"]),
    KEYS,
    RAW_VALUES,
)

OPS = st.one_of(
    st.tuples(st.just("insert"), KEYS, RAW_VALUES),
    st.tuples(st.just("update"), st.integers(0, 10**6), RAW_VALUES),
    st.tuples(st.just("remove"), st.integers(0, 10**6)),
    st.tuples(st.just("remove_absent"), KEYS),
    st.tuples(st.just("batch"), st.lists(BATCH_ITEM, max_size=40), st.booleans()),
    # Many fresh keys at once (grows small tables): count, key seed, via put_many?
    st.tuples(st.just("fill"), st.integers(1, 300), st.integers(0, 2**32), st.booleans()),
)


def run_op(h: Harness, op: tuple[Any, ...]) -> None:
    table = h.table
    present = sorted(h.ref)
    kind = op[0]
    if kind == "insert":
        _, key, raw = op
        value = h.value(raw)
        h.take(table.put(key, value))
        h.record(key, value)
    elif kind in ("update", "remove"):
        if not present:
            return
        key = present[op[1] % len(present)]
        value = h.value(op[2]) if kind == "update" else 0
        h.take(table.put(key, value) if value else table.remove(key))
        h.record(key, value)
    elif kind == "remove_absent":
        key = op[1]
        if key in h.ref:
            return
        patch = table.remove(key)
        assert patch.is_empty
        h.take(patch)
        h.record(key, 0)
    elif kind == "batch":
        _, items, as_arrays = op
        keys: list[int] = []
        values: list[int] = []
        for item_kind, arg, raw in items:
            if item_kind == "insert":
                key, value = arg, h.value(raw)
            elif item_kind in ("update", "remove"):
                if not present:
                    continue
                key = present[arg % len(present)]
                value = h.value(raw) if item_kind == "update" else 0
            elif item_kind == "remove_absent":
                if arg in h.ref:
                    continue
                key, value = arg, 0
            else:  # repeat an earlier key of this batch, with a new value or a removal
                if not keys:
                    continue
                key = keys[arg % len(keys)]
                value = 0 if raw % 3 == 0 else h.value(raw)
            keys.append(key)
            values.append(value)
        if as_arrays:
            patch = table.put_many(
                np.array(keys, dtype=np.uint64), np.array(values, dtype=np.uint64)
            )
        else:
            patch = table.put_many(keys, values)
        h.take(patch)
        for key, value in zip(keys, values, strict=True):  # last write wins
            h.record(key, value)
    elif kind == "fill":
        _, n, seed, many = op
        rng = random.Random(seed)
        keys = [rng.getrandbits(63) for _ in range(n)]
        values = [h.value(rng.getrandbits(64)) for _ in range(n)]
        if many:
            h.take(table.put_many(keys, values))
        else:
            for key, value in zip(keys, values, strict=True):
                h.take(table.put(key, value))
        for key, value in zip(keys, values, strict=True):
            h.record(key, value)
    else:  # pragma: no cover
        raise AssertionError(kind)


def replay(view: LudoView, patches: list[TablePatch]) -> None:
    """Apply a patch stream again; patches of generations the view has left are refused.

    A patch of an older generation (a reload included) raises GenerationMismatch and
    changes nothing; the next reload brings the view back into the stream.
    """
    for patch in patches:
        before = view.image()
        try:
            view.apply(patch)
        except GenerationMismatch:
            assert patch.generation < view.generation
            assert view.image() == before


# -- the property ----------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(
    capacity=st.integers(16, 200),
    value_bits=st.sampled_from([32, 64]),
    fingerprint_bits=st.sampled_from([0, 8]),
    seed=st.integers(0, 2**32),
    ops=st.lists(OPS, min_size=1, max_size=40),
    snapshot_at=st.integers(0, 40),
)
def test_view_from_patches_answers_like_the_table(
    capacity: int,
    value_bits: int,
    fingerprint_bits: int,
    seed: int,
    ops: list[tuple[Any, ...]],
    snapshot_at: int,
) -> None:
    h = Harness.new(capacity, value_bits, fingerprint_bits, seed)
    first_generation = h.table.geometry.generation
    snapshot_at = min(snapshot_at, len(ops))
    mid_view: LudoView | None = None
    mid_patches = 0
    mid_ref: dict[int, int] = {}
    for i, op in enumerate(ops):
        if i == snapshot_at:
            mid_view = LudoView(h.table.view_image())
            mid_patches = len(h.patches)
            mid_ref = dict(h.ref)
        run_op(h, op)
        h.check()
    if mid_view is None:
        mid_view = LudoView(h.table.view_image())
        mid_patches = len(h.patches)
        mid_ref = dict(h.ref)
    h.check(scalar=True)
    final = h.view.image()
    event(f"grew: {h.reloads > 0}")
    event(f"othello rebuilt: {h.resets > 0}")
    target(float(min(h.reloads, 3) + min(h.resets, 3)), label="growths and rebuilds")

    # (e) growth: generations only move up, one or more per reload patch.
    assert h.table.geometry.generation >= first_generation + h.reloads
    assert (h.table.geometry.generation > first_generation) == (h.reloads > 0)

    # (b) a view bootstrapped from a midway image plus the later patches only.
    mid_keys = np.array(sorted(mid_ref), dtype=np.uint64)
    for patch in h.patches[mid_patches:]:
        mid_view.apply(patch)
    assert mid_view.image() == final
    for k, v in h.ref.items():
        assert mid_view.lookup(k) == v
    assert np.array_equal(mid_view.lookup_batch(mid_keys), h.view.lookup_batch(mid_keys))

    # (c) replaying the stream from the snapshot point, again, changes nothing.
    replay(h.view, h.patches[mid_patches:])
    assert h.view.image() == final
    replay(mid_view, h.patches[mid_patches:])
    assert mid_view.image() == final

    # (d) a restored maintenance snapshot answers the same and has the same view.
    parts = h.table.snapshot_parts()
    restored = LudoTable.from_parts(*parts, rng=random.Random(seed + 1))
    assert restored.geometry == h.table.geometry
    assert len(restored) == len(h.ref)
    assert restored.view_image() == h.table.view_image()
    assert restored.snapshot_parts() == parts
    for k, v in h.ref.items():
        assert restored.get(k) == v
    for k in h.gone:
        assert restored.get(k) == 0


@PROPERTY_SETTINGS
@given(
    value_bits=st.sampled_from([32, 64]),
    fingerprint_bits=st.sampled_from([0, 8]),
    seed=st.integers(0, 2**32),
    ops=st.lists(OPS, min_size=1, max_size=12),
)
def test_restored_table_keeps_working(
    value_bits: int, fingerprint_bits: int, seed: int, ops: list[tuple[Any, ...]]
) -> None:
    """A restored table continues the stream: a view of its image follows its patches."""
    h = Harness.new(16, value_bits, fingerprint_bits, seed)
    run_op(h, ("fill", 40, seed, False))
    restored = LudoTable.from_parts(*h.table.snapshot_parts(), rng=random.Random(seed))
    h2 = Harness(restored, LudoView(restored.view_image()), dict(h.ref))
    for op in ops:
        run_op(h2, op)
        h2.check()
    h2.check(scalar=True)


# -- deterministic scenarios -----------------------------------------------------------


@pytest.mark.parametrize("value_bits", [32, 64])
@pytest.mark.parametrize("fingerprint_bits", [0, 8])
def test_growth_and_othello_rebuilds_are_both_observed(
    value_bits: int, fingerprint_bits: int
) -> None:
    h = Harness.new(16, value_bits, fingerprint_bits, seed=2024)
    rng = random.Random(7)
    generations = [h.table.geometry.generation]
    for i in range(2500):
        key = rng.getrandbits(63)
        h.take(h.table.put(key, h.value(rng.getrandbits(64))))
        h.record(key, h.table.get(key))
        if i % 5 == 4:  # churn: remove an older key
            old = rng.choice(sorted(h.ref))
            h.take(h.table.remove(old))
            h.record(old, 0)
        generations.append(h.table.geometry.generation)
        if i % 250 == 0:
            h.check()
    h.check(scalar=True)
    assert h.reloads >= 3
    assert h.resets >= 1
    # Generations only climb, each reload to a newer one (Harness.take checks that too);
    # a single write may grow twice, so a reload can skip a generation.
    assert generations == sorted(generations)
    assert h.table.geometry.generation >= h.reloads
    assert len(set(generations)) == h.reloads + 1
    assert h.table.capacity >= len(h.ref)
    assert all(p.reload is None for p in h.patches if p.othello_reset is not None)


def test_batch_larger_than_capacity_grows_in_one_reload() -> None:
    h = Harness.new(16, 32, 8, seed=5)
    rng = random.Random(5)
    keys = [rng.getrandbits(63) for _ in range(300)]
    values = [rng.getrandbits(32) or 1 for _ in keys]
    # The same batch also rewrites and removes some of its own keys.
    keys += keys[:50]
    values += [0] * 25 + [7] * 25
    patch = h.table.put_many(keys, values)
    assert patch.reload is not None
    assert patch.generation >= 2  # 19 -> 38 -> 76 -> 152 -> 304 keys of capacity
    h.take(patch)
    for key, value in zip(keys, values, strict=True):
        h.record(key, value)
    h.check(scalar=True)
    assert all(h.table.get(k) == 7 for k in keys[25:50])
    assert all(h.table.get(k) == 0 for k in keys[:25])


def test_put_then_remove_in_one_batch_is_a_no_op() -> None:
    h = Harness.new(100, 64, 0, seed=3)
    run_op(h, ("fill", 50, 1, True))
    image = h.table.view_image()
    patch = h.table.put_many([11, 12, 11, 12], [5, 6, 0, 0])
    h.take(patch)
    h.check(scalar=True)
    assert h.table.view_image() == image
    assert h.table.get(11) == h.table.get(12) == 0


def test_update_touches_one_bucket_and_no_locator_word() -> None:
    h = Harness.new(200, 32, 8, seed=4)
    run_op(h, ("fill", 150, 2, False))
    key = sorted(h.ref)[17]
    patch = h.table.put(key, 12345)
    assert patch.reload is None
    assert patch.othello_reset is None
    assert len(patch.words) == 0
    assert patch.buckets is not None
    assert len(patch.buckets) == 1
    assert int(patch.buckets.buckets[0]) in h.table.geometry.buckets(key)
    h.take(patch)
    h.record(key, 12345)
    h.check(scalar=True)


def test_insert_patch_touches_at_most_a_cuckoo_path() -> None:
    h = Harness.new(200, 32, 0, seed=6)
    rng = random.Random(6)
    for _ in range(190):
        key = rng.getrandbits(63)
        patch = h.table.put(key, 1 + rng.getrandbits(31))
        if patch.reload is None and patch.buckets is not None:
            assert len(patch.buckets) <= MAX_CUCKOO_MOVES + 1
        h.take(patch)
        h.record(key, h.table.get(key))
    h.check(scalar=True)


@pytest.mark.parametrize(("value_bits", "fingerprint_bits"), [(32, 0), (64, 8), (32, 16)])
def test_bulk_build_then_patches(value_bits: int, fingerprint_bits: int) -> None:
    rng = random.Random(value_bits + fingerprint_bits)
    keys = np.array(list({rng.getrandbits(63) for _ in range(3000)}), dtype=np.uint64)
    mask = 2**value_bits - 1
    values = np.array([(rng.getrandbits(64) & mask) or 1 for _ in keys], dtype=np.uint64)
    table = LudoTable.build(
        keys,
        values,
        value_bits=value_bits,
        fingerprint_bits=fingerprint_bits,
        rng=random.Random(1),
    )
    assert table.take_patch().is_empty  # a fresh build owes no patch
    h = Harness(table, LudoView(table.view_image()))
    for k, v in zip(keys.tolist(), values.tolist(), strict=True):
        h.record(k, v)
    h.check(scalar=True)
    run_op(h, ("fill", 400, 3, True))  # past capacity: grows
    run_op(h, ("batch", [("update", i, i) for i in range(100)], True))
    run_op(h, ("batch", [("remove", i * 7, 0) for i in range(100)], False))
    h.check(scalar=True)
    assert h.reloads >= 1


def test_bulk_build_validation_and_capacity() -> None:
    keys = np.array([1, 2, 3], dtype=np.uint64)
    with pytest.raises(ValueError, match="distinct"):
        LudoTable.build(np.array([1, 1], dtype=np.uint64), np.array([1, 2], dtype=np.uint64))
    with pytest.raises(ValueError, match="nonzero"):
        LudoTable.build(keys, np.array([1, 0, 2], dtype=np.uint64))
    table = LudoTable.build(
        keys, np.array([4, 5, 6], dtype=np.uint64), capacity=500, rng=random.Random(0)
    )
    assert table.capacity >= 500
    assert [table.get(k) for k in (1, 2, 3, 4)] == [4, 5, 6, 0]
    empty = LudoTable.build(np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint64))
    assert len(empty) == 0
    assert LudoView(empty.view_image()).lookup(1) == 0


def test_put_validation() -> None:
    table = LudoTable.with_capacity(16, value_bits=32, rng=random.Random(0))
    with pytest.raises(ValueError, match="63-bit"):
        table.put(2**63, 1)
    with pytest.raises(ValueError, match="63-bit"):
        table.put(-1, 1)
    with pytest.raises(ValueError, match="does not fit 32 bits"):
        table.put(1, 2**32)
    with pytest.raises(ValueError, match="63-bit"):
        table.put_many([2**63], [1])
    with pytest.raises(ValueError, match="does not fit 32 bits"):
        table.put_many([1], [2**32])
    with pytest.raises(ValueError, match="equal-length"):
        table.put_many([1, 2], [1])
    assert len(table) == 0
    assert table.take_patch().is_empty


def test_read_only_batches_run_the_kernel_compiled_at_set_up() -> None:
    """Keys decoded from a message buffer are read-only arrays; they must not make numba
    compile a second kernel version on the hot path (a 1.8 s stall on a fresh cache)."""
    from kvcompass.index import kernel
    from kvcompass.index.ludo import compile_write_kernel

    compile_write_kernel()
    before = len(kernel.apply_writes.signatures)  # type: ignore[attr-defined]
    table = LudoTable.with_capacity(64, value_bits=32, rng=random.Random(3))
    keys = np.frombuffer(np.arange(1, 30, dtype=np.uint64).tobytes(), dtype=np.uint64)
    assert not keys.flags.writeable
    ones = np.frombuffer(np.ones(len(keys), dtype=np.uint64).tobytes(), dtype=np.uint64)
    table.write_bits_many(keys, ones, ones)
    assert len(kernel.apply_writes.signatures) == before  # type: ignore[attr-defined]
    assert all(table.get(int(k)) == 1 for k in keys)


def test_write_descriptor_refuses_what_the_kernel_must_not_write_through() -> None:
    """The write kernel reaches a table's arrays by address: a described array must be
    writeable, contiguous and of the type the kernel reads it as."""
    from kvcompass.index import kernel
    from kvcompass.index.kernel import OthelloArrays, TableArrays, write_descriptor

    table = LudoTable.with_capacity(64, rng=random.Random(4))
    arrays: TableArrays = table._t
    othello: OthelloArrays = table._othello.arrays
    # The kernel rebuilds both tuples positionally from the rows: the same order.
    described = [name for name, _ in kernel._DESCRIBED_TABLE]
    assert described == [f for f in TableArrays._fields if f not in ("cells", "fps")]
    assert [name for name, _ in kernel._DESCRIBED_OTHELLO] == list(OthelloArrays._fields)
    assert len(write_descriptor(arrays, othello)) == 2 * (len(arrays) - 2 + len(othello))
    frozen = arrays.alt.copy()
    frozen.setflags(write=False)
    strided = np.zeros(2 * len(arrays.kid), dtype=np.int32)[::2]
    for bad in (
        arrays._replace(alt=frozen),
        arrays._replace(kid=strided),
        arrays._replace(alt=arrays.alt.astype(np.int64)),
    ):
        with pytest.raises(ValueError, match="array"):
            write_descriptor(bad, othello)
