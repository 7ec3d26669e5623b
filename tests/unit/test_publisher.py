"""EventPublisher's explicit lengths and namespace (what the worker's cache passes)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace, prefix_keys, shard_of
from kvcompass.levels import plan_levels
from kvcompass.pipeline.clock import ManualClock
from kvcompass.publisher import EventPublisher
from kvcompass.topology import load_builtin
from kvcompass.wire import MAX_ITEMS, EventKind, KVEventBatch, WireError, decode

TOPOLOGY = load_builtin("testbed-3region")
WORKER = TOPOLOGY.workers[0]
PLAN = plan_levels(TOPOLOGY)
OWN = Namespace("llama-3.1-8b")
TOKENS = np.arange(5000, dtype=np.uint32)


def publisher(sent: list[tuple[int, bytes]]) -> EventPublisher:
    return EventPublisher(
        WORKER, PLAN, OWN, 4, lambda shard, data: sent.append((shard, data)),
        incarnation=7, clock=ManualClock(),
    )  # fmt: skip


def keys_sent(sent: list[tuple[int, bytes]]) -> set[tuple[int, int]]:
    """Every (length, key) pair of the sent batches."""
    batches = [decode(data) for _, data in sent]
    assert all(isinstance(b, KVEventBatch) for b in batches)
    return {
        pair for b in batches if isinstance(b, KVEventBatch) for e in b.events for pair in e.keys
    }


def test_by_default_a_change_covers_every_registration_length_of_the_prompt() -> None:
    sent: list[tuple[int, bytes]] = []
    publisher(sent).admit(TOKENS)
    lengths = PLAN.registration_lengths[WORKER.region]
    assert keys_sent(sent) == set(prefix_keys(TOKENS, lengths, OWN).items())


def test_explicit_lengths_and_namespace_publish_only_those_keys() -> None:
    sent: list[tuple[int, bytes]] = []
    tenant = Namespace("llama-3.1-8b", "tenant-a")
    chosen = PLAN.registration_lengths[WORKER.region][2:4]
    publisher(sent).publish(EventKind.ADMIT, TOKENS, Tier.VRAM, namespace=tenant, lengths=chosen)
    assert keys_sent(sent) == set(prefix_keys(TOKENS, chosen, tenant).items())


def test_changes_alternating_namespaces_and_lengths_each_get_their_own_keys() -> None:
    """The publisher keeps one hasher per (namespace, lengths): none may serve another."""
    pub = publisher([])
    registered = PLAN.registration_lengths[WORKER.region]
    tenants = [Namespace("llama-3.1-8b", t) for t in ("a", "b")]
    for lengths in (registered[1:3], registered[2:3], registered[1:3]):
        for tenant in tenants:
            sent: list[tuple[int, bytes]] = []
            pub._send = lambda shard, data, sent=sent: sent.append((shard, data))
            pub.publish(EventKind.ADMIT, TOKENS, Tier.VRAM, namespace=tenant, lengths=lengths)
            pub.flush()
            assert keys_sent(sent) == set(prefix_keys(TOKENS, lengths, tenant).items())


@pytest.mark.parametrize(
    "as_given",
    [list, np.int64, lambda t: t[::-1].copy()[::-1], lambda t: np.frombuffer(t.tobytes(), "<u4")],
    ids=["list", "int64", "strided", "read-only"],
)
def test_tokens_in_any_form_publish_the_keys_of_their_ids(as_given: object) -> None:
    """A uint32 array is keyed as it is; any other form is checked and converted first."""
    given: list[tuple[int, bytes]] = []
    reference: list[tuple[int, bytes]] = []
    tokens = TOKENS[:300]
    converted = as_given(tokens) if callable(as_given) else tokens
    publisher(given).admit(converted)
    publisher(reference).admit(tokens)
    assert keys_sent(given) == keys_sent(reference) != set()


def test_a_length_that_is_not_registered_is_refused() -> None:
    with pytest.raises(ValueError, match="not registration lengths"):
        publisher([]).publish(EventKind.ADMIT, TOKENS, Tier.VRAM, lengths=(17,))


def test_lengths_seen_before_are_checked_and_ordered_alike() -> None:
    """A tuple of lengths is checked once and its answer kept: a refused tuple stays
    refused, and an unordered one is published in order every time."""
    pub = publisher([])
    registered = PLAN.registration_lengths[WORKER.region]
    refused = (registered[0], 17)
    unordered = (registered[3], registered[1], registered[3])
    for _ in range(2):
        with pytest.raises(ValueError, match="not registration lengths"):
            pub.publish(EventKind.ADMIT, TOKENS, Tier.VRAM, lengths=refused)
        sent: list[tuple[int, bytes]] = []
        pub._send = lambda shard, data, sent=sent: sent.append((shard, data))
        pub.publish(EventKind.ADMIT, TOKENS, Tier.VRAM, lengths=unordered)
        pub.flush()
        ordered = [registered[1], registered[3]]
        assert keys_sent(sent) == set(prefix_keys(TOKENS, ordered, OWN).items())


def test_without_a_transport_the_batches_are_returned_with_the_same_keys() -> None:
    sent: list[tuple[int, bytes]] = []
    publisher(sent).admit(TOKENS)
    bare = EventPublisher(WORKER, PLAN, OWN, 4, None, incarnation=7, clock=ManualClock())
    batches = bare.admit(TOKENS)
    assert [b.shard for b in batches] == [shard for shard, _ in sent]
    pairs = {pair for b in batches for e in b.events for pair in e.keys}
    assert pairs == keys_sent(sent)


def test_announce_sends_every_shard_one_batch_of_this_incarnation_in_sequence() -> None:
    sent: list[tuple[int, bytes]] = []
    buffered = EventPublisher(
        WORKER, PLAN, OWN, 4, lambda shard, data: sent.append((shard, data)),
        max_buffered_keys=1 << 20, incarnation=7, clock=ManualClock(),
    )  # fmt: skip
    buffered.admit(TOKENS)  # buffered: it goes out with the announcement
    batches = buffered.announce()
    assert [b.shard for b in batches] == [shard for shard, _ in sent] == [0, 1, 2, 3]
    assert [b.worker_seq for b in batches] == [0, 1, 2, 3]
    assert {b.worker_incarnation for b in batches} == {7}
    unbuffered: list[tuple[int, bytes]] = []
    publisher(unbuffered).admit(TOKENS)
    assert keys_sent(sent) == keys_sent(unbuffered)
    # Nothing buffered: every shard still gets a batch, an empty one.
    again = buffered.announce()
    assert [(b.shard, b.n_keys, b.worker_seq) for b in again] == [(s, 0, 4 + s) for s in range(4)]


def test_every_one_length_change_lands_in_its_keys_shard() -> None:
    """A demotion or eviction (one length) goes straight to its key's shard."""
    pub = EventPublisher(WORKER, PLAN, OWN, 8, None, 1 << 20, incarnation=7, clock=ManualClock())
    registered = PLAN.registration_lengths[WORKER.region]
    for length in registered:
        pub.publish(EventKind.TIER, TOKENS, Tier.DRAM, namespace=OWN, lengths=(length,))
        pub.publish(EventKind.EVICT, TOKENS, Tier.ABSENT, namespace=OWN, lengths=(length,))
    batches = pub.flush()
    placed = {(e.kind, pair, b.shard) for b in batches for e in b.events for pair in e.keys}
    expected = prefix_keys(TOKENS, registered, OWN)
    assert placed == {
        (kind, (length, key), shard_of(key, 8))
        for length, key in expected.items()
        for kind in (EventKind.TIER, EventKind.EVICT)
    }


