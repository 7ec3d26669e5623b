"""The publisher's compiled per-shard buffers: the columns they hand over are the ones the
per-key grouping they replaced built, valid as a decoded batch's, and a refused change
leaves nothing behind."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from kvcompass.event_buffers import ShardEventBuffers
from kvcompass.keys import KeyHash, Namespace, PrefixHasher, shard_of
from kvcompass.wire import KVEventBatch

VALID_PAIRS = [(1, 1), (1, 2), (2, 1), (2, 2), (3, 0)]
KEY_MAX = (1 << 63) - 1

#: One change: (kind, tier), its lengths (ascending), its keys (as many or fewer).
Change = tuple[tuple[int, int], list[int], list[int]]
#: One shard's taken columns, as take() returns them.
Taken = tuple[
    int,
    NDArray[np.uint8],
    NDArray[np.uint8],
    NDArray[np.uint32],
    NDArray[np.uint32],
    NDArray[np.uint64],
]
#: One shard's taken columns as lists: (shard, kinds, tiers, counts, lengths, keys).
Listed = tuple[int, list[int], list[int], list[int], list[int], list[int]]


@st.composite
def changes(draw: st.DrawFn) -> Change:
    pair = draw(st.sampled_from(VALID_PAIRS))
    lengths = sorted(draw(st.sets(st.integers(1, (1 << 32) - 1), min_size=1, max_size=12)))
    n_keys = draw(st.integers(1, len(lengths)))
    keys = draw(st.lists(st.integers(0, KEY_MAX), min_size=n_keys, max_size=n_keys))
    return pair, lengths, keys


def reference(n_shards: int, batches: list[list[Change]]) -> list[list[Listed]]:
    """What each take() must return: per shard in order, one event per change that has
    keys there, its keys in their order (the Python grouping the buffers replaced)."""
    taken = []
    for batch in batches:
        columns: dict[int, tuple[list[int], list[int], list[int], list[int], list[int]]] = {}
        for (kind, tier), lengths, keys in batch:
            by_shard: dict[int, list[tuple[int, int]]] = {}
            for length, key in zip(lengths, keys, strict=False):
                by_shard.setdefault(shard_of(key, n_shards), []).append((length, key))
            for shard, pairs in by_shard.items():
                c = columns.setdefault(shard, ([], [], [], [], []))
                c[0].append(kind)
                c[1].append(tier)
                c[2].append(len(pairs))
                c[3].extend(length for length, _ in pairs)
                c[4].extend(key for _, key in pairs)
        taken.append([(shard, *columns[shard]) for shard in sorted(columns)])
    return taken


def listed(taken: Taken) -> Listed:
    shard, kinds, tiers, counts, lengths, keys = taken
    return shard, kinds.tolist(), tiers.tolist(), counts.tolist(), lengths.tolist(), keys.tolist()


def add(buffers: ShardEventBuffers, change: Change) -> bool:
    (kind, tier), lengths, keys = change
    if len(keys) == 1 and len(lengths) == 1:
        return buffers.add_one(kind, tier, lengths[0], keys[0])
    return buffers.add(kind, tier, lengths, np.array(keys, dtype=np.uint64))


@given(st.integers(1, 16), st.lists(st.lists(changes(), max_size=6), min_size=1, max_size=4))
@settings(max_examples=300, deadline=None)
def test_taken_columns_are_the_per_key_grouping_and_pass_the_wire_checks(
    n_shards: int, batches: list[list[Change]]
) -> None:
    buffers = ShardEventBuffers(n_shards, 1 << 16)
    for batch, want in zip(batches, reference(n_shards, batches), strict=True):
        for change in batch:
            add(buffers, change)
        assert buffers.pending_keys == sum(len(keys) for _, _, keys in batch)
        taken = buffers.take()
        assert [listed(columns) for columns in taken] == want
        for shard, kinds, tiers, counts, lengths, keys in taken:
            assert not any(c.flags.writeable for c in (kinds, tiers, counts, lengths, keys))
            # from_columns copies and checks as decoding does; trusted, they are kept.
            checked = KVEventBatch.from_columns(
                "w", "r", 0, shard, 0, kinds=kinds, tiers=tiers, counts=counts,
                lengths=lengths, keys=keys,
            )  # fmt: skip
            trusted = KVEventBatch.from_valid_columns(
                "w", "r", 0, shard, 0, kinds=kinds, tiers=tiers, counts=counts,
                lengths=lengths, keys=keys,
            )  # fmt: skip
            assert trusted == checked
        assert buffers.pending_keys == 0
        assert buffers.take() == []


@pytest.mark.parametrize(
    ("kind", "tier", "lengths", "last_key", "message"),
    [
        (1, 0, [8, 16], 5, "kind 1 with tier 0"),
        (3, 1, [8, 16], 5, "kind 3 with tier 1"),
        (0, 0, [8, 16], 5, "kind 0"),
        (1, 1, [0, 16], 5, "length 0"),
        (1, 1, [8, 1 << 32], 5, "length 4294967296"),
        (1, 1, [-8, 16], 5, "length -8"),
        (1, 1, [8, 16], 1 << 63, "not a 63-bit key"),
        (1, 1, [8], 5, "2 keys but 1 lengths"),
    ],
)
def test_a_refused_change_raises_and_adds_nothing(
    kind: int, tier: int, lengths: list[int], last_key: int, message: str
) -> None:
    buffers = ShardEventBuffers(4, 1 << 16)
    buffers.add(1, 1, [8], np.array([3], dtype=np.uint64))
    with pytest.raises(ValueError, match=message):
        buffers.add(kind, tier, lengths, np.array([7, last_key], dtype=np.uint64))
    assert buffers.pending_keys == 1
    assert [listed(columns)[5] for columns in buffers.take()] == [[3]]


def test_a_shard_at_its_event_limit_says_so_and_refuses_more_whole() -> None:
    buffers = ShardEventBuffers(2, 3)
    key = 11
    other = next(k for k in range(100) if shard_of(k, 2) != shard_of(key, 2))
    full = [buffers.add_one(1, 1, 8, key) for _ in range(3)]
    assert full == [False, False, True]
    with pytest.raises(ValueError, match="already holds 3 events"):
        buffers.add(1, 1, [8, 16], np.array([other, key], dtype=np.uint64))
    # The refused change left no count behind: the other shard's next event is whole.
    assert buffers.add_one(2, 2, 16, other) is False
    taken = {columns[0]: listed(columns)[1:] for columns in buffers.take()}
    assert taken[shard_of(other, 2)] == ([2], [2], [1], [16], [other])
    assert taken[shard_of(key, 2)][2] == [1, 1, 1]


def test_mark_all_sends_every_shard_and_discard_drops_everything() -> None:
    buffers = ShardEventBuffers(3, 10)
    buffers.add(1, 1, [8, 16, 32], np.array([1, 2, 3], dtype=np.uint64))
    assert buffers.discard() == 3
    assert buffers.take() == []
    buffers.mark_all()
    assert [(c[0], len(c[5])) for c in buffers.take()] == [(0, 0), (1, 0), (2, 0)]
    with pytest.raises(ValueError, match="n_shards must be positive"):
        ShardEventBuffers(0, 10)


@given(
    st.integers(1, 16),
    st.sampled_from(VALID_PAIRS),
    st.lists(st.integers(0, (1 << 32) - 1), max_size=80),
    st.sets(st.integers(1, 100), min_size=1, max_size=12),
)
@settings(max_examples=300, deadline=None)
def test_prefixes_keyed_here_are_the_hashers_keys_added(
    n_shards: int, pair: tuple[int, int], ids: list[int], lengths: set[int]
) -> None:
    """add_prefixes is PrefixHasher.key_array_at then add, in one call: the same columns
    (lengths past the prompt ignored)."""
    namespace = Namespace("m", "t")
    hasher = PrefixHasher(lengths, namespace, KeyHash.XXH3)
    assert hasher.compiled
    tokens = np.array(ids, dtype=np.uint32)
    (kind, tier), ascending = pair, sorted(lengths)
    keyed, given_keys = ShardEventBuffers(n_shards, 1 << 16), ShardEventBuffers(n_shards, 1 << 16)
    keyed.add_prefixes(kind, tier, hasher.head, tokens, ascending)
    given_keys.add(kind, tier, ascending, hasher.key_array_at(tokens, ascending))
    assert keyed.pending_keys == given_keys.pending_keys == sum(c <= len(ids) for c in lengths)
    assert [listed(c) for c in keyed.take()] == [listed(c) for c in given_keys.take()]


@pytest.mark.parametrize(
    ("tokens", "lengths", "error", "message"),
    [
        (np.arange(40, dtype=np.int64), [8, 16], TypeError, "uint32 items"),
        (np.arange(80, dtype=np.uint32)[::2], [8, 16], TypeError, "C-contiguous"),
        ([1, 2, 3] * 10, [8, 16], TypeError, "C-contiguous uint32 buffer"),
        (np.arange(40, dtype=np.uint32), [16, 8], ValueError, "must ascend"),
        (np.arange(40, dtype=np.uint32), [0, 8], ValueError, "length 0"),
    ],
)
def test_prefixes_refused_raise_and_add_nothing(
    tokens: object, lengths: list[int], error: type[Exception], message: str
) -> None:
    buffers = ShardEventBuffers(4, 1 << 16)
    buffers.add(1, 1, [8], np.array([3], dtype=np.uint64))
    head = PrefixHasher([8], Namespace("m")).head
    with pytest.raises(error, match=message):
        buffers.add_prefixes(1, 1, head, tokens, lengths)
    assert buffers.pending_keys == 1
    assert [listed(columns)[5] for columns in buffers.take()] == [[3]]
