"""Queue estimates (live, piggyback EWMA, broadcast, pending, staleness, age, failures),
the broadcast reporter's suppression rule, and the cache belief EWMA."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import (
    CacheBelief,
    QueueEstimates,
    QueueReporter,
    RegionQueues,
    from_vector,
    queues_by_index,
    to_vector,
)
from kvcompass.routing.testing import A0, A1, B0, B1, TOY, queues
from kvcompass.wire import QueueVector, decode, encode

MS = 1_000_000  # ns


def estimates(clock: ManualClock, weight: float = 0.5) -> QueueEstimates:
    return QueueEstimates(TOY, "a", clock, piggyback_weight=weight)


def test_own_region_is_live_and_replaces() -> None:
    clock = ManualClock()
    q = estimates(clock)
    q.apply(queues("a", 1, w0=40.0, w1=10.0), piggybacked=True)
    q.apply(queues("a", 2, w0=8.0), piggybacked=True)  # own region: never averaged
    assert q.values[:2] == [8.0, 10.0]
    assert q.source(A0) == q.source(A1) == "live"


def test_piggyback_folds_with_weight_w_and_broadcast_replaces() -> None:
    clock = ManualClock()
    q = estimates(clock, weight=0.25)
    q.apply(queues("b", 1, w2=100.0), piggybacked=False)
    assert (q.values[B0], q.source(B0)) == (100.0, "broadcast")
    q.apply(queues("b", 2, w2=20.0), piggybacked=True)
    assert q.values[B0] == pytest.approx(100 + 0.25 * (20 - 100))  # 80
    assert q.source(B0) == "piggyback"
    q.apply(queues("b", 3, w2=20.0), piggybacked=True)
    assert q.values[B0] == pytest.approx(80 + 0.25 * (20 - 80))  # 65
    q.apply(queues("b", 4, w2=5.0), piggybacked=False)
    assert (q.values[B0], q.source(B0)) == (5.0, "broadcast")


def test_first_report_replaces_even_when_piggybacked() -> None:
    q = estimates(ManualClock())
    q.apply(queues("b", 1, w3=60.0), piggybacked=True)
    assert q.values[B1] == 60.0  # nothing to average with yet


def test_older_or_repeated_vectors_are_ignored_per_worker() -> None:
    q = estimates(ManualClock())
    q.apply(queues("b", 10, w2=50.0), piggybacked=False)
    assert q.apply(queues("b", 9, w2=999.0, w3=7.0), piggybacked=False) == 1  # only w3
    assert q.apply(queues("b", 10, w2=999.0), piggybacked=True) == 0
    assert (q.values[B0], q.values[B1]) == (50.0, 7.0)
    # Unknown worker indices are skipped, not fatal.
    assert q.apply(RegionQueues("b", 11, 11, {99: 1.0}), piggybacked=False) == 0


def test_pending_work_counts_until_a_report_sent_after_it_arrived() -> None:
    clock = ManualClock(wall_ns=MS)
    q = estimates(clock)
    q.apply(queues("a", MS, w0=10.0), piggybacked=False)
    q.add_pending(A0, 30.0)  # reaches a-0 0.5 ms from now
    q.add_pending(A0, 5.0)
    assert (q.values[A0], q.source(A0)) == (45.0, "pending")
    q.apply(queues("a", MS + MS // 4, w0=12.0), piggybacked=False)  # sent before arrival
    assert (q.values[A0], q.source(A0)) == (47.0, "pending")
    q.apply(queues("a", MS + MS // 2, w0=14.0), piggybacked=False)
    assert (q.values[A0], q.source(A0)) == (14.0, "live")


def test_work_not_above_zero_is_no_pending_work() -> None:
    """NaN, 0 and negative work add nothing: a NaN counted once would stay in the
    estimate (pending above 0 is what says work is in flight)."""
    clock = ManualClock(wall_ns=MS)
    q = estimates(clock)
    q.apply(queues("a", MS, w0=10.0), piggybacked=False)
    for bad in (math.nan, 0.0, -5.0):
        q.add_pending(A0, bad)
    assert (q.values[A0], q.source(A0)) == (10.0, "live")
    q.add_pending(A0, 4.0)
    q.apply(queues("a", 3 * MS, w0=12.0), piggybacked=False)  # sent after it arrived
    assert (q.values[A0], q.source(A0)) == (12.0, "live")


def test_a_remote_broadcast_sent_while_our_request_crosses_the_wan_keeps_it_pending() -> None:
    clock = ManualClock(wall_ns=MS)
    q = estimates(clock)
    q.add_pending(B0, 100.0)  # one way a -> b is 50 ms
    clock.advance(0.001)
    q.add_pending(B0, 20.0)
    q.apply(queues("b", 40 * MS, w2=7.0), piggybacked=False)
    assert q.values[B0] == 127.0
    q.apply(queues("b", 51 * MS, w2=9.0), piggybacked=False)  # counts the first only
    assert q.values[B0] == 29.0
    q.apply(queues("b", 52 * MS, w2=3.0), piggybacked=False)
    assert (q.values[B0], q.source(B0)) == (3.0, "broadcast")


def test_age_is_time_since_the_last_report_not_pending() -> None:
    clock = ManualClock()
    q = estimates(clock)
    clock.advance(2.0)
    q.apply(queues("b", 1, w2=1.0), piggybacked=False)
    clock.advance(0.25)
    q.add_pending(B0, 10.0)
    assert q.age_s(B0) == pytest.approx(0.25)
    assert q.age_s(B1) == pytest.approx(2.25)


def test_idle_time_tracks_how_long_the_estimate_stayed_zero() -> None:
    clock = ManualClock()
    q = estimates(clock)
    clock.advance(1.0)
    assert q.idle_for_s(A0) == pytest.approx(1.0)
    q.apply(queues("a", 1, w0=3.0), piggybacked=False)
    assert q.idle_for_s(A0) == -math.inf
    clock.advance(0.5)
    q.apply(queues("a", 2, w0=0.0), piggybacked=False)
    clock.advance(0.25)
    q.apply(queues("a", 3, w0=0.0), piggybacked=False)  # still zero: the clock keeps running
    assert q.idle_for_s(A0) == pytest.approx(0.25)
    q.add_pending(A0, 1.0)
    assert q.idle_for_s(A0) == -math.inf


def test_a_failed_worker_is_down_until_a_newer_report() -> None:
    clock = ManualClock(wall_ns=1_000)
    q = estimates(clock)
    q.mark_down(B0)
    assert q.values[B0] == q.blocked[B0] == math.inf
    assert q.source(B0) == "down"
    q.add_pending(B0, 5.0)
    assert q.source(B0) == "down"
    q.apply(queues("b", 999, w2=1.0), piggybacked=False)  # sent before the failure
    assert q.values[B0] == math.inf
    q.apply(queues("b", 1_001, w2=4.0), piggybacked=True)  # after: replaces, no EWMA
    assert (q.values[B0], q.blocked[B0], q.source(B0)) == (4.0, 0.0, "piggyback")


def test_reporter_sends_own_region_always_and_others_every_period() -> None:
    clock = ManualClock()
    r = QueueReporter("a", ["a", "b", "c"], clock, period_s=0.1)
    assert r.destinations() == ("a", "b", "c")
    clock.advance(0.02)
    assert r.destinations() == ("a",)
    clock.advance(0.08)
    assert r.destinations() == ("a", "b", "c")


def test_reporter_suppresses_regions_a_piggyback_reached_within_the_period() -> None:
    clock = ManualClock()
    r = QueueReporter("a", ["a", "b", "c"], clock, period_s=0.1)
    r.destinations()
    clock.advance(0.06)
    r.note_piggyback("b")
    clock.advance(0.04)  # Δ since the broadcast, 0.04 since b's piggyback
    assert r.destinations() == ("a", "c")
    clock.advance(0.06)  # Δ since b's piggyback
    assert r.destinations() == ("a", "b")
    r.note_piggyback("a")  # the own region is never suppressed
    assert r.destinations() == ("a",)
    clock.advance(0.1)
    assert r.destinations() == ("a", "b", "c")


class _ReferenceReporter:
    """QueueReporter's rule as first written: every period checks every other region."""

    def __init__(self, region: str, regions: list[str], clock: ManualClock, period_s: float):
        self.region, self.clock, self.period_s = region, clock, period_s
        self.last = {r: -math.inf for r in regions if r != region}

    def note_piggyback(self, region: str) -> None:
        if region in self.last:
            self.last[region] = self.clock.monotonic()

    def destinations(self) -> tuple[str, ...]:
        now = self.clock.monotonic()
        due = [r for r in self.last if now - self.last[r] >= self.period_s]
        for r in due:
            self.last[r] = now
        return (self.region, *due)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(["a", "b", "c", "d"]),  # a piggyback reaches that region
            st.sampled_from([0.0, 0.01, 0.03, 0.1, 0.1000000001, 0.25]),  # time passes
            st.none(),  # a local period: the broadcast's destinations
        ),
        max_size=60,
    )
)
def test_reporter_skips_nothing_due_by_the_rule_it_was_written_with(
    steps: list[str | float | None],
) -> None:
    clock = ManualClock()
    regions = ["a", "b", "c", "d"]
    reporter = QueueReporter("a", regions, clock, period_s=0.1)
    reference = _ReferenceReporter("a", regions, clock, period_s=0.1)
    for step in steps:
        if step is None:
            assert reporter.destinations() == reference.destinations()
        elif isinstance(step, str):
            reporter.note_piggyback(step)
            reference.note_piggyback(step)
        else:
            clock.advance(step)


