"""The load- and state-driven baselines' defining behaviour: Oracle picks the exact least
loaded; the central directory pays one coordinator round trip and scores exact state;
local-only never leaves its region; SkyWalker pushes to a remote region only when that
region's pending queue is empty; Dynamo prefers overlap until load outweighs it, and sees
other regions only as fresh as its last refresh."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from kvcompass.index.layout import Tier
from kvcompass.pipeline.clock import ManualClock
from kvcompass.routing import (
    CentralDirectory,
    DynamoRouter,
    Feedback,
    Oracle,
    SkyWalker,
    make_policy,
)
from kvcompass.routing.baselines import coordinator_region
from kvcompass.routing.testing import A0, A1, B0, B1, TOY, StubReader, queues, request, tokens
from kvcompass.topology import load_builtin

SIM8 = load_builtin("sim-8region")


@dataclass
class World:
    """A WorldView with queues set by the test."""

    ms: dict[int, float] = field(default_factory=dict)

    def queue_ms(self, worker: int) -> float:
        return self.ms.get(worker, 0.0)


# -- Oracle ------------------------------------------------------------------------------------


def test_oracle_picks_the_exact_least_loaded_worker_of_the_pool() -> None:
    rng = random.Random(1)
    world = World()
    p = make_policy("oracle", SIM8, "au", clock=ManualClock(), world=world)
    assert isinstance(p, Oracle)
    for seq in range(1, 51):
        world.ms = {w: rng.uniform(1.0, 500.0) for w in range(64)}
        for region in SIM8.regions:  # the edge's estimates say the opposite of the truth
            wrong = {f"w{w.index}": 600.0 - world.ms[w.index] for w in region.workers}
            p.on_queues(queues(region.name, seq, **wrong))
        d = p.decide(request(tokens(100), origin="au"))
        assert d.worker == min(world.ms, key=world.ms.__getitem__)
        assert d.candidates[0].queue_ms == world.ms[d.worker]  # explains what it went by
        assert d.lookup_ms == 0.0


def test_oracle_ties_rotate_over_the_idle_workers() -> None:
    p = make_policy("oracle", TOY, "a", clock=ManualClock(), world=World({A0: 5.0}))
    picks = [p.decide(request(tokens(10))).worker for _ in range(6)]
    assert A0 not in picks
    assert set(picks) == {A1, B0, B1}


def test_oracle_without_a_world_uses_the_edges_estimates() -> None:
    p = make_policy("oracle", TOY, "a", clock=ManualClock())
    p.on_queues(queues("a", 1, w0=9.0, w1=9.0))
    p.on_queues(queues("b", 1, w2=9.0, w3=1.0))
    assert p.decide(request(tokens(10))).worker == B1


# -- central directory -------------------------------------------------------------------------


def test_the_coordinator_is_the_worker_weighted_rtt_median() -> None:
    assert coordinator_region(SIM8) == "us"
    assert coordinator_region(TOY) == "a"  # a tie: the first listed region


@pytest.mark.parametrize("origin", ["us", "de", "au"])
def test_central_directory_pays_one_round_trip_to_the_coordinator(origin: str) -> None:
    p = make_policy(
        "central-directory", SIM8, origin, StubReader(64), clock=ManualClock(), world=World()
    )
    assert isinstance(p, CentralDirectory)
    for n in (50, 5000):
        d = p.decide(request(tokens(n), origin=origin))
        assert d.lookup_ms == pytest.approx(SIM8.rtt_ms(origin, "us"))


def test_central_directory_scores_the_exact_state() -> None:
    reader = StubReader(4)
    world = World({A0: 400.0, A1: 400.0, B0: 0.0, B1: 0.0})
    p = make_policy("central-directory", TOY, "a", reader, clock=ManualClock(), world=world)
    p.on_queues(queues("a", 1, w0=0.0, w1=0.0))  # the edge believes a is idle: ignored
    p.on_queues(queues("b", 1, w2=900.0, w3=900.0))
    d = p.decide(request(tokens(3000)))
    assert (d.region, d.reason) == ("b", "directory")
    reader.hold(B1, 2000, Tier.VRAM)  # the directory knows b-1 holds 2,000 tokens
    d = p.decide(request(tokens(3000)))
    assert (d.worker, d.claimed_tokens) == (B1, 2000)
    assert d.lookup_ms == pytest.approx(TOY.rtt_ms("a", "a"))


# -- local-only --------------------------------------------------------------------------------


def test_local_only_never_leaves_its_region() -> None:
    rng = random.Random(2)
    reader = StubReader(64)
    for origin in ("us", "kr", "au"):
        p = make_policy("local-least-loaded", SIM8, origin, reader, clock=ManualClock())
        local = {w.index for w in SIM8.region(origin).workers}
        for seq in range(1, 30):
            # remote workers idle and holding the prompt, local ones loaded
            for w in range(64):
                reader.hold(w, 0 if w in local else 4096)
            for region in SIM8.regions:
                loads = {f"w{w.index}": (rng.uniform(100, 900) if w.index in local else 0.0)
                         for w in region.workers}  # fmt: skip
                p.on_queues(queues(region.name, seq, **loads))
            d = p.decide(request(tokens(4096, seed=seq), origin=origin), explain=seq % 2 == 0)
            assert d.worker in local
            assert {c.worker for c in d.candidates} <= local
            assert set(d.fallbacks) <= local


# -- SkyWalker ---------------------------------------------------------------------------------


def skywalker(reader: StubReader) -> SkyWalker:
    p = make_policy("skywalker", TOY, "a", reader, clock=ManualClock())
    assert isinstance(p, SkyWalker)
    return p


def test_skywalker_keeps_requests_home_while_a_local_worker_is_free() -> None:
    reader = StubReader(4)
    reader.hold(B0, 3000)  # an idle remote holder does not pull it away
    reader.hold(A1, 500)
    p = skywalker(reader)
    p.on_queues(queues("a", 1, w0=0.0, w1=0.0))
    d = p.decide(request(tokens(3000)))
    assert (d.worker, d.reason) == (A1, "local-free")  # the free local worker with a match


def test_skywalker_pushes_to_a_remote_region_only_when_its_pending_queue_is_empty() -> None:
    reader = StubReader(4)
    reader.hold(B1, 3000)
    p = skywalker(reader)
    p.on_queues(queues("a", 1, w0=80.0, w1=50.0))  # home is busy
    p.on_queues(queues("b", 1, w2=10.0, w3=20.0))  # b has work pending everywhere
    d = p.decide(request(tokens(3000)))
    assert (d.worker, d.reason) == (A1, "local-queued")  # even though b-1 holds it
    p.on_queues(queues("b", 2, w2=0.0, w3=20.0))  # b-0's queue empties
    d = p.decide(request(tokens(3000)))
    assert (d.worker, d.reason) == (B0, "push")
    p.on_forward(d, 30.0)  # our own push makes b-0 pending again
    assert p.decide(request(tokens(3000))).worker == A1


# -- Dynamo ------------------------------------------------------------------------------------


def dynamo(reader: StubReader, clock: ManualClock) -> DynamoRouter:
    p = make_policy("dynamo", TOY, "a", reader, clock=clock)
    assert isinstance(p, DynamoRouter)
    return p


def test_dynamo_prefers_overlap_until_load_outweighs_it() -> None:
    # 1,000 tokens: 63 blocks; a-1 holds 62 of them (β 0.2 ms/token: 3.2 ms per block)
    reader = StubReader(4)
    reader.hold(A1, 1000)
    p = dynamo(reader, ManualClock())
    assert p.decide(request(tokens(1000))).worker == A1
    p.on_queues(queues("a", 1, w1=190.0))  # 59.4 queued blocks + 1 left < 63 elsewhere
    d = p.decide(request(tokens(1000)))
    assert (d.worker, d.reason, d.claimed_tokens) == (A1, "kv-cost", 1000)
    p.on_queues(queues("a", 2, w1=210.0))  # 65.6 + 1 > 63: the load outweighs the overlap
    assert p.decide(request(tokens(1000))).worker == A0
    # a DRAM copy earns 0.75 of the credit
    reader.hold(A1, 1000, Tier.DRAM)
    p.on_queues(queues("a", 3, w1=100.0))  # 31.25 + 63 - 46.5 = 47.75 < 63
    assert p.decide(request(tokens(1000))).worker == A1


def test_dynamo_counts_its_in_flight_requests_as_decode_blocks() -> None:
    reader = StubReader(4)
    p = dynamo(reader, ManualClock())
    first = p.decide(request(tokens(1000)))
    assert first.worker == A0
    p.on_forward(first, 0.0)
    assert p.decode_blocks[A0] == 63
    assert p.decide(request(tokens(1000))).worker == A1
    p.observe(Feedback(A0, 0, 0, None, False))  # answered: its blocks are freed
    assert p.decode_blocks[A0] == 0


def test_dynamo_sees_other_regions_only_as_of_its_last_refresh() -> None:
    reader = StubReader(4)
    reader.hold(B0, 1000)
    clock = ManualClock()
    p = dynamo(reader, clock)
    assert p.decide(request(tokens(1000))).worker == B0  # no WAN term in its cost
    p.on_queues(queues("b", 1, w2=5_000.0))  # b-0 is swamped: the broadcast arrives
    clock.advance(0.05)  # Δ = 100 ms not yet passed: the stale view still sends to b-0
    assert p.decide(request(tokens(1000))).worker == B0
    clock.advance(0.05)
    assert p.decide(request(tokens(1000))).worker == A0
