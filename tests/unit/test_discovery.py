"""Region table layout, tier fields, and multi-level discovery over Ludo views."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest

from kvcompass.index.discovery import (
    DiscoveryView,
    Match,
    MultiLevelQuery,
    QueryPlanner,
)
from kvcompass.index.layout import IndexLayout, Tier, holders, with_tier
from kvcompass.index.patches import TablePatch
from kvcompass.index.shard_tables import ShardTables
from kvcompass.keys import Namespace, prefix_keys, shard_of, shard_of_array
from kvcompass.levels import LevelPlan, plan_levels
from kvcompass.topology import Topology, builtin_names, load_builtin, load_topology

NS = Namespace("meta-llama/Llama-3.1-8B-Instruct", "tenant-a")

BIG_TOPOLOGY = """
name = "big-region"
description = "one region too large for a single 64-bit table"

[index]
block_size = 16
value_bits = {value_bits}
fingerprint_bits = 16
levels = 4
local_min_tokens = 64

[cost]
gamma_ms_per_token = 0.0026

[worker_defaults]
beta_ms_per_token = 0.085
vram_bytes = 15_032_385_536
dram_bytes = 68_719_476_736

[[regions]]
name = "small"
workers = 3

[[regions]]
name = "big"
workers = 40

[[regions]]
name = "mid"
workers = 20

