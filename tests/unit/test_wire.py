"""The wire schema: round trips, pinned bytes, validation paths and fuzzing (kvcompass.wire)."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
import random
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from kvcompass.errors import BadInput
from kvcompass.index import LudoTable, LudoView
from kvcompass.index.layout import Tier
from kvcompass.index.patches import BucketImages, OthelloReset, TablePatch, WordImages
from kvcompass.wire import (
    MAX_ITEMS,
    DeadLetter,
    EventKind,
    KVEvent,
    KVEventBatch,
    Message,
    PatchBatch,
    QueueVector,
    TablePatchWire,
    TableReload,
    WireError,
    WireMessage,
    decode,
    encode,
)

U32 = 2**32 - 1
I63 = 2**63 - 1
U64 = 2**64 - 1
NOW = 1_700_000_000_123_456_789

# -- comparing messages that hold numpy arrays ---------------------------------------


def same_array(a: NDArray[Any] | None, b: NDArray[Any] | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


def same_patch(a: TablePatch | TableReload, b: TablePatch | TableReload) -> bool:
    if isinstance(a, TableReload) or isinstance(b, TableReload):
        return a == b
    if a.generation != b.generation or a.reload != b.reload:
        return False
    if (a.buckets is None) != (b.buckets is None):
        return False
    if a.buckets is not None and b.buckets is not None:
        x, y = a.buckets, b.buckets
        if not (
            np.array_equal(x.buckets, y.buckets)
            and same_array(x.seeds, y.seeds)
            and same_array(x.cells, y.cells)
            and same_array(x.fingerprints, y.fingerprints)
        ):
            return False
    if not np.array_equal(a.words.indices, b.words.indices):
        return False
    if not np.array_equal(a.words.values, b.words.values):
        return False
    ra, rb = a.othello_reset, b.othello_reset
    if ra is None or rb is None:
        return ra is None and rb is None
    return (ra.othello_seed, ra.words) == (rb.othello_seed, rb.words)


def same(a: Message, b: Message) -> bool:
    if isinstance(a, PatchBatch) and isinstance(b, PatchBatch):
        head = ("shard", "epoch", "seq", "events_from", "events_to", "produced_at_ns", "owner")
        return (
            all(getattr(a, f) == getattr(b, f) for f in head)
            and len(a.tables) == len(b.tables)
            and all(
                x.table_id == y.table_id and same_patch(x.patch, y.patch)
                for x, y in zip(a.tables, b.tables, strict=True)
            )
        )
    return a == b


# -- fixed messages -------------------------------------------------------------------


def u32(*v: int) -> NDArray[np.uint32]:
    return np.array(v, dtype=np.uint32)


def u64(*v: int) -> NDArray[np.uint64]:
    return np.array(v, dtype=np.uint64)


def events_msg() -> KVEventBatch:
    return KVEventBatch(
        worker_id="us-east/w3",
        region="us-east",
        worker_seq=42,
        shard=7,
        sent_at_ns=NOW,
        events=(
            KVEvent(EventKind.ADMIT, Tier.VRAM, ((16, 0x0123456789ABCDEF), (32, I63))),
            KVEvent(EventKind.TIER, Tier.DRAM, ((16, 0x0123456789ABCDEF),)),
            KVEvent(EventKind.EVICT, Tier.ABSENT, ((48, 0),)),
            KVEvent(EventKind.ADMIT, Tier.DRAM, ((64, 1), (80, 2), (96, 3))),
        ),
        worker_incarnation=0x5EED_0000_0001,
    )


def patch_msg() -> PatchBatch:
    with_fingerprints = TablePatch(
        generation=5,
        buckets=BucketImages(
            buckets=np.array([2, 9], dtype=np.int64),
            seeds=np.array([1, 255], dtype=np.uint8),
            cells=np.array([[1, 0, 0, U32], [0, 2, 0, 0]], dtype=np.uint32),
            fingerprints=np.array([[7, 0, 0, 255], [0, 9, 0, 0]], dtype=np.uint8),
        ),
        words=WordImages(np.array([4, 1000], dtype=np.int64), np.array([U64, 1], np.uint64)),
        othello_reset=OthelloReset(0xFEDCBA9876543210, bytes(range(16))),
    )
    wide = TablePatch(
        generation=I63,
        buckets=BucketImages(
            buckets=np.array([U32], dtype=np.int64),
            seeds=np.array([0], dtype=np.uint8),
            cells=np.array([[U64, 0, 1 << 40, 0]], dtype=np.uint64),
            fingerprints=np.array([[0xFFFF, 0, 0x1234, 0]], dtype=np.uint16),
        ),
    )
    return PatchBatch(
        shard=3,
        epoch=2,
        seq=17,
        events_from=100,
        events_to=131,
        produced_at_ns=NOW,
        tables=(
            TablePatchWire(0, with_fingerprints),
            TablePatchWire(1, wide),
            TablePatchWire(2, TableReload(6, "kvc:snap:3:e2:t2:g6")),
        ),
        owner="kvc-mu/kvc:snap",
    )


def queue_msg() -> QueueVector:
    return QueueVector("eu-west", NOW, 9, ((0, 0.0), (3, 12.5), (U32, 1e9)), to=("us", "asia"))


def dead_letter_msg() -> DeadLetter:
    return DeadLetter(
        topic="kvc.events",
        partition=5,
        offset=I63,
        reason="events[3].tier: expected 0..2, got 7",
        payload=b"\x81\xa1t\xa3bad\x00\xff",
    )


FIXED: dict[str, Callable[[], Message]] = {
    "kv_events": events_msg,
    "patch_batch": patch_msg,
    "queue_vector": queue_msg,
    "dead_letter": dead_letter_msg,
}

# Pinned encodings. A change here is a wire-format change: bump the schema version (minor
# for an added optional field, major otherwise) and say so in the commit.
GOLDEN = {
    "dead_letter": (
        "87a174ab646561645f6c6574746572a176920100a27470aa6b76632e6576656e7473a2707405a26f"
        "66cf7fffffffffffffffa27273d9246576656e74735b335d2e746965723a20657870656374656420"
        "302e2e322c20676f742037a2706cc40981a174a362616400ff"
    ),
    "kv_events": (  # v2.1: columnar events, worker incarnation
        "8da174a96b765f6576656e7473a176920201a177aa75732d656173742f7733a172a775732d656173"
        "74a1712aa17307a27473cf17979cfe3d85cd15a27769cf00005eed00000001a16bc40401020301a2"
        "7472c40401020002a16ec41002000000010000000100000003000000a26c6ec41c10000000200000"
        "001000000030000000400000005000000060000000a26b79c438efcdab8967452301ffffffffffff"
        "ff7fefcdab8967452301000000000000000001000000000000000200000000000000030000000000"
        "0000"
    ),
    "patch_batch": (  # v1.1: owner
        "8aa174ab70617463685f6261746368a176920101a17303a2657002a17111a2656664a26574cc83a2"
        "7473cf17979cfe3d85cd15a274629385a2696400a16705a16286a169c4080200000009000000a173"
        "c40201ffa2766220a163c420010000000000000000000000ffffffff000000000200000000000000"
        "00000000a2666208a166c408070000ff00090000a17782a169c40804000000e8030000a178c410ff"
        "ffffffffffffff0100000000000000a16f82a173cffedcba9876543210a178c41000010203040506"
        "0708090a0b0c0d0e0f83a2696401a167cf7fffffffffffffffa16286a169c404ffffffffa173c401"
        "00a2766240a163c420ffffffffffffffff0000000000000000000000000001000000000000000000"
        "00a2666210a166c408ffff00003412000083a2696402a16706a2736bb36b76633a736e61703a333a"
        "65323a74323a6736a26f77af6b76632d6d752f6b76633a736e6170"
    ),
    "queue_vector": (  # v1.1: destination regions
        "88a174ac71756575655f766563746f72a176920101a172a765752d77657374a27473cf17979cfe3d"
        "85cd15a17109a27769c40c0000000003000000ffffffffa2716dc418000000000000000000000000"
        "000029400000000065cdcd41a2746f92a27573a461736961"
    ),
}
# The same messages in the previous minor versions, written before the optional
# incarnation / owner / to fields: they still decode, with the fields' defaults.
GOLDEN_OLDER_MINOR = {
    "queue_vector": (  # v1.0: no "to"
        "87a174ac71756575655f766563746f72a176920100a172a765752d77657374a27473cf17979cfe3d"
        "85cd15a17109a27769c40c0000000003000000ffffffffa2716dc418000000000000000000000000"
        "000029400000000065cdcd41"
    ),
    "kv_events": (  # v2.0: no "wi"
        "8ca174a96b765f6576656e7473a176920200a177aa75732d656173742f7733a172a775732d656173"
        "74a1712aa17307a27473cf17979cfe3d85cd15a16bc40401020301a27472c40401020002a16ec410"
        "02000000010000000100000003000000a26c6ec41c10000000200000001000000030000000400000"
        "005000000060000000a26b79c438efcdab8967452301ffffffffffffff7fefcdab89674523010000"
        "000000000000010000000000000002000000000000000300000000000000"
    ),
    "patch_batch": (  # v1.0: no "ow"
        "89a174ab70617463685f6261746368a176920100a17303a2657002a17111a2656664a26574cc83a2"
        "7473cf17979cfe3d85cd15a274629385a2696400a16705a16286a169c4080200000009000000a173"
        "c40201ffa2766220a163c420010000000000000000000000ffffffff000000000200000000000000"
        "00000000a2666208a166c408070000ff00090000a17782a169c40804000000e8030000a178c410ff"
        "ffffffffffffff0100000000000000a16f82a173cffedcba9876543210a178c41000010203040506"
        "0708090a0b0c0d0e0f83a2696401a167cf7fffffffffffffffa16286a169c404ffffffffa173c401"
        "00a2766240a163c420ffffffffffffffff0000000000000000000000000001000000000000000000"
        "00a2666210a166c408ffff00003412000083a2696402a16706a2736bb36b76633a736e61703a333a"
        "65323a74323a6736"
    ),
}
# The same events_msg() as kv_events 1.0 (a map per event), which this reader refuses.
KV_EVENTS_V1 = (
    "88a174a96b765f6576656e7473a176920100a177aa75732d656173742f7733a172a775732d656173"
    "74a1712aa17307a27473cf17979cfe3d85cd15a1659484a16b01a2747201a26c6ec4081000000020"
    "000000a26b79c410efcdab8967452301ffffffffffffff7f84a16b02a2747202a26c6ec404100000"
    "00a26b79c408efcdab896745230184a16b03a2747200a26c6ec40430000000a26b79c40800000000"
    "0000000084a16b01a2747202a26c6ec40c400000005000000060000000a26b79c418010000000000"
    "000002000000000000000300000000000000"
)
VERSIONS = {"kv_events": [2, 1], "patch_batch": [1, 1], "queue_vector": [1, 1]}
VERSIONS["dead_letter"] = [1, 0]


@pytest.mark.parametrize("tag", sorted(FIXED))
def test_golden_bytes(tag: str) -> None:
    msg = FIXED[tag]()
    assert encode(msg).hex() == GOLDEN[tag]
    assert same(decode(bytes.fromhex(GOLDEN[tag])), msg)


@pytest.mark.parametrize("tag", sorted(FIXED))
def test_fixed_messages_round_trip(tag: str) -> None:
    msg = FIXED[tag]()
    data = msg.to_bytes()
    assert data == encode(msg)
    assert same(decode(data), msg)
    assert same(type(msg).from_bytes(data), msg)
    assert same(decode(bytearray(data), type(msg)), msg)
    assert type(decode(memoryview(data), WireMessage)) is type(msg)
    raw = msgpack.unpackb(data)
    assert raw["t"] == tag
    assert raw["v"] == VERSIONS[tag] == [type(msg).MAJOR, type(msg).MINOR]


@pytest.mark.parametrize("tag", sorted(GOLDEN_OLDER_MINOR))
def test_older_minor_versions_decode_with_the_new_fields_defaulted(tag: str) -> None:
    msg = decode(bytes.fromhex(GOLDEN_OLDER_MINOR[tag]))
    every: dict[str, dict[str, object]] = {
        "kv_events": {"worker_incarnation": 0},
        "patch_batch": {"owner": ""},
        "queue_vector": {"to": ()},
    }
    defaults = every[tag]
    for name, value in defaults.items():
        assert getattr(msg, name) == value
        assert getattr(FIXED[tag](), name) != value  # the fixed message sets it
    if isinstance(msg, KVEventBatch):
        assert msg == rebuilt(events_msg(), worker_incarnation=0)
    elif isinstance(msg, QueueVector):
        assert msg == dataclasses.replace(queue_msg(), to=())
    else:
        assert same(msg, dataclasses.replace(patch_msg(), owner=""))


def test_wire_errors_are_bad_input() -> None:
    with pytest.raises(BadInput):
        decode(b"\xc1")
    assert issubclass(WireError, ValueError)


def test_kv_events_1_0_is_refused_naming_the_version() -> None:
    with pytest.raises(WireError) as info:
        decode(bytes.fromhex(KV_EVENTS_V1))
    assert str(info.value) == "version: unsupported 'kv_events' version 1.0 (this reader: 2.x)"


# -- round trips ----------------------------------------------------------------------

texts = st.text(min_size=1, max_size=12)
i63 = st.integers(0, I63)
kind_tiers = st.sampled_from(
    [
        (EventKind.ADMIT, Tier.VRAM),
        (EventKind.ADMIT, Tier.DRAM),
        (EventKind.TIER, Tier.VRAM),
        (EventKind.TIER, Tier.DRAM),
        (EventKind.EVICT, Tier.ABSENT),
    ]
)
key_pairs = st.lists(st.tuples(st.integers(1, U32), i63), max_size=40).map(tuple)
kv_events = st.builds(lambda kt, keys: KVEvent(kt[0], kt[1], keys), kind_tiers, key_pairs)
kv_batches = st.builds(
    KVEventBatch,
    worker_id=texts,
    region=texts,
    worker_seq=i63,
    shard=st.integers(0, 2**31 - 1),
    sent_at_ns=i63,
    events=st.lists(kv_events, max_size=6).map(tuple),
    worker_incarnation=i63,
)


@st.composite
def table_patches(draw: st.DrawFn) -> TablePatch | TableReload:
    generation = draw(i63)
    if draw(st.booleans()) and draw(st.booleans()):
        return TableReload(generation, draw(texts))
    buckets = None
    if draw(st.booleans()):
        n = draw(st.integers(0, 12))
        cell_type = draw(st.sampled_from([np.uint32, np.uint64]))
        cell_max = U32 if cell_type is np.uint32 else U64
        fp_type = draw(st.sampled_from([None, np.uint8, np.uint16]))
        cells = draw(st.lists(st.integers(0, cell_max), min_size=4 * n, max_size=4 * n))
        fps = None
        if fp_type is not None:
            fp_max = 255 if fp_type is np.uint8 else 65535
            values = draw(st.lists(st.integers(0, fp_max), min_size=4 * n, max_size=4 * n))
            fps = np.array(values, dtype=fp_type).reshape(n, 4)
        buckets = BucketImages(
            np.array(draw(st.lists(st.integers(0, U32), min_size=n, max_size=n)), np.int64),
            np.array(draw(st.lists(st.integers(0, 255), min_size=n, max_size=n)), np.uint8),
            np.array(cells, dtype=cell_type).reshape(n, 4),
            fps,
        )
    m = draw(st.integers(0, 6))
    words = WordImages(
        np.array(draw(st.lists(st.integers(0, U32), min_size=m, max_size=m)), np.int64),
        np.array(draw(st.lists(st.integers(0, U64), min_size=m, max_size=m)), np.uint64),
    )
    reset = None
    if draw(st.booleans()):
        size = 8 * draw(st.integers(0, 4))
        reset = OthelloReset(
            draw(st.integers(0, U64)), draw(st.binary(min_size=size, max_size=size))
        )
    return TablePatch(generation, buckets, words, reset)


@st.composite
def patch_batches(draw: st.DrawFn) -> PatchBatch:
    first = draw(st.integers(0, I63))
    last = draw(st.integers(first - 1, I63))
    tables = draw(st.lists(st.builds(TablePatchWire, st.integers(0, U32), table_patches())))
    return PatchBatch(
        shard=draw(st.integers(0, 2**31 - 1)),
        epoch=draw(i63),
        seq=draw(i63),
        events_from=first,
        events_to=last,
        produced_at_ns=draw(i63),
        tables=tuple(tables[:5]),
        owner=draw(st.text(max_size=200)),
    )


queue_vectors = st.builds(
    QueueVector,
    region=texts,
    sent_at_ns=i63,
    seq=i63,
    queues=st.dictionaries(
        st.integers(0, U32),
        st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False),
        max_size=20,
    ).map(lambda d: tuple(d.items())),
)
dead_letters = st.builds(
    DeadLetter,
    topic=texts,
    partition=st.integers(0, 2**31 - 1),
    offset=i63,
    reason=st.text(min_size=1, max_size=200),
    payload=st.binary(max_size=300),
)
messages = st.one_of(kv_batches, patch_batches(), queue_vectors, dead_letters)


@given(messages)
def test_any_message_round_trips(msg: Message) -> None:
    data = encode(msg)
    back = decode(data)
    assert type(back) is type(msg)
    assert same(back, msg)
    assert encode(back) == data  # the encoding is canonical


def test_big_event_batch_round_trips() -> None:
    rng = random.Random(7)
    events = tuple(
        KVEvent(
            EventKind.ADMIT if i % 2 else EventKind.EVICT,
            Tier.DRAM if i % 2 else Tier.ABSENT,
            tuple((rng.randint(1, U32), rng.getrandbits(63)) for _ in range(10_000)),
        )
        for i in range(10)
    )
    batch = KVEventBatch("w", "r", I63, 2**31 - 1, I63, events)
    assert decode(encode(batch), KVEventBatch) == batch


def test_big_patch_batch_round_trips() -> None:
    rng = np.random.default_rng(3)
    n = 50_000
    patch = TablePatch(
        I63,
        BucketImages(
            rng.integers(0, U32, n, endpoint=True),
            rng.integers(0, 256, n, dtype=np.uint8),
            rng.integers(0, U64, (n, 4), dtype=np.uint64, endpoint=True),
            rng.integers(0, 65536, (n, 4), dtype=np.uint16),
        ),
        WordImages(np.arange(n, dtype=np.int64), rng.integers(0, U64, n, np.uint64, True)),
    )
    batch = PatchBatch(0, I63, I63, 0, I63, I63, (TablePatchWire(U32, patch),))
    assert same(decode(encode(batch)), batch)


def test_extreme_values_round_trip() -> None:
    key_max = KVEvent(EventKind.ADMIT, Tier.VRAM, ((U32, I63), (1, 0)))
    batch = KVEventBatch("w", "r", I63, 2**31 - 1, I63, (key_max,))
    assert decode(encode(batch)) == batch
    low = PatchBatch(0, 0, 0, 0, -1, 0)
    assert same(decode(encode(low)), low)
    tiny = QueueVector("r", 0, 0, ((0, 5e-324), (1, 1.7976931348623157e308)))
    assert decode(encode(tiny)) == tiny


def test_constructors_normalise_numpy_ints_and_lists() -> None:
    event = KVEvent(1, 2, [[np.uint32(16), np.int64(5)]])  # type: ignore[arg-type]
    assert event.kind is EventKind.ADMIT
    assert event.tier is Tier.DRAM
    assert event.keys == ((16, 5),)
    assert type(event.keys[0][0]) is int
    batch = KVEventBatch("w", "r", np.int64(3), np.uint16(1), 0, [event])  # type: ignore[arg-type]
    assert type(batch.worker_seq) is int
    assert batch.events == (event,)
    assert decode(encode(batch)) == batch
    queues = QueueVector("r", 0, 0, [[np.uint8(2), 3]])  # type: ignore[arg-type]
    assert queues.queues == ((2, 3.0),)
    assert type(queues.queues[0][1]) is float
    letter = DeadLetter("t", 0, 0, "why", bytearray(b"x"))  # type: ignore[arg-type]
    assert letter.payload == b"x"
    assert type(letter.payload) is bytes


def test_subclasses_of_builtins_are_stored_as_the_builtins() -> None:
    class Region(StrEnum):
        US = "us-east"

    class Blob(bytes):
        pass

    batch = KVEventBatch("w", Region.US, 0, 0, 0)
    assert type(batch.region) is str
    assert decode(encode(batch)) == batch
    letter = DeadLetter(Region.US, 0, 0, "why", Blob(b"x"))
    assert type(letter.topic) is str
    assert type(letter.payload) is bytes


# -- event batches as columns ---------------------------------------------------------


def columns_of(batch: KVEventBatch) -> dict[str, NDArray[Any]]:
    return {
        "kinds": batch.kind_array,
        "tiers": batch.tier_array,
        "counts": batch.count_array,
        "lengths": batch.length_array,
        "keys": batch.key_array,
    }


def rebuilt(batch: KVEventBatch, **change: Any) -> KVEventBatch:
    """``batch`` built again from its columns (some replaced, or its incarnation)."""
    header = (batch.worker_id, batch.region, batch.worker_seq, batch.shard, batch.sent_at_ns)
    incarnation = change.pop("worker_incarnation", batch.worker_incarnation)
    columns = columns_of(batch) | change
    return KVEventBatch.from_columns(*header, **columns, worker_incarnation=incarnation)


@given(kv_batches)
def test_columns_and_events_describe_the_same_batch(batch: KVEventBatch) -> None:
    events = batch.events
    assert batch.kind_array.tolist() == [int(e.kind) for e in events]
    assert batch.tier_array.tolist() == [int(e.tier) for e in events]
    assert batch.count_array.tolist() == [len(e.keys) for e in events]
    pairs = [pair for e in events for pair in e.keys]
    assert list(zip(batch.length_array.tolist(), batch.key_array.tolist(), strict=True)) == pairs
    assert batch.key_tiers().tolist() == [int(e.tier) for e in events for _ in e.keys]
    arrays = (batch.kind_array, batch.tier_array, batch.count_array)
    assert batch.columns.arrays() == (*arrays, batch.length_array, batch.key_array)
    assert [batch.event_of_key(j) for j in range(batch.n_keys)] == [
        i for i, e in enumerate(events) for _ in e.keys
    ]
    decoded = decode(encode(batch), KVEventBatch)
    assert decoded == batch
    assert decoded.events == events  # built from the columns, on first use
    assert rebuilt(decoded) == batch
    assert hash(decoded) == hash(batch)
    assert pickle.loads(pickle.dumps(decoded)) == batch


def test_columns_have_wire_dtypes_and_are_read_only() -> None:
    for batch in (events_msg(), decode(encode(events_msg()), KVEventBatch)):
        dtypes = {name: a.dtype for name, a in columns_of(batch).items()}
        assert dtypes == {
            "kinds": np.uint8,
            "tiers": np.uint8,
            "counts": np.uint32,
            "lengths": np.uint32,
            "keys": np.uint64,
        }
        for name, column in columns_of(batch).items():
            assert not column.flags.writeable, name
        with pytest.raises(AttributeError):
            batch.shard = 3
    assert "events=4, keys=7" in repr(events_msg())


def test_from_columns_copies_its_arrays() -> None:
    keys = u64(5, 6)
    batch = KVEventBatch.from_columns(
        "w", "r", 0, 0, 0, kinds=np.array([1], np.uint8), tiers=np.array([2], np.uint8),
        counts=u32(2), lengths=u32(16, 32), keys=keys,
    )  # fmt: skip
    keys[0] = 2**63
    assert batch.key_array.tolist() == [5, 6]
    assert batch.events == (KVEvent(EventKind.ADMIT, Tier.DRAM, ((16, 5), (32, 6))),)


def test_event_of_key_refuses_an_index_out_of_range() -> None:
    with pytest.raises(IndexError):
        events_msg().event_of_key(7)


FROM_COLUMNS_FAILURES: list[tuple[str, dict[str, Any], str, str]] = [
    ("int64 kinds", {"kinds": np.array([1, 2, 3, 1])}, "events.kind", "expected uint8 values"),
    ("list tiers", {"tiers": [1, 2, 0, 2]}, "events.tier", "expected a numpy array, got list"),
    ("2-D keys", {"keys": u64(1, 2).reshape(1, 2)}, "events.keys.key", "expected shape (n,)"),
    ("uint64 counts", {"counts": u64(2, 1, 1, 3)}, "events.key_count", "expected uint32 values"),
    ("bad tier", {"tiers": np.array([1, 2, 0, 3], np.uint8)}, "events[3].tier", "got 3"),
    ("counts", {"counts": u32(2, 1, 1, 2)}, "events", "key counts add up to 6"),
    ("length 0", {"lengths": u32(1, 1, 1, 1, 1, 1, 0)}, "events[3].keys[2].length", "got 0"),
]


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [f[1:] for f in FROM_COLUMNS_FAILURES],
    ids=[f[0] for f in FROM_COLUMNS_FAILURES],
)
def test_from_columns_checks_like_decode(change: dict[str, Any], field: str, text: str) -> None:
    with pytest.raises(WireError) as info:
        rebuilt(events_msg(), **change)
    assert info.value.field == field
    assert text in info.value.message


def test_the_fast_event_check_agrees_with_the_scalar_checks() -> None:
    from kvcompass.wire._event_columns import events_valid

    for kind in range(256):
        tiers = bytes(range(256))
        fast = [events_valid(bytes([kind]), bytes([tier])) for tier in tiers]
        slow = []
        for tier in tiers:
            try:
                KVEvent(kind, tier)  # type: ignore[arg-type]
            except WireError:
                slow.append(False)
            else:
                slow.append(True)
        assert fast == slow, kind


@st.composite
def raw_columns(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """Event columns, often valid, often wrong in a small way (a value or a count)."""
    n = draw(st.integers(0, 5))
    counts = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    n_lengths = max(0, sum(counts) + draw(st.sampled_from([0, 0, 0, 0, -1, 1])))
    n_keys = max(0, n_lengths + draw(st.sampled_from([0, 0, 0, 0, -1, 1])))
    return (
        draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)),
        draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)),
        counts,
        draw(st.lists(st.integers(0, 3), min_size=n_lengths, max_size=n_lengths)),
        draw(st.lists(st.sampled_from([0, 1, I63, 2**63, U64]), min_size=n_keys, max_size=n_keys)),
    )


def per_event(
    kinds: list[int], tiers: list[int], counts: list[int], lengths: list[int], keys: list[int]
) -> tuple[KVEvent, ...]:
    """The events the columns stand for, checked one by one by KVEvent (the reference)."""
    if not len(lengths) == len(keys) == sum(counts):
        raise WireError("key counts, lengths and keys disagree")
    pairs = list(zip(lengths, keys, strict=True))
    ends = np.cumsum(counts).tolist()
    starts = [0, *ends][: len(ends)]
    return tuple(
        KVEvent(k, t, tuple(pairs[a:b]))  # type: ignore[arg-type]
        for k, t, a, b in zip(kinds, tiers, starts, ends, strict=True)
    )


def raw_with_columns(
    columns: tuple[list[int], list[int], list[int], list[int], list[int]],
) -> dict[str, Any]:
    """An event batch message's map with these raw columns."""
    kinds, tiers, counts, lengths, keys = columns
    raw = raw_of(events_msg())
    raw |= {"k": bytes(kinds), "tr": bytes(tiers), "n": u32(*counts).tobytes()}
    raw |= {"ln": u32(*lengths).tobytes(), "ky": u64(*keys).tobytes()}
    return raw


