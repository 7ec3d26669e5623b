"""The worker's two-tier block cache: what it holds, what leaves first, what it reports."""

from __future__ import annotations

import random

import pytest

from kvcompass.errors import InvariantBroken
from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace
from kvcompass.topology import load_builtin
from kvcompass.wire import EventKind
from kvcompass.worker import CacheMatch, EvictionPolicy, PrefixCache, PrefixChange

NS = Namespace("m")
BLOCK = 4


def prompt(*blocks: int, extra: int = 0) -> list[int]:
    """One block of 4 tokens per id (block b holds b*10..b*10+3), then ``extra`` tokens."""
    tokens = [b * 10 + i for b in blocks for i in range(BLOCK)]
    return tokens + [999] * extra


def cache(
    vram: int, dram: int, lengths: tuple[int, ...] = (4, 8), policy: str = "lru"
) -> tuple[PrefixCache, list[PrefixChange]]:
    changes: list[PrefixChange] = []
    return PrefixCache(BLOCK, vram, dram, lengths, EvictionPolicy(policy), changes.append), changes


def summary(changes: list[PrefixChange]) -> list[tuple[str, str, tuple[int, ...], list[int]]]:
    return [(c.kind.name, c.tier.name, c.lengths, c.tokens.tolist()) for c in changes]


def test_capacities_come_from_the_worker_memory_and_the_model() -> None:
    topology = load_builtin("testbed-3region")
    c = PrefixCache.for_worker(topology, topology.workers[0])
    # 15,032,385,536 B / (131,072 B per token x 16 tokens) and 64 GiB / 2 MiB
    assert c.capacity == {Tier.VRAM: 7168, Tier.DRAM: 32768}


def test_a_prompt_reuses_its_longest_held_prefix_of_whole_blocks() -> None:
    c, _ = cache(vram=8, dram=0)
    assert c.use(NS, prompt(1, 2, extra=3)) == CacheMatch(0, 0)  # the tail never caches
    assert c.match(NS, prompt(1, 2, 3)) == CacheMatch(8, 0)
    assert c.match(NS, prompt(1, 5)) == CacheMatch(4, 0)
    assert c.match(NS, prompt(5, 2)) == CacheMatch(0, 0)
    assert c.use(NS, prompt(1, 2, 3)) == CacheMatch(8, 0)
    assert c.blocks(Tier.VRAM) == 3


def test_changes_are_reported_at_registration_lengths_only_when_crossed() -> None:
    c, changes = cache(vram=8, dram=0, lengths=(8, 16))
    c.use(NS, prompt(1))  # 4 tokens: below the first registration length
    assert changes == []
    c.use(NS, prompt(1, 2, 3))  # 12 tokens: crosses 8
    assert summary(changes) == [("ADMIT", "VRAM", (8,), prompt(1, 2))]
    c.use(NS, prompt(1, 2, 3, extra=3))  # still 12 whole tokens: nothing new held
    c.use(NS, prompt(1, 2, 7))  # a sibling branch within the same interval
    assert len(changes) == 1
    c.use(NS, prompt(1, 2, 3, 4, 5))  # crosses 16
    assert summary(changes)[1] == ("ADMIT", "VRAM", (16,), prompt(1, 2, 3, 4))


def test_one_prompt_crossing_several_lengths_is_one_change() -> None:
    c, changes = cache(vram=8, dram=0, lengths=(4, 8, 16))
    c.use(NS, prompt(1, 2, 3, 4))
    assert summary(changes) == [("ADMIT", "VRAM", (4, 8, 16), prompt(1, 2, 3, 4))]


def test_a_demotion_streaming_up_a_path_is_one_change() -> None:
    """A full worker demotes a cold prompt's blocks one after the other. The last one
    starts the DRAM run and the first one ends the VRAM run, each the long way; those
    between stream, and report as one change (the order of a streamed eviction and
    demotion is the equivalence test's: against the reference, one step at a time)."""
    c, changes = cache(vram=8, dram=8, lengths=tuple(4 * d for d in range(1, 9)))
    c.use(NS, prompt(*range(1, 9)))
    c.use(NS, prompt(*range(11, 19)))  # all eight blocks of the first go to DRAM
    demoted = [ch for ch in changes if ch.kind is EventKind.TIER]
    assert [ch.lengths for ch in demoted] == [(32,), (8, 12, 16, 20, 24, 28), (4,)]
    assert all(ch.tier is Tier.DRAM for ch in demoted)
    assert demoted[1].tokens.tolist() == prompt(*range(1, 8))


