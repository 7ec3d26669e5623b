"""Pending prefixes: an edge credits what it has just sent before the index reports it."""

from __future__ import annotations

import importlib
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompass.index.layout import Tier
from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import Ablations, KVCompassPolicy, RoutingConfig
from kvcompass.routing.pending import PendingPrefixes
from kvcompass.routing.testing import A0, A1, TOY, StubReader, kvcompass_policy, queues, request
from kvcompass.routing.testing import tokens as make_tokens

# Beside this file (pytest puts its folder on sys.path); untyped on purpose: only a
# reference to compare with.
reference: Any = importlib.import_module("_pending_reference")

#: The paper's score and no migration, pending credit on with half a second of slack.
PENDING = RoutingConfig(
    ablations=Ablations(migration=False),
    remote_margin_rtt=0.0,
    pending_credit=True,
    pending_slack_s=0.5,
)


def policy(clock: ManualClock, config: RoutingConfig = PENDING) -> KVCompassPolicy:
    return kvcompass_policy(TOY, StubReader(len(TOY.workers)), clock, config)


def test_a_prefix_just_sent_is_credited_to_its_worker_before_the_index_knows() -> None:
    clock = ManualClock()
    p = policy(clock)
    prompt = make_tokens(3000, seed=1)
    first = p.decide(request(prompt))
    assert first.reason == "recompute"
    assert first.claimed_tokens == 0

    second = p.decide(request(prompt))
    assert second.worker == first.worker
    assert second.reason == "reuse-pending"
    # Credited at the longest length the worker's region registers within the prompt.
    assert second.claimed_tokens == max(c for c in p._plan.queries_from("a")["a"] if c <= 3000)
    assert second.candidates[0].tier is Tier.VRAM


def test_the_candidate_says_its_match_is_pending_until_the_index_reports_it() -> None:
    clock = ManualClock()
    reader = StubReader(len(TOY.workers))
    p = kvcompass_policy(TOY, reader, clock, PENDING)
    prompt = make_tokens(3000, seed=7)
    sent = p.decide(request(prompt)).worker
    first = p.decide(request(prompt), explain=True).candidates[0]
    assert (first.worker, first.pending) == (sent, True)
    assert first.as_dict()["pending"] is True
    reader.hold(sent, first.matched_tokens)  # the index catches up: the same length
    first = p.decide(request(prompt), explain=True).candidates[0]
    assert (first.worker, first.pending) == (sent, False)


def test_without_an_index_nothing_is_credited_or_recorded() -> None:
    clock = ManualClock()
    reader = StubReader(len(TOY.workers))
    p = kvcompass_policy(TOY, reader, clock, PENDING)
    sent = make_tokens(3000, seed=8)
    p.decide(request(sent))  # recorded while the index answers
    assert p.pending is not None
    recorded = len(p.pending)
    assert recorded > 0
    reader.is_ready = False
    again = p.decide(request(sent))
    assert again.reason == "no-index"
    assert again.claimed_tokens == 0  # routed by load alone
    p.decide(request(make_tokens(3000, seed=9)))
    assert len(p.pending) == recorded  # the new prompt's send was not recorded


def test_without_pending_credit_the_second_request_sees_no_holder() -> None:
    clock = ManualClock()
    p = policy(clock, RoutingConfig(ablations=Ablations(migration=False), pending_credit=False))
    prompt = make_tokens(3000, seed=1)
    p.decide(request(prompt))
    second = p.decide(request(prompt))
    assert second.reason == "recompute"
    assert second.claimed_tokens == 0


def test_the_credit_lasts_the_queue_wait_routed_on_plus_the_slack() -> None:
    clock = ManualClock(wall_ns=10**9)
    p = policy(clock)
    # Every worker has 2 s of work queued.
    p.on_queues(queues("a", 10**9, w0=2000.0, w1=2000.0))
    p.on_queues(queues("b", 10**9, w2=2000.0, w3=2000.0))
    prompt = make_tokens(3000, seed=2)
    sent = p.decide(request(prompt)).worker

    def credited() -> int:
        decision = p.decide(request(prompt), explain=True)  # a dry run records nothing
        return next(c.matched_tokens for c in decision.candidates if c.worker == sent)

    clock.advance(2.45)  # 2 s of queue + 0.5 s of slack: not over yet
    assert credited() > 0
    clock.advance(0.1)
    assert credited() == 0


def test_an_index_match_longer_than_the_pending_one_wins() -> None:
    clock = ManualClock()
    reader = StubReader(len(TOY.workers))
    p = kvcompass_policy(TOY, reader, clock, PENDING)
    prompt = make_tokens(3000, seed=3)
    short = make_tokens(3000, seed=3)[:1200]
    sent = p.decide(request(short))
    reader.hold(sent.worker, 2992)
    decision = p.decide(request(prompt))
    assert decision.worker == sent.worker
    assert decision.claimed_tokens == 2992
    assert decision.reason == "reuse-local"  # the index's match, not the pending one


def test_explaining_a_decision_records_nothing() -> None:
    clock = ManualClock()
    p = policy(clock)
    prompt = make_tokens(3000, seed=4)
    p.decide(request(prompt), explain=True)
    assert p.pending is not None
    assert len(p.pending) == 0
    assert p.decide(request(prompt)).claimed_tokens == 0


