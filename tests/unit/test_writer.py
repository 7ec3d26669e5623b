"""The shard writer: takeover, events applied exactly once, patches, snapshots, crashes."""

from __future__ import annotations

import ctypes
import itertools
import random
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from kvcompass.errors import BadInput, ConfigError, InvariantBroken, Transient
from kvcompass.index import LudoTable, LudoView
from kvcompass.index.errors import TableFull
from kvcompass.index.layout import Tier
from kvcompass.index.patches import TablePatch
from kvcompass.index.shard_tables import ShardTables
from kvcompass.keys import Namespace, shard_of
from kvcompass.levels import plan_levels
from kvcompass.pipeline.clock import ManualClock
from kvcompass.pipeline.sequences import Admission, SequenceRefused
from kvcompass.pipeline.writer import BadEvent, ShardWriter, Takeover
from kvcompass.publisher import EventPublisher
from kvcompass.snapshot import ShardSnapshot
from kvcompass.topology import load_builtin
from kvcompass.wire import (
    EventKind,
    KVEvent,
    KVEventBatch,
    PatchBatch,
    TableReload,
    decode,
    encode,
)

N_SHARDS = 3
TOPOLOGY = load_builtin("testbed-3region")
PLAN = plan_levels(TOPOLOGY)
NS = Namespace("test-model")
OWNER = "kvc-mu/kvc:snap"
T0 = 1_700_000_000_000_000_000


class Fleet:
    """Publishers for every worker, capturing batches per shard in send order."""

    def __init__(self, incarnation: int = 1) -> None:
        self.sent: dict[int, list[bytes]] = {s: [] for s in range(N_SHARDS)}
        self.publishers = {
            w.id: self.publisher(w.id, incarnation + i) for i, w in enumerate(TOPOLOGY.workers)
        }

    def publisher(self, worker_id: str, incarnation: int) -> EventPublisher:
        return EventPublisher(
            TOPOLOGY.worker(worker_id),
            PLAN,
            NS,
            N_SHARDS,
            lambda s, b: self.sent[s].append(b),
            incarnation=incarnation,
            clock=ManualClock(wall_ns=T0),
        )

    def take(self, shard: int) -> list[KVEventBatch]:
        out = [decode(b, KVEventBatch) for b in self.sent[shard]]
        self.sent[shard].clear()
        return out


class Store:
    """An in-memory snapshot store: what ``flush(persist=...)`` writes a grown table to."""

    def __init__(self) -> None:
        self.saved: dict[str, ShardSnapshot] = {}
        self.fail: Exception | None = None

    def persist(self, snapshot: ShardSnapshot) -> str:
        if self.fail is not None:
            raise self.fail
        key = f"snap:{snapshot.meta.shard}:v{len(self.saved)}"
        self.saved[key] = snapshot
        return key


def _prompt(rng: np.random.Generator, n: int = 6000) -> np.ndarray:
    return rng.integers(0, 50_000, n, dtype=np.uint32)


def _writer(shard: int = 0, **take_over: object) -> ShardWriter:
    writer = _new_writer(shard)
    args: dict[str, object] = {
        "stream_epoch": None,
        "stream_end": 0,
        "committed": False,
        "events_low": 0,
    }
    writer.take_over(take_over.pop("snapshot", None), **{**args, **take_over})  # type: ignore[arg-type]
    return writer


def _new_writer(shard: int) -> ShardWriter:
    return ShardWriter(
        shard,
        N_SHARDS,
        TOPOLOGY,
        owner=OWNER,
        clock=ManualClock(wall_ns=T0),
        initial_capacity=64,
        max_seq_jump=1000,
        rng=random.Random(shard),
    )


def _take_over(
    snapshot: ShardSnapshot | None,
    *,
    shard: int = 0,
    stream_epoch: int | None = None,
    stream_end: int = 0,
    committed: bool = False,
    events_low: int = 0,
    events_high: int | None = None,
) -> tuple[ShardWriter, Takeover]:
    writer = _new_writer(shard)
    takeover = writer.take_over(
        snapshot,
        stream_epoch=stream_epoch,
        stream_end=stream_end,
        committed=committed,
        events_low=events_low,
        events_high=events_high,
    )
    return writer, takeover


def _expected_value(tiers: dict[int, int], layout_slots: dict[int, tuple[int, int]]) -> int:
    value = 0
    for worker, tier in tiers.items():
        value |= tier << (2 * layout_slots[worker][1])
    return value


def _one_batch(fleet: Fleet, shard: int = 0, worker: str = "us-0") -> list[KVEventBatch]:
    rng = np.random.default_rng(2)
    while not fleet.sent[shard]:
        fleet.publishers[worker].admit(_prompt(rng), Tier.VRAM)
    return fleet.take(shard)