def test_region_queues_convert_to_and_from_the_wire() -> None:
    rq = queues_by_index(TOY, "b", 7, 123, {"b-1": 2.5, "b-0": 0.0})
    assert rq.queue_ms == {B0: 0.0, B1: 2.5}
    vector = to_vector(rq, to=("a",))
    back = decode(encode(vector))
    assert isinstance(back, QueueVector)
    assert back.addressed_to("a")
    assert not back.addressed_to("b")
    assert from_vector(back) == rq
    with pytest.raises(KeyError, match="zz-0"):
        queues_by_index(TOY, "b", 7, 123, {"zz-0": 1.0})


# -- belief -------------------------------------------------------------------------------


def test_belief_starts_at_one_and_is_an_ewma_of_reused_over_claimed() -> None:
    b = CacheBelief(4, weight=0.2)
    assert b.values == [1.0] * 4
    b.update(A1, claimed_tokens=1000, reused_tokens=0)
    assert b[A1] == pytest.approx(0.8)
    b.update(A1, claimed_tokens=1000, reused_tokens=500)
    assert b[A1] == pytest.approx(0.8 + 0.2 * (0.5 - 0.8))  # 0.74
    b.update(A1, claimed_tokens=100, reused_tokens=400)  # more than claimed: ratio 1
    assert b[A1] == pytest.approx(0.74 + 0.2 * (1 - 0.74))


def test_belief_ignores_responses_without_a_claim() -> None:
    b = CacheBelief(4, weight=0.2)
    b.update(A0, claimed_tokens=1000, reused_tokens=0)
    b.update(A0, claimed_tokens=0, reused_tokens=0)
    b.update(A0, claimed_tokens=0, reused_tokens=300)
    assert b[A0] == pytest.approx(0.8)


def test_a_lying_worker_loses_half_its_belief_in_four_responses() -> None:
    b = CacheBelief(4, weight=0.2)
    for _ in range(3):
        b.update(B0, 1000, 0)
    assert b[B0] > 0.5
    b.update(B0, 1000, 0)
    assert b[B0] < 0.5
