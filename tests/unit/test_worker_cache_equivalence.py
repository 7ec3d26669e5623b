"""The worker cache behaves exactly like its pre-speed-up version (``_cache_reference``).

Seeded random operations (use / load / match / clear over three namespaces, prompts
sharing prefixes, capacities of a few blocks so that demotions, evictions, promotions,
pinning and failed room-making happen constantly) go to both; every result, every
block count and every reported change (namespace, kind, tier, tokens, lengths) must be
equal, in order, for each eviction policy, with and without DRAM.
"""

from __future__ import annotations

import importlib
import itertools
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvcompass.index.layout import Tier
from kvcompass.keys import Namespace
from kvcompass.worker import EvictionPolicy, PrefixCache, PrefixChange

# Beside this file (pytest puts its folder on sys.path); untyped on purpose: only a
# reference to compare with.
reference: Any = importlib.import_module("_cache_reference")

BLOCK = 2
NAMESPACES = [Namespace("m"), Namespace("m", "b"), Namespace("m", "c")]

Change = tuple[Namespace, str, str, list[int], tuple[int, ...]]


def _record(changes: list[Change]) -> Any:
    def on_change(c: Any) -> None:
        changes.append((c.namespace, c.kind.name, c.tier.name, c.tokens.tolist(), c.lengths))

    return on_change


def _as_compared(changes: list[Change]) -> list[Any]:
    """The changes one prefix at a time, each run of consecutive changes of one
    (namespace, kind, tier) in sorted order. The cache may report such a run as one
    change or as several, with its prefixes in any order: the index applies a report's
    keys in any order, and only one key's own changes (never two in such a run) must
    keep theirs. Operation boundaries stay."""
    singles = [
        (ns, kind, tier, tuple(tokens[:length]))
        for ns, kind, tier, tokens, lengths in changes
        for length in (lengths or (0,))
    ]
    out: list[Any] = []
    for _, run in itertools.groupby(singles, key=lambda single: single[:3]):
        out += sorted(run, key=lambda single: single[3])
    return out


def _prompt(rng: random.Random) -> list[int]:
    """Blocks from a small alphabet (so prompts share prefixes), sometimes a partial tail."""
    n = rng.choice([1, 2, 3, 4, 6, 9, 14])
    head = rng.randrange(3)  # a few "system prompts" many prompts start with
    blocks = [head] + [rng.randrange(4) for _ in range(n - 1)]
    tokens = [b * 10 + i for b in blocks for i in range(BLOCK)]
    return tokens + [7] * rng.choice([0, 0, 1])


def _long_prompt(rng: random.Random) -> list[int]:
    """Prompts of up to 50 blocks that repeat a block for a while, so that the cache's
    runs of blocks are long and are split, demoted and promoted part-way."""
    n = rng.choice([1, 5, 12, 20, 33, 47])
    blocks = [rng.randrange(3)] * rng.randrange(1, 8) + [rng.randrange(3) for _ in range(n)]
    tokens = [b * 10 + i for b in blocks for i in range(BLOCK)]
    return tokens + [7] * rng.choice([0, 1])


def _run(
    seed: int,
    policy: EvictionPolicy,
    vram: int,
    dram: int,
    ops: int,
    prompt: Callable[[random.Random], list[int]] = _prompt,
    then_use: float = 0.0,
) -> tuple[list[Any], list[Any], PrefixCache, int]:
    """The two caches' (results, changes) side by side, the new cache (its counts of
    heap rebuilds, the rare path through which lost frontier blocks come back, and of
    walks through the tree) and how many matches it was asked. ``then_use``:
    the share of matches followed at once by a use of the same prompt (an engine's way
    on an idle worker), drawn from a stream of its own."""
    rng = random.Random(seed)
    lengths = sorted(rng.sample([0, 2, 4, 6, 8, 12, 16, 20], rng.randrange(1, 5)))
    runs: list[tuple[list[Any], list[Change]]] = []
    matches = 0
    for cls in (reference.PrefixCache, PrefixCache):
        rng, follow = random.Random(seed), random.Random(~seed)
        results: list[Any] = []
        changes: list[Change] = []
        cache: Any = cls(BLOCK, vram, dram, lengths, policy, _record(changes))
        hot = [(NAMESPACES[0], prompt(rng))]
        burst, repeated = 0, hot[0]
        for _ in range(ops):
            if burst == 0 and rng.random() < 0.01:
                # One prompt again and again: its hits queue entries that no eviction
                # pops, until the heap is rebuilt.
                burst, repeated = 100, rng.choice(hot)
            if burst:
                burst -= 1
                ns, tokens = repeated
            elif rng.random() < 0.3:
                ns, tokens = rng.choice(hot)
            else:
                ns, tokens = rng.choice(NAMESPACES), prompt(rng)
                hot = [*hot[-3:], (ns, tokens)]
            op = rng.random()
            if op < 0.6:
                m = cache.use(ns, tokens)
            elif op < 0.85:
                m = cache.load(ns, tokens)
            elif op < 0.995:
                m = cache.match(ns, tokens)
                matches += cls is PrefixCache
                if follow.random() < then_use:
                    results.append((m.tokens, m.dram_tokens))
                    m = cache.use(ns, tokens)
            else:
                m = cache.clear()
            results.append(
                (m and (m.tokens, m.dram_tokens), cache.blocks(Tier.VRAM), cache.blocks(Tier.DRAM))
            )
            changes.append((ns, "op", "", [], ()))  # a boundary: changes stay per operation
        runs.append((results, changes))
    (old_results, old_changes), (new_results, new_changes) = runs
    old_compared, new_compared = _as_compared(old_changes), _as_compared(new_changes)
    return [old_results, old_compared], [new_results, new_compared], cache, matches


