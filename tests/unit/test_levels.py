"""Latency-derived level lengths (paper §3.2)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest

from kvcompass.keys import KeyHash
from kvcompass.levels import LevelPlan, plan_levels
from kvcompass.topology import (
    IndexSettings,
    Region,
    Topology,
    Worker,
    builtin_names,
    load_builtin,
)

TESTBED = load_builtin("testbed-3region")


def test_testbed_us_to_eu_first_level_is_rtt_over_beta_rounded_up() -> None:
    plan = plan_levels(TESTBED)
    n1 = 2 * 160 / 0.085  # 3764.7 tokens
    assert math.ceil(n1) == 3765
    assert plan.query_lengths["us", "eu"][0] == 3776  # next multiple of 16


def test_testbed_level_tables() -> None:
    plan = plan_levels(TESTBED)
    local = (128, 256, 512, 1024, 2048, 4096)
    us_eu = (3776, 5648, 7536, 9424, 11296, 13184)  # 3764.7 * (1, 1.5, ..., 3.5), rounded up
    us_asia = (2976, 4448, 5936, 7424, 8896, 10384)  # n1 = 252 / 0.085 = 2964.7
    eu_asia = (3520, 5264, 7024, 8768, 10528, 12272)  # n1 = 298 / 0.085 = 3505.9
    assert plan.queries_from("us") == {"us": local, "eu": us_eu, "asia": us_asia}
    assert plan.queries_from("eu") == {"us": us_eu, "eu": local, "asia": eu_asia}
    assert plan.queries_from("asia") == {"us": us_asia, "eu": eu_asia, "asia": local}


@pytest.mark.parametrize("name", builtin_names())
def test_lengths_block_aligned_ascending_and_l_long(name: str) -> None:
    topology = load_builtin(name)
    plan = plan_levels(topology)
    block, n_levels = topology.index.block_size, topology.index.levels
    assert set(plan.query_lengths) == {
        (o.name, r.name) for o in topology.regions for r in topology.regions
    }
    for lengths in plan.query_lengths.values():
        assert len(lengths) == n_levels
        assert all(c % block == 0 and c > 0 for c in lengths)
        assert all(a < b for a, b in itertools.pairwise(lengths))


@pytest.mark.parametrize("name", builtin_names())
def test_remote_levels_follow_half_n1_steps(name: str) -> None:
    topology = load_builtin(name)
    plan = plan_levels(topology)
    block = topology.index.block_size
    for (o, r), lengths in plan.query_lengths.items():
        if o == r:
            continue
        n1 = topology.rtt_ms(o, r) / topology.region(r).beta_ms_per_token
        # Rounding up moves each level by less than one block above its exact value
        # (up to float noise in RTT / β).
        for k, c in enumerate(lengths):
            assert -1e-6 < c - (n1 + k * n1 / 2) < block, (o, r, k)


@pytest.mark.parametrize("name", builtin_names())
def test_registration_is_union_over_edges(name: str) -> None:
    topology = load_builtin(name)
    plan = plan_levels(topology)
    for r in topology.regions:
        union = {c for o in topology.regions for c in plan.query_lengths[o.name, r.name]}
        assert plan.registration_lengths[r.name] == tuple(sorted(union))


def test_all_query_lengths_is_union_over_targets() -> None:
    plan = plan_levels(TESTBED)
    union = {c for lengths in plan.queries_from("eu").values() for c in lengths}
    assert plan.all_query_lengths("eu") == tuple(sorted(union))
    with pytest.raises(KeyError, match="mars"):
        plan.queries_from("mars")


def test_local_levels_double_from_block_aligned_minimum() -> None:
    plan = plan_levels(TESTBED, local_min_tokens=100)  # rounds up to 112
    assert plan.query_lengths["eu", "eu"] == (112, 224, 448, 896, 1792, 3584)


@pytest.mark.parametrize("n_levels", [1, 3, 9])
def test_level_count_respected(n_levels: int) -> None:
    plan = plan_levels(TESTBED, levels=n_levels)
    assert all(len(ls) == n_levels for ls in plan.query_lengths.values())
    assert plan.query_lengths["us", "eu"][0] == 3776


def test_defaults_come_from_topology_and_bad_arguments_are_rejected() -> None:
    assert plan_levels(TESTBED) == plan_levels(TESTBED, levels=6, local_min_tokens=128)
    with pytest.raises(ValueError, match="levels"):
        plan_levels(TESTBED, levels=0)
    with pytest.raises(ValueError, match="local_min_tokens"):
        plan_levels(TESTBED, local_min_tokens=0)


def two_region_topology(one_way_ms: float, beta_a: float, beta_b: float) -> Topology:
    regions = (
        Region("a", (Worker("a-0", "a", 0, beta_a, 1, 0),)),
        Region("b", (Worker("b-0", "b", 1, beta_b, 1, 0), Worker("b-1", "b", 2, 9.9, 1, 0))),
    )
    wan = np.array([[0.0, one_way_ms], [one_way_ms, 0.0]])
    return Topology("pair", "", regions, wan, 0.0, IndexSettings(16, 0, 0, 6, 32))


def test_rounding_collisions_keep_l_distinct_lengths() -> None:
    # n1 = 2 * 0.5 / 0.1 = 10 tokens: every raw level rounds to 16 or 32, so later levels
    # move up a block each to stay distinct.
    plan = plan_levels(two_region_topology(0.5, 0.1, 0.1))
    assert plan.query_lengths["a", "b"] == (16, 32, 48, 64, 80, 96)


def test_target_region_beta_is_the_median() -> None:
    # Region b's median of (0.2, 9.9) is 5.05 ms/token: n1 = 2 * 101 / 5.05 = 40 tokens.
    plan = plan_levels(two_region_topology(101.0, 0.1, 0.2))
    assert plan.query_lengths["a", "b"][0] == 48
    assert plan.query_lengths["b", "a"][0] == 2032  # n1 = 202 / 0.1 = 2020 -> 2032


def test_plan_is_read_only() -> None:
    plan = plan_levels(TESTBED)
    assert isinstance(plan, LevelPlan)
    with pytest.raises(TypeError):
        plan.query_lengths["us", "eu"] = ()  # type: ignore[index]


# --- long-context levels (beyond the paper) ------------------------------------------------


def long_context(topology: Topology, context_tokens: int | None = None) -> Topology:
    model = topology.model
    if context_tokens is not None:
        model = replace(model, context_tokens=context_tokens)
    index = replace(topology.index, long_context_levels=True)
    return replace(topology, index=index, model=model)


def test_long_context_levels_double_to_the_model_context_on_testbed() -> None:
    plan = plan_levels(long_context(TESTBED))  # Llama-3.1-8B: 131,072 tokens
    assert plan.queries_from("us") == {
        "us": (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072),
        "eu": (3776, 5648, 7536, 9424, 11296, 13184, 26368, 52736, 105472),
        "asia": (2976, 4448, 5936, 7424, 8896, 10384, 20768, 41536, 83072),
    }


def test_long_context_is_off_by_default_and_settable_per_call() -> None:
    assert not TESTBED.index.long_context_levels
    assert plan_levels(TESTBED) == plan_levels(TESTBED, long_context=False)
    on = plan_levels(TESTBED, long_context=True)
    assert on == plan_levels(long_context(TESTBED))
    assert plan_levels(long_context(TESTBED), long_context=False) == plan_levels(TESTBED)


@pytest.mark.parametrize("name", builtin_names())
@pytest.mark.parametrize("context", [1_000, 13_184, 32_768, 131_072, 1_000_000])
def test_long_context_extends_the_paper_lists_by_doublings_within_context(
    name: str, context: int
) -> None:
    topology = load_builtin(name)
    paper = plan_levels(topology)
    plan = plan_levels(long_context(topology, context))
    block = topology.index.block_size
    for pair, lengths in plan.query_lengths.items():
        base = paper.query_lengths[pair]
        assert lengths[: len(base)] == base  # the paper's levels, untouched
        extra = lengths[len(base) :]
        assert [b / a for a, b in itertools.pairwise((base[-1], *extra))] == [2.0] * len(extra)
        assert all(c <= context and c % block == 0 for c in extra)
        assert 2 * lengths[-1] > context  # no further doubling fits
    for r in topology.regions:  # workers still register the union of what edges query
        union = {c for o in topology.regions for c in plan.query_lengths[o.name, r.name]}
        assert plan.registration_lengths[r.name] == tuple(sorted(union))


@pytest.mark.parametrize("name", builtin_names())
def test_long_match_credit_is_at_least_half_the_match(name: str) -> None:
    """The point of the extra levels: any match from the last paper level up to the
    context is credited at an indexed length of at least half of it (without them, a
    100K match counts as 13K on the testbed)."""
    topology = load_builtin(name)
    plan = plan_levels(long_context(topology))
    context = topology.model.context_tokens
    for lengths in plan.query_lengths.values():
        for match in range(lengths[-1], context + 1, 997):
            credited = max(c for c in lengths if c <= match)
            assert 2 * credited > match, (match, credited)


def test_plan_carries_the_topology_key_hash() -> None:
    assert plan_levels(TESTBED).key_hash is KeyHash.XXH3
    sha = replace(TESTBED, index=replace(TESTBED.index, key_hash=KeyHash.SHA256))
    assert plan_levels(sha).key_hash is KeyHash.SHA256