[wan]
"small-big" = 40.0
"small-mid" = 70.0
"big-mid" = 55.0
"""


def big_topology(tmp_path: Path, value_bits: str = '"auto"') -> Topology:
    path = tmp_path / "big.toml"
    path.write_text(BIG_TOPOLOGY.format(value_bits=value_bits), encoding="utf-8")
    return load_topology(path)


def with_fingerprints(topology: Topology, bits: int) -> Topology:
    return replace(topology, index=replace(topology.index, fingerprint_bits=bits))


# -- layout ------------------------------------------------------------------------------


def check_layout(topology: Topology, layout: IndexLayout) -> None:
    """Every worker has exactly one (table, field); tables belong to one region each."""
    assert layout.n_workers == len(topology.workers)
    assert [t.table_id for t in layout.tables] == list(range(len(layout.tables)))
    seen = set()
    for w in topology.workers:
        table_id, fld = layout.slots[w.index]
        spec = layout.tables[table_id]
        assert spec.region == w.region
        assert spec.workers[fld] == w.index
        assert 0 <= fld < spec.value_bits // 2
        seen.add((table_id, fld))
    assert len(seen) == len(topology.workers)
    for region in topology.regions:
        specs = layout.tables_of(region.name)
        members = [w for spec in specs for w in spec.workers]
        assert members == [w.index for w in region.workers]
    assert layout.fingerprint_bits == topology.index.fingerprint_bits


@pytest.mark.parametrize("name", builtin_names())
def test_layout_of_builtin_topologies(name: str) -> None:
    topology = load_builtin(name)
    layout = IndexLayout.from_topology(topology)
    check_layout(topology, layout)
    for region in topology.regions:
        specs = layout.tables_of(region.name)
        n = len(region.workers)
        assert n <= 32  # built-ins fit one table per region
        assert len(specs) == 1
        assert specs[0].value_bits == (32 if n <= 16 else 64)


def test_builtin_topologies_cover_both_value_widths() -> None:
    widths = {
        spec.value_bits
        for name in builtin_names()
        for spec in IndexLayout.from_topology(load_builtin(name)).tables
    }
    assert widths == {32, 64}
    assert len(builtin_names()) == 4


def test_testbed_layout_exactly() -> None:
    layout = IndexLayout.from_topology(load_builtin("testbed-3region"))
    assert [(t.region, t.value_bits, t.workers) for t in layout.tables] == [
        ("us", 32, tuple(range(8))),
        ("eu", 32, (8, 9)),
        ("asia", 32, (10, 11, 12, 13)),
    ]
    assert layout.slots[9] == (1, 1)
    assert layout.slots[10] == (2, 0)


def test_region_of_40_workers_needs_two_64_bit_tables(tmp_path: Path) -> None:
    topology = big_topology(tmp_path)
    layout = IndexLayout.from_topology(topology)
    check_layout(topology, layout)
    shape = [(t.region, t.value_bits, len(t.workers)) for t in layout.tables]
    assert shape == [("small", 32, 3), ("big", 64, 32), ("big", 64, 8), ("mid", 64, 20)]
    first_big = topology.region("big").workers[0].index
    assert layout.slots[first_big + 31] == (1, 31)
    assert layout.slots[first_big + 32] == (2, 0)
    assert layout.slots[first_big + 39] == (2, 7)


@pytest.mark.parametrize(
    ("value_bits", "shape"),
    [
        (
            "32",
            [
                ("small", 32, 3),
                ("big", 32, 16),
                ("big", 32, 16),
                ("big", 32, 8),
                ("mid", 32, 16),
                ("mid", 32, 4),
            ],
        ),
        ("64", [("small", 64, 3), ("big", 64, 32), ("big", 64, 8), ("mid", 64, 20)]),
    ],
)
def test_forced_value_bits(tmp_path: Path, value_bits: str, shape: list[object]) -> None:
    topology = big_topology(tmp_path, value_bits)
    layout = IndexLayout.from_topology(topology)
    check_layout(topology, layout)
    assert [(t.region, t.value_bits, len(t.workers)) for t in layout.tables] == shape


# -- tier fields ------------------------------------------------------------------------


def test_with_tier_and_holders_round_trip() -> None:
    rng = random.Random(1)
    for n_fields in (16, 32):
        for _ in range(300):
            tiers = {f: Tier(rng.choice([0, 0, 1, 2])) for f in range(n_fields)}
            value = 0
            for f in rng.sample(range(n_fields), n_fields):
                value = with_tier(value, f, tiers[f])
            assert value < 2 ** (2 * n_fields)
            want = [(f, int(t)) for f, t in sorted(tiers.items()) if t]
            assert holders(value) == want
            # Overwriting a field changes that field only.
            f = rng.randrange(n_fields)
            changed = with_tier(value, f, Tier.DRAM)
            want_changed = dict(want) | {f: int(Tier.DRAM)}
            assert dict(holders(changed)) == want_changed
            cleared = with_tier(changed, f, Tier.ABSENT)
            assert dict(holders(cleared)) == {k: v for k, v in want_changed.items() if k != f}


def test_with_tier_edge_fields() -> None:
    assert with_tier(0, 0, Tier.VRAM) == 1
    assert with_tier(0, 15, Tier.DRAM) == 2 << 30
    assert with_tier(0, 31, Tier.DRAM) == 2 << 62
    assert with_tier(with_tier(0, 31, Tier.DRAM), 31, Tier.ABSENT) == 0
    assert with_tier(2**64 - 1, 5, Tier.VRAM) == (2**64 - 1) & ~(3 << 10) | (1 << 10)
    assert holders(0) == []
    assert holders(2 << 62 | 1) == [(0, 1), (31, 2)]


# -- discovery ---------------------------------------------------------------------------


def new_shards(
    layout: IndexLayout, n_shards: int, initial_capacity: int, seed: int
) -> dict[int, ShardTables]:
    rng = random.Random(seed)
    return {
        s: ShardTables(layout, s, n_shards, initial_capacity=initial_capacity, rng=rng)
        for s in range(n_shards)
    }


def view_images(shards: dict[int, ShardTables]) -> dict[tuple[int, int], bytes]:
    return {(s, t): img for s, st in shards.items() for t, img in st.view_images().items()}


def set_tier(shards: dict[int, ShardTables], keys: list[int], worker: int, tier: Tier) -> None:
    """Route every key to the ShardTables of its shard."""
    k = np.asarray(keys, dtype=np.uint64)
    owners = shard_of_array(k, len(shards))
    for s, tables in shards.items():
        if np.any(owners == s):
            tables.set_tier(k[owners == s], worker, tier)


def take_patches(shards: dict[int, ShardTables]) -> dict[tuple[int, int], TablePatch]:
    return {(s, t): p for s, st in shards.items() for t, p in st.take_patches().items()}


@dataclass
class Scenario:
    """Every shard's ShardTables, an edge's DiscoveryView fed their patches, a reference."""

    topology: Topology
    plan: LevelPlan
    layout: IndexLayout
    shards: dict[int, ShardTables]
    view: DiscoveryView
    n_shards: int
    # worker -> key -> tier: exactly what the index should hold
    regs: dict[int, dict[int, Tier]] = field(default_factory=dict)
    reloads: int = 0

    @classmethod
    def new(cls, topology: Topology, n_shards: int, initial_capacity: int) -> Scenario:
        layout = IndexLayout.from_topology(topology)
        shards = new_shards(layout, n_shards, initial_capacity, seed=7)
        view = DiscoveryView.from_images(layout, n_shards, view_images(shards))
        return cls(topology, plan_levels(topology), layout, shards, view, n_shards)

    def keys(self, worker: int, tokens: np.ndarray, lo: int, hi: int) -> list[int]:
        """Keys a worker registers for tokens[:c], for its region's lengths lo < c <= hi."""
        region = self.topology.workers[worker].region
        lengths = [c for c in self.plan.registration_lengths[region] if lo < c <= hi]
        return list(prefix_keys(tokens, lengths, NS).values())

    def set(
        self, worker: int, tokens: np.ndarray, tier: Tier, lo: int = 0, hi: int = 10**9
    ) -> None:
        keys = self.keys(worker, tokens, lo, hi)
        assert keys
        set_tier(self.shards, keys, worker, tier)
        mine = self.regs.setdefault(worker, {})
        for k in keys:
            if tier == Tier.ABSENT:
                mine.pop(k, None)
            else:
                mine[k] = tier
        patches = take_patches(self.shards)
        assert take_patches(self.shards) == {}
        self.reloads += sum(p.reload is not None for p in patches.values())
        self.view.apply(patches)

    def expected(self, query: MultiLevelQuery) -> Match:
        n = len(self.topology.workers)
        lengths, tiers = [0] * n, [0] * n
        for w in self.topology.workers:
            mine = self.regs.get(w.index, {})
            for length, key in query.per_region.get(w.region, []):
                if key in mine:
                    lengths[w.index], tiers[w.index] = length, int(mine[key])
        return Match(lengths, tiers)

    @property
    def count(self) -> int:
        return sum(st.count for st in self.shards.values())

    def check_index(self) -> None:
        for w, mine in self.regs.items():
            for k, tier in mine.items():
                assert self.shards[shard_of(k, self.n_shards)].tier(k, w) == tier
        assert self.count == len(
            {(k, self.layout.slots[w][0]) for w, mine in self.regs.items() for k in mine}
        )

    def check_views_equal_fresh_images(self) -> DiscoveryView:
        fresh = DiscoveryView.from_images(self.layout, self.n_shards, view_images(self.shards))
        assert set(fresh.views) == set(self.view.views)
        for where, view in self.view.views.items():
            assert view.image() == fresh.views[where].image(), where
        assert fresh.nbytes == self.view.nbytes
        return fresh


