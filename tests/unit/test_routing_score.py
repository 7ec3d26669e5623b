"""The joint score, term by term against hand-computed cases, and its properties.

TOY topology (tests/unit/_routing.py): origin "a"; RTT 1 ms inside a region, 100 ms a-b;
β = 0.1 ms/token except a-1 (0.2); γ = 0.01 ms/token; τ = 350 ms, λmax = 8.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcompass.index.layout import Tier
from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import PAPER_PRICE, Ablations, Candidate, KVCompassPolicy, RoutingConfig
from kvcompass.routing.score import JointScore
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
from kvcompass.topology import Topology


def policy(
    topology: Topology, reader: StubReader, ablations: Ablations | None = None
) -> KVCompassPolicy:
    """A KVCompass policy for origin "a" with the paper's score (no remote margin, the
    paper's capacity price; each is tested on its own), migration off (likewise)."""
    no_migration = dataclasses.replace(ablations or Ablations(), migration=False)
    config = RoutingConfig(
        ablations=no_migration, remote_margin_rtt=0.0, pending_credit=False, **PAPER_PRICE
    )
    return kvcompass_policy(topology, reader, ManualClock(), config)


def set_queues(p: KVCompassPolicy, region: str, **ms: float) -> None:
    p.on_queues(queues(region, 1, **ms))


def by_worker(candidates: tuple[Candidate, ...]) -> dict[int, Candidate]:
    return {c.worker: c for c in candidates}


def test_idle_no_match_recomputes_on_the_fastest_local_worker() -> None:
    p = policy(TOY, StubReader(4))
    d = p.decide(request(tokens(1000)), explain=True)
    c = by_worker(d.candidates)
    # WAN (RTT) + queue + (1+0)·β·L
    assert c[A0].score == pytest.approx(1 + 0 + 0.1 * 1000)
    assert c[A1].score == pytest.approx(1 + 0.2 * 1000)
    assert c[B0].score == pytest.approx(100 + 0.1 * 1000)
    assert (d.worker_id, d.reason, d.claimed_tokens, d.lam) == ("a-0", "recompute", 0, 0.0)
    # b-0 and b-1 tie at 200: lower index first; a-1 (201) after them.
    assert d.fallbacks == (B0, B1)
    assert [x.worker for x in d.candidates] == [A0, B0, B1, A1]


def test_remote_vram_holder_wins_when_its_match_pays_for_the_round_trip() -> None:
    reader = StubReader(4)
    reader.hold(B0, 1008)
    d = policy(TOY, reader).decide(request(tokens(2000)), explain=True)
    c = by_worker(d.candidates)
    assert c[B0].prefill_ms == pytest.approx(0.1 * (2000 - 1008))
    assert c[B0].score == pytest.approx(100 + 99.2)
    assert c[A0].score == pytest.approx(1 + 200)
    assert (d.worker_id, d.reason, d.claimed_tokens) == ("b-0", "reuse-remote", 1008)
    assert (c[B0].matched_tokens, c[B0].tier, c[B0].reload_ms) == (1008, Tier.VRAM, 0.0)


def test_a_remote_margin_keeps_marginal_cross_region_work_home() -> None:
    """b-0's match saves 100.8 ms of prefill for a 100 ms round trip: it wins by 1.8 ms
    in the paper's score. A margin of 0.5 round trips (50 ms) keeps the request home."""
    reader = StubReader(4)
    reader.hold(B0, 1008)
    config = RoutingConfig(ablations=Ablations(migration=False), remote_margin_rtt=0.5)
    d = kvcompass_policy(TOY, reader, ManualClock(), config).decide(
        request(tokens(2000)), explain=True
    )
    c = by_worker(d.candidates)
    assert c[B0].score == pytest.approx(150 + 99.2)
    assert c[B1].score == pytest.approx(150 + 200)
    assert c[A0].score == pytest.approx(1 + 200)  # local workers pay no margin
    assert (c[B0].wan_ms, c[A0].wan_ms) == pytest.approx((150, 1))  # what /v1/route shows
    assert (d.worker_id, d.reason, d.claimed_tokens) == ("a-0", "recompute", 0)
    with pytest.raises(ValueError, match="remote_margin_rtt must be >= 0, got -1"):
        RoutingConfig(remote_margin_rtt=-1)