@given(raw_columns())
@settings(max_examples=300)
def test_decoded_columns_agree_with_the_per_event_checks(
    columns: tuple[list[int], list[int], list[int], list[int], list[int]],
) -> None:
    raw = raw_with_columns(columns)
    try:
        want = per_event(*columns)
    except WireError:
        with pytest.raises(WireError, match=r"^events"):
            decode(pack(raw))
        return
    assert decode(pack(raw), KVEventBatch).events == want


# -- decoded patches drive a real view ------------------------------------------------


@pytest.mark.parametrize(("value_bits", "fingerprint_bits"), [(32, 0), (64, 12), (32, 8)])
def test_decoded_patches_bring_a_view_to_the_table_state(
    value_bits: int, fingerprint_bits: int
) -> None:
    rng = random.Random(value_bits + fingerprint_bits)
    table = LudoTable.with_capacity(
        64, value_bits=value_bits, fingerprint_bits=fingerprint_bits, rng=rng
    )
    view = LudoView(table.view_image())
    snapshots: dict[str, bytes] = {}  # stands in for Redis
    keys: list[int] = []
    for seq in range(12):  # grows past the initial capacity: reload patches happen
        new = [rng.getrandbits(63) for _ in range(40)]
        keys += new
        patch = table.put_many(new, [rng.randint(1, 2**value_bits - 1) for _ in new])
        wire_patch: TablePatch | TableReload = patch
        if patch.reload is not None:
            key = f"kvc:snap:0:t0:g{patch.generation}"
            snapshots[key] = patch.reload
            wire_patch = TableReload(patch.generation, key)
        batch = PatchBatch(0, 1, seq, seq, seq, NOW, (TablePatchWire(0, wire_patch),))
        for table_patch in decode(encode(batch), PatchBatch).tables:
            received = table_patch.patch
            if isinstance(received, TableReload):
                received = TablePatch(received.generation, reload=snapshots[received.snapshot_key])
            view.apply(received)
    assert snapshots, "the table never grew: the reload path went untested"
    probe = np.array(keys, dtype=np.uint64)
    want = np.array([table.get(k) for k in keys], dtype=np.uint64)
    assert np.array_equal(view.lookup_batch(probe).astype(np.uint64), want)