@pytest.mark.parametrize(
    ("kind", "tier", "message"),
    [
        (EventKind.EVICT, Tier.VRAM, "EVICT carries tier 0"),
        (EventKind.ADMIT, Tier.ABSENT, "ADMIT needs tier 1..2"),
        (EventKind.TIER, 3, "tier"),
        (True, Tier.VRAM, "kind"),
        (4, Tier.VRAM, "kind"),
    ],
)
def test_a_bad_kind_or_tier_is_refused_when_published(
    kind: object, tier: object, message: str
) -> None:
    pub = publisher([])
    with pytest.raises(WireError, match=message):
        pub.publish(kind, TOKENS, tier)  # type: ignore[arg-type]
    assert pub.flush() == []  # nothing was buffered


def test_kind_and_tier_given_as_ints_are_published_as_their_enums() -> None:
    bare = EventPublisher(WORKER, PLAN, OWN, 4, None, 1 << 20, incarnation=7, clock=ManualClock())
    bare.publish(2, TOKENS, 2)  # type: ignore[arg-type]
    events = [e for b in bare.flush() for e in b.events]
    assert events
    assert {(e.kind, e.tier) for e in events} == {(EventKind.TIER, Tier.DRAM)}


def test_a_send_that_raises_loses_no_batch_and_keeps_each_shards_order() -> None:
    """The batches a failed send left go first at the next flush, with their numbers."""
    sent: list[tuple[int, bytes]] = []
    calls = 0

    def flaky(shard: int, data: bytes) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise BufferError("local queue full")
        sent.append((shard, data))

    pub = EventPublisher(
        WORKER, PLAN, OWN, 4, flaky, max_buffered_keys=1 << 20, incarnation=7, clock=ManualClock()
    )
    pub.admit(TOKENS)
    with pytest.raises(BufferError):
        pub.flush()
    assert len(sent) == 1
    pub.admit(TOKENS[:3000], Tier.DRAM)
    again = pub.flush()
    seqs = [decode(data, KVEventBatch).worker_seq for _, data in sent]
    assert seqs == list(range(len(seqs)))  # every number once, in order: none lost
    assert [b.worker_seq for b in again] == seqs[1:]
    unbroken: list[tuple[int, bytes]] = []
    publisher(unbroken).admit(TOKENS)
    assert keys_sent(unbroken) <= keys_sent(sent)