def _apply_view(views: dict[int, LudoView], batch: PatchBatch, store: Store) -> None:
    for entry in batch.tables:
        if isinstance(entry.patch, TableReload):
            image = store.saved[entry.patch.snapshot_key].views[entry.table_id]
            views[entry.table_id] = LudoView(image)
        else:
            views[entry.table_id].apply(entry.patch)


# -- applying events -------------------------------------------------------------------


def test_views_fed_by_flushes_match_a_reference_of_the_same_events() -> None:
    rng = np.random.default_rng(1)
    fleet = Fleet()
    store = Store()
    writers = [_writer(s) for s in range(N_SHARDS)]
    views = {
        w.shard: {t: LudoView(image) for t, image in w.tables.view_images().items()}
        for w in writers
    }
    reference: dict[tuple[int, int], dict[int, int]] = {}
    prompts = [_prompt(rng) for _ in range(40)]
    reloads = 0
    for step in range(300):
        worker = TOPOLOGY.workers[int(rng.integers(len(TOPOLOGY.workers)))]
        prompt = prompts[int(rng.integers(len(prompts)))]
        pub = fleet.publishers[worker.id]
        kind = int(rng.integers(3))
        if kind == 0:
            batches = pub.admit(prompt, Tier.VRAM)
        elif kind == 1:
            batches = pub.move(prompt, Tier.DRAM)
        else:
            batches = pub.evict(prompt)
        table_id, _ = writers[0].layout.slots[worker.index]
        for batch in batches:
            for event in batch.events:
                for _, key in event.keys:
                    holders = reference.setdefault((table_id, key), {})
                    if event.kind == EventKind.EVICT:
                        holders.pop(worker.index, None)
                    else:
                        holders[worker.index] = int(event.tier)
        for writer in writers:
            for offset, batch in enumerate(fleet.take(writer.shard), start=step * 1000):
                assert writer.apply(batch, offset) is Admission.APPLY
            patch_batch = writer.flush(store.persist)
            if patch_batch is not None:
                reloads += sum(isinstance(t.patch, TableReload) for t in patch_batch.tables)
                _apply_view(views[writer.shard], decode(encode(patch_batch), PatchBatch), store)
    assert reloads > 0  # tables of 64 keys grew: the reload path was exercised
    slots = dict(enumerate(writers[0].layout.slots))
    for (table_id, key), holders in reference.items():
        want = _expected_value(holders, slots)
        shard = shard_of(key, N_SHARDS)
        assert writers[shard].tables.tables[table_id].get(key) == want
        if want:
            assert views[shard][table_id].lookup(key) == want


def test_redelivered_batches_are_dropped() -> None:
    fleet = Fleet()
    writer = _writer()
    batches = _one_batch(fleet)
    for offset, batch in enumerate(batches):
        assert writer.apply(batch, offset) is Admission.APPLY
    writer.flush()
    before = writer.snapshot().views
    for offset, batch in enumerate(batches, start=len(batches)):
        assert writer.apply(batch, offset) is Admission.DUPLICATE
    assert writer.duplicates == len(batches)
    flush = writer.flush()
    assert flush is not None
    assert not flush.tables
    assert flush.events_to == 2 * len(batches) - 1
    assert writer.snapshot().views == before


def test_an_offset_read_again_is_not_applied_again() -> None:
    fleet = Fleet()
    writer = _writer()
    batches = _one_batch(fleet)
    writer.apply(batches[0], 5)
    # The same offset, even carrying a batch the sequence check would take: already held.
    other = fleet.publisher("us-1", 99)
    rng = np.random.default_rng(7)
    while not fleet.sent[0]:
        other.admit(_prompt(rng), Tier.VRAM)
    assert writer.apply(fleet.take(0)[0], 5) is Admission.DUPLICATE
    assert writer.events_offset == 5


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: KVEventBatch("nobody", b.region, 1, b.shard, 0, b.events), "unknown worker"),
        (lambda b: KVEventBatch(b.worker_id, "eu", 1, b.shard, 0, b.events), "is in 'us'"),
        (lambda b: KVEventBatch(b.worker_id, b.region, 1, 1, 0, b.events), "for shard 1"),
    ],
)
def test_bad_batches_are_rejected_whole(
    mutate: Callable[[KVEventBatch], KVEventBatch], reason: str
) -> None:
    writer = _writer()
    good = KVEventBatch("us-0", "us", 0, 0, 0, (KVEvent(EventKind.ADMIT, Tier.VRAM, ()),))
    before = writer.snapshot()
    with pytest.raises(BadEvent, match=reason):
        writer.apply(mutate(good), 0)
    after = writer.snapshot()
    assert after.views == before.views
    assert after.meta.worker_seq == before.meta.worker_seq == {}
    assert issubclass(BadEvent, BadInput)