def test_credit_goes_only_to_the_worker_it_was_sent_to() -> None:
    clock = ManualClock()
    p = policy(clock)
    prompt = make_tokens(3000, seed=5)
    sent = p.decide(request(prompt))
    other = A1 if sent.worker == A0 else A0
    decision = p.decide(request(prompt), explain=True)
    credited = {c.worker: c.matched_tokens for c in decision.candidates}
    assert credited[sent.worker] > 0
    assert all(n == 0 for w, n in credited.items() if w != sent.worker)
    assert credited[other] == 0


def test_a_prefix_sent_to_another_region_is_not_credited() -> None:
    clock = ManualClock(wall_ns=10**9)
    p = policy(clock)
    p.on_queues(queues("a", 10**9, w0=5000.0, w1=5000.0))  # region a is busy: go to b
    prompt = make_tokens(3000, seed=6)
    sent = p.decide(request(prompt))
    assert sent.region == "b"
    assert p.pending is not None
    assert len(p.pending) == 0
    decision = p.decide(request(prompt), explain=True)
    assert all(c.matched_tokens == 0 for c in decision.candidates)


def test_memory_is_bounded_and_forgets_the_oldest_first() -> None:
    pending = PendingPrefixes(slack_s=10.0, capacity=4)
    pending.record(0, [(16, 101), (32, 102)], now=0.0, wait_s=0.0)
    pending.record(1, [(16, 201), (32, 202), (48, 203)], now=0.0, wait_s=0.0)
    assert len(pending) == 4
    # A prompt whose keys include both sends' (two workers of one region).
    pairs = [(16, 101), (32, 102), (48, 203)]
    lengths, tiers = pending.credit(pairs, [0, 0], [0, 0], now=1.0)
    assert list(lengths) == [32, 48]  # 101 was forgotten; 102 still credits worker 0
    assert list(tiers) == [int(Tier.VRAM)] * 2


def test_a_send_cut_by_the_bound_counts_only_its_kept_keys() -> None:
    pending = PendingPrefixes(slack_s=1.0, capacity=4)
    pending.record(0, [(16, 101), (32, 102)], now=0.0, wait_s=0.0)
    pending.record(1, [(16, 201), (32, 202), (48, 203)], now=0.0, wait_s=5.0)  # 101 goes
    pending.record(2, [(16, 301)], now=2.0, wait_s=5.0)  # the first send lapsed: 102 goes
    assert len(pending) == 4
    pending.record(3, [(16, 401)], now=2.0, wait_s=5.0)  # over the bound: 201, the oldest
    assert len(pending) == 4
    pairs = [(16, 201), (32, 202)]
    assert list(pending.credit(pairs, [0, 0], [0, 0], now=2.0)[0]) == [0, 32]


def test_a_lapsed_entry_is_neither_credited_nor_kept() -> None:
    pending = PendingPrefixes(slack_s=0.5)
    pending.record(0, [(16, 7)], now=0.0, wait_s=1.0)
    pairs = [(16, 7)]
    assert list(pending.credit(pairs, [0], [0], now=1.5)[0]) == [16]
    assert list(pending.credit(pairs, [0], [0], now=1.6)[0]) == [0]
    pending.record(0, [(16, 8)], now=2.0, wait_s=0.0)
    assert len(pending) == 1


def test_nothing_is_recorded_for_a_worker_believed_down() -> None:
    pending = PendingPrefixes(slack_s=0.5)
    pending.record(0, [(16, 7)], now=0.0, wait_s=math.inf)
    assert len(pending) == 0


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="slack_s"):
        PendingPrefixes(slack_s=-1.0)
    with pytest.raises(ValueError, match="pending_slack_s"):
        RoutingConfig(pending_slack_s=-0.1)


@given(
    st.floats(0.0, 2.0),
    st.sampled_from([1, 3, 40, 400]),
    st.lists(
        st.tuples(
            st.sampled_from(["record", "credit"]),
            st.floats(0.0, 0.5),  # time step
            st.lists(st.integers(0, 300), max_size=12),  # key choices, some repeated
            st.integers(0, 7),  # worker
            st.sampled_from([0.0, 0.05, 0.3, 1.0, math.inf]),  # wait
        ),
        max_size=200,
    ),
)
@settings(max_examples=400, deadline=None)
def test_the_compiled_memory_answers_as_the_python_one_did(
    slack_s: float, capacity: int, operations: list[tuple[str, float, list[int], int, float]]
) -> None:
    """Records, lapses, repeats and the capacity bound, against the frozen reference:
    every credit's lengths and tiers and every size equal, operation by operation."""
    compiled, python = (
        PendingPrefixes(slack_s, capacity),
        reference.PendingPrefixes(slack_s, capacity),
    )
    now = 0.0
    lengths, tiers = [0, 128, 0, 0, 512, 0, 0, 0], [0, 1, 0, 0, 2, 0, 0, 0]
    for op, step, choices, worker, wait in operations:
        now += step
        keys = [(choice * 0x9E3779B97F4A7C15) & ((1 << 63) - 1) for choice in choices]
        pairs = [(128 * (i + 1), key) for i, key in enumerate(keys)]
        if op == "record":
            compiled.record(worker, pairs, now, wait)
            python.record(worker, pairs, now, wait)
        else:
            got = compiled.credit(pairs, lengths, tiers, now)
            want = python.credit(pairs, lengths, tiers, now)
            assert (list(got[0]), list(got[1])) == (list(want[0]), list(want[1]))
            assert (got[0] is lengths) == (want[0] is lengths)  # new lists only if credited
        assert len(compiled) == len(python)
