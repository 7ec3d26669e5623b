"""In the simulator, pending credit keeps a burst of one new prefix on one worker while
the first request of the burst still waits in a queue (the index cannot know it yet)."""

from __future__ import annotations

import dataclasses

import numpy as np

from kvcompass.loadgen.sim import SimConfig, simulate
from kvcompass.loadgen.workloads import LiveRequest
from kvcompass.routing import RoutingConfig
from kvcompass.routing.testing import TOY
from kvcompass.topology import Region, Worker

REGION = "a"
#: One region of four equal workers (the toy topology's settings, its region b dropped).
TOPOLOGY = dataclasses.replace(
    TOY,
    regions=(
        Region(
            REGION,
            tuple(Worker(f"a-{i}", REGION, i, 0.1, 10**9, 10**9) for i in range(4)),
        ),
    ),
    one_way_ms=np.zeros((1, 1)),
)

PREFIX = 512
BURST = 8


def _requests() -> list[LiveRequest]:
    """Every worker of the region busy for 0.8 s with a unique prompt, then a burst of
    prompts sharing a new 512-token prefix (the longest length the region registers),
    each with its own 16-token tail."""
    rng = np.random.default_rng(11)
    busy = [
        LiveRequest(0.001 * i, REGION, "t", rng.integers(0, 2**32, 8000).tolist(), 1, "", f"b{i}")
        for i in range(4)
    ]
    prefix = rng.integers(0, 2**32, PREFIX).tolist()
    burst = [
        LiveRequest(
            0.01 + 0.001 * i,
            REGION,
            "t",
            prefix + rng.integers(0, 2**32, 16).tolist(),
            1,
            f"s{i}",
            f"r{i}",
        )
        for i in range(BURST)
    ]
    return busy + burst


def _burst_reuse(pending_credit: bool) -> tuple[int, int]:
    """(prefix tokens the burst reused, workers it ran on)."""
    routing = RoutingConfig(pending_credit=pending_credit)
    config = SimConfig(TOPOLOGY, seed=1, routing=routing)
    records = [r for r in simulate(config, _requests()).records if r.request_id.startswith("r")]
    assert len(records) == BURST
    return sum(r.reused_tokens for r in records), len({r.worker for r in records})


def test_pending_credit_keeps_a_queued_burst_of_one_prefix_on_one_worker() -> None:
    reused, workers = _burst_reuse(pending_credit=True)
    # Every request after the first reuses the prefix (its whole blocks) on one worker.
    assert workers == 1
    assert reused == (BURST - 1) * PREFIX


def test_without_it_the_burst_spreads_and_recomputes_the_prefix() -> None:
    reused, workers = _burst_reuse(pending_credit=False)
    assert workers > 1
    assert reused < (BURST - 1) * PREFIX