def test_without_cross_region_reuse_a_remote_holder_is_a_stranger() -> None:
    reader = StubReader(4)
    reader.hold(B0, 1008)
    d = policy(TOY, reader, Ablations(xregion_reuse=False)).decide(request(tokens(2000)))
    assert (d.worker_id, d.reason, d.claimed_tokens) == ("a-0", "recompute", 0)


def test_dram_match_pays_the_reload_and_tier_blind_drops_it() -> None:
    reader = StubReader(4)
    reader.hold(B0, 1008, Tier.DRAM)
    d = policy(TOY, reader).decide(request(tokens(2000)), explain=True)
    c = by_worker(d.candidates)
    assert c[B0].reload_ms == pytest.approx(0.01 * 1008)
    assert c[B0].score == pytest.approx(199.2 + 10.08)
    assert d.worker_id == "a-0"  # 201 < 209.28
    blind = policy(TOY, reader, Ablations(tier_aware=False)).decide(request(tokens(2000)))
    assert (blind.worker_id, blind.candidates[0].reload_ms) == ("b-0", 0.0)
    assert blind.candidates[0].score == pytest.approx(199.2)


def test_belief_discounts_the_match() -> None:
    reader = StubReader(4)
    reader.hold(B0, 1008)
    p = policy(TOY, reader)
    p.belief.values[B0] = 0.5
    d = p.decide(request(tokens(2000)), explain=True)
    c = by_worker(d.candidates)
    assert c[B0].belief == 0.5
    assert c[B0].prefill_ms == pytest.approx(0.1 * (2000 - 504))
    assert d.worker_id == "a-0"  # 249.6 > 201


def test_local_holder_uses_its_own_beta() -> None:
    reader = StubReader(4)
    reader.hold(A1, 512)
    c = by_worker(policy(TOY, reader).decide(request(tokens(1000)), explain=True).candidates)
    assert c[A1].score == pytest.approx(1 + 0.2 * (1000 - 512))  # 98.6: beats a-0's 101
    assert c[A1].matched_tokens == 512


def test_queues_and_the_capacity_price() -> None:
    p = policy(TOY, StubReader(4))
    set_queues(p, "a", w0=350.0, w1=700.0)
    set_queues(p, "b", w2=700.0, w3=1000.0)
    d = p.decide(request(tokens(1000)), explain=True)
    c = by_worker(d.candidates)
    assert d.lam == pytest.approx(1.0)  # min queue 350 / τ 350
    assert c[A0].queue_ms == 350.0
    assert c[A0].prefill_ms == pytest.approx(2 * 0.1 * 1000)
    assert c[A0].score == pytest.approx(1 + 350 + 200)
    assert c[B1].score == pytest.approx(100 + 1000 + 200)


def test_capacity_price_is_capped_and_has_slope_one_over_tau() -> None:
    s = JointScore(TOY, "a", Ablations(), lambda_max=8.0, tau_ms=350.0)
    assert s.price([3500.0] * 4) == 8.0
    assert s.price([0.0, 3500.0, 3500.0, 3500.0]) == 0.0
    assert s.price([175.0, 900.0, 900.0, 900.0]) == pytest.approx(0.5)
    assert JointScore(TOY, "a", Ablations(load_aware=False), 8.0, 350.0).price([3500.0] * 4) == 0


