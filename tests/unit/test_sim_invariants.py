"""Simulator invariants: every request finishes once with its tokens accounted for, a
seed fixes the run, and local-only routing never crosses the WAN."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter

import pytest

from kvcompass.loadgen.sim import SimConfig, SimResult, simulate
from kvcompass.loadgen.sim.testing import shared_prefixes
from kvcompass.loadgen.workloads import LiveRequest, make_workload
from kvcompass.routing import POLICY_NAMES, RoutingConfig
from kvcompass.routing.config import Ablations
from kvcompass.routing.testing import TOY
from kvcompass.topology import load_builtin

REQUESTS = shared_prefixes(TOY, rate=40.0, count=300, seed=3)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_request_finishes_once_and_tokens_add_up(policy: str) -> None:
    result = simulate(SimConfig(TOY, policy=policy, seed=3, jitter_pct=20), REQUESTS)

    assert Counter(r.request_id for r in result.records) == Counter(r.request_id for r in REQUESTS)
    beta = {w.id: w.beta_ms_per_token for w in TOY.workers}
    by_id = {r.request_id: r for r in REQUESTS}
    for rec in result.records:
        sent = by_id[rec.request_id]
        assert rec.prompt_tokens == len(sent.tokens)
        assert rec.output_tokens == sent.max_tokens
        assert 0 <= rec.dram_tokens <= rec.reused_tokens <= rec.prompt_tokens
        # What was not reused was recomputed, at the worker's β.
        assert rec.prefill_ms == pytest.approx(beta[rec.worker] * rec.recomputed_tokens)
        assert rec.reload_ms == pytest.approx(TOY.gamma_ms_per_token * rec.dram_tokens)
        parts = rec.lookup_ms + rec.wan_ms + rec.queue_ms + rec.reload_ms + rec.prefill_ms
        parts += rec.overhead_ms
        assert rec.ttft_ms == pytest.approx(parts)
        assert rec.e2e_ms >= rec.ttft_ms
    # The workload shares system prompts and documents: some prefill is reused.
    assert sum(r.reused_tokens for r in result.records) > 0


def test_the_serving_overhead_is_paid_once_by_every_request() -> None:
    # Round-robin picks the same workers whatever the timing, so every arrival at a
    # worker moves by exactly the overhead and nothing else changes.
    paper = simulate(SimConfig(TOY, policy="round-robin", seed=3), REQUESTS).records
    live = simulate(
        SimConfig(TOY, policy="round-robin", seed=3, serving_overhead_ms=12.0), REQUESTS
    ).records

    assert all(r.overhead_ms == 0.0 for r in paper)
    by_id = {r.request_id: r for r in paper}
    for rec in live:
        before = by_id[rec.request_id]
        assert rec.worker == before.worker
        assert rec.overhead_ms == 12.0
        assert rec.ttft_ms == pytest.approx(before.ttft_ms + 12.0)
        assert rec.e2e_ms == pytest.approx(before.e2e_ms + 12.0)
        parts = rec.lookup_ms + rec.wan_ms + rec.queue_ms + rec.reload_ms + rec.prefill_ms
        assert rec.ttft_ms == pytest.approx(parts + rec.overhead_ms)


def test_a_seed_fixes_the_run() -> None:
    config = SimConfig(TOY, policy="kvcompass", seed=5, jitter_pct=30, update_loss=0.2)
    first = simulate(config, REQUESTS)
    again = simulate(config, REQUESTS)

    assert first.records == again.records
    assert first.load_samples == again.load_samples
    other = simulate(SimConfig(TOY, policy="kvcompass", seed=6, jitter_pct=30), REQUESTS)
    assert [r.ttft_ms for r in other.records] != [r.ttft_ms for r in first.records]


def test_local_least_loaded_never_leaves_its_region() -> None:
    result = simulate(SimConfig(TOY, policy="local-least-loaded", seed=3), REQUESTS)

    origins = Counter(r.origin for r in result.records)
    assert set(origins) == {"a", "b"}  # both edges were exercised
    assert all(r.worker_region == r.origin for r in result.records)
    assert all(r.wan_ms == pytest.approx(2 * TOY.intra_region_one_way_ms) for r in result.records)


def test_the_summary_counts_migration_orders_and_the_ablation_stops_them() -> None:
    # testbed-3region's synthetic mix at 20 req/s turns a few prefix families hot in a
    # region with no holder and an idle worker (two orders in these 200 requests).
    topology = load_builtin("testbed-3region")
    requests = list(itertools.islice(make_workload("synthetic", topology, 20.0, 0), 200))
    on = simulate(SimConfig(topology, policy="kvcompass", seed=0), requests)
    off = simulate(
        SimConfig(
            topology,
            policy="kvcompass",
            seed=0,
            routing=RoutingConfig(ablations=Ablations(migration=False)),
        ),
        requests,
    )
    assert on.stats["migrations"] > 0
    assert off.stats["migrations"] == 0


def test_records_carry_the_expected_queue_and_the_summary_its_shortfall() -> None:
    result = simulate(SimConfig(TOY, policy="kvcompass", seed=3), REQUESTS)
    expected = [r.expected_queue_ms for r in result.records]
    assert all(math.isfinite(e) and e >= 0 for e in expected)
    assert any(e > 0 for e in expected), "at 40 req/s the score expects some queueing"
    # The summary: met − expected queue, averaged apart for home and away requests.
    base = result.records[0]
    recs = [
        dataclasses.replace(
            base, origin="a", worker_region="a", queue_ms=10.0, expected_queue_ms=4.0
        ),
        dataclasses.replace(
            base, origin="a", worker_region="b", queue_ms=100.0, expected_queue_ms=20.0
        ),
        dataclasses.replace(
            base, origin="b", worker_region="a", queue_ms=0.0, expected_queue_ms=0.0
        ),
        # A decision without candidates: no estimate, not counted.
        dataclasses.replace(
            base, origin="b", worker_region="a", queue_ms=50.0, expected_queue_ms=math.nan
        ),
    ]
    summary = SimResult(recs, [], {}, 0.1).summary()
    assert summary["queue_underestimate_local_ms"] == pytest.approx(6.0)
    assert summary["queue_underestimate_remote_ms"] == pytest.approx(40.0)


def test_a_window_in_which_the_pool_computed_nothing_has_no_load_factor() -> None:
    # Short prompts 5 s apart: the windows between them see no prefill anywhere.
    origin = TOY.regions[0].name
    requests = [
        LiveRequest(at, origin, "t", list(range(1 + k, 257 + k)), 1, f"s{k}", f"r{k}")
        for k, at in enumerate((0.1, 5.1, 10.1))
    ]
    result = simulate(SimConfig(TOY, policy="round-robin", seed=0), requests)

    windows: dict[float, list[float]] = {}
    for sample in result.load_samples:
        windows.setdefault(sample.t_s, []).append(sample.load_factor)
    idle = [t for t, factors in windows.items() if all(map(math.isnan, factors))]
    busy = [t for t, factors in windows.items() if not any(map(math.isnan, factors))]
    assert sorted(idle + busy) == sorted(windows)  # a window is wholly one or the other
    # The windows in which the first two prefills ended (sampling ends with the run).
    assert len(busy) == 2
    assert len(idle) == 8
    for t in busy:  # an even split is 1: the factors average 1 over the pool
        assert sum(windows[t]) / len(windows[t]) == pytest.approx(1.0)
