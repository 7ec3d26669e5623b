"""Policies through make_policy: KVCompass over a real in-process index, feedback wiring,
and the baselines."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from kvcompass.errors import BadInput, ConfigError
from kvcompass.index.layout import Tier
from kvcompass.index.reader import IndexReader
from kvcompass.keys import Namespace
from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import (
    POLICY_NAMES,
    Ablations,
    Feedback,
    KVCompassPolicy,
    RoutingConfig,
    make_policy,
)
from kvcompass.routing.testing import (
    A0,
    A1,
    B0,
    B1,
    NS,
    TOY,
    RealIndex,
    StubReader,
    queues,
    request,
    tokens,
)
from kvcompass.topology import load_builtin

#: The paper's score (no remote margin, no pending credit), migration off: each is
#: tested on its own.
NO_MIGRATION = RoutingConfig(
    ablations=Ablations(migration=False), remote_margin_rtt=0.0, pending_credit=False
)


def kvc(reader: IndexReader, clock: ManualClock | None = None) -> KVCompassPolicy:
    p = make_policy(
        "kvcompass", TOY, "a", reader, config=NO_MIGRATION, clock=clock or ManualClock()
    )
    assert isinstance(p, KVCompassPolicy)
    return p


# -- KVCompass over a real index -----------------------------------------------------------


def test_real_index_matches_drive_the_decision() -> None:
    index = RealIndex(TOY)
    prompt = tokens(3000, seed=5)
    p = kvc(index.view)
    assert p.decide(request(prompt)).reason == "recompute"

    # b-0 caches the first 2,000 tokens; edge a queries b at n1 + k·n1/2 = 1008, 1504, 2000.
    index.set(B0, prompt, upto=2000, tier=Tier.VRAM)
    d = p.decide(request(prompt), explain=True)
    assert (d.worker_id, d.reason, d.claimed_tokens) == ("b-0", "reuse-remote", 2000)
    assert d.candidates[0].score == pytest.approx(100 + 0.1 * (3000 - 2000))

    # Demoted to DRAM: the reload is priced; evicted: b-0 stops being chosen.
    index.set(B0, prompt, upto=2000, tier=Tier.DRAM)
    d = p.decide(request(prompt))
    assert d.worker_id == "b-0"
    assert d.candidates[0].reload_ms == pytest.approx(0.01 * 2000)
    index.set(B0, prompt, upto=2000, tier=Tier.ABSENT)
    assert p.decide(request(prompt)).reason == "recompute"


def test_tenants_never_match_each_others_prefixes() -> None:
    index = RealIndex(TOY)
    prompt = tokens(3000, seed=6)
    index.set(A0, prompt, upto=512, tier=Tier.VRAM, ns=NS)
    p = kvc(index.view)
    mine = p.decide(request(prompt, ns=NS))
    other = p.decide(request(prompt, ns=Namespace(NS.model, "tenant-b")))
    assert (mine.worker, mine.claimed_tokens, mine.reason) == (A0, 512, "reuse-local")
    assert (other.worker, other.claimed_tokens, other.reason) == (A0, 0, "recompute")


def test_one_query_planner_per_namespace() -> None:
    reader = StubReader(4)
    p = kvc(reader)
    for group in ("x", "y", "x", "x"):
        p.decide(request(tokens(300), ns=Namespace(NS.model, group)))
    assert len(p._planners) == 2
    assert [q.per_region["a"][0][0] for q in reader.queries] == [128] * 4


def test_index_not_ready_scores_as_if_nothing_matched() -> None:
    reader = StubReader(4)
    reader.hold(B0, 1008)
    reader.is_ready = False
    d = kvc(reader).decide(request(tokens(2000)))
    assert (d.worker, d.reason, d.claimed_tokens, d.migration) == (A0, "no-index", 0, None)


def test_bad_requests_are_refused() -> None:
    p = kvc(StubReader(4))
    with pytest.raises(BadInput, match="region 'b'"):
        p.decide(request(tokens(10), origin="b"))
    with pytest.raises(BadInput, match="empty"):
        p.decide(request(tokens(0)))


# -- feedback ----------------------------------------------------------------------------------


def test_false_claims_lower_belief_until_the_holder_stops_winning() -> None:
    reader = StubReader(4)
    reader.hold(A1, 1024)  # a-1 claims 1,024 tokens but never has them
    p = kvc(reader)
    chosen = []
    for _ in range(10):
        d = p.decide(request(tokens(1100)))
        chosen.append(d.worker)
        p.observe(Feedback(d.worker, d.claimed_tokens, 0, None, cross_region=False))
    # a-1: 1 + 0.2·(1100 − b·1024) beats a-0's 111 while b > 0.537: b = 1, 0.8, 0.64.
    assert chosen == [A1] * 3 + [A0] * 7
    assert p.belief[A1] == pytest.approx(0.8**3)  # a-0's responses claimed nothing


def test_feedback_vectors_update_queues_live_or_piggybacked() -> None:
    p = kvc(StubReader(4))
    p.observe(Feedback(A0, 0, 0, queues("a", 1, w0=50.0, w1=20.0), cross_region=False))
    p.observe(Feedback(B0, 0, 0, queues("b", 1, w2=100.0), cross_region=True))
    p.observe(Feedback(B0, 0, 0, queues("b", 2, w2=0.0), cross_region=True))
    assert p.queues.values == [50.0, 20.0, 50.0, 0.0]  # 100 + 0.5·(0 − 100)
    assert p.queues.source(B0) == "piggyback"
    p.on_queues(queues("b", 3, w2=7.0, w3=9.0))
    assert (p.queues.values[B0], p.queues.source(B0)) == (7.0, "broadcast")


def test_forwarded_work_spreads_decisions_between_reports() -> None:
    p = kvc(StubReader(4))
    picks = []
    for _ in range(4):
        d = p.decide(request(tokens(1000)))
        p.on_forward(d, d.expected_service_ms)
        picks.append(d.worker_id)
    # a-0 (101 ms) first; with 100 ms pending it scores 201 against b-0's and b-1's 200
    # (a-1: 201); the tied b workers take turns, b-1 on the second decision.
    assert picks[:2] == ["a-0", "b-1"]
    assert len(set(picks)) >= 3
    assert p.queues.source(A0) == "pending"


def test_failure_routes_around_then_a_report_restores_the_worker() -> None:
    clock = ManualClock(wall_ns=10)
    p = kvc(StubReader(4), clock)
    d = p.decide(request(tokens(1000)))
    assert d.worker == A0
    p.on_failure(A0)
    assert p.decide(request(tokens(1000))).region == "b"  # b-0 and b-1 tie: either
    clock.advance(0.1)
    p.on_queues(queues("a", clock.wall_ns(), w0=0.0))
    assert p.decide(request(tokens(1000))).worker == A0


def test_decision_serialises_for_the_route_endpoint() -> None:
    reader = StubReader(4)
    reader.hold(B1, 1008, Tier.DRAM)
    d = kvc(reader).decide(request(tokens(2000)), explain=True)
    body = json.loads(json.dumps(d.as_dict()))
    assert body["worker"] == d.worker_id
    assert len(body["candidates"]) == 4
    b1 = next(c for c in body["candidates"] if c["worker"] == "b-1")
    assert (b1["tier"], b1["matched_tokens"], b1["region"]) == ("dram", 1008, "b")
    assert set(b1) >= {"score_ms", "wan_ms", "queue_ms", "prefill_ms", "reload_ms", "belief"}


# -- the factory and the baselines ------------------------------------------------------------


def test_make_policy_builds_every_name_and_refuses_bad_ones() -> None:
    for name in POLICY_NAMES:
        p = make_policy(name, TOY, "a", StubReader(4), clock=ManualClock())
        assert p.name == name
        assert p.decide(request(tokens(50))).worker in range(4)
    with pytest.raises(ConfigError, match="unknown routing policy 'nope'"):
        make_policy("nope", TOY, "a", StubReader(4))
    with pytest.raises(ConfigError, match="needs an index reader"):
        make_policy("kvcompass", TOY, "a", None)
    with pytest.raises(ConfigError, match="origin region 'zz'"):
        make_policy("random", TOY, "zz")


def test_local_least_loaded_ignores_caches_and_other_regions() -> None:
    reader = StubReader(4)
    reader.hold(B0, 1008)
    p = make_policy("local-least-loaded", TOY, "a", reader, clock=ManualClock())
    p.on_queues(queues("a", 1, w0=30.0, w1=10.0))
    d = p.decide(request(tokens(2000)))
    assert (d.worker, d.reason, d.claimed_tokens, d.fallbacks) == (A1, "least-loaded", 0, (A0,))
    p.on_forward(d, 25.0)  # a-1 now 35 ms: a-0 is less loaded
    assert p.decide(request(tokens(2000))).worker == A0
    p.on_failure(A0)
    assert p.decide(request(tokens(2000))).worker == A1


def test_baselines_explain_every_eligible_worker() -> None:
    for name, expected in (("local-least-loaded", 2), ("round-robin", 4), ("random", 4)):
        p = make_policy(name, TOY, "a", clock=ManualClock())
        d = p.decide(request(tokens(10)), explain=True)
        assert len(d.candidates) == expected
        assert d.candidates[0].prefill_ms == pytest.approx(
            TOY.workers[d.worker].beta_ms_per_token * 10
        )


def test_round_robin_and_random_cover_every_worker() -> None:
    rr = make_policy("round-robin", TOY, "a", clock=ManualClock())
    assert [rr.decide(request(tokens(10))).worker for _ in range(6)] == [0, 1, 2, 3, 0, 1]
    picks = [
        make_policy("random", TOY, "a", seed=3).decide(request(tokens(10))).worker for _ in range(3)
    ]
    assert len(set(picks)) == 1  # seeded: the same first pick every time
    rnd = make_policy("random", TOY, "a", seed=3)
    counts = Counter(rnd.decide(request(tokens(10))).worker for _ in range(400))
    assert set(counts) == {0, 1, 2, 3}


def test_builtin_topologies_decide_with_a_real_index() -> None:
    for name in ("testbed-3region", "sim-8region"):
        topology = load_builtin(name)
        index = RealIndex(topology)
        origin = topology.regions[0].name
        far = topology.regions[-1].workers[0]
        prompt = tokens(8000, seed=9)
        index.set(far.index, prompt, upto=8000, tier=Tier.VRAM)
        p = make_policy("kvcompass", topology, origin, index.view, clock=ManualClock())
        d = p.decide(request(prompt, origin=origin), explain=True)
        assert len(d.candidates) == len(topology.workers)
        assert (d.worker_id, d.reason) == (far.id, "reuse-remote")