@pytest.mark.parametrize(
    ("uses", "policy", "evicted"),
    [
        # A used twice then B: LRU drops A (older last use), LFU drops B (fewer uses).
        ([1, 1, 2], "lru", 1),
        ([1, 1, 2], "lfu", 2),
        ([1, 1, 2], "fifo", 1),
        # A, B, then A again: LRU and LFU drop B; FIFO drops A (cached first).
        ([1, 2, 1], "lru", 2),
        ([1, 2, 1], "lfu", 2),
        ([1, 2, 1], "fifo", 1),
    ],
)
def test_eviction_order_follows_the_policy(uses: list[int], policy: str, evicted: int) -> None:
    c, _ = cache(vram=2, dram=0, policy=policy)
    for block in uses:
        c.use(NS, prompt(block))
    c.use(NS, prompt(3))
    kept = 1 if evicted == 2 else 2
    assert c.match(NS, prompt(evicted)).tokens == 0
    assert c.match(NS, prompt(kept)).tokens == BLOCK
    assert c.match(NS, prompt(3)).tokens == BLOCK


def test_a_full_vram_demotes_to_dram_before_anything_is_evicted() -> None:
    c, changes = cache(vram=2, dram=2, lengths=(4,))
    for block in (1, 2, 3):
        c.use(NS, prompt(block))
    assert c.match(NS, prompt(1)) == CacheMatch(4, 4)  # demoted, still held
    assert c.blocks(Tier.VRAM) == 2
    assert c.blocks(Tier.DRAM) == 1
    for block in (4, 5):
        c.use(NS, prompt(block))
    assert c.match(NS, prompt(1)) == CacheMatch(0, 0)  # DRAM full: the oldest leaves
    events_of_1 = [(k, t) for k, t, _, tokens in summary(changes) if tokens == prompt(1)]
    assert events_of_1 == [("ADMIT", "VRAM"), ("TIER", "DRAM"), ("EVICT", "ABSENT")]


def test_reuse_promotes_dram_blocks_and_reports_the_move() -> None:
    c, changes = cache(vram=2, dram=2, lengths=(4,))
    for block in (1, 2, 3):
        c.use(NS, prompt(block))
    changes.clear()
    assert c.use(NS, prompt(1)) == CacheMatch(4, 4)  # the reuse came from DRAM
    assert c.match(NS, prompt(1)) == CacheMatch(4, 0)
    assert ("TIER", "VRAM", (4,), prompt(1)) in summary(changes)
    assert ("TIER", "DRAM", (4,), prompt(2)) in summary(changes)  # made room for it


def test_only_frontier_blocks_leave_so_held_prefixes_stay_contiguous() -> None:
    c, _ = cache(vram=3, dram=1, lengths=(4, 8, 12))
    c.use(NS, prompt(1, 2, 3))  # one path of three blocks fills VRAM
    c.use(NS, prompt(4))  # one must go: the deepest, never the root block
    assert c.match(NS, prompt(1, 2, 3)) == CacheMatch(12, 4)
    c.use(NS, prompt(5))  # DRAM full: the DRAM leaf goes, then block 2 is demoted
    assert c.match(NS, prompt(1, 2, 3)) == CacheMatch(8, 4)


def test_a_prompt_longer_than_vram_keeps_its_first_blocks() -> None:
    c, _ = cache(vram=2, dram=4)
    c.use(NS, prompt(1, 2, 3, 4))
    assert c.match(NS, prompt(1, 2, 3, 4)) == CacheMatch(8, 0)


def test_namespaces_never_share_blocks_and_changes_name_theirs() -> None:
    other = Namespace("m", "tenant-b")
    c, changes = cache(vram=4, dram=0)
    c.use(NS, prompt(1, 2))
    assert c.match(other, prompt(1, 2)) == CacheMatch(0, 0)
    assert c.use(other, prompt(1, 2)) == CacheMatch(0, 0)
    assert [ch.namespace for ch in changes] == [NS, other]


def test_a_use_right_after_a_match_of_its_tokens_elsewhere_walks_its_own() -> None:
    other = Namespace("m", "tenant-b")
    c, changes = cache(vram=8, dram=0)
    c.use(NS, prompt(1, 2))
    assert c.match(NS, prompt(1, 2)) == CacheMatch(8, 0)  # walked for NS
    assert c.use(other, prompt(1, 2)) == CacheMatch(0, 0)  # not NS's walk
    assert [ch.namespace for ch in changes] == [NS, other]
    assert c.blocks(Tier.VRAM) == 4


def test_load_puts_new_blocks_in_dram_and_leaves_held_ones() -> None:
    c, changes = cache(vram=4, dram=4, lengths=(4, 8))
    c.use(NS, prompt(1))
    c.load(NS, prompt(1, 2))
    assert c.match(NS, prompt(1, 2)) == CacheMatch(8, 4)
    assert summary(changes)[-1] == ("ADMIT", "DRAM", (8,), prompt(1, 2))