@pytest.mark.parametrize("least_queue_ms", [0.0, 500.0])
def test_the_shipped_price_keeps_a_busier_holder_only_once_no_worker_is_idle(
    least_queue_ms: float,
) -> None:
    """a-0 holds half the prompt behind 1.5 s of queue; a-1 holds nothing. With an idle
    worker (a-1 at 0 ms) both prices are 0 and a-1 wins. Once every worker is busy the
    paper's price (λ = 500/350) still trades the second of queue for the recomputation;
    the shipped one (λ = 500/10 = 50) keeps the request on the holder."""
    reader = StubReader(4)
    reader.hold(A0, 1000)
    paper = policy(TOY, reader)
    config = RoutingConfig(remote_margin_rtt=0.0, pending_credit=False)
    shipped = kvcompass_policy(TOY, reader, ManualClock(), config)
    for p in (paper, shipped):
        set_queues(p, "a", w0=1500.0, w1=least_queue_ms)
        set_queues(p, "b", w2=3000.0, w3=3000.0)
    by_paper = paper.decide(request(tokens(2000)))
    by_shipped = shipped.decide(request(tokens(2000)))
    assert by_paper.worker_id == "a-1"
    if least_queue_ms == 0.0:
        assert (by_paper.lam, by_shipped.lam) == (0.0, 0.0)
        assert by_shipped.worker_id == "a-1"
    else:
        assert by_shipped.lam == pytest.approx(50.0)
        assert by_shipped.worker_id == "a-0"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e5), min_size=4, max_size=4), st.floats(0, 1e4))
def test_price_is_one_over_tau_lipschitz(qs: list[float], bump: float) -> None:
    s = JointScore(TOY, "a", Ablations(), lambda_max=8.0, tau_ms=350.0)
    bumped = [q + bump for q in qs]
    assert 0 <= s.price(bumped) - s.price(qs) <= bump / 350.0 + 1e-9
    assert s.price(bumped) <= 8.0


def test_candidate_terms_sum_to_the_score() -> None:
    reader = StubReader(4)
    reader.hold(A1, 256, Tier.DRAM)
    reader.hold(B1, 1008)
    p = policy(TOY, reader)
    set_queues(p, "a", w0=40.0, w1=3.0)
    d = p.decide(request(tokens(3000)), explain=True)
    assert len(d.candidates) == 4
    for c in d.candidates:
        assert c.score == pytest.approx(c.wan_ms + c.queue_ms + c.prefill_ms + c.reload_ms)
    assert [c.score for c in d.candidates] == sorted(c.score for c in d.candidates)
    fast = p.decide(request(tokens(3000)))
    assert fast.candidates == d.candidates[:3]  # the chosen and the two fallbacks
    assert fast.fallbacks == d.fallbacks == tuple(c.worker for c in d.candidates[1:3])


def test_ties_go_local_first_then_lower_queue() -> None:
    topo = TOY
    # Equal scores by construction: b-0 and a-0 with β 0.1; give a-0 99 ms more queue
    # than the 99 ms of extra WAN b-0 pays: both 1 + 99 + 10 = 100 + 0 + 10.
    p = policy(topo, StubReader(4))
    set_queues(p, "a", w0=99.0, w1=1e6)
    set_queues(p, "b", w2=0.0, w3=1e6)
    d = p.decide(request(tokens(100)), explain=True)
    c = by_worker(d.candidates)
    assert c[A0].score == c[B0].score
    assert d.worker == A0  # local first
    # From region b, the local worker b-0 goes before a-0 despite its higher index.
    from_b = JointScore(topo, "b", Ablations(), 8.0, 350.0)
    assert from_b.rank([5.0, 6.0, 5.0, 7.0], [0.0] * 4, 2)[:2] == [B0, A0]
    s = JointScore(topo, "a", Ablations(), 8.0, 350.0)
    # Same region and score, different queues: the lower queue first, then the index.
    assert s.rank([5.0, 5.0, 9.0, 9.0], [3.0, 1.0, 0.0, 0.0], 2)[:2] == [A1, A0]
    assert s.rank([5.0, 5.0, 9.0, 9.0], [1.0, 1.0, 0.0, 0.0], 2)[:2] == [A0, A1]