def prompts(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**32, size=14_000, dtype=np.uint64).astype(np.uint32)
    b = np.concatenate([a[:3000], rng.integers(0, 128_000, size=9000).astype(np.uint32)])
    c = rng.integers(0, 128_000, size=5000).astype(np.uint32)
    return {"a": a, "b": b, "c": c}


def run_testbed_scenario(scenario: Scenario, exact: bool) -> None:
    """Register, change tiers and evict on the testbed; check every edge's matches."""
    p = prompts(3)
    a, b, c = p["a"], p["b"], p["c"]
    steps: list[Callable[[Scenario], None]] = [
        # us workers 0-7, eu 8-9, asia 10-13
        lambda s: s.set(0, a, Tier.VRAM),
        lambda s: s.set(1, b, Tier.DRAM),
        lambda s: s.set(8, a, Tier.VRAM, hi=2048),  # below every remote region's n1
        lambda s: s.set(9, a, Tier.DRAM, hi=6000),
        lambda s: s.set(10, c, Tier.VRAM),
        lambda s: s.set(13, b, Tier.DRAM, hi=12_000),
        lambda s: s.set(7, a, Tier.VRAM, hi=300),
        # tier change, partial eviction (longest prefixes dropped), full eviction
        lambda s: s.set(0, a, Tier.DRAM),
        lambda s: s.set(9, a, Tier.ABSENT, lo=4000),
        lambda s: s.set(10, c, Tier.ABSENT),
        lambda s: s.set(1, b, Tier.VRAM, hi=4000),
        lambda s: s.set(13, b, Tier.ABSENT),
    ]
    for step in steps:
        step(scenario)
        scenario.check_index()
        fresh = scenario.check_views_equal_fresh_images()
        for edge in ("us", "eu", "asia"):
            for tokens in p.values():
                for cut in (len(tokens), 2500, 4200):
                    query = MultiLevelQuery.for_prompt(tokens[:cut], edge, scenario.plan, NS)
                    got = scenario.view.match(query)
                    assert got == fresh.match(query)
                    # A planner's query takes the readers' per-plan rows; as a plain
                    # mapping it takes the general path: the two must agree.
                    assert got == scenario.view.match(MultiLevelQuery(dict(query.per_region)))
                    want = scenario.expected(query)
                    if exact:
                        assert got == want, (edge, cut)
                    else:
                        # Without fingerprints an unregistered key may hit another
                        # key's cell; registered lengths are always found.
                        for w, n in enumerate(want.lengths):
                            assert got.lengths[w] >= n
                            if got.lengths[w] == n and n:
                                assert got.tiers[w] == want.tiers[w]


