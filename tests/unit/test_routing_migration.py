"""Hot-prefix migration: the family tracker, both triggers, and the idle-target choice."""

from __future__ import annotations

import numpy as np
import pytest

from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import (
    Ablations,
    HotPrefixTracker,
    KVCompassPolicy,
    MigrationOrder,
    RoutingConfig,
)
from kvcompass.routing.testing import (
    A0,
    A1,
    B0,
    B1,
    TOY,
    StubReader,
    kvcompass_policy,
    queues,
    request,
    tokens,
)

SHARED = tokens(1500, seed=1)


def sibling(i: int) -> np.ndarray:
    """Prompts of one family: a shared 1,500-token prefix, then 500 tokens of their own."""
    return np.concatenate([SHARED, tokens(500, seed=100 + i)])


def setup(migration: bool = True) -> tuple[KVCompassPolicy, StubReader, ManualClock]:
    clock = ManualClock()
    reader = StubReader(4)
    config = RoutingConfig(
        ablations=Ablations(migration=migration), remote_margin_rtt=0.0, pending_credit=False
    )
    return kvcompass_policy(TOY, reader, clock, config), reader, clock


def test_tracker_counts_misses_in_a_sliding_window() -> None:
    t = HotPrefixTracker(hot_misses=3, window_s=1.0, max_families=10)
    assert not t.miss(7, 0.0)
    assert not t.miss(7, 0.6)
    assert not t.miss(7, 1.2)  # 0.0 left the window
    assert t.miss(7, 1.5)  # 0.6, 1.2, 1.5
    assert not t.miss(8, 1.5)  # families count apart
    t.reset(7)
    assert not t.miss(7, 1.6)


def test_tracker_forgets_the_least_recently_missed_family_first() -> None:
    t = HotPrefixTracker(hot_misses=2, window_s=10.0, max_families=2)
    t.miss(1, 0.0)
    t.miss(2, 0.1)
    t.miss(1, 0.2)  # 1 is now the most recent
    t.miss(3, 0.3)  # evicts 2
    assert len(t) == 2
    assert not t.miss(2, 0.4)  # 2 starts over
    assert t.miss(3, 0.5)


def test_remote_holder_beyond_n1_and_no_local_holder_ships_the_prompt() -> None:
    p, reader, clock = setup()
    reader.hold(B0, 1008)  # n1(a -> b) = 1008
    clock.advance(1.0)  # every local worker idle for idle_for_s
    orders = [p.decide(request(sibling(i))) for i in range(3)]
    assert [d.reason for d in orders] == ["reuse-remote"] * 3
    assert [d.migration for d in orders[:2]] == [None, None]
    assert orders[2].migration == MigrationOrder(2000, A0, None, "recompute")
    # The target is now busy loading (β · 2000 ms pending) and the family starts over.
    assert p.queues.values[A0] == pytest.approx(0.1 * 2000)
    assert p.decide(request(sibling(3))).migration is None


def test_no_migration_without_any_holder_or_with_a_remote_match_below_n1() -> None:
    p, reader, clock = setup()
    clock.advance(1.0)
    assert all(p.decide(request(sibling(i))).migration is None for i in range(6))
    reader.hold(B0, 992)  # shorter than n1(a -> b) = 1008: not worth a trip, nor a copy
    assert all(p.decide(request(sibling(i))).migration is None for i in range(6))


def test_local_holders_losing_to_load_copy_within_the_region() -> None:
    p, reader, clock = setup()
    reader.hold(A0, 512)
    p.on_queues(queues("a", 1, w0=5000.0))  # the holder is swamped
    clock.advance(1.0)
    decisions = [p.decide(request(sibling(i))) for i in range(3)]
    # b-0 and b-1 recompute (300 ms each; tied, they take turns); a-0 would win with an
    # empty queue (149.8 ms).
    assert [d.worker for d in decisions] == [B0, B1, B0]
    assert decisions[2].migration == MigrationOrder(512, A1, A0, "copy")


def test_a_local_holder_losing_on_merit_orders_no_copy() -> None:
    p, reader, clock = setup()
    reader.hold(A1, 512)  # idle, but slow: 1 + 0.2·1488 = 298.6 ms against a-0's 201
    clock.advance(1.0)
    decisions = [p.decide(request(sibling(i))) for i in range(4)]
    assert [d.worker for d in decisions] == [A0] * 4
    assert all(d.migration is None for d in decisions)


def test_a_local_hit_is_not_a_miss() -> None:
    p, reader, clock = setup()
    reader.hold(A0, 512)
    reader.hold(B0, 1008)
    clock.advance(1.0)
    decisions = [p.decide(request(sibling(i))) for i in range(5)]
    assert {d.reason for d in decisions} == {"reuse-local"}
    assert all(d.migration is None for d in decisions)


def test_target_must_have_been_idle_for_idle_for_s_and_prefers_the_longest_idle() -> None:
    p, reader, clock = setup()
    reader.hold(B0, 1008)
    p.on_queues(queues("a", 1, w0=3.0))
    clock.advance(0.3)
    p.on_queues(queues("a", 2, w0=0.0))  # a-0 idle since 0.3, a-1 since 0
    clock.advance(0.2)
    assert [p.decide(request(sibling(i))).migration for i in range(3)] == [None] * 3  # 0.5 s
    clock.advance(0.7)  # a-1 idle 1.2 s, a-0 0.9 s: only a-1 qualifies
    order = p.decide(request(sibling(3))).migration  # still hot: 4 misses within 1 s
    assert order == MigrationOrder(2000, A1, None, "recompute")


def test_among_idle_targets_the_longest_idle_wins() -> None:
    p, reader, clock = setup()
    reader.hold(B0, 1008)
    p.on_queues(queues("a", 1, w1=3.0))
    clock.advance(0.3)
    p.on_queues(queues("a", 2, w1=0.0))  # a-1 idle since 0.3, a-0 since 0
    clock.advance(1.5)  # both idle over 1 s
    orders = [p.decide(request(sibling(i))).migration for i in range(3)]
    assert orders[2] == MigrationOrder(2000, A0, None, "recompute")


def test_prompt_shorter_than_the_first_chunk_has_no_family() -> None:
    p, reader, clock = setup()
    reader.hold(B0, 1008)
    clock.advance(1.0)
    assert all(p.decide(request(tokens(100))).migration is None for _ in range(5))


def test_explaining_is_a_dry_run() -> None:
    p, reader, clock = setup()
    reader.hold(B0, 1008)
    clock.advance(1.0)
    assert all(p.decide(request(sibling(i)), explain=True).migration is None for i in range(5))
    assert len(p.hot) == 0
    assert p.queues.values == [0.0] * 4


def test_no_migration_ablation_never_orders() -> None:
    p, reader, clock = setup(migration=False)
    reader.hold(B0, 1008)
    clock.advance(1.0)
    assert all(p.decide(request(sibling(i))).migration is None for i in range(6))
    assert len(p.hot) == 0