# -- sizes ----------------------------------------------------------------------------


def test_encoding_is_compact() -> None:
    rng = random.Random(1)
    pairs = tuple((16 * rng.randint(1, 512), rng.getrandbits(63)) for _ in range(1000))
    batch = KVEventBatch("us-east/w3", "us-east", 1, 7, NOW, (KVEvent(1, 1, pairs),))  # type: ignore[arg-type]
    assert len(encode(batch)) / 1000 < 12.1  # 4 + 8 bytes a key, plus a fixed header
    n = 1000
    images = BucketImages(
        np.arange(n, dtype=np.int64) * 37,
        np.zeros(n, np.uint8),
        np.ones((n, 4), np.uint32),
    )
    patches = PatchBatch(7, 1, 1, 0, 0, NOW, (TablePatchWire(0, TablePatch(1, images)),))
    assert len(encode(patches)) / n < 21.1  # 4 (id) + 1 (seed) + 4 × 4 (cells)


# -- evolution ------------------------------------------------------------------------


def raw_of(msg: Message) -> dict[str, Any]:
    raw: dict[str, Any] = msgpack.unpackb(encode(msg))
    return raw


def pack(raw: object) -> bytes:
    data: bytes = msgpack.packb(raw, use_bin_type=True)
    return data


@pytest.mark.parametrize("tag", sorted(FIXED))
def test_newer_minor_version_with_extra_fields_decodes(tag: str) -> None:
    msg = FIXED[tag]()
    raw = raw_of(msg)
    raw["v"] = [type(msg).MAJOR, 7]
    raw["zz"] = {"added": [1, 2, 3], "in": b"1.7"}
    raw["x9"] = None
    for item in raw.get("tb", []):
        item["new"] = "ignored"
        for sub in ("b", "w", "o"):
            if sub in item:
                item[sub]["more"] = 1.5
    assert same(decode(pack(raw)), msg)