def test_clear_evicts_every_registered_prefix() -> None:
    c, changes = cache(vram=4, dram=4, lengths=(4, 8))
    c.use(NS, prompt(1, 2))
    c.use(NS, prompt(3))
    changes.clear()
    c.clear()
    assert sorted(ch.tokens.tolist() for ch in changes) == [prompt(1), prompt(1, 2), prompt(3)]
    assert {ch.kind for ch in changes} == {EventKind.EVICT}
    assert c.blocks(Tier.VRAM) == c.blocks(Tier.DRAM) == 0


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo"])
@pytest.mark.parametrize("seed", range(4))
def test_the_reported_changes_replay_to_exactly_what_is_held(policy: str, seed: int) -> None:
    """An index fed only the changes agrees with the cache after every operation, and the
    capacities and the DRAM-children rule always hold."""
    rng = random.Random(seed)
    lengths = (4, 8, 16)
    c, changes = cache(vram=6, dram=5, lengths=lengths, policy=policy)
    namespaces = [NS, Namespace("m", "b")]
    index: dict[tuple[Namespace, tuple[int, ...]], Tier] = {}
    for _ in range(300):
        ns = rng.choice(namespaces)
        tokens = prompt(*[rng.randrange(3) for _ in range(rng.randrange(1, 6))])
        op = rng.random()
        if op < 0.7:
            c.use(ns, tokens)
        elif op < 0.97:
            c.load(ns, tokens)
        else:
            c.clear()
        for change in changes:
            for length in change.lengths:
                key = (change.namespace, tuple(change.tokens[:length].tolist()))
                if change.kind is EventKind.EVICT:
                    assert index.pop(key) is not None
                else:
                    index[key] = change.tier
        changes.clear()
        assert index == _held(c, lengths, namespaces)
        assert c.blocks(Tier.VRAM) <= 6
        assert c.blocks(Tier.DRAM) <= 5


def _held(
    c: PrefixCache, lengths: tuple[int, ...], namespaces: list[Namespace]
) -> dict[tuple[Namespace, tuple[int, ...]], Tier]:
    """Every held prefix at a registration length (``lengths``, the cache's), each with
    the tier the cache's own match answers, after a check of the cache's invariants (its
    tree's shape and its victim queues)."""
    c.check()
    held = {}
    for change in c.held():
        assert change.lengths[0] in lengths
        if change.namespace in namespaces:
            prefix = change.tokens.tolist()
            held[change.namespace, tuple(prefix)] = c.match(change.namespace, prefix).tier
    return held


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo"])
def test_held_is_the_state_the_reported_changes_add_up_to(policy: str) -> None:
    c, changes = cache(vram=6, dram=5, lengths=(4, 8, 12), policy=policy)
    rng = random.Random(3)
    tenants = [NS, Namespace("m", "other")]
    state: dict[tuple[Namespace, bytes], Tier] = {}
    for _ in range(300):
        tokens = prompt(*(rng.randrange(4) for _ in range(rng.randrange(1, 5))))
        namespace = rng.choice(tenants)
        (c.load if rng.random() < 0.3 else c.use)(namespace, tokens)
        for change in changes:  # the index's view, from the changes alone
            for length in change.lengths:
                key = (change.namespace, change.tokens[:length].tobytes())
                if change.kind is EventKind.EVICT:
                    del state[key]
                else:
                    state[key] = change.tier
        changes.clear()
        held = {}
        for change in c.held():
            assert change.kind is EventKind.ADMIT
            (length,) = change.lengths
            assert len(change.tokens) == length
            held[(change.namespace, change.tokens.tobytes())] = change.tier
        assert held == state
    assert set(state.values()) == {Tier.VRAM, Tier.DRAM}


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        ("vram_children", "VRAM children"),
        ("used", "counted as used"),
        ("queue", "without a live queue entry"),
        ("parent", "parent link"),
        ("tier", "VRAM block under a DRAM block"),
    ],
)
def test_check_names_the_invariant_a_corrupted_cache_breaks(corrupt: str, message: str) -> None:
    """check() is what the invariant tests rely on: it must not pass a broken cache.
    (Breaking one means reaching into the cache; nothing else here does.)"""
    c, _ = cache(vram=3, dram=4)
    c.use(NS, prompt(1, 2, 3))
    c.use(NS, prompt(4, 5, 6))  # demotes 1-2-3's deepest blocks to DRAM
    c.check()
    (root,) = c._roots.values()
    runs = [root]
    for run in runs:
        runs.extend(run.children.values())
    dram = next(r for r in runs if r.tier == Tier.DRAM and r.parent is not None)
    assert dram.first < dram.last  # the three blocks are one run
    assert not dram.children
    if corrupt == "vram_children":
        root.vram_children += 1
    elif corrupt == "used":
        dram.last -= 1  # one block fewer than counted
    elif corrupt == "queue":
        dram.version += 1  # the run changed, and was not queued again
    elif corrupt == "parent":
        dram.parent = root if dram.parent is not root else None
    else:  # a well-formed VRAM block hung under the DRAM one
        block = bytes(4 * BLOCK)
        source = dram.source[: dram.last * 4 * BLOCK] + block
        depth = dram.last + 1
        child = type(dram)(NS, dram, source, depth, depth, Tier.VRAM, 0, 0, 0, 0)
        dram.children = {block: child}
    with pytest.raises(InvariantBroken, match=message):
        c.check()