@pytest.mark.parametrize(("n_shards", "initial_capacity"), [(3, 1024), (1, 16), (2, 8)])
def test_testbed_discovery_with_fingerprints(n_shards: int, initial_capacity: int) -> None:
    topology = with_fingerprints(load_builtin("testbed-3region"), 16)
    scenario = Scenario.new(topology, n_shards, initial_capacity)
    run_testbed_scenario(scenario, exact=True)
    if initial_capacity < 1024:
        assert scenario.reloads > 0  # tables grew while the view followed


def test_testbed_discovery_without_fingerprints() -> None:
    scenario = Scenario.new(load_builtin("testbed-3region"), 2, 64)
    run_testbed_scenario(scenario, exact=False)


def test_match_follows_a_view_that_reloads_after_a_match() -> None:
    """The compiled match reads each view's buffer by address: after a table grew, the
    view holds a new buffer, and the next match must read that one."""
    scenario = Scenario.new(with_fingerprints(load_builtin("testbed-3region"), 16), 1, 8)
    a = prompts(3)["a"]
    query = MultiLevelQuery.for_prompt(a, "us", scenario.plan, NS)
    assert not any(scenario.view.match(query).lengths)
    scenario.set(0, a, Tier.VRAM)
    assert scenario.reloads > 0
    got = scenario.view.match(query)
    assert got == scenario.expected(query)
    assert got.lengths[0]


def test_remote_match_below_n1_is_not_reported() -> None:
    topology = with_fingerprints(load_builtin("testbed-3region"), 16)
    scenario = Scenario.new(topology, 2, 256)
    tokens = prompts(5)["a"]
    scenario.set(8, tokens, Tier.VRAM, hi=3000)  # eu worker, shorter than us->eu n1 3776
    scenario.set(10, tokens, Tier.DRAM, hi=4000)  # asia worker, above us->asia n1 2976
    us = scenario.view.match(MultiLevelQuery.for_prompt(tokens, "us", scenario.plan, NS))
    eu = scenario.view.match(MultiLevelQuery.for_prompt(tokens, "eu", scenario.plan, NS))
    asia = scenario.view.match(MultiLevelQuery.for_prompt(tokens, "asia", scenario.plan, NS))
    assert us.holders() == {10: (2976, Tier.DRAM)}
    assert eu.holders() == {8: (2048, Tier.VRAM), 10: (3520, Tier.DRAM)}  # eu->asia n1 3520
    # From asia the eu worker is remote again (asia->eu n1 3520 > 3000): not reported.
    assert asia.holders() == {10: (2048, Tier.DRAM)}
    # Registered well past n1, the eu worker appears for the us edge too.
    scenario.set(8, tokens, Tier.VRAM, lo=3000, hi=6000)
    us = scenario.view.match(MultiLevelQuery.for_prompt(tokens, "us", scenario.plan, NS))
    assert us.holders() == {8: (5648, Tier.VRAM), 10: (2976, Tier.DRAM)}