@pytest.mark.parametrize("tag", sorted(FIXED))
def test_newer_major_version_is_refused(tag: str) -> None:
    msg = FIXED[tag]()
    raw = raw_of(msg)
    newer = type(msg).MAJOR + 1
    raw["v"] = [newer, 0]
    with pytest.raises(WireError, match=rf"^version: .* major version {newer} is newer") as info:
        decode(pack(raw))
    assert info.value.field == "version"


def test_unknown_tag_is_refused() -> None:
    raw = raw_of(queue_msg())
    raw["t"] = "queue_vector_v2"
    with pytest.raises(WireError, match=r"^tag: unknown message tag 'queue_vector_v2'$"):
        decode(pack(raw))


def test_expected_type_mismatch_is_refused() -> None:
    with pytest.raises(WireError, match=r"^tag: expected a 'patch_batch' message, got 'kv_events'"):
        decode(encode(events_msg()), PatchBatch)
    with pytest.raises(WireError, match=r"^tag: expected a 'dead_letter'"):
        DeadLetter.from_bytes(queue_msg().to_bytes())


# -- validation: every failure names its field ----------------------------------------

Edit = Callable[[dict[str, Any]], None]


def put(*path: Any, value: Any) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        node: Any = raw
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value

    return edit


def drop(*path: Any) -> Edit:
    def edit(raw: dict[str, Any]) -> None:
        node: Any = raw
        for step in path[:-1]:
            node = node[step]
        del node[path[-1]]

    return edit


