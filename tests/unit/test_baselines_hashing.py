"""The hash-placement baselines' defining behaviour: consistent hashing pins a prefix to
one worker whatever the load; Chord's lookup time is the WAN of its hops and it reads its
directory from the index; PlanetServe returns a prefix to its designated worker unless
that worker is among the most loaded."""

from __future__ import annotations

import bisect
from itertools import pairwise

import numpy as np
import pytest

from kvcompass.index.layout import Tier
from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import ChordDHT, ConsistentHashing, PlanetServe, make_policy
from kvcompass.routing.baselines.placement import ChunkKeys, node_hash
from kvcompass.routing.testing import TOY, RealIndex, StubReader, queues, request, tokens
from kvcompass.topology import load_builtin

SIM8 = load_builtin("sim-8region")


def consistent(origin: str = "a", seed: int = 0) -> ConsistentHashing:
    p = make_policy("consistent-hashing", TOY, origin, clock=ManualClock(), seed=seed)
    assert isinstance(p, ConsistentHashing)
    return p


# -- consistent hashing ----------------------------------------------------------------------


def test_consistent_hashing_sends_a_prefix_to_one_worker_whatever_the_load() -> None:
    prompt = tokens(600, seed=1)
    p = consistent()
    owner = p.decide(request(prompt)).worker
    for loads in ({"w0": 500.0, "w1": 500.0}, {"w0": 0.0, "w1": 0.0}):
        p.on_queues(queues("a", 1 + len(p.queues.values), **loads))
        p.on_queues(queues("b", 2, w2=900.0 if owner == 2 else 0.0, w3=900.0))
        for _ in range(5):
            d = p.decide(request(prompt))
            p.on_forward(d, 1_000.0)  # piles work on it: still the same worker
            assert (d.worker, d.reason) == (owner, "hash")
    # every edge agrees, whatever the seed it was given (the simulator seeds each apart)
    assert consistent("b", seed=9).decide(request(prompt, origin="b")).worker == owner
    assert consistent(seed=5).decide(request(prompt)).worker == owner


def test_consistent_hashing_keys_the_longest_level_the_prompt_reaches() -> None:
    p = consistent()
    base = tokens(600, seed=2)  # levels 128, 256, 512: the 512 prefix decides
    same_512 = np.concatenate([base[:512], tokens(88, seed=3)])
    assert p.decide(request(same_512)).worker == p.decide(request(base)).worker
    owners = {p.decide(request(tokens(600, seed=s))).worker for s in range(40)}
    assert owners == {0, 1, 2, 3}  # different prefixes spread over the pool
    # the owner is the 512 ring's owner of the 512-token key
    keys = p.chunks.keys(base, request(base).namespace)
    assert keys[-1][0] == 512
    assert p.decide(request(base)).worker == p.rings[2].owner(keys[-1][1])


# -- Chord -------------------------------------------------------------------------------------


def chord(origin: str = "us") -> tuple[ChordDHT, RealIndex]:
    index = RealIndex(SIM8)
    p = make_policy("dht", SIM8, origin, index.view, clock=ManualClock(), seed=7)
    assert isinstance(p, ChordDHT)
    other = make_policy("dht", SIM8, "cn", index.view, clock=ManualClock(), seed=8)
    assert isinstance(other, ChordDHT)
    assert other.ring.workers == p.ring.workers  # every edge builds the same ring
    return p, index


def hops_ms(p: ChordDHT, origin: str, path: list[int]) -> float:
    """The WAN of a lookup's hops, from the topology: edge -> entry, node -> node, owner -> edge."""
    t = p.topology
    regions = [t.workers[p.ring.workers[pos]].region for pos in path]
    legs = [origin, *regions, origin]
    return sum(t.wan_ms(a, b) for a, b in pairwise(legs))


@pytest.mark.parametrize("origin", ["us", "au", "de"])
def test_dht_lookup_time_is_the_wan_of_its_hops(origin: str) -> None:
    p, _ = chord(origin=origin)
    multi_hop = 0
    for seed in range(20):
        prompt = tokens(200, seed=seed)  # reaches one level (128): one lookup
        [(_, key)] = p.chunks.keys(prompt, request(prompt).namespace)
        entry = p.ring.position_of(p.local[0])
        path = p.ring.lookup(entry, key)
        multi_hop += len(path) > 2
        d = p.decide(request(prompt, origin=origin))
        assert d.lookup_ms == pytest.approx(hops_ms(p, origin, path))
    assert multi_hop  # some lookups crossed several nodes