def test_key_of_another_shard_is_rejected() -> None:
    key = next(k for k in range(1000) if shard_of(k, N_SHARDS) != 0)
    writer = _writer()
    batch = KVEventBatch(
        "us-0", "us", 0, 0, 0, (KVEvent(EventKind.ADMIT, Tier.VRAM, ((16, key),)),)
    )
    with pytest.raises(BadEvent, match="belongs to shard"):
        writer.apply(batch, 0)
    assert writer.tables.count == 0


def test_the_error_names_the_event_and_key_of_another_shard() -> None:
    mine = [k for k in range(1000) if shard_of(k, N_SHARDS) == 0][:3]
    theirs = next(k for k in range(1000) if shard_of(k, N_SHARDS) == 2)
    events = (
        KVEvent(EventKind.ADMIT, Tier.VRAM, ((16, mine[0]), (32, mine[1]))),
        KVEvent(EventKind.EVICT, Tier.ABSENT, ()),
        KVEvent(EventKind.TIER, Tier.DRAM, ((16, mine[2]), (48, theirs))),
    )
    writer = _writer()
    with pytest.raises(BadEvent) as info:
        writer.apply(KVEventBatch("us-0", "us", 0, 0, 0, events), 0)
    assert str(info.value) == f"events[2]: key {theirs} (length 48) belongs to shard 2"
    assert writer.tables.count == 0
    assert writer.sequences.to_map() == {}


def test_a_far_future_seq_is_refused_and_the_worker_s_later_batches_still_apply() -> None:
    fleet = Fleet()
    writer = _writer()
    batches = _one_batch(fleet)
    first = batches[0]
    writer.apply(first, 0)
    far = KVEventBatch.from_columns(
        first.worker_id,
        first.region,
        first.worker_seq + 10**12,
        0,
        0,
        kinds=first.kind_array,
        tiers=first.tier_array,
        counts=first.count_array,
        lengths=first.length_array,
        keys=first.key_array,
        worker_incarnation=first.worker_incarnation,
    )
    with pytest.raises(SequenceRefused, match="jumps more than 1000"):
        writer.apply(far, 1)
    writer.skip(1)  # dead-lettered
    later = _one_batch(fleet)
    assert [writer.apply(b, 2 + i) for i, b in enumerate(later)] == [Admission.APPLY] * len(later)
    assert writer.sequences.current(first.worker_id) == (
        first.worker_incarnation,
        later[-1].worker_seq,
    )


def test_a_restarted_worker_starts_its_numbering_again() -> None:
    fleet = Fleet()
    writer = _writer()
    before = _one_batch(fleet)
    for i, b in enumerate(before):
        writer.apply(b, i)
    fleet.publishers["us-0"] = fleet.publisher("us-0", 424242)  # the worker restarted
    after = _one_batch(fleet)
    assert after[0].worker_seq <= before[-1].worker_seq  # a duplicate but for incarnations
    got = [writer.apply(b, 100 + i) for i, b in enumerate(after)]
    assert got[0] is Admission.RESTART
    assert writer.restarts == 1
    assert writer.sequences.current("us-0") == (424242, after[-1].worker_seq)


def _held(writer: ShardWriter, worker: str) -> set[int]:
    """Keys of the writer's shard that ``worker`` holds in any tier."""
    table_id, field = writer.layout.slots[TOPOLOGY.worker(worker).index]
    keys, values = writer.tables.tables[table_id].items()
    return set(keys[((values >> np.uint64(2 * field)) & np.uint64(3)) != 0].tolist())