BAD = 2**64 - 1
# (message, edit of its raw map, field the error names, text the error contains)
DECODE_FAILURES: list[tuple[str, Edit, str | None, str]] = [
    # envelope
    ("kv_events", drop("t"), "tag", "missing required field 't'"),
    ("kv_events", put("t", value=1), "tag", "expected str, got int"),
    ("kv_events", drop("v"), "version", "missing required field 'v'"),
    ("kv_events", put("v", value=1), "version", "expected [major, minor] ints"),
    ("kv_events", put("v", value=[1]), "version", "expected [major, minor] ints"),
    ("kv_events", put("v", value=[1, "0"]), "version", "expected [major, minor] ints"),
    ("kv_events", put("v", value=[0, 9]), "version", "unsupported 'kv_events' version 0.9"),
    ("kv_events", put("v", value=[1, -1]), "version", "unsupported"),
    # KVEventBatch
    ("kv_events", drop("w"), "worker_id", "missing required field 'w'"),
    ("kv_events", put("w", value=b"w3"), "worker_id", "expected str, got bytes"),
    ("kv_events", put("w", value=""), "worker_id", "expected a non-empty string"),
    ("kv_events", put("r", value=None), "region", "expected str, got None"),
    ("kv_events", put("q", value=-1), "worker_seq", "expected 0..2^63-1, got -1"),
    ("kv_events", put("q", value=BAD), "worker_seq", f"expected 0..2^63-1, got {BAD}"),
    ("kv_events", put("q", value=True), "worker_seq", "expected int, got bool"),
    ("kv_events", put("s", value=2**31), "shard", "expected 0..2^31-1, got 2147483648"),
    ("kv_events", put("ts", value=1.5), "sent_at_ns", "expected int, got float"),
    ("kv_events", put("wi", value=-1), "worker_incarnation", "expected 0..2^63-1, got -1"),
    ("kv_events", put("wi", value="x"), "worker_incarnation", "expected int, got str"),
    # KVEventBatch columns (events_msg: kinds 1 2 3 1, tiers 1 2 0 2, key counts 2 1 1 3)
    ("kv_events", put("v", value=[1, 0]), "version", "unsupported 'kv_events' version 1.0"),
    ("kv_events", drop("k"), "events.kind", "missing required field 'k'"),
    ("kv_events", put("k", value=[1, 2, 3, 1]), "events.kind", "expected bytes, got list"),
    ("kv_events", put("tr", value="x"), "events.tier", "expected bytes, got str"),
    ("kv_events", drop("n"), "events.key_count", "missing required field 'n'"),
    ("kv_events", put("n", value=b"\0" * 15), "events.key_count", "15 bytes is not a whole"),
    ("kv_events", put("ln", value=b"\x01\0\0"), "events.keys.length", "3 bytes is not"),
    ("kv_events", put("ky", value=b"\0" * 9), "events.keys.key", "9 bytes is not"),
    ("kv_events", drop("ky"), "events.keys.key", "missing required field 'ky'"),
    ("kv_events", put("k", value=b"\1" * 65537), "events", "65537 items exceed the limit"),
    ("kv_events", put("tr", value=b"\1\2\0"), "events", "4 kinds, 3 tiers and 4 key counts"),
    ("kv_events", put("n", value=u32(2, 1, 1).tobytes()), "events", "and 3 key counts"),
    ("kv_events", put("ln", value=u32(16, 32).tobytes()), "events.keys", "2 lengths but 7 keys"),
    (
        "kv_events",
        put("n", value=u32(2, 1, 1, 2).tobytes()),
        "events",
        "key counts add up to 6, but there are 7 keys",
    ),
    (
        "kv_events",
        put("n", value=u32(2, 1, 1, U32).tobytes()),
        "events",
        f"key counts add up to {4 + U32}, but",
    ),
    ("kv_events", put("tr", value=b"\1\2\0\7"), "events[3].tier", "expected 0..2, got 7"),
    ("kv_events", put("tr", value=b"\1\7\1\7"), "events[1].tier", "expected 0..2, got 7"),
    ("kv_events", put("k", value=b"\1\x09\3\1"), "events[1].kind", "expected 1..3, got 9"),
    ("kv_events", put("k", value=b"\1\0\3\1"), "events[1].kind", "expected 1..3, got 0"),
    ("kv_events", put("k", value=b"\1\2\3\xff"), "events[3].kind", "expected 1..3, got 255"),
    ("kv_events", put("tr", value=b"\1\2\1\2"), "events[2].tier", "EVICT carries tier 0, got 1"),
    ("kv_events", put("tr", value=b"\0\2\0\2"), "events[0].tier", "ADMIT needs tier 1..2"),
    ("kv_events", put("tr", value=b"\1\0\0\2"), "events[1].tier", "TIER needs tier 1..2"),
    (
        "kv_events",
        put("ln", value=u32(16, 0, 16, 48, 64, 80, 96).tobytes()),
        "events[0].keys[1].length",
        "expected 1..2^32-1, got 0",
    ),
    (
        "kv_events",
        put("ln", value=u32(16, 32, 16, 48, 64, 80, 0).tobytes()),
        "events[3].keys[2].length",
        "expected 1..2^32-1, got 0",
    ),
    (
        "kv_events",
        put("ky", value=u64(1, 2, 3, 4, 5, U64, 7).tobytes()),
        "events[3].keys[1].key",
        f"expected 0..2^63-1, got {U64}",
    ),
    (
        "kv_events",
        put("ky", value=u64(1, 2, 2**63, 4, 5, 6, 7).tobytes()),
        "events[1].keys[0].key",
        f"expected 0..2^63-1, got {2**63}",
    ),
    (  # the first bad key wins, whichever column it is bad in
        "kv_events",
        put("ky", value=u64(1, 2, 3, 4, 2**63, 6, 7).tobytes()),
        "events[3].keys[0].key",
        "expected 0..2^63-1",
    ),
    # PatchBatch
    ("patch_batch", put("s", value=-3), "shard", "expected 0..2^31-1, got -3"),
    ("patch_batch", put("ep", value="2"), "epoch", "expected int, got str"),
    ("patch_batch", drop("q"), "seq", "missing required field 'q'"),
    ("patch_batch", put("ef", value=-1), "events_from", "expected 0..2^63-1, got -1"),
    ("patch_batch", put("et", value=-2), "events_to", "expected -1..2^63-1, got -2"),
    ("patch_batch", put("et", value=98), "events_to", "expected ≥ events_from - 1 = 99"),
    ("patch_batch", put("ts", value=None), "produced_at_ns", "expected int, got None"),
    ("patch_batch", put("ow", value=5), "owner", "expected str, got int"),
    ("patch_batch", put("ow", value="x" * 201), "owner", "201 characters exceed 200"),
    ("patch_batch", put("tb", value=b""), "tables", "expected an array, got bytes"),
    ("patch_batch", put("tb", 1, value="t"), "tables[1]", "expected a map, got str"),
    ("patch_batch", put("tb", 0, "id", value=2**32), "tables[0].table_id", "expected 0..2^32-1"),
    ("patch_batch", drop("tb", 0, "g"), "tables[0].patch.generation", "missing required"),
    ("patch_batch", put("tb", 1, "g", value=-5), "tables[1].patch.generation", "got -5"),
    ("patch_batch", put("tb", 0, "b", value=[]), "tables[0].patch.buckets", "expected a map"),
    (
        "patch_batch",
        put("tb", 0, "b", "i", value=b"\0" * 6),
        "tables[0].patch.buckets.buckets",
        "6 bytes is not a whole number of 4-byte values",
    ),
    (
        "patch_batch",
        put("tb", 0, "b", "s", value=b"\0" * 3),
        "tables[0].patch.buckets.seeds",
        "expected shape (2,), got (3,)",
    ),
    (
        "patch_batch",
        put("tb", 0, "b", "vb", value=16),
        "tables[0].patch.buckets.cells",
        "width 'vb' must be 32 or 64 bits, got 16",
    ),
    (
        "patch_batch",
        drop("tb", 0, "b", "vb"),
        "tables[0].patch.buckets.cells",
        "missing required field 'vb'",
    ),
    (
        "patch_batch",
        put("tb", 0, "b", "c", value=b"\0" * 28),
        "tables[0].patch.buckets.cells",
        "expected 4 × 2 = 8 values, got 7",
    ),
    (
        "patch_batch",
        put("tb", 1, "b", "vb", value=32),
        "tables[1].patch.buckets.cells",
        "expected 4 × 1 = 4 values, got 8",
    ),
    (
        "patch_batch",
        drop("tb", 0, "b", "fb"),
        "tables[0].patch.buckets.fingerprints",
        "missing required field 'fb'",
    ),
    (
        "patch_batch",
        put("tb", 1, "b", "fb", value=8),
        "tables[1].patch.buckets.fingerprints",
        "expected 4 × 1 = 4 values, got 8",
    ),
    (
        "patch_batch",
        put("tb", 0, "w", "x", value=b"\0" * 8),
        "tables[0].patch.words.values",
        "expected shape (2,), got (1,)",
    ),
    (
        "patch_batch",
        put("tb", 0, "w", "i", value=5),
        "tables[0].patch.words.indices",
        "expected bytes, got int",
    ),
    (
        "patch_batch",
        put("tb", 0, "o", "s", value=-1),
        "tables[0].patch.othello_reset.othello_seed",
        "expected 0..2^64-1, got -1",
    ),
    (
        "patch_batch",
        put("tb", 0, "o", "x", value=b"\0" * 12),
        "tables[0].patch.othello_reset.words",
        "12 bytes is not a whole number of 64-bit words",
    ),
    (
        "patch_batch",
        put("tb", 2, "b", value={}),
        "tables[2].patch.buckets",
        "a reload carries no buckets",
    ),
    (
        "patch_batch",
        put("tb", 2, "sk", value=""),
        "tables[2].patch.snapshot_key",
        "expected a non-empty string",
    ),
    ("patch_batch", put("tb", 2, "sk", value=7), "tables[2].patch.snapshot_key", "expected str"),
    # QueueVector
    ("queue_vector", drop("r"), "region", "missing required field 'r'"),
    ("queue_vector", put("q", value=-9), "seq", "expected 0..2^63-1, got -9"),
    ("queue_vector", put("ts", value="now"), "sent_at_ns", "expected int, got str"),
    ("queue_vector", put("wi", value=b"\0" * 8), "queues", "2 worker indices but 3 queue times"),
    ("queue_vector", put("qm", value=b"\0" * 7), "queues", "7 bytes is not a whole number"),
    (
        "queue_vector",
        put("wi", value=u32(4, 5, 4).tobytes()),
        "queues[2]",
        "worker 4 already at queues[0]",
    ),
    (
        "queue_vector",
        put("qm", value=np.array([1.0, -2.0, 0.0]).tobytes()),
        "queues[1].queue_ms",
        "expected a finite number ≥ 0, got -2.0",
    ),
    (
        "queue_vector",
        put("qm", value=np.array([1.0, 0.0, math.nan]).tobytes()),
        "queues[2].queue_ms",
        "got nan",
    ),
    (
        "queue_vector",
        put("qm", value=np.array([math.inf, 0.0, 0.0]).tobytes()),
        "queues[0].queue_ms",
        "got inf",
    ),
    # DeadLetter
    ("dead_letter", put("tp", value=""), "topic", "expected a non-empty string"),
    ("dead_letter", put("pt", value=2**31), "partition", "expected 0..2^31-1"),
    ("dead_letter", put("of", value=-1), "offset", "expected 0..2^63-1, got -1"),
    ("dead_letter", drop("rs"), "reason", "missing required field 'rs'"),
    ("dead_letter", put("pl", value="text"), "payload", "expected bytes, got str"),
    ("dead_letter", put("pl", value=[1, 2]), "payload", "expected bytes, got list"),
]