def test_big_region_discovery(tmp_path: Path) -> None:
    topology = big_topology(tmp_path)
    scenario = Scenario.new(topology, 2, 32)
    big = [w.index for w in topology.region("big").workers]
    small = [w.index for w in topology.region("small").workers]
    mid = [w.index for w in topology.region("mid").workers]
    p = prompts(9)
    plan = [
        (big[0], p["a"], Tier.VRAM, 0, 10**9),
        (big[31], p["a"], Tier.DRAM, 0, 3000),
        (big[32], p["b"], Tier.VRAM, 0, 10**9),  # second table of the region
        (big[39], p["a"], Tier.DRAM, 0, 5000),
        (small[2], p["c"], Tier.VRAM, 0, 10**9),
        (mid[19], p["b"], Tier.DRAM, 0, 8000),
        (big[39], p["a"], Tier.VRAM, 0, 10**9),  # tier change and longer
        (big[32], p["b"], Tier.ABSENT, 1000, 10**9),  # partial eviction
    ]
    for worker, tokens, tier, lo, hi in plan:
        scenario.set(worker, tokens, tier, lo, hi)
        scenario.check_index()
        fresh = scenario.check_views_equal_fresh_images()
        for edge in ("small", "big", "mid"):
            for prompt in p.values():
                query = MultiLevelQuery.for_prompt(prompt, edge, scenario.plan, NS)
                got = scenario.view.match(query)
                assert got == scenario.expected(query)
                assert got == fresh.match(query)
    held = scenario.view.match(MultiLevelQuery.for_prompt(p["a"], "big", scenario.plan, NS))
    assert held.holders()[big[39]][1] == Tier.VRAM
    assert held.holders()[big[32]][0] <= 1000  # only the shared, short prefix is left


def test_keys_land_in_their_shard_only() -> None:
    topology = with_fingerprints(load_builtin("testbed-3region"), 16)
    scenario = Scenario.new(topology, 4, 64)
    tokens = prompts(1)["a"]
    scenario.set(3, tokens, Tier.VRAM)
    table_id, _ = scenario.layout.slots[3]
    for key in scenario.regs[3]:
        for shard, tid, table in (
            (s, t, table) for s, st in scenario.shards.items() for t, table in st.tables.items()
        ):
            want = int(Tier.VRAM) << (2 * 3) if (shard, tid) == (shard_of(key, 4), table_id) else 0
            assert table.get(key) == want


def test_set_tier_is_idempotent_and_absent_removes() -> None:
    topology = with_fingerprints(load_builtin("testbed-3region"), 16)
    scenario = Scenario.new(topology, 2, 64)
    tokens = prompts(2)["c"]
    scenario.set(2, tokens, Tier.DRAM)
    count = scenario.count
    keys = list(scenario.regs[2])
    set_tier(scenario.shards, keys, 2, Tier.DRAM)  # no change: no patch
    assert take_patches(scenario.shards) == {}
    scenario.set(5, tokens, Tier.VRAM)  # same keys, another field of the same table
    assert scenario.count == count
    scenario.set(2, tokens, Tier.ABSENT)
    assert scenario.count == count  # worker 5 still holds every key
    scenario.set(5, tokens, Tier.ABSENT)
    assert scenario.count == 0
    query = MultiLevelQuery.for_prompt(tokens, "us", scenario.plan, NS)
    assert scenario.view.match(query).holders() == {}


def test_view_requires_every_table() -> None:
    layout = IndexLayout.from_topology(load_builtin("testbed-3region"))
    images = view_images(new_shards(layout, 2, 16, seed=0))
    assert len(images) == 2 * len(layout.tables)
    del images[(1, 2)]
    with pytest.raises(ValueError, match="views missing for 1 tables"):
        DiscoveryView.from_images(layout, 2, images)