def test_a_restarted_worker_s_earlier_cache_is_cleared_from_the_shard() -> None:
    fleet, writer, reference = Fleet(), _writer(), _writer()
    rng = np.random.default_rng(5)
    shared, own = _prompt(rng), _prompt(rng)
    fleet.publishers["us-0"].admit(shared, Tier.VRAM)
    fleet.publishers["us-0"].admit(own, Tier.DRAM)
    fleet.publishers["us-1"].admit(shared, Tier.VRAM)  # same region: the same table
    batches = fleet.take(0)
    offset = itertools.count()
    for batch in batches:
        at = next(offset)
        reference.apply(batch, at)
        writer.stage(batch, at)  # staged, not written: the clear must come after them
    before0, before1 = _held(reference, "us-0"), _held(reference, "us-1")
    assert before1
    assert before0 > before1
    # us-0 restarts (SIGKILLed: its evictions were never sent) and announces itself.
    fleet.publishers["us-0"] = fleet.publisher("us-0", 424242)
    fleet.publishers["us-0"].announce()
    (hello,) = fleet.take(0)
    assert hello.n_keys == 0
    hello_at = next(offset)
    assert writer.stage(hello, hello_at) is Admission.RESTART
    writer.write_staged()
    # A unit that takes over from a snapshot cut before the announcement replays it the
    # same way: the snapshot's sequence table knows the old run.
    reference.flush(Store().persist)
    reference.delivered(0, 10)
    restored, _ = _take_over(reference.snapshot(), stream_end=hello_at)
    assert restored.apply(hello, hello_at) is Admission.RESTART
    assert _held(restored, "us-0") == set()
    assert _held(restored, "us-1") == before1
    assert _held(writer, "us-0") == set()
    assert _held(writer, "us-1") == before1
    for key in before1:
        assert writer.tables.tier(key, TOPOLOGY.worker("us-1").index) is Tier.VRAM
    # Keys nobody else held are gone from the table.
    assert writer.tables.count == reference.tables.count - len(before0 - before1)
    assert writer.restart_cleared_keys == len(before0)
    # What the new run caches is indexed as usual.
    fleet.publishers["us-0"].admit(own, Tier.VRAM)
    for batch in fleet.take(0):
        assert writer.apply(batch, next(offset)) is Admission.APPLY
    assert _held(writer, "us-0") == before0 - before1


def test_a_batch_is_one_write_of_every_key_in_event_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = [k for k in range(1000) if shard_of(k, N_SHARDS) == 0][:4]
    worker = TOPOLOGY.worker("us-0")
    writer = _writer()
    table_id, field = writer.layout.slots[worker.index]
    events = (
        KVEvent(EventKind.ADMIT, Tier.VRAM, ((16, keys[0]), (32, keys[1]))),
        KVEvent(EventKind.TIER, Tier.DRAM, ((16, keys[0]),)),
        KVEvent(EventKind.EVICT, Tier.ABSENT, ((32, keys[1]), (48, keys[2]))),
        KVEvent(EventKind.ADMIT, Tier.DRAM, ()),
        KVEvent(EventKind.ADMIT, Tier.DRAM, ((64, keys[3]),)),
    )
    calls: list[tuple[list[int], list[int], list[int]]] = []
    write_at = LudoTable.write_at

    def record(table: LudoTable, k: int, c: int, b: int, n: int) -> None:
        k_list, c_list, b_list = (list((ctypes.c_uint64 * n).from_address(a)) for a in (k, c, b))
        calls.append((k_list, c_list, b_list))
        write_at(table, k, c, b, n)

    monkeypatch.setattr(LudoTable, "write_at", record)
    batch = KVEventBatch(worker.id, worker.region, 5, 0, 0, events, worker_incarnation=3)
    assert writer.apply(batch, 0) is Admission.APPLY
    shift = 2 * field
    assert calls == [
        (
            [keys[0], keys[1], keys[0], keys[1], keys[2], keys[3]],
            [3 << shift] * 6,
            [1 << shift, 1 << shift, 2 << shift, 0, 0, 2 << shift],
        )
    ]
    table = writer.tables.tables[table_id]
    assert [table.get(k) for k in keys] == [2 << shift, 0, 0, 2 << shift]
    assert writer.applied_keys == 6
    assert writer.sequences.current(worker.id) == (3, 5)
    # A batch without keys still takes its sequence number and writes nothing.
    empty = KVEventBatch(worker.id, worker.region, 6, 0, 0, (events[3],), worker_incarnation=3)
    assert writer.apply(empty, 1) is Admission.APPLY
    assert len(calls) == 1
    assert (writer.applied_keys, writer.sequences.current(worker.id)) == (6, (3, 6))


def _fleet_batches(
    seed: int, prompts: int, shard: int, *, move_every: int = 0, evict_every: int = 3
) -> list[KVEventBatch]:
    """A fleet's batches for ``shard``: each worker in turn admits a random prompt, and
    moves every ``move_every``-th to DRAM (0: none) and evicts every ``evict_every``-th."""
    fleet = Fleet()
    rng = np.random.default_rng(seed)
    for i in range(prompts):
        pub = fleet.publishers[TOPOLOGY.workers[i % 14].id]
        prompt = _prompt(rng)
        pub.admit(prompt, Tier.VRAM)
        if move_every and i % move_every == 0:
            pub.move(prompt, Tier.DRAM)
        if i % evict_every == 0:
            pub.evict(prompt)
    return fleet.take(shard)


