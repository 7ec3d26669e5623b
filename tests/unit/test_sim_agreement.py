"""The sim-vs-live comparison: zero gap against itself, and it flags a real difference."""

from __future__ import annotations

import dataclasses

from kvcompass.loadgen.records import RequestRecord
from kvcompass.loadgen.sim import SimConfig, SimRecord, simulate
from kvcompass.loadgen.sim.agreement import compare
from kvcompass.loadgen.sim.testing import shared_prefixes
from kvcompass.routing.testing import TOY

RECORDS = simulate(SimConfig(TOY, seed=2), shared_prefixes(TOY, 20.0, 120, seed=2)).records


def as_live(rec: SimRecord, slower: float = 1.0) -> RequestRecord:
    """What the load generator would have written for the same outcome."""
    return RequestRecord(
        request_id=rec.request_id,
        session=rec.session,
        origin=rec.origin,
        tenant=rec.tenant,
        scheduled_s=rec.arrival_s,
        late_ms=0.0,
        prompt_tokens=rec.prompt_tokens,
        max_tokens=rec.output_tokens,
        status=200,
        worker=rec.worker,
        region=rec.worker_region,
        reason=rec.reason,
        claimed_tokens=rec.matched_tokens,
        reused_tokens=rec.reused_tokens,
        completion_tokens=rec.output_tokens,
        ttft_ms=rec.ttft_ms * slower,
        e2e_ms=rec.e2e_ms * slower,
    )


def test_identical_outcomes_have_no_gap() -> None:
    gaps, facts = compare(RECORDS, [as_live(r) for r in RECORDS])
    assert all(g.within and abs(g.gap) < 1e-9 for g in gaps)
    assert facts["joined"] == len(RECORDS)
    assert facts["same_worker_share"] == 1.0


def test_a_slower_live_run_is_outside_the_tolerance_and_time_scale_undoes_it() -> None:
    live = [as_live(r, slower=2.0) for r in RECORDS]
    gaps, _ = compare(RECORDS, live)
    outside = {g.metric for g in gaps if not g.within}
    assert outside == {"ttft_p50_ms", "ttft_p90_ms", "e2e_p50_ms"}
    scaled, _ = compare(RECORDS, live, time_scale=2.0)
    assert all(g.within for g in scaled)


def test_failed_live_requests_are_left_out() -> None:
    live = [as_live(r) for r in RECORDS]
    live[0] = dataclasses.replace(live[0], status=0, error="timeout")
    _, facts = compare(RECORDS, live)
    assert facts["joined"] == len(RECORDS) - 1
    assert facts["live_failed"] == 1