def test_exact_ties_rotate_over_equal_workers_local_first() -> None:
    # From region b, b-0 and b-1 are idle, unmatched and equally fast: every score ties.
    # Taking the lower index every time would pile an idle pool's work on b-0.
    p = kvcompass_policy(TOY, StubReader(4), ManualClock(), origin="b")
    r = request(tokens(100), origin="b")
    first = p.decide(r, explain=True).worker
    assert p.decide(r, explain=True).worker == first  # a dry run does not rotate
    chosen = [p.decide(r).worker for _ in range(4)]
    assert chosen == [B0, B1, B0, B1]
    s = JointScore(TOY, "b", Ablations(), 8.0, 350.0)
    assert s.tie_order(0) == (B0, B1, A0, A1)
    assert s.tie_order(1) == (B1, B0, A1, A0)  # each group rotates, local stays first
    assert s.rank([5.0, 5.0, 5.0, 5.0], [0.0] * 4, 2, turn=1)[:2] == [B1, B0]


# -- ablations: each changes exactly its term ---------------------------------------------


def _explain(ablations: Ablations) -> tuple[float, dict[int, Candidate]]:
    reader = StubReader(4)
    reader.hold(A1, 256, Tier.DRAM)
    reader.hold(B0, 1024, Tier.DRAM)
    p = policy(TOY, reader, ablations)
    set_queues(p, "a", w0=70.0, w1=80.0)
    set_queues(p, "b", w2=90.0, w3=100.0)
    d = p.decide(request(tokens(3000)), explain=True)
    return d.lam, by_worker(d.candidates)


FIELDS = ("wan_ms", "queue_ms", "matched_tokens", "tier", "belief", "prefill_ms", "reload_ms")


def _changed(a: dict[int, Candidate], b: dict[int, Candidate]) -> set[tuple[int, str]]:
    return {(w, f) for w in a for f in FIELDS if getattr(a[w], f) != getattr(b[w], f)}


def test_each_ablation_changes_exactly_its_term() -> None:
    lam, full = _explain(Ablations())
    assert lam == pytest.approx(70 / 350)

    lam0, no_load = _explain(Ablations(load_aware=False))
    assert lam0 == 0.0
    # Queue terms vanish; prefill changes only through λ (1+λ factor), nothing else.
    assert _changed(full, no_load) == {(w, f) for w in range(4) for f in ("queue_ms", "prefill_ms")}
    for w in range(4):
        assert no_load[w].queue_ms == 0.0
        assert no_load[w].prefill_ms * (1 + lam) == pytest.approx(full[w].prefill_ms)

    _, local_only = _explain(Ablations(xregion_reuse=False))
    for c in local_only.values():
        assert c.score == pytest.approx(c.wan_ms + c.queue_ms + c.prefill_ms + c.reload_ms)
    assert _changed(full, local_only) == {
        (B0, "matched_tokens"),
        (B0, "tier"),
        (B0, "prefill_ms"),
        (B0, "reload_ms"),
    }
    assert local_only[B0].prefill_ms == pytest.approx((1 + lam) * 0.1 * 3000)

    _, blind = _explain(Ablations(tier_aware=False))
    assert _changed(full, blind) == {(A1, "reload_ms"), (B0, "reload_ms")}
    assert blind[A1].reload_ms == blind[B0].reload_ms == 0.0


def test_failed_worker_is_avoided_even_without_load_awareness() -> None:
    for ablations in (Ablations(), Ablations(load_aware=False)):
        p = policy(TOY, StubReader(4), ablations)
        p.on_failure(A0)
        d = p.decide(request(tokens(1000)))
        assert d.worker != A0
        assert A0 not in d.fallbacks