def test_staged_batches_end_up_as_if_applied_one_by_one() -> None:
    batches = _fleet_batches(4, 30, shard=2)
    applied, staged = _writer(2), _writer(2)
    for offset, batch in enumerate(batches):
        assert applied.apply(batch, offset) is Admission.APPLY
        assert staged.stage(batch, offset) is Admission.APPLY
    assert staged.tables.count == 0  # nothing written yet
    # dedupe does not wait for writes
    assert staged.stage(batches[-1], len(batches)) is Admission.DUPLICATE
    applied.skip(len(batches))
    store = Store()
    one_by_one, grouped = applied.flush(store.persist), staged.flush(store.persist)
    assert one_by_one is not None
    assert grouped is not None
    assert [t.table_id for t in one_by_one.tables] == [t.table_id for t in grouped.tables]
    assert (one_by_one.events_from, one_by_one.events_to) == (0, len(batches))
    assert (grouped.events_from, grouped.events_to) == (0, len(batches))
    a, b = applied.snapshot(), staged.snapshot()
    assert (a.views, a.keys, a.meta.worker_seq) == (b.views, b.keys, b.meta.worker_seq)


def test_the_columns_a_writer_writes_unchecked_pass_the_tables_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The writer skips ShardTables' column checks (it checked the batches as it staged
    them, and hands the staged columns over by address): with the checks forced on, the
    same batches must pass and end the same."""
    batches = _fleet_batches(5, 40, shard=1, move_every=3, evict_every=4)
    fast = _writer(1)
    for offset, batch in enumerate(batches[:-1]):
        fast.stage(batch, offset)
    fast.apply(batches[-1], len(batches) - 1)

    def checked_anyway(
        tables: ShardTables, table_id: int, keys: int, clear: int, bits: int, n: int
    ) -> None:
        columns = (np.array((ctypes.c_uint64 * n).from_address(a)) for a in (keys, clear, bits))
        tables.write_columns(table_id, *columns)  # every check ShardTables makes

    monkeypatch.setattr(ShardTables, "write_staged", checked_anyway)
    slow = _writer(1)
    for offset, batch in enumerate(batches[:-1]):
        slow.stage(batch, offset)
    slow.apply(batches[-1], len(batches) - 1)
    a, b = fast.snapshot(), slow.snapshot()
    assert a.views == b.views
    assert a.keys == b.keys


# -- patches -----------------------------------------------------------------------------


def test_flushes_are_contiguous_batches_of_this_owner_and_epoch() -> None:
    fleet = Fleet()
    writer, takeover = _take_over(None, stream_epoch=6, stream_end=40)
    assert takeover.announce.seq == 0
    assert takeover.announce.tables == ()
    assert takeover.announce.owner == OWNER
    assert (takeover.announce.events_from, takeover.announce.events_to) == (0, -1)
    assert writer.flush() is None  # nothing read yet
    store = Store()
    out = []
    offset = 0
    for _ in range(4):
        for batch in _one_batch(fleet):
            writer.apply(batch, offset)
            offset += 1
        writer.skip(offset)  # a dead letter in between
        offset += 1
        flushed = writer.flush(store.persist)
        assert flushed is not None
        out.append(flushed)
    assert writer.flush(store.persist) is None
    assert [b.seq for b in out] == [1, 2, 3, 4]
    assert {(b.epoch, b.owner, b.shard) for b in out} == {(7, OWNER, 0)}
    assert out[0].events_from == 0
    for prev, nxt in itertools.pairwise(out):
        assert nxt.events_from == prev.events_to + 1
    assert out[-1].events_to == offset - 1
    assert [b.produced_at_ns for b in out] == [T0] * 4  # the injected clock


def test_a_grown_table_waits_for_its_snapshot_and_nothing_is_lost() -> None:
    fleet = Fleet()
    writer = _writer()
    views = {t: LudoView(image) for t, image in writer.tables.view_images().items()}
    store = Store()
    rng = np.random.default_rng(12)
    offset = 0
    generation = writer.tables.generations[0]
    while writer.tables.generations[0] == generation:
        fleet.publishers["us-0"].admit(_prompt(rng), Tier.VRAM)
        for batch in fleet.take(0):
            writer.apply(batch, offset)
            offset += 1
    store.fail = Transient("redis is down")
    with pytest.raises(Transient):
        writer.flush(store.persist)
    assert writer.next_seq == 1
    store.fail = None
    patches = writer.flush(store.persist)
    assert patches is not None
    assert patches.seq == 1
    assert (patches.events_from, patches.events_to) == (0, offset - 1)
    reload = next(t.patch for t in patches.tables if t.table_id == 0)
    assert isinstance(reload, TableReload)
    saved = store.saved[reload.snapshot_key]
    assert saved.meta.next_seq == 2  # the snapshot holds this batch's content
    _apply_view(views, patches, store)
    keys, values = writer.tables.tables[0].items()
    for k, v in zip(keys.tolist(), values.tolist(), strict=True):
        assert views[0].lookup(k) == v
    # Once sent, the growth is old news: the table's next writes travel as a patch.
    fleet.publishers["us-0"].admit(_prompt(rng), Tier.VRAM)
    for batch in fleet.take(0):
        writer.apply(batch, offset)
        offset += 1
    after = writer.flush(store.persist)
    assert after is not None
    assert len(store.saved) == 1
    assert [t.table_id for t in after.tables] == [0]
    assert not isinstance(after.tables[0].patch, TableReload)


def test_delivered_positions_go_into_the_snapshot() -> None:
    fleet = Fleet()
    writer, _ = _take_over(None, stream_end=12)
    writer.delivered(0, 12)  # the announcement
    for i, b in enumerate(_one_batch(fleet)):
        writer.apply(b, i)
    batch = writer.flush(Store().persist)
    assert batch is not None
    assert writer.snapshot().meta.patches_offset == 13
    writer.delivered(batch.seq, 20)
    writer.delivered(batch.seq + 5, 90)  # not a batch of this writer: ignored
    meta = writer.snapshot().meta
    assert (meta.patches_offset, meta.next_seq, meta.epoch) == (21, 2, 1)
    assert meta.created_ns == T0


def test_an_edge_snapshot_is_the_full_one_without_its_key_halves() -> None:
    snap, _ = _restorable()
    writer, _ = _take_over(snap, shard=1, stream_end=50)
    full, views_only = writer.snapshot(), writer.snapshot(keys=False)
    assert views_only.keys == {}
    assert views_only.views == full.views
    assert views_only.meta == full.meta
    views_only.verify(shard=1, n_shards=writer.n_shards, topology_digest=writer.topology_digest)
    assert len(full.keys) == len(full.views) > 0
    assert writer.snapshot_meta() == full.meta  # what an edge compares, nothing sealed


# -- takeover ----------------------------------------------------------------------------


def _restorable(epoch: int = 4) -> tuple[ShardSnapshot, list[KVEventBatch]]:
    fleet = Fleet()
    writer = _writer(1)
    rng = np.random.default_rng(3)
    for i in range(30):
        fleet.publishers[TOPOLOGY.workers[i % 14].id].admit(_prompt(rng), Tier.DRAM)
    batches = fleet.take(1)
    for offset, batch in enumerate(batches):
        writer.apply(batch, offset)
    writer.flush(Store().persist)
    writer.epoch = epoch
    writer.delivered(0, 98)
    return writer.snapshot(), batches


def test_takeover_restores_tables_positions_and_dedupe() -> None:
    snap, batches = _restorable()
    restored, takeover = _take_over(snap, shard=1, stream_end=50)
    assert takeover.restored
    assert not takeover.snapshot_lost
    assert takeover.snapshot_refused == ""
    assert takeover.events_gone == 0
    assert takeover.resume_offset == len(batches)
    assert (restored.epoch, restored.next_seq, restored.patches_offset) == (5, 1, 99)
    assert restored.events_offset == len(batches) - 1
    assert restored.sequences.to_map() == snap.meta.worker_seq
    original = {t: LudoTable.from_parts(snap.views[t], snap.keys[t]) for t in snap.views}
    for t, table in original.items():
        keys, values = table.items()
        for k, v in zip(keys.tolist(), values.tolist(), strict=True):
            assert restored.tables.tables[t].get(k) == v
    # still a duplicate, read again at a later offset
    assert restored.apply(batches[-1], len(batches)) is Admission.DUPLICATE


@pytest.mark.parametrize(
    ("snapshot_epoch", "stream_epoch", "epoch"),
    [(None, None, 1), (4, None, 5), (4, 2, 5), (4, 9, 10), (None, 3, 4)],
)
def test_the_epoch_is_above_the_snapshot_s_and_the_stream_s(
    snapshot_epoch: int | None, stream_epoch: int | None, epoch: int
) -> None:
    snap = None if snapshot_epoch is None else _restorable(snapshot_epoch)[0]
    writer, takeover = _take_over(snap, shard=1, stream_epoch=stream_epoch)
    assert writer.epoch == takeover.announce.epoch == epoch


def test_a_lost_snapshot_is_detected_and_the_shard_rebuilt_from_the_log() -> None:
    writer, takeover = _take_over(None, committed=True, stream_epoch=3)
    assert takeover.snapshot_lost
    assert not takeover.restored
    assert takeover.resume_offset == 0
    assert takeover.events_gone == 0
    assert writer.epoch == 4  # Redis lost everything; the stream did not
    assert writer.tables.count == 0


@pytest.mark.parametrize(("high", "reset", "resume"), [(3, True, 0), (None, False, None)])
def test_a_log_ending_before_the_snapshot_is_a_new_log_read_from_its_start(
    high: int | None, reset: bool, resume: int | None
) -> None:
    """A memory broker restarted: its new log holds only events newer than the snapshot,
    at offsets below the snapshot's position; skipping to that position would lose them."""
    snap, batches = _restorable()
    restored, takeover = _take_over(snap, shard=1, events_high=high)
    assert (takeover.restored, takeover.log_reset, takeover.events_gone) == (True, reset, 0)
    assert takeover.resume_offset == (len(batches) if resume is None else resume)
    assert restored.events_offset == takeover.resume_offset - 1
    # the old log's last batch, redelivered at the new log's offset 0, is still dropped
    assert restored.apply(batches[-1], 0) is Admission.DUPLICATE
    _, at_end = _take_over(snap, shard=1, events_high=len(batches))
    assert not at_end.log_reset  # a log that just reaches the position is the same log