def test_dht_lookups_end_at_the_keys_successor_and_run_in_parallel() -> None:
    p, _ = chord()
    ids = sorted(node_hash(w.id, 0) for w in SIM8.workers)
    by_id = {node_hash(w.id, 0): w.index for w in SIM8.workers}
    prompt = tokens(3000, seed=4)  # levels 128 ... 2048: five lookups
    keys = p.chunks.keys(prompt, request(prompt).namespace)
    assert [n for n, _ in keys] == [128, 256, 512, 1024, 2048]
    entry = p.ring.position_of(p.local[0])
    times = []
    for _, key in keys:
        path = p.ring.lookup(entry, key)
        successor = ids[bisect.bisect_left(ids, p.ring.key_id(key)) % len(ids)]
        assert p.ring.workers[path[-1]] == by_id[successor]
        assert len(path) <= 1 + 2 * 6  # O(log N) hops on 64 nodes
        times.append(hops_ms(p, "us", path))
    d = p.decide(request(prompt, origin="us"))
    assert d.lookup_ms == pytest.approx(max(times))
    assert d.reason == "dht-place"  # nobody holds it: the longest key's successor
    assert (
        d.worker == p.ring.workers[p.ring.lookup(p.ring.position_of(p.local[0]), keys[-1][1])[-1]]
    )


def test_dht_directory_is_what_the_index_says() -> None:
    p, index = chord()
    prompt = tokens(3000, seed=4)
    holder = SIM8.region("au").workers[1].index
    index.set(holder, prompt, upto=700, tier=Tier.DRAM)  # holds levels 128, 256, 512
    d = p.decide(request(prompt, origin="us"))
    assert (d.worker, d.reason, d.claimed_tokens) == (holder, "dht-holder", 512)
    # two holders of the longest held level: the less loaded by estimate
    other = SIM8.region("de").workers[0].index
    index.set(other, prompt, upto=600, tier=Tier.VRAM)
    p.on_queues(queues("au", 5, **{f"w{holder}": 50.0}))
    assert p.decide(request(prompt, origin="us")).worker == other


# -- PlanetServe -----------------------------------------------------------------------------


def test_planetserve_returns_a_prefix_to_its_designated_worker_until_it_is_overloaded() -> None:
    p = make_policy("planetserve", SIM8, "us", clock=ManualClock(), seed=1)
    assert isinstance(p, PlanetServe)
    prompt = tokens(1000, seed=8)
    first = p.decide(request(prompt, origin="us"))
    assert first.reason == "hrt-new"
    follow_up = np.concatenate([prompt[:512], tokens(300, seed=9)])  # shares 512 tokens
    again = p.decide(request(follow_up, origin="us"))
    assert (again.worker, again.reason) == (first.worker, "hrt-match")
    # the designated worker among the busiest fifth: the pool's least loaded instead
    w = first.worker
    p.on_queues(queues(SIM8.workers[w].region, 3, **{f"w{w}": 100.0}))
    moved = p.decide(request(prompt, origin="us"))
    assert moved.reason == "hrt-balance"
    assert moved.worker != w
    assert p.queues.values[moved.worker] == 0.0
    # which is now listed too: with the first one still busy, the prefix goes there
    assert p.decide(request(prompt, origin="us")).worker == moved.worker


def test_chunk_keys_are_the_same_region_levels_and_a_short_prompt_is_keyed_whole() -> None:
    chunks = ChunkKeys(TOY, RealIndex(TOY).plan, "a")
    assert chunks.lengths == (128, 256, 512)
    ns = request(tokens(1)).namespace
    [(n, _)] = chunks.keys(tokens(50), ns)
    assert n == 50
    assert chunks.keys(tokens(50, seed=1), ns) != chunks.keys(tokens(50, seed=2), ns)
    assert StubReader(4).ready()