@pytest.mark.parametrize(
    ("tag", "edit", "field", "text"),
    DECODE_FAILURES,
    ids=[f"{t}:{f}:{x[:24]}" for t, _, f, x in DECODE_FAILURES],
)
def test_decode_failure_names_the_field(tag: str, edit: Edit, field: str, text: str) -> None:
    raw = raw_of(FIXED[tag]())
    edit(raw)
    with pytest.raises(WireError) as info:
        decode(pack(raw))
    err = info.value
    assert err.field == field
    assert str(err) == f"{field}: {err.message}"
    assert text in err.message
    assert isinstance(err, ValueError)


def test_the_documented_example_error_reads_exactly() -> None:
    raw = raw_of(events_msg())
    raw["tr"] = b"\1\2\0\7"
    with pytest.raises(WireError) as info:
        decode(pack(raw))
    assert str(info.value) == "events[3].tier: expected 0..2, got 7"


GARBAGE: list[tuple[str, object, str]] = [
    ("empty", b"", "empty message"),
    ("reserved byte", b"\xc1", "not a msgpack message"),
    ("truncated", bytes.fromhex("82a174a9"), "not a msgpack message"),
    ("trailing data", pack({"t": "dead_letter"}) + b"\x00", "not a msgpack message"),
    ("top-level array", pack([1, 2]), "expected a map at the top level, got list"),
    ("top-level int", pack(7), "expected a map at the top level, got int"),
    ("top-level nil", b"\xc0", "expected a map at the top level, got None"),
    ("int map key", pack({1: 2}), "not a msgpack message"),
    ("extension type", b"\xd4\x05\x00", "not a msgpack message"),
    ("empty ext", b"\xc7\x00\x05", "extension type 5 is not part of the schema"),
    ("timestamp", msgpack.packb(msgpack.Timestamp(1, 2)), "not a msgpack message"),
    ("bad utf-8", b"\x81\xa1t\xa2\xff\xfe", "not a msgpack message"),
    ("deep nesting", b"\x91" * 100_000, "not a msgpack message"),
    ("array too long", b"\xdd\x00\x01\x00\x01" + b"\xc0" * 65537, "not a msgpack message"),
    ("not bytes", "kv_events", "expected bytes, got str"),
    ("none", None, "expected bytes, got None"),
]


