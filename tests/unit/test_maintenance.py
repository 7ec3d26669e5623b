"""Shard state: events applied exactly once, bad batches rejected whole, snapshots exact."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvcompass.index import LudoTable, LudoView
from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace, shard_of
from kvcompass.levels import plan_levels
from kvcompass.maintenance import BadEvent, ShardState
from kvcompass.publisher import EventPublisher
from kvcompass.topology import load_builtin
from kvcompass.wire import EventKind, KVEvent, KVEventBatch, decode

N_SHARDS = 3
TOPOLOGY = load_builtin("testbed-3region")
PLAN = plan_levels(TOPOLOGY)
NS = Namespace("test-model")


class Fleet:
    """Publishers for every worker, capturing batches per shard in send order."""

    def __init__(self) -> None:
        self.sent: dict[int, list[bytes]] = {s: [] for s in range(N_SHARDS)}
        self.publishers = {
            w.id: EventPublisher(
                w, PLAN, NS, N_SHARDS, lambda s, b: self.sent[s].append(b), first_seq=0
            )
            for w in TOPOLOGY.workers
        }

    def take(self, shard: int) -> list[KVEventBatch]:
        out = [decode(b, KVEventBatch) for b in self.sent[shard]]
        self.sent[shard].clear()
        return out


def _prompt(rng: np.random.Generator, n: int = 6000) -> np.ndarray:
    return rng.integers(0, 50_000, n, dtype=np.uint32)


def _states() -> list[ShardState]:
    return [
        ShardState(s, N_SHARDS, TOPOLOGY, initial_capacity=64, rng=random.Random(s))
        for s in range(N_SHARDS)
    ]


def _expected_value(tiers: dict[int, int], layout_slots: dict[int, tuple[int, int]]) -> int:
    value = 0
    for worker, tier in tiers.items():
        value |= tier << (2 * layout_slots[worker][1])
    return value


def test_views_fed_by_flushes_match_a_reference_of_the_same_events() -> None:
    rng = np.random.default_rng(1)
    fleet = Fleet()
    states = _states()
    views = {
        (s.shard, t): LudoView(table.view_image()) for s in states for t, table in s.tables.items()
    }
    # Reference: (table, key) -> {worker index: tier}
    reference: dict[tuple[int, int], dict[int, int]] = {}
    prompts = [_prompt(rng) for _ in range(40)]
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
        table_id, _ = states[0].layout.slots[worker.index]
        for batch in batches:
            for event in batch.events:
                for _, key in event.keys:
                    holders = reference.setdefault((table_id, key), {})
                    if event.kind == EventKind.EVICT:
                        holders.pop(worker.index, None)
                    else:
                        holders[worker.index] = int(event.tier)
        for state in states:
            for offset, batch in enumerate(fleet.take(state.shard), start=step * 1000):
                assert state.apply(batch, offset)
            flush = state.flush()
            if flush is not None:
                for t, patch in flush.tables.items():
                    views[(state.shard, t)].apply(patch)
    slots = dict(enumerate(states[0].layout.slots))
    for (table_id, key), holders in reference.items():
        want = _expected_value(holders, slots)
        shard = shard_of(key, N_SHARDS)
        assert states[shard].tables[table_id].get(key) == want
        if want:
            assert views[(shard, table_id)].lookup(key) == want


def test_redelivered_batches_are_dropped() -> None:
    fleet = Fleet()
    state = _states()[0]
    pub = fleet.publishers["us-0"]
    prompt = _prompt(np.random.default_rng(2))
    while not fleet.sent[0]:
        pub.admit(prompt, Tier.VRAM)
        prompt = _prompt(np.random.default_rng(len(prompt)))
    batches = fleet.take(0)
    for offset, batch in enumerate(batches):
        assert state.apply(batch, offset)
    state.flush()
    before = state.snapshot().views
    for offset, batch in enumerate(batches, start=len(batches)):
        assert not state.apply(batch, offset)
    assert state.duplicates == len(batches)
    flush = state.flush()
    assert flush is not None
    assert not flush.tables
    assert flush.events_to == 2 * len(batches) - 1
    assert state.snapshot().views == before


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda b: KVEventBatch("nobody", b.region, 1, b.shard, 0, b.events), "unknown worker"),
        (lambda b: KVEventBatch(b.worker_id, "eu", 1, b.shard, 0, b.events), "is in 'us'"),
        (lambda b: KVEventBatch(b.worker_id, b.region, 1, 1, 0, b.events), "for shard 1"),
    ],
)
def test_bad_batches_are_rejected_whole(mutate: object, reason: str) -> None:
    state = _states()[0]
    good = KVEventBatch("us-0", "us", 0, 0, 0, (KVEvent(EventKind.ADMIT, Tier.VRAM, ()),))
    before = state.snapshot().views
    with pytest.raises(BadEvent, match=reason):
        state.apply(mutate(good), 0)  # type: ignore[operator]
    assert state.snapshot().views == before


def test_key_of_another_shard_is_rejected() -> None:
    key = next(k for k in range(1000) if shard_of(k, N_SHARDS) != 0)
    state = _states()[0]
    batch = KVEventBatch(
        "us-0", "us", 0, 0, 0, (KVEvent(EventKind.ADMIT, Tier.VRAM, ((16, key),)),)
    )
    with pytest.raises(BadEvent, match="belongs to shard"):
        state.apply(batch, 0)
    assert len(state.tables[0]) == 0


def test_the_error_names_the_event_and_key_of_another_shard() -> None:
    mine = [k for k in range(1000) if shard_of(k, N_SHARDS) == 0][:3]
    theirs = next(k for k in range(1000) if shard_of(k, N_SHARDS) == 2)
    events = (
        KVEvent(EventKind.ADMIT, Tier.VRAM, ((16, mine[0]), (32, mine[1]))),
        KVEvent(EventKind.EVICT, Tier.ABSENT, ()),
        KVEvent(EventKind.TIER, Tier.DRAM, ((16, mine[2]), (48, theirs))),
    )
    state = _states()[0]
    with pytest.raises(BadEvent) as info:
        state.apply(KVEventBatch("us-0", "us", 0, 0, 0, events), 0)
    assert str(info.value) == f"events[2]: key {theirs} (length 48) belongs to shard 2"
    assert len(state.tables[0]) == 0
    assert state.worker_seq == {}


def test_a_batch_is_one_write_of_every_key_in_event_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = [k for k in range(1000) if shard_of(k, N_SHARDS) == 0][:4]
    worker = TOPOLOGY.worker("us-0")
    table_id, field = _states()[0].layout.slots[worker.index]
    events = (
        KVEvent(EventKind.ADMIT, Tier.VRAM, ((16, keys[0]), (32, keys[1]))),
        KVEvent(EventKind.TIER, Tier.DRAM, ((16, keys[0]),)),
        KVEvent(EventKind.EVICT, Tier.ABSENT, ((32, keys[1]), (48, keys[2]))),
        KVEvent(EventKind.ADMIT, Tier.DRAM, ()),
        KVEvent(EventKind.ADMIT, Tier.DRAM, ((64, keys[3]),)),
    )
    calls: list[tuple[list[int], list[int], list[int]]] = []
    write_many = LudoTable.write_bits_many

    def record(table: LudoTable, k: np.ndarray, c: np.ndarray, b: np.ndarray) -> None:
        calls.append((k.tolist(), c.tolist(), b.tolist()))
        write_many(table, k, c, b)

    monkeypatch.setattr(LudoTable, "write_bits_many", record)
    state = _states()[0]
    assert state.apply(KVEventBatch(worker.id, worker.region, 5, 0, 0, events), 0)
    shift = 2 * field
    assert calls == [
        (
            [keys[0], keys[1], keys[0], keys[1], keys[2], keys[3]],
            [3 << shift] * 6,
            [1 << shift, 1 << shift, 2 << shift, 0, 0, 2 << shift],
        )
    ]
    table = state.tables[table_id]
    assert [table.get(k) for k in keys] == [2 << shift, 0, 0, 2 << shift]
    assert state.applied_keys == 6
    assert state.worker_seq == {worker.id: 5}
    # A batch without keys still takes its sequence number and writes nothing.
    empty = KVEventBatch(worker.id, worker.region, 6, 0, 0, (events[3],))
    assert state.apply(empty, 1)
    assert len(calls) == 1
    assert (state.applied_keys, state.worker_seq) == (6, {worker.id: 6})


def test_staged_batches_end_up_as_if_applied_one_by_one() -> None:
    fleet = Fleet()
    rng = np.random.default_rng(4)
    for i in range(30):
        pub = fleet.publishers[TOPOLOGY.workers[i % 14].id]
        prompt = _prompt(rng)
        pub.admit(prompt, Tier.VRAM)
        if i % 3 == 0:
            pub.evict(prompt)
    batches = fleet.take(2)
    applied, staged = _states()[2], _states()[2]
    for offset, batch in enumerate(batches):
        assert applied.apply(batch, offset)
        assert staged.stage(batch, offset)
    assert all(len(t) == 0 for t in staged.tables.values())  # nothing written yet
    assert not staged.stage(batches[-1], len(batches))  # dedupe does not wait for writes
    applied.skip(len(batches))
    one_by_one, grouped = applied.flush(), staged.flush()
    assert one_by_one is not None
    assert grouped is not None
    assert one_by_one.tables.keys() == grouped.tables.keys()
    assert (one_by_one.events_from, one_by_one.events_to) == (0, len(batches))
    assert (grouped.events_from, grouped.events_to) == (0, len(batches))
    a, b = applied.snapshot(), staged.snapshot()
    assert (a.views, a.keys, a.meta.worker_seq) == (b.views, b.keys, b.meta.worker_seq)


def test_snapshot_restores_tables_positions_and_dedupe() -> None:
    fleet = Fleet()
    states = _states()
    rng = np.random.default_rng(3)
    for i in range(30):
        fleet.publishers[TOPOLOGY.workers[i % 14].id].admit(_prompt(rng), Tier.DRAM)
    state = states[1]
    batches = fleet.take(1)
    for offset, batch in enumerate(batches):
        state.apply(batch, offset)
    state.flush()
    state.epoch, state.next_seq, state.patches_offset = 4, 17, 99
    snap = state.snapshot(created_ns=123)
    restored = ShardState.from_snapshot(snap, N_SHARDS, TOPOLOGY)
    assert (restored.epoch, restored.next_seq, restored.patches_offset) == (4, 17, 99)
    assert restored.events_offset == len(batches) - 1
    assert restored.worker_seq == state.worker_seq
    for t, table in state.tables.items():
        keys, values = table.items()
        for k, v in zip(keys.tolist(), values.tolist(), strict=True):
            assert restored.tables[t].get(k) == v
    assert not restored.apply(batches[-1], len(batches))  # still a duplicate