def test_query_lengths_follow_the_plan() -> None:
    topology = load_builtin("testbed-3region")
    plan = plan_levels(topology)
    tokens = prompts(4)["a"][:6000]
    query = MultiLevelQuery.for_prompt(tokens, "us", plan, NS)
    assert {r: [n for n, _ in pairs] for r, pairs in query.per_region.items()} == {
        "us": [128, 256, 512, 1024, 2048, 4096],
        "eu": [3776, 5648],
        "asia": [2976, 4448, 5936],
    }
    assert QueryPlanner(plan, "us", NS).query(tokens) == query
    # Chained, each remote region's first length is guarded by the longest length its
    # workers register below it (eu's lengths include asia's edges' 3520); "us" starts
    # at its shortest registered length.
    assert QueryPlanner(plan, "us", NS, chained=True).guard_lengths == {
        "eu": 3520,
        "asia": 2048,
    }
    assert QueryPlanner(plan, "us", NS).guard_lengths == {}
    assert MultiLevelQuery.for_prompt(tokens.tolist(), "us", plan, NS) == query
    keys = prefix_keys(tokens, [4096, 5648], NS)
    assert dict(query.per_region["us"])[4096] == keys[4096]
    assert dict(query.per_region["eu"])[5648] == keys[5648]
    planned = QueryPlanner(plan, "us", NS).query(tokens[:300]).per_region
    assert planned.get("us") == planned["us"]
    assert [n for n, _ in planned["us"]] == [128, 256]
    assert planned.get("eu", ()) == []
    assert planned.get("mars", ()) == ()
    assert planned.get("mars") is None


@pytest.mark.parametrize("chained", [False, True])
def test_a_planner_moved_to_another_namespace_plans_as_one_built_there(chained: bool) -> None:
    plan = plan_levels(load_builtin("testbed-3region"))
    tokens = prompts(4)["a"][:6000]
    tenant = Namespace(NS.model, "tenant-b")
    moved = QueryPlanner(plan, "us", NS, chained).for_namespace(tenant)
    built = QueryPlanner(plan, "us", tenant, chained)
    assert moved.namespace == tenant
    assert moved.guard_lengths == built.guard_lengths
    assert moved.query(tokens) == built.query(tokens)
    assert moved.query(tokens) != QueryPlanner(plan, "us", NS, chained).query(tokens)


def test_chained_lookups_keep_true_matches_and_turn_away_most_false_locators() -> None:
    """No fingerprints (the paper's index): a never-inserted key answers whatever occupied
    cell it lands on. Chained, a hit counts only where the worker also hit at the
    region's previous length, or, at a remote region's first length, at the guard (the
    longest length the region registers below it): true holders keep their whole match,
    while a false locator needs the same worker named by consecutive false hits, which
    is an order of magnitude rarer past the first length. At a remote region's first
    length only the guard stands before it, and in regions of 2 and 4 workers a false
    hit names a given worker often, so it turns away fewer there. The edge's own region
    starts at its shortest registered length, so its first length has no guard."""
    topology = load_builtin("testbed-3region")
    assert topology.index.fingerprint_bits == 0
    scenario = Scenario.new(topology, 1, 64)
    rng = np.random.default_rng(1)
    stored = []
    for _ in range(400):
        toks = rng.integers(0, 50_000, 8192, dtype=np.uint32)
        worker = int(rng.integers(len(topology.workers)))
        region = topology.workers[worker].region
        lengths = list(scenario.plan.registration_lengths[region])
        set_tier(scenario.shards, list(prefix_keys(toks, lengths, NS).values()), worker, Tier.VRAM)
        stored.append((toks, worker))
    scenario.view.apply(take_patches(scenario.shards))

    for toks, worker in stored[:50]:
        chained = scenario.view.match(
            MultiLevelQuery.for_prompt(toks, "us", scenario.plan, NS, chained=True)
        )
        plain = scenario.view.match(MultiLevelQuery.for_prompt(toks, "us", scenario.plan, NS))
        assert chained.lengths[worker] == plain.lengths[worker] > 0

    first = {r: lengths[0] for r, lengths in scenario.plan.queries_from("us").items()}
    assert first["us"] == min(scenario.plan.registration_lengths["us"])
    past_first = {False: 0, True: 0}
    remote_first = {False: 0, True: 0}
    for _ in range(300):
        alien = rng.integers(50_000, 100_000, 8192, dtype=np.uint32)  # never inserted
        for chain in (False, True):
            query = MultiLevelQuery.for_prompt(alien, "us", scenario.plan, NS, chained=chain)
            match = scenario.view.match(query)
            for w, n in zip(topology.workers, match.lengths, strict=True):
                past_first[chain] += n > first[w.region]
                remote_first[chain] += n == first[w.region] and w.region != "us"
    assert past_first[False] > 1000
    assert past_first[True] * 8 < past_first[False]
    assert remote_first[False] > 100
    assert remote_first[True] * 2 < remote_first[False]