@pytest.mark.parametrize("policy", list(EvictionPolicy))
@pytest.mark.parametrize(("vram", "dram"), [(3, 5), (6, 4), (4, 0), (1, 9), (12, 30)])
def test_every_result_and_change_equals_the_reference(
    policy: EvictionPolicy, vram: int, dram: int
) -> None:
    rebuilt = 0
    for seed in range(6):
        old, new, cache, _ = _run(seed, policy, vram, dram, ops=1500)
        assert new[0] == old[0], f"results differ (seed {seed})"
        assert new[1] == old[1], f"changes differ (seed {seed})"
        rebuilt += cache.rebuilds
    assert rebuilt > 0  # the heaps' rebuild was exercised too


@pytest.mark.parametrize("policy", list(EvictionPolicy))
@pytest.mark.parametrize(("vram", "dram"), [(60, 150), (50, 20), (48, 0)])
def test_long_prompts_too(policy: EvictionPolicy, vram: int, dram: int) -> None:
    for seed in range(2):
        old, new, _, _ = _run(seed, policy, vram, dram, ops=1000, prompt=_long_prompt)
        assert new == old, f"seed {seed}"


def _array_prompt(rng: random.Random) -> Any:
    """A prompt as the engine passes it: a uint32 array."""
    return np.array(_prompt(rng), dtype=np.uint32)


@pytest.mark.parametrize("policy", list(EvictionPolicy))
@pytest.mark.parametrize(("vram", "dram"), [(3, 5), (4, 0), (12, 30)])
@pytest.mark.parametrize("prompt", [_prompt, _array_prompt], ids=["list", "array"])
def test_a_use_right_after_its_match_equals_the_reference(
    policy: EvictionPolicy, vram: int, dram: int, prompt: Callable[[random.Random], Any]
) -> None:
    """The use takes the match's walk unless the cache changed since: never a stale one."""
    for seed in range(4):
        old, new, cache, matches = _run(
            seed, policy, vram, dram, ops=1500, prompt=prompt, then_use=0.8
        )
        assert new == old, f"seed {seed}"
        # Not vacuous: without the match's walk every result but a clear's would walk
        # once (a match followed by its use adds one result, the match's own); only a
        # use or load after a match, with no change between, can skip it.
        results = new[0]
        walking = len(results) - sum(len(r) == 3 and r[0] is None for r in results)
        assert any(len(r) == 2 for r in results)
        assert walking - matches <= cache.walks < walking


def test_a_prompt_changed_in_place_after_its_match_is_walked_again() -> None:
    """The match's walk is kept for the same tokens, not for the same array object."""
    fresh, reused = PrefixCache(BLOCK, 8, 8, (2,)), PrefixCache(BLOCK, 8, 8, (2,))
    for cache in (fresh, reused):
        cache.use(NAMESPACES[0], [1, 2, 3, 4])
    tokens = np.array([1, 2, 3, 4], dtype=np.uint32)
    assert reused.match(NAMESPACES[0], tokens).tokens == 4
    tokens[2] = 9  # same object, other prompt: held to 2 tokens only
    assert reused.use(NAMESPACES[0], tokens) == fresh.use(NAMESPACES[0], tokens)
    assert reused.use(NAMESPACES[0], tokens).tokens == 4  # its new branch was admitted


def test_the_comparison_sees_changes() -> None:
    """Guard against a vacuous pass: the scenarios do report, promote and evict."""
    _, new, _, _ = _run(0, EvictionPolicy.LRU, 3, 5, ops=1500)
    kinds = {(kind, tier) for _, kind, tier, _ in new[1]}
    assert {("ADMIT", "VRAM"), ("ADMIT", "DRAM"), ("TIER", "DRAM"), ("TIER", "VRAM")} <= kinds
    assert ("EVICT", "ABSENT") in kinds


def test_a_prefix_change_is_the_public_type() -> None:
    changes: list[PrefixChange] = []
    PrefixCache(BLOCK, 2, 2, (2,), on_change=changes.append).use(NAMESPACES[0], [1, 2])
    assert isinstance(changes[0], PrefixChange)


@pytest.mark.parametrize("policy", list(EvictionPolicy))
def test_every_frontier_block_keeps_a_live_entry(policy: EvictionPolicy) -> None:
    """What makes the heaps' rebuild change no victim: after every operation each
    frontier block has an entry of its current version in its tier's heap or beside it."""
    rng = random.Random(7)
    cache = PrefixCache(BLOCK, 3, 5, (2, 4), policy)
    for _ in range(3000):
        ns, tokens = rng.choice(NAMESPACES[:2]), _prompt(rng)
        if rng.random() < 0.7:
            cache.use(ns, tokens)
        else:
            cache.load(ns, tokens)
        cache.check()