@pytest.mark.parametrize(("restarted", "offset"), [(True, 7), (False, 99)])
def test_a_patch_log_restarted_empty_resets_the_offset_edges_resume_at(
    restarted: bool, offset: int
) -> None:
    """The snapshot's patch offset (99) belongs to a log the broker lost; the new log,
    read from its start, ends at 7. Snapshots must point edges at the new log's end."""
    snap, _ = _restorable()
    writer = _new_writer(1)
    writer.take_over(
        snap,
        stream_epoch=None,
        stream_end=7,
        patches_restarted=restarted,
        committed=True,
        events_low=0,
    )
    assert writer.patches_offset == offset
    assert writer.snapshot().meta.patches_offset == offset


def test_events_gone_from_the_log_are_reported() -> None:
    _, takeover = _take_over(None, committed=True, events_low=70)
    assert (takeover.snapshot_lost, takeover.resume_offset, takeover.events_gone) == (
        True,
        70,
        70,
    )
    snap, batches = _restorable()
    _, takeover = _take_over(snap, shard=1, events_low=len(batches) + 5)
    assert (takeover.restored, takeover.events_gone) == (True, 5)


@pytest.mark.parametrize("patches_restarted", [True, False])
def test_a_new_event_log_already_past_the_snapshot_is_known_by_the_new_patch_log(
    patches_restarted: bool,
) -> None:
    """The broker lost its logs and the workers re-sent their caches at once: the new
    event log has grown past the snapshot's position before the unit takes over. Its
    end cannot tell, but the patch log, which only this owner writes, restarted too."""
    snap, batches = _restorable()
    writer = _new_writer(1)
    takeover = writer.take_over(
        snap,
        stream_epoch=None,
        stream_end=0,
        patches_restarted=patches_restarted,
        committed=False,
        events_low=0,
        events_high=len(batches) + 50,
    )
    assert takeover.log_reset is patches_restarted
    assert takeover.resume_offset == (0 if patches_restarted else len(batches))