@pytest.mark.parametrize(("data", "text"), [g[1:] for g in GARBAGE], ids=[g[0] for g in GARBAGE])
def test_garbage_is_a_wire_error(data: Any, text: str) -> None:
    with pytest.raises(WireError, match=re.escape(text)) as info:
        decode(data)
    assert info.value.field is None


def test_oversized_input_is_refused_before_unpacking(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvcompass.wire._base as base

    monkeypatch.setattr(base, "MAX_MESSAGE_BYTES", 100)
    with pytest.raises(WireError, match="message of 101 bytes exceeds 100"):
        decode(b"\x00" * 101)
    with pytest.raises(WireError, match=r"encoded message of \d+ bytes exceeds 100"):
        encode(DeadLetter("t", 0, 0, "why", b"\0" * 100))


# -- validation at construction -------------------------------------------------------


def images(**change: Any) -> BucketImages:
    parts: dict[str, Any] = {
        "buckets": np.array([1, 2], np.int64),
        "seeds": np.array([0, 0], np.uint8),
        "cells": np.zeros((2, 4), np.uint32),
        "fingerprints": None,
    }
    parts.update(change)
    return BucketImages(**parts)


def table(patch: Any) -> TablePatchWire:
    return TablePatchWire(0, patch)


CONSTRUCT_FAILURES: list[tuple[str, Callable[[], object], str]] = [
    ("evict in vram", lambda: KVEvent(EventKind.EVICT, Tier.VRAM), "tier"),
    ("kind 4", lambda: KVEvent(4, Tier.VRAM), "kind"),  # type: ignore[arg-type]
    ("bool tier", lambda: KVEvent(EventKind.ADMIT, True), "tier"),  # type: ignore[arg-type]
    ("zero length", lambda: KVEvent(1, 1, ((1, 2), (0, 3))), "keys[1].length"),  # type: ignore[arg-type]
    ("key 2^63", lambda: KVEvent(1, 1, ((1, 2**63),)), "keys[0].key"),  # type: ignore[arg-type]
    ("float key", lambda: KVEvent(1, 1, ((1, 2.0),)), "keys[0].key"),  # type: ignore[arg-type]
    ("not a pair", lambda: KVEvent(1, 1, ((1, 2, 3),)), "keys[0]"),  # type: ignore[arg-type]
    ("keys not tuple", lambda: KVEvent(1, 1, 5), "keys"),  # type: ignore[arg-type]
    (
        "event not KVEvent",
        lambda: KVEventBatch("w", "r", 0, 0, 0, ({"k": 1},)),  # type: ignore[arg-type]
        "events[0]",
    ),
    ("too many events", lambda: KVEventBatch("w", "r", 0, 0, 0, ((),) * (MAX_ITEMS + 1)), "events"),  # type: ignore[arg-type]
    ("lone surrogate", lambda: KVEventBatch("w\ud800", "r", 0, 0, 0), "worker_id"),
    ("huge string", lambda: KVEventBatch("w" * (1 << 20 | 1), "r", 0, 0, 0), "worker_id"),
    ("inline reload", lambda: table(TablePatch(1, reload=b"image")), "patch.reload"),
    ("patch of dict", lambda: table({"g": 1}), "patch"),
    ("negative generation", lambda: table(TablePatch(-1)), "patch.generation"),
    ("reload generation", lambda: TableReload(-1, "k"), "generation"),
    ("reload key", lambda: TableReload(1, ""), "snapshot_key"),
    ("table id", lambda: TablePatchWire(-1, TableReload(1, "k")), "table_id"),
    (
        "int64 cells",
        lambda: table(TablePatch(1, images(cells=np.zeros((2, 4), np.int64)))),
        "patch.buckets.cells",
    ),
    (
        "cells shape",
        lambda: table(TablePatch(1, images(cells=np.zeros((2, 3), np.uint32)))),
        "patch.buckets.cells",
    ),
    (
        "bucket id 2^32",
        lambda: table(TablePatch(1, images(buckets=np.array([0, 2**32])))),
        "patch.buckets.buckets[1]",
    ),
    (
        "negative bucket id",
        lambda: table(TablePatch(1, images(buckets=np.array([-1, 0])))),
        "patch.buckets.buckets[0]",
    ),
    (
        "float bucket ids",
        lambda: table(TablePatch(1, images(buckets=np.ones(2)))),
        "patch.buckets.buckets",
    ),
    (
        "seeds not array",
        lambda: table(TablePatch(1, images(seeds=[0, 0]))),
        "patch.buckets.seeds",
    ),
    (
        "uint32 fingerprints",
        lambda: table(TablePatch(1, images(fingerprints=np.zeros((2, 4), np.uint32)))),
        "patch.buckets.fingerprints",
    ),
    ("buckets not images", lambda: table(TablePatch(1, buckets=5)), "patch.buckets"),  # type: ignore[arg-type]
    (
        "word index range",
        lambda: table(TablePatch(1, words=WordImages(np.array([2**32]), np.zeros(1, np.uint64)))),
        "patch.words.indices[0]",
    ),
    (
        "word values dtype",
        lambda: table(TablePatch(1, words=WordImages(np.array([1]), np.zeros(1, np.int64)))),
        "patch.words.values",
    ),
    (
        "odd othello words",
        lambda: table(TablePatch(1, othello_reset=OthelloReset(1, b"\0" * 9))),
        "patch.othello_reset.words",
    ),
    (
        "othello seed 2^64",
        lambda: table(TablePatch(1, othello_reset=OthelloReset(2**64, b""))),
        "patch.othello_reset.othello_seed",
    ),
    ("table not wire", lambda: PatchBatch(0, 0, 0, 0, 0, 0, (TablePatch(1),)), "tables[0]"),  # type: ignore[arg-type]
    ("empty range", lambda: PatchBatch(0, 0, 0, 5, 3, 0), "events_to"),
    ("long owner", lambda: PatchBatch(0, 0, 0, 0, -1, 0, owner="o" * 201), "owner"),
    ("owner not str", lambda: PatchBatch(0, 0, 0, 0, -1, 0, owner=b"o"), "owner"),  # type: ignore[arg-type]
    (
        "negative incarnation",
        lambda: KVEventBatch("w", "r", 0, 0, 0, worker_incarnation=-1),
        "worker_incarnation",
    ),
    ("duplicate worker", lambda: QueueVector("r", 0, 0, ((1, 1.0), (1, 2.0))), "queues[1]"),
    ("nan queue", lambda: QueueVector("r", 0, 0, ((1, math.nan),)), "queues[0].queue_ms"),
    ("str queue", lambda: QueueVector("r", 0, 0, ((1, "5"),)), "queues[0].queue_ms"),  # type: ignore[arg-type]
    ("queue pair", lambda: QueueVector("r", 0, 0, (1,)), "queues[0]"),  # type: ignore[arg-type]
    ("payload str", lambda: DeadLetter("t", 0, 0, "why", "x"), "payload"),  # type: ignore[arg-type]
    ("empty reason", lambda: DeadLetter("t", 0, 0, "", b""), "reason"),
]


@pytest.mark.parametrize(
    ("build", "field"), [c[1:] for c in CONSTRUCT_FAILURES], ids=[c[0] for c in CONSTRUCT_FAILURES]
)
def test_invalid_messages_cannot_be_built(build: Callable[[], object], field: str) -> None:
    with pytest.raises(WireError) as info:
        build()
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_encode_refuses_non_messages() -> None:
    with pytest.raises(TypeError, match="not a wire message"):
        encode({"t": "kv_events"})  # type: ignore[arg-type]


def test_wire_error_pickles_and_reroots() -> None:
    err = WireError("expected 0..2, got 7", "tier")
    back = pickle.loads(pickle.dumps(err))
    assert (back.message, back.field, str(back)) == (err.message, err.field, str(err))
    assert str(err.within("events[3]")) == "events[3].tier: expected 0..2, got 7"
    assert WireError("bad").within("x").field == "x"
    assert err.within("") is err


# -- fuzzing: nothing but WireError ever escapes decode -------------------------------


def decode_or_wire_error(data: bytes) -> None:
    try:
        msg = decode(data)
    except WireError:
        return
    # Whatever decodes is a valid message: it re-encodes and decodes to itself.
    assert same(decode(encode(msg)), msg)


@given(st.binary(max_size=300))
@settings(max_examples=500)
def test_random_bytes_only_raise_wire_error(data: bytes) -> None:
    decode_or_wire_error(data)


@given(st.sampled_from(sorted(GOLDEN)), st.data())
@settings(max_examples=500)
def test_damaged_golden_bytes_only_raise_wire_error(tag: str, data: st.DataObject) -> None:
    raw = bytearray(bytes.fromhex(GOLDEN[tag]))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        if data.draw(st.booleans()):
            raw[pos] = data.draw(st.integers(0, 255))
        else:
            del raw[pos:]
            if not raw:
                break
    decode_or_wire_error(bytes(raw))


msgpack_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), U64),
    st.floats(),
    st.text(max_size=10),
    st.binary(max_size=24),
)
msgpack_values = st.recursive(
    msgpack_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(msgpack_values)
def test_random_msgpack_objects_only_raise_wire_error(obj: object) -> None:
    decode_or_wire_error(pack(obj))


WIRE_KEYS = ["w", "r", "q", "s", "ts", "e", "ep", "ef", "et", "tb", "wi", "qm", "tp", "pt"]
WIRE_KEYS += ["of", "rs", "pl", "k", "tr", "n", "ln", "ky", "id", "g", "sk", "b", "w", "o", "ow"]


@given(
    st.fixed_dictionaries(
        {"t": st.sampled_from(sorted(FIXED)), "v": st.sampled_from([[1, 0], [1, 3], [2, 0]])},
        optional=dict.fromkeys(WIRE_KEYS, msgpack_values),
    )
)
def test_random_envelopes_only_raise_wire_error(raw: dict[str, object]) -> None:
    decode_or_wire_error(pack(raw))


def paths(node: object, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every position inside a decoded msgpack tree (map keys and array indices)."""
    out = []
    items: list[tuple[Any, Any]] = []
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))
    for key, child in items:
        out.append((*prefix, key))
        out.extend(paths(child, (*prefix, key)))
    return out


@given(st.sampled_from(sorted(FIXED)), st.data())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_valid_messages_with_one_field_replaced_only_raise_wire_error(
    tag: str, data: st.DataObject
) -> None:
    raw = copy.deepcopy(raw_of(FIXED[tag]()))
    path = data.draw(st.sampled_from(paths(raw)))
    if data.draw(st.booleans()):
        put(*path, value=data.draw(msgpack_values))(raw)
    else:
        drop(*path)(raw)
    decode_or_wire_error(pack(raw))