def test_a_shard_never_gets_more_events_than_a_batch_may_hold() -> None:
    pub = EventPublisher(WORKER, PLAN, OWN, 1, None, 1 << 30, incarnation=7, clock=ManualClock())
    length = PLAN.registration_lengths[WORKER.region][0]
    flushed = []
    for _ in range(MAX_ITEMS + 1):
        flushed += pub.publish(EventKind.EVICT, TOKENS, Tier.ABSENT, lengths=(length,))
    flushed += pub.flush()
    assert [len(b.kind_array) for b in flushed] == [MAX_ITEMS, 1]


@pytest.mark.parametrize(
    ("worker_id", "n_shards", "incarnation", "field"),
    [("", 4, 7, "worker_id"), ("w", 1 << 32, 7, "shard"), ("w", 4, -1, "worker_incarnation")],
)
def test_a_header_no_batch_could_carry_is_refused_at_construction(
    worker_id: str, n_shards: int, incarnation: int, field: str
) -> None:
    """Batches take their header unchecked: what could break it is checked up front."""
    worker = dataclasses.replace(WORKER, id=worker_id)
    with pytest.raises(WireError) as info:
        EventPublisher(worker, PLAN, OWN, n_shards, None, incarnation=incarnation)
    assert info.value.field == field


def test_a_clock_outside_the_wire_range_stops_the_flush() -> None:
    clock = ManualClock(wall_ns=-5)
    pub = EventPublisher(WORKER, PLAN, OWN, 4, None, 1 << 20, incarnation=7, clock=clock)
    pub.admit(TOKENS)
    with pytest.raises(ValueError, match="clock reads -5"):
        pub.flush()