# -- properties ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    holder=st.sampled_from([B0, B1]),
    blocks=st.integers(1, 200),
    extra=st.integers(0, 4000),
    belief=st.floats(0.0, 1.0),
    tier=st.sampled_from([Tier.VRAM, Tier.DRAM]),
    margin=st.floats(0.001, 1e4),
    busy=st.floats(0.0, 1e4),
)
def test_idle_worker_without_holder_beats_a_saturated_holder(
    holder: int, blocks: int, extra: int, belief: float, tier: Tier, margin: float, busy: float
) -> None:
    """An idle a-0 (no match) never loses to a holder whose queue exceeds the prefill it
    saves plus its extra WAN (a-0 is idle, so λ = 0)."""
    m = blocks * 16
    reader = StubReader(4)
    reader.hold(holder, m, tier)
    p = policy(TOY, reader)
    p.belief.values[holder] = belief
    saved = 0.1 * belief * m
    wan_difference = 100.0 - 1.0
    other = B1 if holder == B0 else B0
    set_queues(p, "a", w0=0.0, w1=busy)
    p.on_queues(
        queues("b", 1, **{f"w{holder}": saved + wan_difference + margin, f"w{other}": busy})
    )
    c = by_worker(p.decide(request(tokens(m + extra)), explain=True).candidates)
    assert c[A0].score < c[holder].score


@settings(max_examples=200, deadline=None)
@given(
    worker=st.integers(0, 3),
    qs=st.lists(st.floats(0, 5000), min_size=4, max_size=4),
    bump=st.floats(0.0, 5000),
    held=st.lists(st.integers(0, 100), min_size=4, max_size=4),
)
def test_score_is_monotone_in_the_queue(
    worker: int, qs: list[float], bump: float, held: list[int]
) -> None:
    def score(q: list[float]) -> float:
        reader = StubReader(4)
        for w, blocks in enumerate(held):
            reader.hold(w, blocks * 16)
        p = policy(TOY, reader)
        set_queues(p, "a", w0=q[0], w1=q[1])
        set_queues(p, "b", w2=q[2], w3=q[3])
        return by_worker(p.decide(request(tokens(2000)), explain=True).candidates)[worker].score

    bumped = list(qs)
    bumped[worker] += bump
    assert score(bumped) >= score(qs)


@settings(max_examples=100, deadline=None)
@given(one_way=st.floats(1.0, 300.0), more=st.floats(0.0, 300.0), held=st.integers(0, 100))
def test_score_is_monotone_in_the_wan(one_way: float, more: float, held: int) -> None:
    def remote_score(ms: float) -> float:
        wan = np.array([[0.0, ms], [ms, 0.0]])
        topology = dataclasses.replace(TOY, one_way_ms=wan)
        reader = StubReader(4)
        reader.hold(B0, held * 16)
        p = policy(topology, reader)
        return by_worker(p.decide(request(tokens(2000)), explain=True).candidates)[B0].score

    # Monotone, and exactly by the extra round trip: nothing else depends on the WAN.
    assert remote_score(one_way + more) - remote_score(one_way) == pytest.approx(2 * more)


@settings(max_examples=200, deadline=None)
@given(
    worker=st.integers(0, 3),
    b1=st.floats(0.0, 1.0),
    b2=st.floats(0.0, 1.0),
    blocks=st.integers(1, 120),
    tier=st.sampled_from([Tier.VRAM, Tier.DRAM]),
    q=st.floats(0, 3000),
)
def test_more_belief_never_makes_a_holder_worse(
    worker: int, b1: float, b2: float, blocks: int, tier: Tier, q: float
) -> None:
    lo, hi = sorted((b1, b2))

    def score(b: float) -> float:
        reader = StubReader(4)
        reader.hold(worker, blocks * 16, tier)
        p = policy(TOY, reader)
        set_queues(p, "a", w0=q, w1=q)
        set_queues(p, "b", w2=q, w3=q)
        p.belief.values[worker] = b
        return by_worker(p.decide(request(tokens(2000)), explain=True).candidates)[worker].score

    assert score(hi) <= score(lo) + 1e-9