def _damaged(how: str) -> ShardSnapshot:
    snap, _ = _restorable()
    if how == "shard":
        return replace(snap, meta=replace(snap.meta, shard=2))
    if how == "tables":
        return replace(snap, views={0: snap.views[0]}, keys={0: snap.keys[0]})
    if how == "keys":
        keys = dict(snap.keys)
        keys[1] = keys[1][:-8]
        return replace(snap, keys=keys)
    if how.startswith("flipped"):
        part = dict(snap.keys if "key" in how else snap.views)
        table = 1 if "key" in how else 2
        damaged = bytearray(part[table])
        damaged[len(damaged) // 2] ^= 0x10
        part[table] = bytes(damaged)
        return replace(snap, keys=part) if "key" in how else replace(snap, views=part)
    if how == "sequences":
        return replace(snap, meta=replace(snap.meta, worker_seq={"garbage": 1}))
    if how == "n_shards":
        return replace(snap, meta=replace(snap.meta, n_shards=4))
    if how == "topology":
        return replace(snap, meta=replace(snap.meta, topology_digest="0" * 32))
    if how == "no owner":
        return replace(snap, meta=replace(snap.meta, owner=""))
    raise AssertionError(how)


@pytest.mark.parametrize(
    ("how", "named", "epoch"),
    [
        ("shard", "meta: shard is 2, expected 1", 1),
        ("n_shards", "meta: n_shards is 4, expected 3", 1),
        ("topology", "meta: topology_digest is '000", 1),
        ("no owner", "meta: owner is '', expected 'kvc-mu/kvc:snap'", 1),
        # The meta itself is sound: its epoch (4) still fences the new one.
        ("tables", "meta: records tables [0, 1, 2]", 5),
        ("keys", "keys:1: ", 5),
        ("flipped key byte", "keys:1: ", 5),
        ("flipped view byte", "view:2: ", 5),
        ("sequences", "'garbage'", 5),
    ],
)
def test_a_corrupt_snapshot_is_refused_and_the_shard_rebuilt(
    how: str, named: str, epoch: int
) -> None:
    writer, takeover = _take_over(_damaged(how), shard=1, committed=True)
    assert not takeover.restored
    assert takeover.snapshot_lost
    assert named in takeover.snapshot_refused
    assert takeover.snapshot_refused
    assert takeover.resume_offset == 0
    assert writer.epoch == epoch
    assert writer.tables.count == 0
    assert writer.sequences.to_map() == {}


def test_a_snapshot_of_another_owner_is_a_configuration_error() -> None:
    snap, _ = _restorable()
    foreign = replace(snap, meta=replace(snap.meta, owner="other-group/kvc:snap"))
    with pytest.raises(ConfigError, match="belongs to 'other-group/kvc:snap'"):
        _take_over(foreign, shard=1)


def test_a_writer_takes_over_once() -> None:
    writer = _writer()
    with pytest.raises(RuntimeError, match="already taken over"):
        writer.take_over(None, stream_epoch=None, stream_end=0, committed=False, events_low=0)
    with pytest.raises(RuntimeError, match="take_over"):
        _new_writer(0).snapshot()


# -- crashes ---------------------------------------------------------------------------


def test_a_write_that_fails_mid_move_breaks_the_writer_for_good(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = Fleet()
    writer = _writer()
    batches = _one_batch(fleet)
    writer.apply(batches[0], 0)
    good = writer.snapshot()
    write_at = LudoTable.write_at

    def fail_half_way(table: LudoTable, k: int, c: int, b: int, n: int) -> None:
        write_at(table, k, c, b, n // 2)
        raise TableFull("no bucket seed separates a bucket's keys; reload the table")

    monkeypatch.setattr(LudoTable, "write_at", fail_half_way)
    more = _one_batch(fleet)
    with pytest.raises(InvariantBroken, match="reload the table"):
        writer.apply(more[0], 1)
    monkeypatch.setattr(LudoTable, "write_at", write_at)
    assert writer.broken
    for attempt in (
        writer.snapshot,
        lambda: writer.flush(Store().persist),
        lambda: writer.apply(more[-1], 2),
    ):
        with pytest.raises(InvariantBroken, match="broken"):
            attempt()
    assert good.meta.events_offset == 0  # the last good snapshot is what the next owner gets


def test_a_failed_staged_write_surfaces_at_the_flush_and_nothing_is_snapshotted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = Fleet()
    writer = _writer()
    batches = _one_batch(fleet)
    for i, b in enumerate(batches):
        writer.stage(b, i)

    def corrupt(table: LudoTable, *columns: int) -> None:
        raise InvariantBroken("kernel left a bucket half-moved")

    monkeypatch.setattr(LudoTable, "write_at", corrupt)
    with pytest.raises(InvariantBroken, match="half-moved"):
        writer.flush(Store().persist)
    with pytest.raises(InvariantBroken, match="broken"):
        writer.snapshot()


def test_patch_batches_carry_only_table_patches_or_reloads() -> None:
    fleet = Fleet()
    writer = _writer()
    for i, b in enumerate(_one_batch(fleet)):
        writer.apply(b, i)
    batch = writer.flush(Store().persist)
    assert batch is not None
    assert all(isinstance(t.patch, TablePatch | TableReload) for t in batch.tables)


@pytest.mark.parametrize(("shard", "owner"), [(0, "g" * 201), (-1, OWNER)])
def test_a_writer_whose_patch_batches_could_not_travel_is_refused_at_start(
    shard: int, owner: str
) -> None:
    """Its batches carry shard and owner unchecked: what could break them is checked up
    front, as a configuration error."""
    with pytest.raises(ConfigError, match=f"shard writer {shard}"):
        ShardWriter(shard, N_SHARDS, TOPOLOGY, owner=owner, clock=ManualClock())


def test_a_clock_outside_the_wire_range_stops_the_flush_before_anything_is_taken() -> None:
    writer = _writer()
    publisher = EventPublisher(
        TOPOLOGY.workers[0], plan_levels(TOPOLOGY), Namespace("m"), N_SHARDS, None,
        1 << 20, incarnation=1, clock=ManualClock(),
    )  # fmt: skip
    publisher.admit(_prompt(np.random.default_rng(0)))
    for events in publisher.flush():
        if events.shard == 0:
            writer.apply(events, 0)
    writer._clock = ManualClock(wall_ns=-1)
    with pytest.raises(ValueError, match="clock reads -1"):
        writer.flush()
    writer._clock = ManualClock(wall_ns=T0)
    batch = writer.flush()
    assert batch is not None
    assert batch.tables  # the patches were still there to take
